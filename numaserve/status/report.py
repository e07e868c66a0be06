"""A shard's status report and the whole server's, as typed records, each with one wire form.

A router shard builds its `Report` (router/status.py) and sends `to_wire()`: to the supervisor
with each answer to its slot table, and to a client that asks `status`. The supervisor reads
each shard's answer back with `from_wire` (a malformed one raises `BadReport`), merges them
(merge.py) and hands them to /metrics and the probes (monitoring/); `numaserve status` formats
one (format.py). The wire form is the protocol's `status` answer, unchanged for clients:
records of a supervised server carry the supervisor's fields of each slot, which an instance
run without one (testing/cluster.py) has not, and leave out what they do not have.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from numaserve.wire import protocol


class BadReport(ValueError):
    """A status that does not have a report's shape (a shard of another version, a bug)."""


def _known(cls, body: Any) -> dict:
    if not isinstance(body, dict):
        raise BadReport(f"{cls.__name__}: expected an object, got {type(body).__name__}")
    return {f.name: body[f.name] for f in fields(cls) if f.name in body}


def _build(cls, body: Any, **typed):
    try:
        return cls(**(_known(cls, body) | typed))
    except TypeError as e:  # a required field missing
        raise BadReport(f"{cls.__name__}: {e}") from None


class _Plain:
    """A record whose wire form is its fields, as they are."""

    def to_wire(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_wire(cls, body: dict):
        return _build(cls, body)


@dataclass(frozen=True)
class Pool(_Plain):
    """One pool of a shard (or, merged, of the whole server): its length band and load."""

    name: str
    model_name: str | None
    max_tokens: int
    queue: int
    ready: int


@dataclass(frozen=True)
class Cache(_Plain):
    entries: int
    capacity: int
    hits: int
    misses: int
    hit_rate: float


# A slot's fields that only the supervisor's slot table has; absent where none runs.
SUPERVISED = ("model_name", "shard", "restarts", "last_exit")
# What a shard knows of an instance that the supervisor's slot table does not.
ROUTER_SIDE = (
    "routed",
    "threads",
    "membind",
    "model_path",
    "weights",
    "busy",
    "served",
    "live_cpus",
    "affinity_ok",
)


@dataclass(frozen=True)
class Instance:
    """One slot of the plan (or, with no supervisor, one instance the router knows), with what
    the shard that routes to it sees of its process."""

    name: str
    pool: str | None
    state: str
    pid: int | None
    cpus: list[int] | None
    nodes: list[int] | None
    # The supervisor's (SUPERVISED): None where none runs.
    model_name: str | None = None
    shard: int | None = None
    restarts: int | None = None
    last_exit: str | None = None
    # The routing shard's (ROUTER_SIDE).
    routed: bool = False
    threads: int | None = None
    membind: str | None = None
    model_path: dict | None = None  # processes/prepared.py's ModelPath, as the worker said it
    # The weights files it maps, shared with the instances that map them
    # (backends/node_weights.py's Weights, as the worker said them); empty: its own copy.
    weights: list[dict] | None = None
    busy: int = 0
    served: int = 0
    live_cpus: list[int] | None = None
    affinity_ok: bool | None = None

    def as_routed(self, routing: Instance | None) -> Instance:
        """This slot as one shard's table has it, with what the shard that routes to it sees
        of that same process."""
        if routing is None or routing.pid != self.pid:
            return self
        return replace(self, **{k: getattr(routing, k) for k in ROUTER_SIDE})

    def to_wire(self) -> dict:
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in SUPERVISED or getattr(self, f.name) is not None
        }

    @classmethod
    def from_wire(cls, body: dict) -> Instance:
        return _build(cls, body)


@dataclass(frozen=True)
class Front(_Plain):
    """An HTTP front, as the supervisor's slot table lists it."""

    name: str
    state: str
    pid: int | None
    cpus: list[int]


@dataclass(frozen=True)
class SupervisorInfo:
    """What the supervisor's latest slot table says of itself: its pid and identity (so that
    `numaserve stop` signals it and no other process), the server's state line, its HTTP
    fronts, and the table's sequence number."""

    pid: int | None = None
    boot_id: str | None = None
    started: int | None = None
    state: str | None = None
    http: tuple[Front, ...] = ()
    seq: int | None = None

    def to_wire(self) -> dict:
        body = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "http"}
        body["http"] = [front.to_wire() for front in self.http]
        return {k: v for k, v in body.items() if v is not None}

    @classmethod
    def from_wire(cls, body: dict) -> SupervisorInfo | None:
        """None for an empty one: a shard that has no slot table yet."""
        if not body:
            return None
        fronts = tuple(Front.from_wire(f) for f in body.get("http") or ())
        return _build(cls, body, http=fronts)


