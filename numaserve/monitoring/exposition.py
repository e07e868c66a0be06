"""A Snapshot, and what was read from the OS at scrape time, as Prometheus metric families.

Pure: no I/O here (endpoint.py reads RSS, affinity and numastat and passes them in), so every
series is tested from a hand-built snapshot, and the live output with promtool. Names follow
Prometheus' conventions: base units (seconds, bytes), `_total` on counters, `numaserve_`.
Series a router shard counts carry `shard`, so that a restarted shard's counters reset alone
and `sum()` / `rate()` work as for any fleet of processes, and `model_name`, the shard's
model's name (`default` for a `model:` config); an instance's carry its model's too.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)

from numaserve.config.schema import DEFAULT_MODEL
from numaserve.host.cpuset import CPUSet
from numaserve.monitoring.snapshot import Process, Snapshot
from numaserve.status.report import ShardReport

# An instance is named by its slot ("main-0"; a restart keeps it): `instance` is the label
# Prometheus gives every series of a scrape target (host:port), and would rename ours.
INSTANCE_LABELS = ("slot", "model_name", "pool", "node", "cpus")
STATES = ("starting", "ready", "draining", "stopped", "backoff", "fatal")
NUMASTAT = {
    "numa_hit": "allocated on the node they were meant for",
    "numa_miss": "allocated on this node although another was preferred",
    "numa_foreign": "meant for this node but allocated on another",
    "interleave_hit": "interleaved and allocated on this node as meant",
    "local_node": "allocated on this node for a process running on it",
    "other_node": "allocated on this node for a process running on another node",
}


@dataclass(frozen=True)
class Readings:
    """What endpoint.py read from the OS for one scrape."""

    rss: dict[int, int] = field(default_factory=dict)  # by pid
    affinity: dict[int, CPUSet] = field(default_factory=dict)  # live, by pid
    numastat: dict[int, dict[str, int]] = field(default_factory=dict)  # by node
    fronts: tuple[dict, ...] = ()  # each front's counts, as its stats file holds them


def families(snapshot: Snapshot, readings: Readings) -> Iterator[Metric]:
    yield from _build(snapshot)
    yield from _processes(snapshot, readings)
    yield from _instances(snapshot, readings)
    # Each shard's series carry its index and its model (`default` for a `model:` config).
    shards = [
        ([str(i), s.model_name or DEFAULT_MODEL], s)
        for i, s in enumerate(snapshot.shards)
        if s is not None
    ]
    yield from _requests(shards)
    yield from _pools(shards)
    yield from _cache(shards)
    yield from _model_paths(shards)
    yield from _memory_binding(shards)
    yield from _shared_weights(shards)
    yield from _passes(snapshot, shards)
    yield from _http(readings.fronts)
    yield from _grpc(readings.fronts)
    yield from _numastat(readings)


def _http(fronts: tuple[dict, ...]) -> Iterator[Metric]:
    yield from _answered(
        fronts,
        "http",
        "route",
        ("requests", "latency"),
        (
            "HTTP requests answered by the HTTP fronts, by route and status code.",
            "Time in an HTTP front from a request read whole to its answer.",
        ),
    )
    connections = GaugeMetricFamily(
        "numaserve_http_connections",
        "Open client connections of each HTTP front.",
        labels=["front"],
    )
    dropped = CounterMetricFamily(
        "numaserve_http_spans_dropped",
        "Trace spans an HTTP front could not deliver to the OTLP collector (down, refusing, slow).",
        labels=["front"],
    )
    for stats in fronts:
        front = str(stats.get("front", 0))
        dropped.add_metric([front], stats.get("spans_dropped", 0))
        connections.add_metric([front], stats.get("connections", 0))
    yield connections
    yield dropped


def _grpc(fronts: tuple[dict, ...]) -> Iterator[Metric]:
    yield from _answered(
        fronts,
        "grpc",
        "method",
        ("grpc", "grpc_latency"),
        (
            "gRPC calls answered by the fronts (server.grpc), by method and status code.",
            "Time in a front from a gRPC call's start to its end (a stream's whole life).",
        ),
    )


def _answered(
    fronts: tuple[dict, ...], api: str, what: str, keys: tuple[str, str], helps: tuple[str, str]
) -> Iterator[Metric]:
    """One API's calls by `what` (a route, a method) and status code, and their latency, as
    each front's stats file holds them under `keys`."""
    counts, latencies = keys
    answered = CounterMetricFamily(
        f"numaserve_{api}_requests", helps[0], labels=["front", what, "code"]
    )
    latency = HistogramMetricFamily(
        f"numaserve_{api}_request_duration_seconds", helps[1], labels=["front", what]
    )
    for stats in fronts:
        front = str(stats.get("front", 0))
        for name, code, count in stats.get(counts, ()):
            answered.add_metric([front, str(name), str(code)], count)
        for name, hist in sorted((stats.get(latencies) or {}).items()):
            latency.add_metric([front, name], *_buckets(hist))
    yield answered
    yield latency


