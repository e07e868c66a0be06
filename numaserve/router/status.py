"""The server's status: what the router reports (instances, pools), and `numaserve status` as
a person reads it."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from numaserve.host.cpulist import format_cpulist
from numaserve.host.pinning import BOUND_BY, affinity_if_alive
from numaserve.router.dispatch import Dispatcher
from numaserve.wire import protocol

if TYPE_CHECKING:
    from numaserve.processes.specs import RouterSpec
    from numaserve.router.book import RequestBook
    from numaserve.router.connections import Connections
    from numaserve.router.metrics import RouterMetrics


def shard(
    spec: RouterSpec,
    dispatch: Dispatcher,
    book: RequestBook,
    metrics: RouterMetrics,
    connections: Connections,
    supervisor: dict,
) -> dict:
    """One shard's state, as its status answer carries it; where a supervisor runs, one
    instance entry per slot of its plan (its slot table)."""
    return {
        "task": spec.model.task,
        "model_name": spec.model_name,
        "shard": spec.shard,
        "cpus": list(spec.cpus),
        "model": spec.model.path,
        "instances": instances(dispatch, supervisor.get("slots")),
        "pools": pools(dispatch, spec.model_name),
        "cache": book.cache.stats(),
        "requests": {**book.counters, **connections.counts()},
        "errors": dict(book.errors),
        "metrics": metrics.wire(),
        "draining": book.draining_until is not None,
        "routed_pids": routed_pids(dispatch),
        "supervisor": {
            k: v for k, v in supervisor.items() if k not in ("type", "slots", "routers")
        },
    }


def instances(dispatch: Dispatcher, slots: list[dict] | None) -> list[dict]:
    """One entry per slot of the supervisor's plan (`slots`, each with its live affinity as the
    supervisor read it), or, with no supervisor, per instance the router knows; each with what
    the router sees of it and its live affinity."""
    live = {w.info.get("pid"): w for w in dispatch.workers.values()}
    supervised = slots is not None
    if slots is None:
        slots = [
            {
                "name": w.name,
                "pool": dispatch.pools[w.pool].config.name,
                "state": "draining" if w.stopping else "ready",
                "pid": w.info.get("pid"),
                "cpus": w.info.get("cpus"),
                "nodes": w.info.get("nodes"),
            }
            for w in dispatch.workers.values()
        ]
    entries = []
    for slot in sorted(slots, key=lambda s: s["name"]):
        worker = live.get(slot.get("pid"))
        # The supervisor reads it (its slot table's live_cpus), off this loop; a router run
        # without one reads it itself, for a status request.
        live_cpus = slot.get("live_cpus") if supervised else _live_affinity(slot.get("pid"))
        entries.append(
            {
                **slot,
                "routed": worker is not None and not worker.stopping,
                "threads": worker.info.get("threads") if worker else None,
                "membind": worker.info.get("membind") if worker else None,
                "model_path": worker.info.get("model_path") if worker else None,
                "busy": worker.jobs if worker else 0,
                "served": worker.served if worker else 0,
                "live_cpus": live_cpus,
                "affinity_ok": live_cpus == slot.get("cpus") if live_cpus is not None else None,
            }
        )
    return entries


def model_path_lines(instances: list[dict], several: bool) -> list[str]:
    """What runs each model (its instances agree unless a reload is under way), and why."""
    seen: dict[tuple, str] = {}
    for i in instances:
        if path := i.get("model_path"):
            keep = ",".join(path["keep_fp32"])
            what = f"{path['backend']} {path['quantize']}" + (f" keep_fp32 {keep}" if keep else "")
            why = f"auto: {path['why']}" if path["chosen_by"] == "auto" else "as configured"
            model = f" of {i.get('model_name')}" if several else ""
            seen.setdefault((model, what), f"model path{model}: {what} ({why})")
    return list(seen.values())


def memory_lines(instances: list[dict]) -> list[str]:
    """How each instance's memory is bound to its node, instances alike on one line."""
    bound: dict[str, list[str]] = {}
    for i in instances:
        if method := i.get("membind"):
            bound.setdefault(BOUND_BY.get(method, method), []).append(i["name"])
    return [f"memory bound by {how}: {', '.join(names)}" for how, names in bound.items()]


def pools(dispatch: Dispatcher, model_name: str) -> list[dict]:
    return [
        {
            "name": p.config.name,
            "model_name": model_name,
            "max_tokens": p.config.max_tokens,
            "queue": len(p.queue),
            "ready": sum(1 for w in dispatch.workers.values() if w.pool == i and not w.stopping),
        }
        for i, p in enumerate(dispatch.pools)
    ]


