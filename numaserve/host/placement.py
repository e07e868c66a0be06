"""The placement planner: topology + pools -> a Plan of slots. Pure: no OS calls, no processes.

A slot is whole physical cores of one type on one NUMA node. The rules, each checked by the
tests: no CPU or physical core in two slots; one thread per core unless `smt: true`; an
instance never mixes core types (a P-core waiting on E-cores runs at their pace) and spans
nodes only when no single node has room for it; reserved cores (the lowest-numbered of each
node in turn) are never placed; `auto` fills what is left, fastest type first, node by node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from numaserve.config.schema import AUTO, DEFAULT_MODEL, PlacementConfig, PoolConfig, ServedModel
from numaserve.host.cpuset import Binding, CPUSet
from numaserve.host.topology import Core, CPUTopology


class PlacementError(ValueError):
    pass


@dataclass(frozen=True)
class Slot:
    """Where one instance runs. It keeps these CPUs across restarts."""

    name: str
    pool: str
    binding: Binding  # its CPUs and the node(s) they are on
    threads: int
    model: str = DEFAULT_MODEL

    @property
    def cpus(self) -> CPUSet:
        return self.binding.cpus

    @property
    def node(self) -> int | None:
        """The node holding every CPU, or None for an instance too big for any one node."""
        return self.binding.node


@dataclass(frozen=True)
class Plan:
    slots: tuple[Slot, ...]
    reserved_cpus: CPUSet
    idle_cpus: CPUSet
    smt: bool

    @property
    def models(self) -> tuple[str, ...]:
        """The models the plan places, in config order."""
        return tuple(dict.fromkeys(s.model for s in self.slots))

    def for_model(self, model: str) -> Plan:
        """The instances of one model: what its router shards route to."""
        return dataclasses.replace(self, slots=tuple(s for s in self.slots if s.model == model))

    def pool_slots(self, pool: str) -> tuple[Slot, ...]:
        return tuple(s for s in self.slots if s.pool == pool)

    def to_json(self) -> dict:
        return {
            "instances": [
                {
                    "name": s.name,
                    "model": s.model,
                    "pool": s.pool,
                    "cpus": s.cpus.to_plain(),
                    "node": s.node,
                    "nodes": s.binding.nodes.to_plain(),
                    "threads": s.threads,
                }
                for s in self.slots
            ],
            "reserved_cpus": self.reserved_cpus.to_plain(),
            "idle_cpus": self.idle_cpus.to_plain(),
        }


class _FreeCores:
    """Free physical cores per node, lowest id first, so instances take neighbouring cores."""

    def __init__(self, cores: list[Core]):
        self.by_node: dict[int, list[Core]] = {}
        for core in sorted(cores, key=lambda c: c.id):
            self.by_node.setdefault(core.node, []).append(core)

    def total(self, kind: str | None = None) -> int:
        return sum(len(self.of(n, kind)) for n in self.by_node)

    def of(self, node: int, kind: str | None) -> list[Core]:
        return [c for c in self.by_node[node] if kind is None or c.type == kind]

    def describe(self) -> str:
        parts = [f"node {n}: {len(v)}" for n, v in sorted(self.by_node.items())]
        return ", ".join(parts) or "none"

    def take_from(self, node: int, count: int, kind: str) -> list[Core]:
        taken = self.of(node, kind)[:count]
        self.by_node[node] = [c for c in self.by_node[node] if c not in taken]
        return taken

    def take(self, count: int, kinds: tuple[str, ...]) -> list[Core] | None:
        """`count` cores of one type, the first of `kinds` that has them: from the roomiest
        node that has them all, else spread over the fewest nodes."""
        for kind in kinds:
            fitting = [n for n in self.by_node if len(self.of(n, kind)) >= count]
            if fitting:
                node = max(fitting, key=lambda n: (len(self.of(n, kind)), -n))
                return self.take_from(node, count, kind)
        for kind in kinds:
            if self.total(kind) < count:
                continue
            # Too big for any node: fill from the roomiest socket's nodes first.
            order = sorted(
                self.by_node,
                key=lambda n: (-self._socket_free(n, kind), -len(self.of(n, kind)), n),
            )
            taken: list[Core] = []
            for node in order:
                taken += self.take_from(node, count - len(taken), kind)
                if len(taken) == count:
                    return taken
        return None

    def _socket_free(self, node: int, kind: str) -> int:
        mine = self.of(node, kind)
        socket = mine[0].socket if mine else -1
        return sum(1 for n in self.by_node for c in self.of(n, kind) if c.socket == socket)


def plan_placement(
    topo: CPUTopology,
    placement: PlacementConfig,
    models: tuple[ServedModel, ...] = (),
    named: bool | None = None,
) -> Plan:
    """One plan over every model's pools (none: the one model of `placement.pools`), so that
    no core is in two instances of any model. `named` (a `models:` config's, Config.named;
    by default, whether `models` were given): each instance's name carries its model's."""
    demands = models or (ServedModel(name=DEFAULT_MODEL, pools=placement.pools),)
    several = bool(models) if named is None else named
    usable = [c for c in topo.cores if any(cpu in topo.allowed_cpus for cpu in c.cpus)]
    if not usable:
        raise PlacementError(
            f"no allowed CPUs to place on (allowed: {topo.allowed_cpus or 'none'})"
        )

    def threads_of(core: Core) -> tuple[int, ...]:
        allowed = tuple(cpu for cpu in core.cpus if cpu in topo.allowed_cpus)
        return allowed if placement.smt else allowed[:1]

    machine = _describe_machine(usable)
    if placement.reserved_cores >= len(usable):
        raise PlacementError(
            f"placement.reserved_cores is {placement.reserved_cores}, but {machine}: nothing "
            f"would be left for instances. Would fit: reserved_cores <= {len(usable) - 1}"
        )
    reserved = _reserve(usable, placement.reserved_cores)
    free = _FreeCores([c for c in usable if c not in reserved])
    reserved_note = (
        f"after reserving {len(reserved)} core(s)" if reserved else "with no cores reserved"
    )

    pools = [_Demand(m, pool, several) for m in demands for pool in m.pools]
    kinds = {d: _core_types(d, topo) for d in pools}
    asked = f". The models ask for: {_asked_words(pools)}" if several else ""
    words = _Words(machine, reserved_note, asked)
    placed: dict[_Demand, list[list[Core]]] = {}
    _place_fixed([d for d in pools if d.pool.instances != AUTO], free, kinds, placed, words)
    _place_autos([d for d in pools if d.pool.instances == AUTO], free, kinds, placed, words)

    slots = []
    for d in pools:
        for i, cores in enumerate(placed[d]):
            binding = Binding.on((cpu for c in cores for cpu in threads_of(c)), topo)
            name = f"{d.label}-{i}"
            slots.append(Slot(name, d.pool.name, binding, len(binding.cpus), d.model.name))
    reserved_cpus = CPUSet(cpu for c in reserved for cpu in c.cpus) & topo.allowed_cpus
    return Plan(tuple(slots), reserved_cpus, _idle(topo, slots, reserved_cpus), placement.smt)


def _idle(topo: CPUTopology, slots: Iterable[Slot], reserved: CPUSet) -> CPUSet:
    """The allowed CPUs neither reserved nor in a slot."""
    used = CPUSet.union(s.cpus for s in slots) | reserved
    return topo.allowed_cpus - used


class _Words(NamedTuple):
    """What a placement error says of the machine and the ask, whichever pool it is for."""

    machine: str
    reserved_note: str
    asked: str


def _place_fixed(
    fixed: list[_Demand],
    free: _FreeCores,
    kinds: dict[_Demand, tuple[str, ...]],
    placed: dict[_Demand, list[list[Core]]],
    words: _Words,
) -> None:
    """Pools with a number of instances, the largest instances first: less fragmentation."""
    for d in sorted(fixed, key=lambda d: -d.pool.cores_per_instance):
        pool = d.pool
        count = pool.instances
        assert isinstance(count, int), "a fixed pool's instances are a number"
        room = sum(free.total(kind) for kind in kinds[d])
        placed[d] = []
        for _ in range(count):
            cores = free.take(pool.cores_per_instance, kinds[d])
            if cores is None:
                raise PlacementError(
                    f"{d.words} asks for {pool.instances} instance(s) of "
                    f"{pool.cores_per_instance} physical core(s), but {words.machine}, and "
                    f"{room} are free for it {words.reserved_note} and placing "
                    f"{_placed_words(placed, d)}. Would fit: "
                    f"{room // pool.cores_per_instance} instance(s) of "
                    f"{pool.cores_per_instance} core(s){words.asked}"
                )
            placed[d].append(cores)


def _place_autos(
    autos: list[_Demand],
    free: _FreeCores,
    kinds: dict[_Demand, tuple[str, ...]],
    placed: dict[_Demand, list[list[Core]]],
    words: _Words,
) -> None:
    """`instances: auto` pools on what the fixed ones left: one fills it node by node
    (neighbouring instances on each node); several share it by weight."""
    left = free.describe()
    if len(autos) == 1:
        (d,) = autos
        placed[d] = [
            free.take_from(node, d.pool.cores_per_instance, kind)
            for kind in kinds[d]
            for node in sorted(free.by_node)
            for _ in range(len(free.of(node, kind)) // d.pool.cores_per_instance)
        ]
    else:
        placed |= _share(free, autos, kinds)
    for d in autos:
        if not placed[d]:
            raise PlacementError(
                f"{d.words} (instances: auto{_weight_words(d, autos)}) gets no instance: it "
                f"needs {d.pool.cores_per_instance} physical core(s) on one node, but "
                f"{words.machine}, and {words.reserved_note} and placing "
                f"{_placed_words(placed, d)} the free cores are ({left}). Would fit: fewer "
                f"reserved cores, smaller fixed pools, "
                f"{'a larger weight, ' if len(autos) > 1 else ''}or a smaller cores_per_instance"
                f"{words.asked}"
            )


def replan(
    current: Plan, topo: CPUTopology, placement: PlacementConfig, models: tuple[ServedModel, ...]
) -> Plan:
    """A reload's plan (either form of config): the models still served keep their instances
    where they are (they are not restarted for a neighbour's sake); the models new to the
    config are placed on the whole cores left free, those of removed models included, with
    no more cores reserved (their router shards share the reserved ones)."""
    names = {m.name for m in models}
    kept = [s for s in current.slots if s.model in names]
    added = tuple(m for m in models if m.name not in {s.model for s in kept})
    busy = CPUSet.union(s.cpus for s in kept) | current.reserved_cpus
    free = dataclasses.replace(topo, allowed_cpus=topo.allowed_cpus - busy.whole_cores(topo))
    new: tuple[Slot, ...] = ()
    if added:
        try:
            new = plan_placement(
                free, dataclasses.replace(placement, reserved_cores=0), added
            ).slots
        except PlacementError as e:
            raise PlacementError(
                f"the added model(s) {', '.join(m.name for m in added)} do not fit in the cores "
                f"the models kept running leave free: {e}"
            ) from None
    order = {m.name: i for i, m in enumerate(models)}
    slots = sorted([*kept, *new], key=lambda s: order[s.model])  # stable: pools keep order
    idle = _idle(topo, slots, current.reserved_cpus)
    return Plan(tuple(slots), current.reserved_cpus, idle, smt=current.smt)


@dataclass(frozen=True)
class _Demand:
    """One pool of one model, as the planner places it."""

    model: ServedModel
    pool: PoolConfig
    several: bool  # one of a `models:` config's: its instances' names say which

    @property
    def label(self) -> str:
        """The pool's name, after its model's in a `models:` config: `embed.main`."""
        return f"{self.model.name}.{self.pool.name}" if self.several else self.pool.name

    @property
    def words(self) -> str:
        return f"pool {self.label!r}"


def _share(
    free: _FreeCores, autos: list[_Demand], kinds: dict[_Demand, tuple[str, ...]]
) -> dict[_Demand, list[list[Core]]]:
    """Several models' `auto` pools share what is free by their weights, node by node, so
    that each model has its share of every node (and its router shard there, instances to
    route to): one instance at a time to the pool furthest below its share, until no pool
    fits another on the node."""
    placed: dict[_Demand, list[list[Core]]] = {d: [] for d in autos}
    for node in sorted(free.by_node):
        cores = dict.fromkeys(autos, 0)
        hungry = list(autos)
        while hungry:
            d = min(hungry, key=lambda d: (cores[d] / d.model.weight, autos.index(d)))
            size = d.pool.cores_per_instance
            kind = next((k for k in kinds[d] if len(free.of(node, k)) >= size), None)
            if kind is None:
                hungry.remove(d)
                continue
            placed[d].append(free.take_from(node, size, kind))
            cores[d] += size
    return placed


def _asked_words(pools: list[_Demand]) -> str:
    """What every model asked for, for an error about a `models:` config."""
    by_model: dict[str, list[str]] = {}
    for d in pools:
        count = "auto" if d.pool.instances == AUTO else str(d.pool.instances)
        weight = f" (weight {d.model.weight})" if d.pool.instances == AUTO else ""
        asked = f"{d.pool.name} {count} x {d.pool.cores_per_instance} core(s){weight}"
        by_model.setdefault(d.model.name, []).append(asked)
    return "; ".join(f"{model}: {', '.join(asks)}" for model, asks in by_model.items())


def _weight_words(d: _Demand, autos: list[_Demand]) -> str:
    if len(autos) < 2:
        return ""
    total = sum(a.model.weight for a in autos)
    return f", weight {d.model.weight} of {total}"


def _core_types(d: _Demand, topo: CPUTopology) -> tuple[str, ...]:
    """The types a pool may take, in its order of preference: the machine's, fastest first,
    unless it names its own."""
    pool = d.pool
    if not pool.core_types:
        return topo.core_types
    kinds = tuple(k for k in pool.core_types if k in topo.core_types)
    if not kinds:
        raise PlacementError(
            f"{d.words} may use {', '.join(pool.core_types)} cores only, but this "
            f"machine has {', '.join(topo.core_types)} cores. Would fit: core_types "
            f"{list(topo.core_types)}, or leave core_types out"
        )
    return kinds


def _reserve(usable: list[Core], count: int) -> list[Core]:
    """The lowest-numbered cores of each node, taken a node at a time in turn, so that every
    node gets a reserved core (for its router shard) before any gets two."""
    by_node: dict[int, list[Core]] = {}
    for core in sorted(usable, key=lambda c: c.id):
        by_node.setdefault(core.node, []).append(core)
    order = [cores[i] for i in range(len(usable)) for cores in by_node.values() if i < len(cores)]
    return order[:count]


def _describe_machine(usable: list[Core]) -> str:
    per_node: dict[int, int] = {}
    for c in usable:
        per_node[c.node] = per_node.get(c.node, 0) + 1
    nodes = ", ".join(f"node {n}: {k}" for n, k in sorted(per_node.items()))
    return f"this machine has {len(usable)} allowed physical core(s) ({nodes})"


def _placed_words(placed: dict[_Demand, list], current: _Demand) -> str:
    others = [f"{d.label!r} ({len(v)})" for d, v in placed.items() if d != current]
    return "pools " + ", ".join(others) if others else "no other pool"


def format_plan(plan: Plan) -> str:
    """A table a person reads: one row per instance, with its model's column where there
    are several."""
    several = len(plan.models) > 1
    rows = [("instance", *(("model",) if several else ()), "pool", "node", "threads", "cpus")]
    for s in plan.slots:
        node = (
            str(s.node) if s.node is not None else ",".join(map(str, s.binding.nodes)) + " (spans)"
        )
        model = (s.model,) if several else ()
        rows.append((s.name, *model, s.pool, node, str(s.threads), str(s.cpus)))
    last = len(rows[0]) - 1
    widths = [max(len(r[i]) for r in rows) for i in range(last)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(last)) + "  " + r[last] for r in rows]
    lines.append("")
    lines.append(f"reserved for router and supervisor: {plan.reserved_cpus or 'none'}")
    idle_why = "" if plan.smt else " (SMT siblings stay idle with smt: false)"
    lines.append(f"idle CPUs: {plan.idle_cpus or 'none'}{idle_why if plan.idle_cpus else ''}")
    return "\n".join(lines)
