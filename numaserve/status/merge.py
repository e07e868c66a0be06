"""The whole server's status from its parts: the one place a slot is joined with what the
shard that routes to its process sees of it.

The supervisor answers `status` (asked over the endpoint through a shard, or on its control
socket: one road) from its own slot table and every shard's latest report, fresh: it asks
for them with the question. A shard with no supervisor to ask (none runs, or it has not
answered in time) answers the same shape from its own table or the instances it knows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from numaserve.status.report import (
    Cache,
    Instance,
    Pool,
    ServerReport,
    ShardLine,
    ShardReport,
    SlotEntry,
    SupervisorInfo,
)


def server_report(
    slots: Iterable[SlotEntry], supervisor: SupervisorInfo | None, reports: list[ShardReport]
) -> ServerReport:
    """Each slot with the routing of its process (by pid: a shard's view of the process
    before a restart is not the new one's), the pools (one per model and pool name), cache
    and counters summed over the shards, and one line per shard."""
    shards = sorted(reports, key=lambda s: s.shard)
    routing = {r.pid: r for s in shards for r in s.routing}
    instances = tuple(
        Instance(slot, routing.get(slot.pid) if slot.pid is not None else None)
        for slot in sorted(slots, key=lambda s: s.name)
    )
    pools: dict[tuple, Pool] = {}
    for shard in shards:
        for pool in shard.pools:
            key = (pool.model_name, pool.name)  # a pool's name is its model's own
            total = pools.setdefault(key, replace(pool, queue=0, ready=0))
            pools[key] = replace(
                total, queue=total.queue + pool.queue, ready=total.ready + pool.ready
            )
    first = shards[0]
    return ServerReport(
        task=first.task,
        model_name=first.model_name,
        model=first.model,
        instances=instances,
        pools=tuple(pools.values()),
        cache=_cache(s.cache for s in shards),
        requests=_sums(s.requests for s in shards),
        errors=_sums(s.errors for s in shards),
        draining=any(s.draining for s in shards),
        routed_pids=tuple(sorted(pid for s in shards for pid in s.routed_pids)),
        shards=tuple(
            ShardLine(
                shard=s.shard,
                model_name=s.model_name,
                cpus=s.cpus,
                instances=sum(1 for i in instances if i.slot.shard == s.shard),
                requests=s.requests,
                pools=s.pools,
                cache=s.cache,
                draining=s.draining,
                metrics=s.metrics,
            )
            for s in shards
        ),
        supervisor=supervisor,
    )


def _cache(caches: Iterable[Cache]) -> Cache:
    caches = list(caches)
    hits, misses = sum(c.hits for c in caches), sum(c.misses for c in caches)
    looked_up = hits + misses
    return Cache(
        entries=sum(c.entries for c in caches),
        capacity=sum(c.capacity for c in caches),
        hits=hits,
        misses=misses,
        hit_rate=round(hits / looked_up, 4) if looked_up else 0.0,
    )


def _sums(counters: Iterable[Mapping[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for counter in counters:
        for key, value in counter.items():
            total[key] = total.get(key, 0) + value
    return total
