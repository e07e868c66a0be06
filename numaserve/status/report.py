"""What status is made of, as typed records, each with one wire form, each with one owner.

- The supervisor's `SlotTable` (its `SupervisorInfo` and a `SlotEntry` per slot of its plan)
  goes to every shard, on a timer and on each change of state.
- A shard's `ShardReport` (router/status.py) goes back to the supervisor once a second: its
  pools, cache, counters, metrics, and a `Routing` per process it has heard from. /metrics
  and the probes read these (monitoring/).
- The whole server's `ServerReport` is the `status` op's answer, over the endpoint and the
  control socket alike: the slots joined with the shards' routing and summed over the shards
  (merge.py, the one place they are joined); `numaserve status` formats one (format.py).

`from_wire` refuses a malformed one with `BadReport`. Records of a supervised server carry
the supervisor's fields of each slot, which an instance run without one (testing/cluster.py)
has not, and leave out what they do not have.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from numaserve.config.paths import PoolPath
from numaserve.config.schema import ConfigError, from_mapping
from numaserve.host.cpuset import Binding, CPUSet
from numaserve.wire import protocol


class BadReport(ValueError):
    """A status that does not have a report's shape (a shard of another version, a bug)."""


def _known(cls, body: Any) -> dict:
    if not isinstance(body, dict):
        raise BadReport(f"{cls.__name__}: expected an object, got {type(body).__name__}")
    return {f.name: body[f.name] for f in fields(cls) if f.name in body}


def _plain(value: Any) -> Any:
    """A field's wire form: a set of CPUs or nodes as its list."""
    return value.to_plain() if isinstance(value, CPUSet | Binding) else value


def _fields(record: Any, leave_out: tuple[str, ...] = ()) -> dict:
    """A record's fields as its wire form holds them, but for `leave_out`."""
    return {
        f.name: _plain(getattr(record, f.name)) for f in fields(record) if f.name not in leave_out
    }


def _cpus(body: dict, key: str = "cpus") -> CPUSet | None:
    """A wire list of CPUs or nodes back as a set; None where it is absent or null."""
    value = body.get(key)
    try:
        return None if value is None else CPUSet.from_plain(value)
    except ValueError as e:
        raise BadReport(f"{key}: {e}") from None


def _build(cls, body: Any, **typed):
    try:
        return cls(**(_known(cls, body) | typed))
    except TypeError as e:  # a required field missing
        raise BadReport(f"{cls.__name__}: {e}") from None


class _Plain:
    """A record whose wire form is its fields, as they are."""

    def to_wire(self) -> dict:
        return _fields(self)

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


@dataclass(frozen=True)
class RunningPath:
    """What an instance says it runs (its READY, worker.py), as status and /metrics show it:
    its pool's paths, the one record prepare wrote and `auto` chose (config/paths.py), and
    who chose them (`auto`, and why, or the config). On the wire: the record's own form,
    with `chosen_by`."""

    runs: PoolPath
    chosen_by: str  # auto or config

    def to_wire(self) -> dict:
        return self.runs.to_json() | {"chosen_by": self.chosen_by}

    @classmethod
    def from_wire(cls, body: Any) -> RunningPath:
        try:
            return cls(PoolPath.from_json(body), body["chosen_by"])
        except (KeyError, TypeError, AttributeError) as e:
            raise BadReport(f"not a model path: {e!r}") from None