@dataclass(frozen=True)
class ShardLine:
    """One shard, in the whole server's status."""

    shard: int
    model_name: str | None
    cpus: list[int] | None
    instances: int  # how many the merged table says it routes to
    requests: dict[str, int]
    pools: tuple[Pool, ...]
    cache: Cache
    draining: bool
    metrics: dict | None  # router/metrics.py's wire form

    def to_wire(self) -> dict:
        body = {f.name: getattr(self, f.name) for f in fields(self)}
        return body | {"pools": [p.to_wire() for p in self.pools], "cache": self.cache.to_wire()}

    @classmethod
    def from_wire(cls, body: dict) -> ShardLine:
        pools = tuple(Pool.from_wire(p) for p in body.get("pools") or ())
        return _build(cls, body, pools=pools, cache=Cache.from_wire(body.get("cache")))


@dataclass(frozen=True)
class Report:
    """A shard's status, or the whole server's (merge.py), which has `shards`, one line per
    shard, and no `metrics` of its own (each shard's line has its)."""

    task: str
    model_name: str | None
    shard: int
    cpus: list[int]
    model: str
    instances: tuple[Instance, ...]
    pools: tuple[Pool, ...]
    cache: Cache
    requests: dict[str, int]  # counters by name: the RequestBook's and the connections'
    errors: dict[str, int]  # by error code
    draining: bool
    routed_pids: tuple[int, ...]  # the instances the shard hears from and sends work to
    supervisor: SupervisorInfo | None = None  # none: no slot table yet, or none runs
    metrics: dict | None = None  # router/metrics.py's wire form; a shard's own report only
    shards: tuple[ShardLine, ...] | None = None  # the whole server's only

    def to_wire(self) -> dict:
        body: dict = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("metrics", "shards", "supervisor")
        }
        body |= {
            "instances": [i.to_wire() for i in self.instances],
            "pools": [p.to_wire() for p in self.pools],
            "cache": self.cache.to_wire(),
            "routed_pids": list(self.routed_pids),
            "supervisor": self.supervisor.to_wire() if self.supervisor else {},
        }
        if self.shards is None:
            body["metrics"] = self.metrics
        else:
            body["shards"] = [s.to_wire() for s in self.shards]
        return body

    @classmethod
    def from_wire(cls, body: Any) -> Report:
        """Raises BadReport for anything but a report's shape."""
        try:
            shards = body.get("shards")
            return _build(
                cls,
                body,
                instances=tuple(Instance.from_wire(i) for i in body["instances"]),
                pools=tuple(Pool.from_wire(p) for p in body["pools"]),
                cache=Cache.from_wire(body["cache"]),
                routed_pids=tuple(body["routed_pids"]),
                supervisor=SupervisorInfo.from_wire(body.get("supervisor") or {}),
                shards=None if shards is None else tuple(ShardLine.from_wire(s) for s in shards),
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise BadReport(f"not a status report: {e!r}") from None


@dataclass(frozen=True)
class SlotTable:
    """The supervisor's slot table, which it sends every shard on a timer and on each change of
    state: what it says of itself, every slot of its plan (each with its live affinity, read by
    the supervisor so that no shard reads /proc in its loop), and each shard's state (a peer
    that is not ready takes no handed-over request)."""

    supervisor: SupervisorInfo
    slots: tuple[Instance, ...]
    routers: tuple[tuple[int, str], ...]  # (shard, state)
    # Whether the shard answers with its whole Report, or only with what liveness needs (the
    # instances it routes to): the supervisor asks for the report once a second, not with every
    # table (four a second, and one on each change of state).
    report: bool = True

    def to_wire(self) -> dict:
        return {
            "type": protocol.SUPERVISOR,
            **self.supervisor.to_wire(),
            "slots": [slot.to_wire() for slot in self.slots],
            "routers": [{"shard": shard, "state": state} for shard, state in self.routers],
            "report": self.report,
        }

    @classmethod
    def from_wire(cls, body: Any) -> SlotTable:
        """Raises BadReport for anything but a slot table's shape."""
        try:
            told = {
                k: v for k, v in body.items() if k not in ("type", "slots", "routers", "report")
            }
            return cls(
                supervisor=SupervisorInfo.from_wire(told) or SupervisorInfo(),
                slots=tuple(Instance.from_wire(s) for s in body["slots"]),
                routers=tuple((r["shard"], r["state"]) for r in body["routers"]),
                report=bool(body.get("report", True)),
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise BadReport(f"not a slot table: {e!r}") from None
