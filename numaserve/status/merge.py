"""The status op's answer where several router shards serve: the whole server, merged.

The supervisor hears every shard's whole status once a second; a shard asked for `status` sends
its own, fresh, and the supervisor answers with the merge. So the shards never
forward their statuses to each other. A shard that has no supervisor to ask (just restarted,
before its first slot table) answers the same shape with its own part alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from numaserve.status.report import Cache, Pool, Report, ShardLine


def server_status(reports: list[Report], several: bool) -> Report:
    """The status op's answer from every shard's latest report, as the supervisor gives it on
    its control socket: the one shard's own, or (`several` shards) their merge."""
    first, *others = sorted(reports, key=lambda r: r.shard)
    return whole_server(first, others) if several else first


def whole_server(own: Report, peers: list[Report]) -> Report:
    """The status op's answer where several shards serve: totals over every shard, each
    instance as the shard that routes to it sees it, and one line per shard. The peers' parts
    are as fresh as their latest reports to the supervisor (a second at most)."""
    shards = sorted([own, *peers], key=lambda s: s.shard)
    seen = {s.shard: {i.name: i for i in s.instances} for s in shards}
    # Each slot as our table has it (the supervisor's newest: a peer's copy may be a round
    # older, and say starting after systemd heard READY=1), as its routing shard sees it.
    instances = tuple(e.as_routed(seen.get(e.shard, {}).get(e.name)) for e in own.instances)
    pools: dict[tuple, Pool] = {}
    for shard in shards:
        for pool in shard.pools:
            key = (pool.model_name, pool.name)  # a pool's name is its model's own
            total = pools.setdefault(key, replace(pool, queue=0, ready=0))
            pools[key] = replace(
                total, queue=total.queue + pool.queue, ready=total.ready + pool.ready
            )
    return replace(
        own,
        instances=instances,
        pools=tuple(pools.values()),
        cache=_cache(s.cache for s in shards),
        requests=_sums(s.requests for s in shards),
        errors=_sums(s.errors for s in shards),
        draining=any(s.draining for s in shards),
        routed_pids=tuple(sorted(pid for s in shards for pid in s.routed_pids)),
        metrics=None,  # each shard's, below
        shards=tuple(
            ShardLine(
                shard=s.shard,
                model_name=s.model_name,
                cpus=s.cpus,
                instances=sum(1 for i in instances if i.shard == s.shard),
                requests=s.requests,
                pools=s.pools,
                cache=s.cache,
                draining=s.draining,
                metrics=s.metrics,
            )
            for s in shards
        ),
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