@dataclass(frozen=True)
class Ready:
    """What an instance says of itself once it can take work (its READY, worker.py): read and
    checked once, where its shard hears it; a READY of another shape is refused there, said
    in the shard's log. A path of another version's shape reads as none (status shows no
    path rather than failing)."""

    name: str
    pool: str
    pid: int
    binding: Binding = Binding()
    membind: str | None = None
    threads: int | None = None
    max_tokens: int | None = None
    model_key: str | None = None  # what its answers are cached under (specs.model_key)
    load_seconds: float | None = None
    task: str | None = None
    max_length: int | None = None
    model_path: RunningPath | None = None
    weights: list[dict] | None = None  # node_weights.Weights, as it said them
    labels: tuple[str, ...] = ()  # a classifier's or tagger's, in its output's order
    dim: int | None = None  # an embedding's width

    def to_wire(self) -> dict:
        return _fields(self) | {
            "type": protocol.READY,
            "labels": list(self.labels),
            "model_path": self.model_path and self.model_path.to_wire(),
        }

    @classmethod
    def from_wire(cls, body: Any) -> Ready:
        if not isinstance(body, dict):
            raise BadReport("READY: not an object")
        for key, kind in _READY_FIELDS.items():
            value = body.get(key)
            if (value is None and key not in _READY_REQUIRED) or _is(value, kind):
                continue
            raise BadReport(f"READY: {key} is {value!r}")
        path = body.get("model_path")
        try:
            running = RunningPath.from_wire(path) if path else None
        except BadReport:
            running = None
        try:  # the specs' own reading of a binding: both keys lists of numbers, no other key
            binding = from_mapping(Binding, body.get("binding") or {}, "READY", "binding")
        except ConfigError as e:
            raise BadReport(str(e)) from None
        return _build(
            cls,
            body,
            binding=binding,
            labels=tuple(body.get("labels") or ()),
            model_path=running,
        )


_READY_REQUIRED = ("name", "pool", "pid")
_READY_FIELDS: dict[str, Any] = {
    "name": str,
    "pool": str,
    "pid": int,
    "binding": dict,
    "membind": str,
    "threads": int,
    "max_tokens": int,
    "model_key": str,
    "load_seconds": float,
    "task": str,
    "max_length": int,
    "weights": [dict],
    "labels": [str],
    "dim": int,
}


def _is(value: Any, kind: Any) -> bool:
    """Whether a wire value has a field's kind: a type (int is no bool; a float may be an
    int), or [type], a list of them."""
    if isinstance(kind, list):
        return isinstance(value, list) and all(_is(v, kind[0]) for v in value)
    if kind is float:
        return type(value) in (int, float)
    return type(value) is kind


# A slot's fields that only the supervisor's slot table has; absent where none runs.
SUPERVISED = ("model_name", "shard", "restarts", "last_exit")


@dataclass(frozen=True)
class SlotEntry:
    """One slot of the supervisor's plan, as its slot table says it (or, with no supervisor,
    one instance a shard knows, from its READY), with its live affinity as its owner read it:
    the supervisor, so that no shard reads /proc in its loop."""

    name: str
    pool: str | None
    state: str
    pid: int | None
    binding: Binding  # where it was placed; on the wire, as `cpus` and `nodes`
    # The supervisor's (SUPERVISED): None where none runs.
    model_name: str | None = None
    shard: int | None = None
    restarts: int | None = None
    last_exit: str | None = None
    live_cpus: CPUSet | None = None  # None: not read (no process, or it is gone)

    @property
    def affinity_ok(self) -> bool | None:
        """Whether the kernel lets it run where it was placed; None: not read."""
        return None if self.live_cpus is None else self.live_cpus == self.binding.cpus

    def to_wire(self) -> dict:
        unsupervised = tuple(k for k in SUPERVISED if getattr(self, k) is None)
        return _fields(self, ("binding", *unsupervised)) | self.binding.to_plain()

    @classmethod
    def from_wire(cls, body: dict) -> SlotEntry:
        binding = Binding(_cpus(body) or CPUSet(), _cpus(body, "nodes") or CPUSet())
        return _build(cls, body, binding=binding, live_cpus=_cpus(body, "live_cpus"))


@dataclass(frozen=True)
class Routing:
    """What the shard that routes to an instance's process knows of it: what its READY said
    (threads, memory binding, model path, the weights files it maps) and its counts."""

    name: str
    pid: int
    routed: bool  # the shard sends it work (it is not stopping)
    threads: int | None = None
    membind: str | None = None
    model_path: RunningPath | None = None
    # The weights files it maps, shared with the instances that map them
    # (backends/node_weights.py's Weights, as the worker said them); empty: its own copy.
    weights: list[dict] | None = None
    busy: int = 0
    served: int = 0
    # The forward passes each of its model paths ran, by path, where it holds more than one.
    passes: dict[str, int] | None = None
    labels: list[str] | None = None  # a classifier's label names, in its output's order

    def to_wire(self) -> dict:
        body = _fields(self)
        return body | {"model_path": self.model_path and self.model_path.to_wire()}

    @classmethod
    def from_wire(cls, body: dict) -> Routing:
        path = body.get("model_path")
        return _build(cls, body, model_path=path and RunningPath.from_wire(path))