def routed_pids(dispatch: Dispatcher) -> list[int]:
    """The instances the router hears from and sends work to: the supervisor counts an
    instance ready once it appears here."""
    return sorted(w.info.get("pid") for w in dispatch.workers.values() if not w.stopping)


class WholeStatusQueries:
    """Status ops a shard among several has asked the supervisor to answer for the whole
    server (numaserve/status/merge.py): the shards never forward their statuses to each other.
    One the supervisor leaves unanswered is answered with the shard's own status."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.waiting: dict[int, tuple[list[bytes], object, float]] = {}
        self.tokens = itertools.count()

    def ask(self, envelope: list[bytes], request_id, own: dict, now: float) -> dict:
        """The question for the supervisor, with this shard's own status, fresh."""
        token = next(self.tokens)
        self.waiting[token] = (envelope, request_id, now + self.timeout_s)
        return {"type": protocol.WHOLE, "token": token, "server": own}

    def answered(self, body: dict) -> tuple[list[bytes], object, dict] | None:
        """(envelope, request id, the whole server's status) for the supervisor's answer."""
        token, whole = body.get("token"), body.get("server")
        if not isinstance(whole, dict) or not isinstance(token, int):
            return None
        asked = self.waiting.pop(token, None)
        return None if asked is None else (asked[0], asked[1], whole)

    def expired(self, now: float) -> list[tuple[list[bytes], object]]:
        late = [token for token, (_, _, expires) in self.waiting.items() if expires <= now]
        return [self.waiting.pop(token)[:2] for token in late]


def _live_affinity(pid) -> list[int] | None:
    """The CPUs the kernel lets `pid` run on now (the router shares the workers' host)."""
    cpus = affinity_if_alive(pid)
    return None if cpus is None else list(cpus)


def format_status(report: dict) -> str:
    """A table a person reads; with a model column, and each pool named for its model, where
    the server serves several."""
    several = len({p.get("model_name") for p in report["pools"]}) > 1
    head = ("instance", *(("model",) * several), "pool", "state", "pid", "cpus", "node")
    rows = [(*head, "live affinity", "served", "restarts")]
    for i in report["instances"]:
        live = i.get("live_cpus")
        if live is None:
            affinity = "-"
        else:
            affinity = format_cpulist(live) + (
                " (as planned)" if i.get("affinity_ok") else " (NOT as planned)"
            )
        nodes = i.get("nodes") or []
        rows.append(
            (
                i["name"],
                *((str(i.get("model_name")),) * several),
                str(i.get("pool")),
                i.get("state", "?"),
                str(i.get("pid") or "-"),
                format_cpulist(i.get("cpus") or []),
                format_cpulist(nodes) or "-",
                affinity,
                str(i.get("served", 0)),
                str(i.get("restarts", 0)),
            )
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.append("")
    pools = ", ".join(
        f"{p['model_name'] + '.' if several else ''}{p['name']} (<= {p['max_tokens']} tokens): "
        f"{p['queue']} queued, {p['ready']} ready"
        for p in report["pools"]
    )
    lines.append(f"pools: {pools}")
    lines += model_path_lines(report["instances"], several)
    lines += memory_lines(report["instances"])
    cache = report["cache"]
    lines.append(
        f"cache: {cache['entries']}/{cache['capacity']} entries, hit rate {cache['hit_rate']:.1%} "
        f"({cache['hits']} hits, {cache['misses']} misses)"
    )
    errors = ", ".join(f"{k} {v}" for k, v in sorted(report.get("errors", {}).items())) or "none"
    lines.append(f"errors: {errors}")
    for shard in report.get("shards", ()):
        requests = shard["requests"]
        model = f" of {shard.get('model_name')}" if several else ""
        lines.append(
            f"router shard {shard['shard']}{model} "
            f"(CPUs {format_cpulist(shard.get('cpus') or []) or 'any'})"
            f": {shard['instances']} instance(s), {requests.get('requests', 0)} requests, "
            f"{requests.get('replies_ok', 0)} answered ok"
            + (", draining" if shard.get("draining") else "")
        )
    supervisor = report.get("supervisor") or {}
    for front in supervisor.get("http") or ():
        lines.append(
            f"HTTP front {front.get('name')}: {front.get('state')}, pid {front.get('pid') or '-'}"
            f", CPUs {format_cpulist(front.get('cpus') or []) or 'any'}"
        )
    if supervisor:
        lines.append(f"supervisor: pid {supervisor.get('pid')}, {supervisor.get('state')}")
    return "\n".join(lines)