def _build(snapshot: Snapshot) -> Iterator[Metric]:
    info = InfoMetricFamily("numaserve_build", "The running numaserve and its models.")
    for build in snapshot.build:
        info.add_metric([], build)
    yield info


def _processes(snapshot: Snapshot, readings: Readings) -> Iterator[Metric]:
    rss = GaugeMetricFamily(
        "numaserve_process_resident_memory_bytes",
        "Resident memory of each numaserve process (the supervisor, router shards, frontend, "
        "instances).",
        labels=["process", "kind"],
    )
    rows = [("supervisor", "supervisor", snapshot.supervisor_pid)]
    rows += [(p.name, p.kind, p.pid) for p in snapshot.processes]
    for name, kind, pid in rows:
        if pid in readings.rss:
            rss.add_metric([name, kind], readings.rss[pid])
    yield rss
    routers = GaugeMetricFamily(
        "numaserve_router_up",
        "1 while a router shard answers the supervisor.",
        labels=["shard"],
    )
    for shard, age in enumerate(snapshot.shard_age):
        routers.add_metric([str(shard)], 1 if age is not None else 0)
    yield routers
    stopping = GaugeMetricFamily("numaserve_stopping", "1 while the server drains to stop.")
    stopping.add_metric([], 1 if snapshot.stopping else 0)
    yield stopping


def instance_labels(process: Process) -> list[str]:
    return [
        process.name,
        str(process.model_name or DEFAULT_MODEL),
        str(process.pool or ""),
        str(process.binding.nodes),
        str(process.binding.cpus),
    ]


def _instances(snapshot: Snapshot, readings: Readings) -> Iterator[Metric]:
    up = GaugeMetricFamily(
        "numaserve_instance_up", "1 while an instance is ready.", labels=INSTANCE_LABELS
    )
    state = GaugeMetricFamily(
        "numaserve_instance_state",
        "1 for the state an instance is in (the supervisor's), 0 for the others.",
        labels=[*INSTANCE_LABELS, "state"],
    )
    restarts = CounterMetricFamily(
        "numaserve_instance_restarts",
        "Times the supervisor restarted an instance after it exited.",
        labels=INSTANCE_LABELS,
    )
    affinity = GaugeMetricFamily(
        "numaserve_instance_affinity_as_planned",
        "1 when the CPUs the kernel lets an instance run on are its planned ones.",
        labels=INSTANCE_LABELS,
    )
    rss = GaugeMetricFamily(
        "numaserve_instance_resident_memory_bytes",
        "Resident memory of an instance.",
        labels=INSTANCE_LABELS,
    )
    for process in snapshot.instances():
        labels = instance_labels(process)
        up.add_metric(labels, 1 if process.state == "ready" else 0)
        for name in STATES:
            state.add_metric([*labels, name], 1 if process.state == name else 0)
        restarts.add_metric(labels, process.restarts)
        pid = process.pid
        if pid in readings.affinity:
            planned = process.binding.cpus
            affinity.add_metric(labels, 1 if readings.affinity[pid] == planned else 0)
        if pid in readings.rss:
            rss.add_metric(labels, readings.rss[pid])
    yield from (up, state, restarts, affinity, rss)