# An instance's fields in a status answer that its routing shard's view gives, and each one's
# value where no shard routes to it.
ROUTED = {
    "routed": False,
    "threads": None,
    "membind": None,
    "model_path": None,
    "weights": None,
    "busy": 0,
    "served": 0,
    "passes": None,
    "labels": None,
}


@dataclass(frozen=True)
class Instance:
    """One instance in the whole server's status: its slot, joined (status/merge.py, the one
    place) with what the shard that routes to its process sees of it; no routing: no shard
    has heard from that process."""

    slot: SlotEntry
    routing: Routing | None = None

    @property
    def routed(self) -> bool:
        return self.routing is not None and self.routing.routed

    def to_wire(self) -> dict:
        """One flat entry, as the protocol's status answer lists it."""
        routing = self.routing.to_wire() if self.routing else ROUTED
        seen = {key: routing[key] for key in ROUTED}
        return self.slot.to_wire() | seen | {"affinity_ok": self.slot.affinity_ok}

    @classmethod
    def from_wire(cls, body: dict) -> Instance:
        slot = SlotEntry.from_wire(body)
        if all(body.get(key, none) == none for key, none in ROUTED.items()):
            return cls(slot)  # written with no routing (or one that says nothing)
        return cls(slot, Routing.from_wire(body | {"name": slot.name, "pid": slot.pid}))


@dataclass(frozen=True)
class Front(_Plain):
    """A front (HTTP and gRPC), as the supervisor's slot table lists it."""

    name: str
    state: str
    pid: int | None
    cpus: CPUSet

    @classmethod
    def from_wire(cls, body: dict) -> Front:
        return _build(cls, body, cpus=_cpus(body) or CPUSet())


@dataclass(frozen=True)
class SupervisorInfo:
    """What the supervisor's latest slot table says of itself: its pid and identity (so that
    `numaserve stop` signals it and no other process), the server's state line, its
    fronts, and the table's sequence number."""

    pid: int | None = None
    boot_id: str | None = None
    started: int | None = None
    state: str | None = None
    fronts: tuple[Front, ...] = ()
    seq: int | None = None

    def to_wire(self) -> dict:
        body = _fields(self, ("fronts",))
        body["fronts"] = [front.to_wire() for front in self.fronts]
        return {k: v for k, v in body.items() if v is not None}

    @classmethod
    def from_wire(cls, body: dict) -> SupervisorInfo | None:
        """None for an empty one: a shard that has no slot table yet."""
        if not body:
            return None
        fronts = tuple(Front.from_wire(f) for f in body.get("fronts") or ())
        return _build(cls, body, fronts=fronts)


@dataclass(frozen=True)
class ShardLine:
    """One shard, in the whole server's status."""

    shard: int
    model_name: str | None
    cpus: CPUSet | None
    instances: int  # how many the merged table says it routes to
    requests: dict[str, int]
    pools: tuple[Pool, ...]
    cache: Cache
    draining: bool
    metrics: dict | None  # router/metrics.py's wire form

    def to_wire(self) -> dict:
        body = _fields(self)
        return body | {"pools": [p.to_wire() for p in self.pools], "cache": self.cache.to_wire()}

    @classmethod
    def from_wire(cls, body: dict) -> ShardLine:
        pools = tuple(Pool.from_wire(p) for p in body.get("pools") or ())
        cache = Cache.from_wire(body.get("cache"))
        return _build(cls, body, pools=pools, cache=cache, cpus=_cpus(body))


