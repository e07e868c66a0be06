"""The placement planner: topology + pools -> a Plan of slots. Pure: no OS calls, no processes.

A slot is whole physical cores of one type on one NUMA node. The rules, each checked by the
tests: no CPU or physical core in two slots; one thread per core unless `smt: true`; an
instance never mixes core types (a P-core waiting on E-cores runs at their pace) and spans
nodes only when no single node has room for it; reserved cores (the lowest-numbered of each
node in turn) are never placed; `auto` fills what is left, fastest type first, node by node.
"""

from __future__ import annotations

from dataclasses import dataclass

from numaserve.config import AUTO, PlacementConfig, PoolConfig
from numaserve.host.cpulist import format_cpulist
from numaserve.host.topology import Core, CPUTopology


class PlacementError(ValueError):
    pass


@dataclass(frozen=True)
class Slot:
    """Where one instance runs. It keeps these CPUs across restarts."""

    name: str
    pool: str
    cpus: tuple[int, ...]
    nodes: tuple[int, ...]
    threads: int

    @property
    def node(self) -> int | None:
        """The node holding every CPU, or None for an instance too big for any one node."""
        return self.nodes[0] if len(self.nodes) == 1 else None


@dataclass(frozen=True)
class Plan:
    slots: tuple[Slot, ...]
    reserved_cpus: tuple[int, ...]
    idle_cpus: tuple[int, ...]
    smt: bool

    def pool_slots(self, pool: str) -> tuple[Slot, ...]:
        return tuple(s for s in self.slots if s.pool == pool)

    def to_json(self) -> dict:
        return {
            "instances": [
                {
                    "name": s.name,
                    "pool": s.pool,
                    "cpus": list(s.cpus),
                    "node": s.node,
                    "nodes": list(s.nodes),
                    "threads": s.threads,
                }
                for s in self.slots
            ],
            "reserved_cpus": list(self.reserved_cpus),
            "idle_cpus": list(self.idle_cpus),
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


def plan_placement(topo: CPUTopology, placement: PlacementConfig) -> Plan:
    usable = [c for c in topo.cores if any(cpu in topo.allowed_cpus for cpu in c.cpus)]
    if not usable:
        raise PlacementError(
            f"no allowed CPUs to place on (allowed: {format_cpulist(topo.allowed_cpus) or 'none'})"
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

    kinds = {pool.name: _core_types(pool, topo) for pool in placement.pools}
    placed: dict[str, list[list[Core]]] = {}
    fixed = [p for p in placement.pools if p.instances != AUTO]
    for pool in sorted(fixed, key=lambda p: -p.cores_per_instance):  # big first: less fragmentation
        room = sum(free.total(kind) for kind in kinds[pool.name])
        placed[pool.name] = []
        for _ in range(pool.instances):
            cores = free.take(pool.cores_per_instance, kinds[pool.name])
            if cores is None:
                raise PlacementError(
                    f"pool {pool.name!r} asks for {pool.instances} instance(s) of "
                    f"{pool.cores_per_instance} physical core(s), but {machine}, and {room} are "
                    f"free for it {reserved_note} and placing {_placed_words(placed, pool)}. "
                    f"Would fit: {room // pool.cores_per_instance} instance(s) of "
                    f"{pool.cores_per_instance} core(s)"
                )
            placed[pool.name].append(cores)

    for pool in (p for p in placement.pools if p.instances == AUTO):
        left = free.describe()
        placed[pool.name] = [
            free.take_from(node, pool.cores_per_instance, kind)
            for kind in kinds[pool.name]
            for node in sorted(free.by_node)
            for _ in range(len(free.of(node, kind)) // pool.cores_per_instance)
        ]
        if not placed[pool.name]:
            raise PlacementError(
                f"pool {pool.name!r} (instances: auto) gets no instance: it needs "
                f"{pool.cores_per_instance} physical core(s) on one node, but {machine}, and "
                f"{reserved_note} and placing {_placed_words(placed, pool)} the free cores are "
                f"({left}). Would fit: fewer reserved cores, smaller fixed pools, or a smaller "
                "cores_per_instance"
            )

    slots = []
    for pool in placement.pools:
        for i, cores in enumerate(placed[pool.name]):
            cpus = tuple(sorted(cpu for c in cores for cpu in threads_of(c)))
            nodes = tuple(sorted({c.node for c in cores}))
            slots.append(Slot(f"{pool.name}-{i}", pool.name, cpus, nodes, threads=len(cpus)))
    reserved_cpus = tuple(
        sorted(cpu for c in reserved for cpu in c.cpus if cpu in topo.allowed_cpus)
    )
    used = {cpu for s in slots for cpu in s.cpus} | set(reserved_cpus)
    idle = tuple(sorted(topo.allowed_cpus - used))
    return Plan(tuple(slots), reserved_cpus, idle, smt=placement.smt)


def _core_types(pool: PoolConfig, topo: CPUTopology) -> tuple[str, ...]:
    """The types `pool` may take, in its order of preference: the machine's, fastest first,
    unless it names its own."""
    if not pool.core_types:
        return topo.core_types
    kinds = tuple(k for k in pool.core_types if k in topo.core_types)
    if not kinds:
        raise PlacementError(
            f"pool {pool.name!r} may use {', '.join(pool.core_types)} cores only, but this "
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


def _placed_words(placed: dict[str, list], current: PoolConfig) -> str:
    others = [f"{name!r} ({len(v)})" for name, v in placed.items() if name != current.name]
    return "pools " + ", ".join(others) if others else "no other pool"


def format_plan(plan: Plan) -> str:
    """A table a person reads: one row per instance."""
    rows = [("instance", "pool", "node", "threads", "cpus")]
    for s in plan.slots:
        node = str(s.node) if s.node is not None else ",".join(map(str, s.nodes)) + " (spans)"
        rows.append((s.name, s.pool, node, str(s.threads), format_cpulist(s.cpus)))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4] for r in rows]
    lines.append("")
    lines.append(
        f"reserved for router and supervisor: {format_cpulist(plan.reserved_cpus) or 'none'}"
    )
    idle_why = "" if plan.smt else " (SMT siblings stay idle with smt: false)"
    lines.append(
        f"idle CPUs: {format_cpulist(plan.idle_cpus) or 'none'}{idle_why if plan.idle_cpus else ''}"
    )
    return "\n".join(lines)