def _requests(shards: list[tuple[list[str], ShardReport]]) -> Iterator[Metric]:
    replies = CounterMetricFamily(
        "numaserve_requests",
        "Requests answered, by op, result code (ok, or the error's code) and priority.",
        labels=["shard", "model_name", "op", "code", "priority"],
    )
    latency = HistogramMetricFamily(
        "numaserve_request_duration_seconds",
        "Time in the router from a request's receipt to its reply (queued, computed or cached).",
        labels=["shard", "model_name", "op", "priority"],
    )
    counters = {
        "client_disconnects": "Client connections closed (left, or over max_message_bytes).",
        "refused_handshakes": "Client connections refused in the CurveZMQ handshake.",
        "dropped_frames": "Client or worker messages dropped as unreadable.",
        "handed_over": "Requests passed to a peer shard that had an instance this one lacked.",
        "internal_errors": "Messages that failed in the router on a bug, dropped.",
        "cancelled": "Requests their client gave up on (an HTTP client that hung up), not run.",
        "spans_dropped": "Trace spans not delivered to the OTLP collector (down, refusing, slow).",
        "instance_spans_dropped": (
            "Trace spans the shard's instances did not deliver to the OTLP collector."
        ),
    }
    simple = {
        key: CounterMetricFamily(f"numaserve_router_{key}", doc, labels=["shard", "model_name"])
        for key, doc in counters.items()
    }
    for shard, status in shards:
        metrics = status.metrics or {}
        for op, code, priority, count in metrics.get("replies", ()):
            replies.add_metric([*shard, op, code, priority], count)
        for op, priority, hist in sorted(metrics.get("latency") or (), key=lambda e: e[:2]):
            latency.add_metric([*shard, op, priority], *_buckets(hist))
        for key, family in simple.items():
            family.add_metric(shard, status.requests.get(key, 0))
    yield replies
    yield latency
    yield from simple.values()


def _model_paths(shards: list[tuple[list[str], ShardReport]]) -> Iterator[Metric]:
    """What each ready instance runs, as the shard that routes to it heard in its READY: a
    series for each path it holds, by the texts it runs (`last_tokens`: up to that many, ""
    for every longer one; `from_batch`: micro-batches of at least that many), `quantize:
    auto`'s choice (chosen_by auto) with the config's own (config); and the passes each ran,
    where an instance holds several."""
    info = InfoMetricFamily(
        "numaserve_instance_model_path",
        "A backend and precision an instance runs, for which texts (last_tokens: up to that "
        "many tokens, '' every longer one; from_batch: micro-batches of at least that many), "
        "whether auto or the config chose it, and the accuracy gate's figures there.",
    )
    passes = CounterMetricFamily(
        "numaserve_instance_model_passes",
        "Forward passes an instance ran on each of its model paths, where it holds several.",
        labels=["instance", "model_name", "path"],
    )
    for (_, model_name), status in shards:
        for instance in status.routing:
            running = instance.model_path
            if not (instance.routed and running):
                continue
            for last, from_batch, path, accuracy in running.runs.by_band:
                labels = {
                    "instance": instance.name,
                    "model_name": model_name,
                    "backend": path.backend,
                    "quantize": path.quantize,
                    "keep_fp32": ",".join(path.keep_fp32),
                    "chosen_by": running.chosen_by,
                    "last_tokens": "" if last is None else str(last),
                    "from_batch": str(from_batch),
                    "accuracy": accuracy or "",
                }
                info.add_metric([], labels)
            for name, count in sorted((instance.passes or {}).items()):
                passes.add_metric([instance.name, model_name, name], count)
    yield info
    yield passes


def _memory_binding(shards: list[tuple[list[str], ShardReport]]) -> Iterator[Metric]:
    """What binds each ready instance's memory to its node: `cpuset` where the memory-policy
    calls are refused (a container's default seccomp profile) and the cgroup binds it."""
    info = InfoMetricFamily(
        "numaserve_instance_memory_binding",
        "What binds an instance's memory to its node: numactl, set_mempolicy or cpuset.",
    )
    for (_, model_name), status in shards:
        for instance in status.routing:
            if instance.routed and instance.membind:
                labels = {
                    "instance": instance.name,
                    "model_name": model_name,
                    "bound_by": instance.membind,
                }
                info.add_metric([], labels)
    yield info


def _pools(shards: list[tuple[list[str], ShardReport]]) -> Iterator[Metric]:
    labels = ["shard", "model_name", "pool"]
    queue = GaugeMetricFamily(
        "numaserve_queue_texts", "Texts waiting in a pool's queue.", labels=labels
    )
    ready = GaugeMetricFamily(
        "numaserve_pool_ready_instances",
        "Instances a shard routes a pool's texts to.",
        labels=labels,
    )
    wait = HistogramMetricFamily(
        "numaserve_queue_wait_seconds",
        "Time a text waited in its pool's queue before it was sent to an instance.",
        labels=labels,
    )
    batch = HistogramMetricFamily(
        "numaserve_batch_texts", "Texts in each forward pass sent to a pool.", labels=labels
    )
    texts = CounterMetricFamily(
        "numaserve_texts", "Texts sent to a pool's instances.", labels=labels
    )
    tokens = CounterMetricFamily(
        "numaserve_tokens",
        "Tokens (special tokens included) sent to a pool's instances.",
        labels=labels,
    )
    for shard, status in shards:
        for pool in status.pools:
            queue.add_metric([*shard, pool.name], pool.queue)
            ready.add_metric([*shard, pool.name], pool.ready)
        for name, pool in sorted(((status.metrics or {}).get("pools") or {}).items()):
            wait.add_metric([*shard, name], *_buckets(pool["queue_wait"]))
            batch.add_metric([*shard, name], *_buckets(pool["batch"]))
            texts.add_metric([*shard, name], pool["texts"])
            tokens.add_metric([*shard, name], pool["tokens"])
    yield from (queue, ready, wait, batch, texts, tokens)


