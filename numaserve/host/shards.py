"""Router shards: which instances each shard owns and where it runs. Pure, as placement is.

One router process caps a big host (docs/benchmarks.md, "Router capacity"): `server.routers`
splits the routing into shards behind one endpoint. Each shard owns a share of every pool's
instances, taken node by node, so that a text is never refused by a shard for want of a pool
another shard has, and a shard's traffic to its instances stays on its node; each is pinned to
a reserved core of its own node where there is one.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from numaserve.host.cpuset import Binding, CPUSet
from numaserve.host.placement import PlacementError, Plan, Slot
from numaserve.host.topology import CPUTopology


@dataclass(frozen=True)
class Shard:
    index: int
    slots: tuple[str, ...]  # the instances it routes to
    node: int  # where most of its instances' CPUs are
    binding: Binding  # the reserved CPUs it is pinned to, and their node; empty: not pinned

    def to_json(self) -> dict:
        return {
            "shard": self.index,
            "node": self.node,
            "cpus": self.binding.cpus.to_plain(),
            "instances": list(self.slots),
        }

    def describe(self) -> str:
        where = f"CPUs {self.binding.cpus}" if self.binding else "not pinned (no reserved cores)"
        return f"router shard {self.index}: node {self.node}, {where}, routes to {', '.join(self.slots)}"


def shard_count(plan: Plan, routers: int | str) -> int:
    """`auto`: one shard per node that holds instances; never more shards than the smallest
    pool has instances (each shard needs one of every pool)."""
    per_pool = Counter(slot.pool for slot in plan.slots)
    most = min(per_pool.values())
    if isinstance(routers, str):  # auto
        nodes = {_home(slot) for slot in plan.slots}
        return max(1, min(len(nodes), most))
    if routers > most:
        pool, count = min(per_pool.items(), key=lambda item: item[1])
        raise PlacementError(
            f"server.routers is {routers}, but pool {pool!r} has {count} instance(s), and every "
            f"router shard needs an instance of every pool. Would fit: routers <= {most}, or "
            "more instances in that pool"
        )
    return routers


def plan_shards(plan: Plan, topo: CPUTopology, routers: int | str) -> tuple[Shard, ...]:
    count = shard_count(plan, routers)
    owned: list[list[Slot]] = [[] for _ in range(count)]
    for pool in dict.fromkeys(slot.pool for slot in plan.slots):
        # A pool's instances in node order, cut into `count` runs of near-equal length: each
        # shard gets at least one, and with a shard per node, the run of its own node.
        slots = sorted(plan.pool_slots(pool), key=lambda s: (_home(s), s.cpus.sorted()))
        for i, slot in enumerate(slots):
            owned[i * count // len(slots)].append(slot)
    homes = [Counter(_home(s) for s in mine).most_common(1)[0][0] for mine in owned]
    pins = _pin(plan, topo, homes)
    return tuple(Shard(i, tuple(s.name for s in owned[i]), homes[i], pins[i]) for i in range(count))


def plan_model_shards(
    plan: Plan,
    topo: CPUTopology,
    routers: int | str,
    numbers: Mapping[str, tuple[int, ...]] | None = None,
) -> tuple[tuple[str, Shard], ...]:
    """Each model's shards over its own instances, as (model, shard), numbered across all
    models in config order: the numbers the server gives its router processes. `numbers`:
    the running server's, by model, for a reload: a model that keeps its shards keeps their
    numbers, and a model new to the server gets numbers no shard has had."""
    numbers = numbers or {}
    fresh = itertools.count(max((i for ns in numbers.values() for i in ns), default=-1) + 1)
    out = []
    for model in plan.models:
        shards = plan_shards(plan.for_model(model), topo, routers)
        kept = numbers.get(model, ())
        indices = kept if len(kept) == len(shards) else [next(fresh) for _ in shards]
        out += [
            (model, dataclasses.replace(s, index=i)) for s, i in zip(shards, indices, strict=True)
        ]
    return tuple(out)


def _home(slot: Slot) -> int:
    return slot.node if slot.node is not None else next(iter(slot.binding.nodes))


def _pin(plan: Plan, topo: CPUTopology, homes: list[int]) -> list[Binding]:
    """A reserved core of its own node for each shard: one to itself while its node has
    reserved cores to go round, shared after that; a reserved core of another node where its
    own has none; unpinned where nothing is reserved."""
    reserved = plan.reserved_cpus
    cores = [
        (core.node, tuple(cpu for cpu in core.cpus if cpu in reserved))
        for core in sorted(topo.cores, key=lambda c: c.id)
        if reserved & CPUSet(core.cpus)
    ]
    if not cores:
        return [Binding() for _ in homes]
    taken: Counter = Counter()
    pins = []
    for node in homes:
        mine = [cpus for n, cpus in cores if n == node] or [cpus for _, cpus in cores]
        choice = min(mine, key=lambda cpus: taken[cpus])  # the least shared, lowest first
        taken[choice] += 1
        pins.append(choice)
    return [Binding.on(cpus, topo) for cpus in pins]
