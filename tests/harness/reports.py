"""Status records built by hand (status/report.py's), for tests of what reads them: the merge,
the formatter, the exposition, the supervisor's fake shards. Every field a test does not name
has a plain default."""

from __future__ import annotations

from numaserve.host.cpuset import CPUSet
from numaserve.status.report import Cache, Instance, Pool, Routing, ShardReport, SlotEntry

NO_CACHE = Cache(entries=0, capacity=10, hits=0, misses=0, hit_rate=0.0)


def pool(name: str = "main", model_name: str = "default", **fields) -> Pool:
    return Pool(
        **{"name": name, "model_name": model_name, "max_tokens": 64, "queue": 0, "ready": 1}
        | fields
    )


def slot(name: str, **fields) -> SlotEntry:
    """A slot as its wire form says it (CPUs and nodes as lists)."""
    return SlotEntry.from_wire(
        {"name": name, "pool": "main", "state": "ready", "pid": None, "cpus": [], "nodes": []}
        | fields
    )


def routing(name: str, pid: int = 0, **fields) -> Routing:
    """A shard's view of a process that said READY: routed, with one thread, unless named."""
    return Routing(**{"name": name, "pid": pid, "routed": True, "threads": 1} | fields)


def instance(name: str, seen: dict | None = None, **fields) -> Instance:
    """A slot (`fields`) and, with `seen`, its routing shard's view (`seen`'s fields)."""
    at = slot(name, **fields)
    return Instance(at, None if seen is None else routing(name, at.pid or 0, **seen))


def report(shard: int = 0, routed: tuple[Routing, ...] = (), **fields) -> ShardReport:
    model = fields.get("model_name", "default")
    return ShardReport(
        **{
            "task": "embed",
            "model_name": model,
            "shard": shard,
            "cpus": CPUSet.of([shard]),
            "model": "bundled:minilm",
            "routing": tuple(routed),
            "pools": (pool(model_name=model),),
            "cache": NO_CACHE,
            "requests": {},
            "errors": {},
            "draining": False,
            "routed_pids": tuple(r.pid for r in routed if r.routed),
            "metrics": None,
        }
        | fields
    )