def _cache(shards: list[tuple[list[str], ShardReport]]) -> Iterator[Metric]:
    labels = ["shard", "model_name"]
    hits = CounterMetricFamily(
        "numaserve_cache_hits", "Texts answered from the cache.", labels=labels
    )
    misses = CounterMetricFamily(
        "numaserve_cache_misses", "Texts looked up in the cache and not found.", labels=labels
    )
    entries = GaugeMetricFamily(
        "numaserve_cache_entries", "Results the cache holds.", labels=labels
    )
    capacity = GaugeMetricFamily(
        "numaserve_cache_capacity_entries", "The most results the cache holds.", labels=labels
    )
    for shard, status in shards:
        cache = status.cache
        hits.add_metric(shard, cache.hits)
        misses.add_metric(shard, cache.misses)
        entries.add_metric(shard, cache.entries)
        capacity.add_metric(shard, cache.capacity)
    yield from (hits, misses, entries, capacity)


def _passes(snapshot: Snapshot, shards: list[tuple[list[str], ShardReport]]) -> Iterator[Metric]:
    passes = HistogramMetricFamily(
        "numaserve_forward_pass_seconds",
        "An instance's forward passes, as the instance times them.",
        labels=INSTANCE_LABELS,
    )
    by_name = {p.name: p for p in snapshot.instances()}
    for _, status in shards:
        for name, hist in sorted(((status.metrics or {}).get("passes") or {}).items()):
            process = by_name.get(name)
            if process is not None:  # an instance a reload retired keeps no series
                passes.add_metric(instance_labels(process), *_buckets(hist))
    yield passes


def _numastat(readings: Readings) -> Iterator[Metric]:
    for counter, doc in NUMASTAT.items():
        family = CounterMetricFamily(
            f"numaserve_numastat_{counter}_pages",
            f"Pages {doc} (the kernel's /sys/devices/system/node/nodeN/numastat).",
            labels=["node"],
        )
        for node, counters in readings.numastat.items():
            if counter in counters:
                family.add_metric([str(node)], counters[counter])
        yield family


def _buckets(hist: dict) -> tuple[list[tuple[str, float]], float]:
    """The router's histogram (counts per bucket, the last above every bound) as Prometheus'
    cumulative buckets and sum."""
    buckets, total = [], 0
    for bound, count in zip([*hist["bounds"], float("inf")], hist["counts"], strict=True):
        total += count
        buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), total))
    return buckets, hist["sum"]


def _shared_weights(shards: list[tuple[list[str], ShardReport]]) -> Iterator[Metric]:
    """Each shared weights file (one a NUMA node): its bytes, and how many ready instances map
    it; a file the instances of several shards map counts once, with all of them."""
    sharing: dict[tuple[str, str, str], tuple[int, int]] = {}
    for (_, model_name), status in shards:
        for instance in status.routing:
            for w in (instance.weights or ()) if instance.routed else ():
                key = (model_name, "" if w["node"] is None else str(w["node"]), w["file"])
                _, count = sharing.get(key, (0, 0))
                sharing[key] = (w["bytes"], count + 1)
    labels = ["model_name", "node", "file"]
    size = GaugeMetricFamily(
        "numaserve_weights_bytes",
        "A weights file instances map and share, one copy a NUMA node (node empty: the host).",
        labels=labels,
    )
    mapped = GaugeMetricFamily(
        "numaserve_weights_instances",
        "How many ready instances map a shared weights file.",
        labels=labels,
    )
    for key, (nbytes, count) in sorted(sharing.items()):
        size.add_metric(list(key), nbytes)
        mapped.add_metric(list(key), count)
    yield size
    yield mapped