@dataclass(frozen=True)
class ShardReport:
    """One router shard's report of itself, to the supervisor: its pools, cache, counters and
    metrics, and what it knows of the instances it routes to (`routing`). The slots are the
    supervisor's: it joins the two (status/merge.py)."""

    task: str
    model_name: str | None
    shard: int
    cpus: CPUSet
    model: str
    routing: tuple[Routing, ...]  # the processes it has heard READY from, by name
    pools: tuple[Pool, ...]
    cache: Cache
    requests: dict[str, int]  # counters by name: the RequestBook's and the connections'
    errors: dict[str, int]  # by error code
    draining: bool
    routed_pids: tuple[int, ...]  # the instances the shard hears from and sends work to
    metrics: dict | None  # router/metrics.py's wire form

    def to_wire(self) -> dict:
        body: dict = _fields(self)
        return body | _counts_to_wire(self) | {"routing": [r.to_wire() for r in self.routing]}

    @classmethod
    def from_wire(cls, body: Any) -> ShardReport:
        """Raises BadReport for anything but a shard report's shape."""
        try:
            routing = tuple(Routing.from_wire(r) for r in body["routing"])
            cpus = _cpus(body) or CPUSet()
            return _build(cls, body, **_counts_from_wire(body), routing=routing, cpus=cpus)
        except (KeyError, TypeError, AttributeError) as e:
            raise BadReport(f"not a shard's report: {e!r}") from None


@dataclass(frozen=True)
class ServerReport:
    """The whole server's status, the `status` op's answer (over the endpoint or the control
    socket alike): every slot joined with its routing shard's view, the pools, cache and
    counters summed over the shards, and one line per shard. `task`, `model_name` and `model`
    are the first shard's (its model's, where a `models:` config serves several)."""

    task: str
    model_name: str | None
    model: str
    instances: tuple[Instance, ...]
    pools: tuple[Pool, ...]
    cache: Cache
    requests: dict[str, int]
    errors: dict[str, int]
    draining: bool
    routed_pids: tuple[int, ...]
    shards: tuple[ShardLine, ...]
    supervisor: SupervisorInfo | None = None  # none: no slot table yet, or none runs

    def to_wire(self) -> dict:
        body: dict = _fields(self)
        return (
            body
            | _counts_to_wire(self)
            | {
                "instances": [i.to_wire() for i in self.instances],
                "shards": [s.to_wire() for s in self.shards],
                "supervisor": self.supervisor.to_wire() if self.supervisor else {},
            }
        )

    @classmethod
    def from_wire(cls, body: Any) -> ServerReport:
        """Raises BadReport for anything but a status answer's shape."""
        try:
            return _build(
                cls,
                body,
                **_counts_from_wire(body),
                instances=tuple(Instance.from_wire(i) for i in body["instances"]),
                shards=tuple(ShardLine.from_wire(s) for s in body["shards"]),
                supervisor=SupervisorInfo.from_wire(body.get("supervisor") or {}),
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise BadReport(f"not a status report: {e!r}") from None


def _counts_to_wire(report: ShardReport | ServerReport) -> dict:
    """The records a shard's report and the server's both hold, in their wire form."""
    return {
        "pools": [p.to_wire() for p in report.pools],
        "cache": report.cache.to_wire(),
        "routed_pids": list(report.routed_pids),
    }


def _counts_from_wire(body: dict) -> dict:
    return {
        "pools": tuple(Pool.from_wire(p) for p in body["pools"]),
        "cache": Cache.from_wire(body["cache"]),
        "routed_pids": tuple(body["routed_pids"]),
    }


@dataclass(frozen=True)
class SlotTable:
    """The supervisor's slot table, which it sends every shard on a timer and on each change of
    state: what it says of itself, every slot of its plan (each with its live affinity, read by
    the supervisor so that no shard reads /proc in its loop), and each shard's state (a peer
    that is not ready takes no handed-over request)."""

    supervisor: SupervisorInfo
    slots: tuple[SlotEntry, ...]
    routers: tuple[tuple[int, str], ...]  # (shard, state)
    # Whether the shard answers with its whole report, or only with what liveness needs (the
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
                slots=tuple(SlotEntry.from_wire(s) for s in body["slots"]),
                routers=tuple((r["shard"], r["state"]) for r in body["routers"]),
                report=bool(body.get("report", True)),
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise BadReport(f"not a slot table: {e!r}") from None
