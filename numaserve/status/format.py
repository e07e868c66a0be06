"""`numaserve status` as a person reads it: a table of the instances, then the pools, the
model paths, memory binding, cache, errors, shards, HTTP fronts and the supervisor."""

from __future__ import annotations

from collections.abc import Iterable

from numaserve.config.paths import BatchedPath
from numaserve.host.pinning import BOUND_BY
from numaserve.status.report import Instance, ServerReport


def model_path_lines(instances: Iterable[Instance], several: bool) -> list[str]:
    """What runs each model (its instances agree unless a reload is under way), and why; and
    where its instances hold several paths, the forward passes each ran, summed over them."""
    seen: dict[tuple, list[str]] = {}
    passes: dict[tuple, dict[str, int]] = {}
    for i in instances:
        if i.routing and (running := i.routing.model_path):
            path = running.runs
            why = f"auto: {path.why}" if running.chosen_by == "auto" else "as configured"
            model = f" of {i.slot.model_name}" if several else ""
            lines = [f"model path{model}: {path.path} ({why})"]
            lines += _accuracy(path.accuracy, "  ")
            lines += _batched(path.batched, "  ")
            for s in path.shorter:
                lines.append(f"  texts of up to {s.last} tokens: {s.path} (auto: {s.why})")
                lines += _accuracy(s.accuracy, "    ")
                lines += _batched(s.batched, "    ")
            seen.setdefault((model, str(path.path)), lines)
            for name, count in (i.routing.passes or {}).items():
                summed = passes.setdefault((model, str(path.path)), {})
                summed[name] = summed.get(name, 0) + count
    for key, summed in passes.items():
        ran = ", ".join(f"{name} {count:,}" for name, count in summed.items())
        seen[key].append(f"  forward passes, every instance: {ran}")
    return [line for lines in seen.values() for line in lines]


def _batched(batched: BatchedPath | None, indent: str) -> list[str]:
    """A band's micro-batches' path, where it has one of its own."""
    if batched is None:
        return []
    return [
        f"{indent}micro-batches of {batched.from_batch} texts or more: {batched.path} "
        f"(auto: {batched.why})",
        *_accuracy(batched.accuracy, indent + "  "),
    ]


def _accuracy(figures: str | None, indent: str) -> list[str]:
    """A path's accuracy gate figures in each band of lengths it runs, where judged."""
    return [f"{indent}accuracy: {figures}"] if figures else []


def memory_lines(instances: Iterable[Instance]) -> list[str]:
    """How each instance's memory is bound to its node, instances alike on one line."""
    bound: dict[str, list[str]] = {}
    for i in instances:
        if i.routing and (method := i.routing.membind):
            bound.setdefault(BOUND_BY.get(method, method), []).append(i.slot.name)
    return [f"memory bound by {how}: {', '.join(names)}" for how, names in bound.items()]


def weights_lines(instances: Iterable[Instance]) -> list[str]:
    """Where the weights are: each shared file (one a NUMA node) with its size and how many
    instances map it, or that each instance holds its own."""
    shared: dict[tuple, list[str]] = {}
    own = []
    for i in instances:
        weights = i.routing.weights if i.routing else None
        if weights:
            for w in weights:
                shared.setdefault((w["node"], w["file"], w["bytes"]), []).append(i.slot.name)
        elif weights is not None:
            own.append(i.slot.name)
    lines = [
        f"weights on {'host' if node is None else f'node {node}'}: {size / 1e6:,.0f} MB, "
        f"one copy mapped by {len(names)} instance(s) ({file})"
        for (node, file, size), names in sorted(
            shared.items(), key=lambda e: (e[0][0] or 0, e[0][1])
        )
    ]
    if own:
        lines.append(f"weights in each instance's own memory: {', '.join(own)}")
    return lines


def _instance_rows(report: ServerReport, several: bool) -> list[tuple[str, ...]]:
    head = ("instance", *(("model",) * several), "pool", "state", "pid", "cpus", "node")
    rows = [(*head, "live affinity", "served", "restarts")]
    for i in report.instances:
        slot = i.slot
        if slot.live_cpus is None:
            affinity = "-"
        else:
            affinity = str(slot.live_cpus) + (
                " (as planned)" if slot.affinity_ok else " (NOT as planned)"
            )
        rows.append(
            (
                slot.name,
                *((str(slot.model_name),) * several),
                str(slot.pool),
                slot.state,
                str(slot.pid or "-"),
                str(slot.binding.cpus),
                str(slot.binding.nodes) or "-",
                affinity,
                str(i.routing.served if i.routing else 0),
                str(slot.restarts or 0),
            )
        )
    return rows


def format_status(report: ServerReport) -> str:
    """A table a person reads; with a model column, and each pool named for its model, where
    the server serves several."""
    several = len({p.model_name for p in report.pools}) > 1
    rows = _instance_rows(report, several)
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.append("")
    pools = ", ".join(
        f"{p.model_name + '.' if several else ''}{p.name} (<= {p.max_tokens} tokens): "
        f"{p.queue} queued, {p.ready} ready"
        for p in report.pools
    )
    lines.append(f"pools: {pools}")
    lines += model_path_lines(report.instances, several)
    lines += memory_lines(report.instances)
    lines += weights_lines(report.instances)
    cache = report.cache
    lines.append(
        f"cache: {cache.entries}/{cache.capacity} entries, hit rate {cache.hit_rate:.1%} "
        f"({cache.hits} hits, {cache.misses} misses)"
    )
    errors = ", ".join(f"{k} {v}" for k, v in sorted(report.errors.items())) or "none"
    lines.append(f"errors: {errors}")
    for shard in report.shards:
        model = f" of {shard.model_name}" if several else ""
        lines.append(
            f"router shard {shard.shard}{model} "
            f"(CPUs {shard.cpus or 'any'})"
            f": {shard.instances} instance(s), {shard.requests.get('requests', 0)} requests, "
            f"{shard.requests.get('replies_ok', 0)} answered ok"
            + (", draining" if shard.draining else "")
        )
    supervisor = report.supervisor
    for front in supervisor.fronts if supervisor else ():
        lines.append(
            f"front {front.name}: {front.state}, pid {front.pid or '-'}, CPUs {front.cpus or 'any'}"
        )
    if supervisor:
        lines.append(f"supervisor: pid {supervisor.pid}, {supervisor.state}")
    return "\n".join(lines)
