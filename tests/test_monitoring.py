"""The metrics and health endpoint, in parts: the router's counts, the exposition of a
hand-built snapshot, the probes' verdicts, numastat, and the real HTTP server on a real port.
A whole server scraped by a real Prometheus is tests/test_prometheus.py."""

import socket
from dataclasses import replace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from numaserve.config.paths import BandPath, BatchedPath, ModelPath, PoolPath
from numaserve.front.stats import Stats
from numaserve.host.cpuset import Binding, CPUSet
from numaserve.host.numastat import read_numastat
from numaserve.monitoring import health
from numaserve.monitoring.endpoint import MonitoringEndpoint, MonitoringError
from numaserve.monitoring.exposition import Readings, families
from numaserve.monitoring.snapshot import Process, Snapshot
from numaserve.router.metrics import Histogram, RouterMetrics
from numaserve.status.report import Cache, RunningPath, ShardReport
from tests.harness.http import http_get
from tests.harness.reports import pool, report, routing


def shard_status(ready=1, queue=0) -> ShardReport:
    metrics = RouterMetrics(["short", "long"])
    metrics.replied("embed", "ok", 0.002)
    metrics.replied("embed", "ok", 0.0004)
    metrics.replied("embed", "overloaded", 0.00001)
    metrics.replied("bogus", "bad_request")
    metrics.replied("embed", "ok", 0.02, bulk=True)
    metrics.replied("embed", "overloaded", 0.00001, bulk=True)
    metrics.dispatched(0, [0.001, 0.003], tokens=17)
    metrics.forward_pass("short-0", 0.004)
    return report(
        pools=(pool("short", queue=queue, ready=ready), pool("long")),
        cache=Cache(hits=5, misses=3, entries=3, capacity=100, hit_rate=0.625),
        requests={"client_disconnects": 2, "dropped_frames": 0},
        metrics=metrics.wire(),
    )


def snapshot(taken=100.0, shards=None, ages=None, stopping=False, long_0="backoff") -> Snapshot:
    shards = (shard_status(),) if shards is None else shards
    worker = {"kind": "worker", "model_name": "default", "state": "ready", "restarts": 2}
    return Snapshot(
        taken=taken,
        stopping=stopping,
        build=({"version": "9.9", "backend": "onnxruntime", "model": "m", "task": "embed"},),
        pools=(("default", "short"), ("default", "long")),
        processes=(
            Process("router", "router", "ready", 4000, Binding.of([0], [0])),
            Process(
                **worker, name="short-0", pool="short", pid=4242, binding=Binding.of([2, 3], [1])
            ),
            Process(**(worker | {"state": long_0}), name="long-0", pool="long", pid=None),
        ),
        shards=shards,
        shard_age=(0.1,) * len(shards) if ages is None else ages,
        supervisor_pid=3999,
    )


def samples(snap: Snapshot, readings: Readings | None = None) -> dict:
    """{(sample name, sorted labels): value} of what `families` yields."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in families(snap, readings or Readings())
        for s in family.samples
    }


SHORT_0 = (
    ("cpus", "2-3"),
    ("model_name", "default"),
    ("node", "1"),
    ("pool", "short"),
    ("slot", "short-0"),
)
DEFAULT = ("model_name", "default")


# -- the router's counts --------------------------------------------------------------------


def test_a_histogram_counts_a_value_equal_to_a_bound_in_that_bound_as_prometheus_le_does():
    hist = Histogram((0.1, 1.0))
    for value in (0.1, 0.5, 1.0, 7.0):
        hist.observe(value)
    assert hist.wire() == {"bounds": [0.1, 1.0], "counts": [1, 2, 1], "sum": 8.6}


def test_an_op_no_server_knows_is_counted_as_unknown_so_clients_cannot_add_series():
    metrics = RouterMetrics(["main"])
    for op in ("embed", "x" * 100, None, 7):
        metrics.replied(op, "bad_request")
    assert metrics.wire()["replies"] == [
        ["embed", "bad_request", "interactive", 1],
        ["unknown", "bad_request", "interactive", 3],
    ]


def test_a_forward_pass_time_that_is_not_a_plausible_float_is_ignored():
    metrics = RouterMetrics(["main"])
    for seconds in ("1", -1.0, float("nan"), 1e9, None):
        metrics.forward_pass("main-0", seconds)
    assert metrics.wire()["passes"] == {}


# -- exposition -----------------------------------------------------------------------------


INTERACTIVE, BULK = ("priority", "interactive"), ("priority", "bulk")


def test_requests_are_counted_by_shard_op_code_and_priority():
    got = samples(snapshot())
    ok = (("code", "ok"), DEFAULT, ("op", "embed"))
    assert got[("numaserve_requests_total", (*ok, INTERACTIVE, ("shard", "0")))] == 2
    assert got[("numaserve_requests_total", (*ok, BULK, ("shard", "0")))] == 1
    shed = (("code", "overloaded"), DEFAULT, ("op", "embed"), BULK, ("shard", "0"))
    assert got[("numaserve_requests_total", shed)] == 1
    unknown = (("code", "bad_request"), DEFAULT, ("op", "unknown"), INTERACTIVE, ("shard", "0"))
    assert got[("numaserve_requests_total", unknown)] == 1


def test_latency_buckets_are_cumulative_and_end_in_inf():
    got = samples(snapshot())
    labels = (DEFAULT, ("op", "embed"), INTERACTIVE, ("shard", "0"))
    bucket = "numaserve_request_duration_seconds_bucket"
    assert got[(bucket, (("le", "0.0001"), *labels))] == 1  # the overloaded one
    assert got[(bucket, (("le", "0.0005"), *labels))] == 2
    assert got[(bucket, (("le", "0.0025"), *labels))] == 3
    assert got[(bucket, (("le", "+Inf"), *labels))] == 3
    assert got[("numaserve_request_duration_seconds_count", labels)] == 3


def test_pools_show_queue_wait_batch_sizes_texts_and_tokens():
    got = samples(snapshot())
    short = (DEFAULT, ("pool", "short"), ("shard", "0"))
    assert got[("numaserve_queue_wait_seconds_count", short)] == 2
    assert got[("numaserve_batch_texts_sum", short)] == 2
    assert got[("numaserve_texts_total", short)] == 2
    assert got[("numaserve_tokens_total", short)] == 17
    assert got[("numaserve_pool_ready_instances", short)] == 1


def test_instances_carry_their_pool_node_and_cpus():
    got = samples(snapshot(), Readings(rss={4242: 123}, affinity={4242: CPUSet.of([2, 3])}))
    assert got[("numaserve_instance_up", SHORT_0)] == 1
    assert got[("numaserve_instance_restarts_total", SHORT_0)] == 2
    assert got[("numaserve_instance_affinity_as_planned", SHORT_0)] == 1
    assert got[("numaserve_instance_resident_memory_bytes", SHORT_0)] == 123
    assert got[("numaserve_forward_pass_seconds_count", SHORT_0)] == 1
    assert got[("numaserve_instance_state", (*SHORT_0, ("state", "ready")))] == 1
    assert got[("numaserve_instance_state", (*SHORT_0, ("state", "backoff")))] == 0


def test_an_instance_off_its_planned_cpus_shows_zero():
    got = samples(snapshot(), Readings(affinity={4242: CPUSet.parse("0-3")}))
    assert got[("numaserve_instance_affinity_as_planned", SHORT_0)] == 0


def test_an_instance_without_a_process_is_down_and_has_no_memory_or_affinity_series():
    got = samples(snapshot(), Readings(rss={4242: 1}, affinity={4242: CPUSet.of([2, 3])}))
    long_0 = (("cpus", ""), DEFAULT, ("node", ""), ("pool", "long"), ("slot", "long-0"))
    assert got[("numaserve_instance_up", long_0)] == 0
    assert got[("numaserve_instance_state", (*long_0, ("state", "backoff")))] == 1
    assert ("numaserve_instance_resident_memory_bytes", long_0) not in got
    assert ("numaserve_instance_affinity_as_planned", long_0) not in got


def test_cache_counts_and_build_info():
    got = samples(snapshot())
    assert got[("numaserve_cache_hits_total", (DEFAULT, ("shard", "0")))] == 5
    assert got[("numaserve_cache_misses_total", (DEFAULT, ("shard", "0")))] == 3
    build = (("backend", "onnxruntime"), ("model", "m"), ("task", "embed"), ("version", "9.9"))
    assert got[("numaserve_build_info", build)] == 1


def test_a_shard_that_has_not_answered_is_down_and_adds_no_request_series():
    got = samples(snapshot(shards=(shard_status(), None), ages=(0.1, None)))
    assert got[("numaserve_router_up", (("shard", "0"),))] == 1
    assert got[("numaserve_router_up", (("shard", "1"),))] == 0
    assert not any(
        labels and ("shard", "1") in labels for _, labels in got if _ != "numaserve_router_up"
    )


def test_numastat_counters_are_per_node():
    readings = Readings(numastat={0: {"numa_hit": 10, "numa_miss": 1}, 1: {"numa_hit": 7}})
    got = samples(snapshot(), readings)
    assert got[("numaserve_numastat_numa_hit_pages_total", (("node", "1"),))] == 7
    assert got[("numaserve_numastat_numa_miss_pages_total", (("node", "0"),))] == 1
    assert ("numaserve_numastat_numa_miss_pages_total", (("node", "1"),)) not in got


def test_process_memory_covers_the_supervisor_router_and_instances():
    got = samples(snapshot(), Readings(rss={3999: 1, 4000: 2, 4242: 3}))
    rss = "numaserve_process_resident_memory_bytes"
    assert got[(rss, (("kind", "supervisor"), ("process", "supervisor")))] == 1
    assert got[(rss, (("kind", "router"), ("process", "router")))] == 2
    assert got[(rss, (("kind", "worker"), ("process", "short-0")))] == 3


# -- numastat -------------------------------------------------------------------------------


def test_numastat_is_read_per_node_and_a_broken_node_file_is_left_out(tmp_path):
    nodes = tmp_path / "devices/system/node"
    (nodes / "node0").mkdir(parents=True)
    (nodes / "node0/numastat").write_text("numa_hit 5\nnuma_miss 2\nodd line\nlocal_node x\n")
    (nodes / "node1").mkdir()  # no numastat file: offline firmware, say
    (nodes / "node1/numastat").mkdir()  # a directory where the file should be: unreadable
    (nodes / "possible").write_text("0-1\n")
    assert read_numastat(tmp_path) == {0: {"numa_hit": 5, "numa_miss": 2}}


def test_numastat_of_this_machine_has_every_counter():
    stats = read_numastat()
    assert stats and all(set(c) >= {"numa_hit", "numa_miss", "other_node"} for c in stats.values())


# -- the probes -----------------------------------------------------------------------------


def test_alive_and_ready_when_all_answer():
    assert health.alive(snapshot(long_0="ready"), 101.0) == []
    assert health.ready(snapshot(long_0="ready"), 101.0) == []


def test_not_ready_from_the_moment_the_supervisor_sees_a_pools_only_instance_exit():
    # The shard still routes to it: its heartbeats have not expired yet.
    assert health.ready(snapshot(long_0="backoff"), 100.0) == ["pool long has no ready instance"]


def test_not_alive_before_the_first_snapshot_or_when_the_loop_stops_turning():
    assert health.alive(None, 0.0) == ["the supervisor has not finished starting"]
    assert health.alive(snapshot(taken=100.0), 106.0) == [
        "the supervisor's loop has not turned for 6.0 s"
    ]


def test_not_alive_while_a_shard_is_silent():
    snap = snapshot(shards=(shard_status(), shard_status(), None), ages=(0.1, 9.0, None))
    assert health.alive(snap, 100.0) == [
        "router shard 1 has not answered for 9.0 s",
        "router shard 2 has not answered the supervisor yet",
    ]


def test_not_ready_while_a_pool_has_no_ready_instance_in_any_shard():
    one = snapshot(shards=(shard_status(ready=0),), long_0="ready")
    assert health.ready(one, 100.0) == ["pool short has no ready instance"]
    two = snapshot(
        shards=(shard_status(ready=0), shard_status(ready=1)), ages=(0, 0), long_0="ready"
    )
    assert health.ready(two, 100.0) == []


def test_not_ready_while_stopping_though_still_alive():
    snap = snapshot(stopping=True, long_0="ready")
    assert health.alive(snap, 100.0) == []
    assert health.ready(snap, 100.0) == ["the server is stopping"]


# -- the HTTP endpoint ----------------------------------------------------------------------


@pytest.fixture
def endpoint():
    e = MonitoringEndpoint("127.0.0.1:0")
    e.start()
    yield e
    e.close()


def get(endpoint: MonitoringEndpoint, path: str) -> tuple[int, str, str]:
    return http_get(f"http://127.0.0.1:{endpoint.port}{path}")


def test_metrics_are_served_in_prometheus_text_format(endpoint):
    endpoint.publish(snapshot())
    status, content_type, text = get(endpoint, "/metrics")
    assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {
        "numaserve_requests",
        "numaserve_request_duration_seconds",
        "numaserve_build_info",
    } <= names


def test_probes_answer_503_with_the_reason_until_the_server_is_up(endpoint):
    assert get(endpoint, "/healthz")[::2] == (503, "the supervisor has not finished starting\n")
    endpoint.publish(snapshot(shards=(shard_status(ready=0),), taken=float("inf"), long_0="ready"))
    assert get(endpoint, "/healthz")[::2] == (200, "ok\n")
    assert get(endpoint, "/readyz")[::2] == (503, "pool short has no ready instance\n")


def test_other_paths_are_not_found(endpoint):
    assert get(endpoint, "/")[0] == 404
    assert get(endpoint, "/metrics/../etc/passwd")[0] == 404


def test_metrics_before_the_first_snapshot_are_empty_not_an_error(endpoint):
    assert get(endpoint, "/metrics")[:1] == (200,)


def test_a_broken_snapshot_answers_500_and_the_endpoint_goes_on(endpoint):
    endpoint.publish(snapshot(shards=(replace(shard_status(), pools=("not a pool",)),)))
    status, _, text = get(endpoint, "/metrics")
    assert status == 500 and "rendering the metrics failed" in text
    endpoint.publish(snapshot())
    assert get(endpoint, "/metrics")[0] == 200


def test_a_taken_port_is_a_clear_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(MonitoringError, match=f"cannot listen on 127.0.0.1:{port}: Address"):
            MonitoringEndpoint(f"127.0.0.1:{port}")


def test_each_routed_instance_says_what_it_runs_and_who_chose_it():
    path = RunningPath(PoolPath(ModelPath("openvino", "bf16"), "the fastest"), chosen_by="auto")
    status = replace(
        shard_status(),
        routing=(
            routing("short-0", 10, model_path=path),
            routing("long-0", 11, routed=False, model_path=path),  # stopping: not routed
        ),
    )
    got = samples(snapshot(shards=(status,), ages=(0.1,)))
    labels = (
        ("accuracy", ""),
        ("backend", "openvino"),
        ("chosen_by", "auto"),
        ("from_batch", "1"),
        ("instance", "short-0"),
        ("keep_fp32", ""),
        ("last_tokens", ""),
        DEFAULT,
        ("quantize", "bf16"),
    )
    assert got[("numaserve_instance_model_path_info", labels)] == 1
    assert [k for k in got if k[0] == "numaserve_instance_model_path_info"] == [
        ("numaserve_instance_model_path_info", labels)
    ]


def test_every_path_an_instance_holds_has_its_series_with_its_accuracy_and_passes():
    switch = BatchedPath(4, ModelPath("openvino", "bf16"), "8 a batch: 1.47x", "9-16: 100%")
    shorter = BandPath(
        16, ModelPath("ctranslate2", "int16"), "one at a time", switch, accuracy="1-8: 99.9%"
    )
    own = PoolPath(ModelPath("ctranslate2", "int8"), "", (shorter,), accuracy="17-64: 99%")
    path = RunningPath(own, chosen_by="auto")
    counted = {"ctranslate2 int16": 7, "openvino bf16": 3, "ctranslate2 int8": 5}
    status = replace(
        shard_status(), routing=(routing("main-0", 10, model_path=path, passes=counted),)
    )
    got = samples(snapshot(shards=(status,), ages=(0.1,)))
    paths = sorted(
        tuple(dict(k[1])[label] for label in ("last_tokens", "from_batch", "quantize", "accuracy"))
        for k in got
        if k[0] == "numaserve_instance_model_path_info"
    )
    assert paths == [
        ("", "1", "int8", "17-64: 99%"),
        ("16", "1", "int16", "1-8: 99.9%"),
        ("16", "4", "bf16", "9-16: 100%"),
    ]
    passes = {
        dict(k[1])["path"]: v
        for k, v in got.items()
        if k[0] == "numaserve_instance_model_passes_total"
    }
    assert passes == counted


def test_each_routed_instance_says_what_binds_its_memory():
    status = replace(
        shard_status(),
        routing=(
            routing("main-0", 10, membind="cpuset"),
            routing("main-1", 11, routed=False, membind="cpuset"),  # stopping: not routed
        ),
    )
    got = samples(snapshot(shards=(status,), ages=(0.1,)))
    labels = (("bound_by", "cpuset"), ("instance", "main-0"), DEFAULT)
    assert [k for k in got if k[0] == "numaserve_instance_memory_binding_info"] == [
        ("numaserve_instance_memory_binding_info", labels)
    ]


def test_each_nodes_shared_weights_show_their_bytes_and_the_ready_instances_mapping_them():
    weights = [{"file": "/c/node1/model.onnx.data", "bytes": 474_000_000, "node": 1}]
    status = replace(
        shard_status(),
        routing=(
            routing("short-0", 10, weights=weights),
            routing("short-1", 11, weights=weights),
            routing("long-0", 12, routed=False, weights=weights),  # stopping: not counted
        ),
    )
    got = samples(snapshot(shards=(status,), ages=(0.1,)))
    labels = (("file", "/c/node1/model.onnx.data"), DEFAULT, ("node", "1"))
    assert got[("numaserve_weights_bytes", labels)] == 474_000_000
    assert got[("numaserve_weights_instances", labels)] == 2


def test_each_fronts_grpc_calls_are_counted_by_method_and_status_code():
    stats = Stats(index=1)
    stats.count_grpc("/tei.v1.Embed/Embed", "OK", 0.002)
    stats.count_grpc("/tei.v1.Embed/Embed", "OK", 0.003)
    stats.count_grpc("/tei.v1.Embed/Embed", "INVALID_ARGUMENT", 0.001)
    got = samples(snapshot(), Readings(fronts=(stats.to_json(),)))
    method = ("method", "/tei.v1.Embed/Embed")
    assert got["numaserve_grpc_requests_total", (("code", "OK"), ("front", "1"), method)] == 2
    assert (
        got["numaserve_grpc_requests_total", (("code", "INVALID_ARGUMENT"), ("front", "1"), method)]
        == 1
    )
    assert got["numaserve_grpc_request_duration_seconds_count", (("front", "1"), method)] == 3
