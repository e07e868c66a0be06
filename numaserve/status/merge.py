"""The status op's answer where several router shards serve: the whole server, merged.

The supervisor hears every shard's status each round (a quarter of a second); a shard asked for
`status` sends its own, fresh, and the supervisor answers with the merge. So the shards never
forward their statuses to each other. A shard that has no supervisor to ask (just restarted,
before its first slot table) answers the same shape with its own part alone.
"""

from __future__ import annotations


def whole_server(own: dict, peers: list[dict]) -> dict:
    """The status op's answer where several shards serve: totals over every shard, each
    instance as the shard that routes to it sees it, and one line per shard. The peers' parts
    are as fresh as the supervisor's last round (a quarter of a second)."""
    shards = sorted([own, *peers], key=lambda s: s.get("shard", 0))
    seen = {s.get("shard"): {i["name"]: i for i in s["instances"]} for s in shards}
    instances = [
        _as_routed(e, seen.get(e.get("shard"), {}).get(e["name"])) for e in own["instances"]
    ]
    pools = {}
    for shard in shards:
        for pool in shard["pools"]:
            key = (pool.get("model_name"), pool["name"])  # a pool's name is its model's own
            total = pools.setdefault(key, {**pool, "queue": 0, "ready": 0})
            total["queue"] += pool["queue"]
            total["ready"] += pool["ready"]
    cache = {
        k: sum(s["cache"][k] for s in shards) for k in ("entries", "capacity", "hits", "misses")
    }
    looked_up = cache["hits"] + cache["misses"]
    cache["hit_rate"] = round(cache["hits"] / looked_up, 4) if looked_up else 0.0
    whole = {k: v for k, v in own.items() if k != "metrics"}  # each shard's, below
    return {
        **whole,
        "instances": instances,
        "pools": list(pools.values()),
        "cache": cache,
        "requests": _sums(s["requests"] for s in shards),
        "errors": _sums(s["errors"] for s in shards),
        "draining": any(s["draining"] for s in shards),
        "routed_pids": sorted(pid for s in shards for pid in s["routed_pids"]),
        "shards": [
            {
                "shard": s.get("shard"),
                "model_name": s.get("model_name"),
                "cpus": s.get("cpus"),
                "instances": sum(1 for i in instances if i.get("shard") == s.get("shard")),
                "requests": s["requests"],
                "pools": s["pools"],
                "cache": s["cache"],
                "draining": s["draining"],
                "metrics": s.get("metrics"),
            }
            for s in shards
        ],
    }


# What a shard knows of an instance that the supervisor's slot table does not.
ROUTER_SIDE = (
    "routed",
    "threads",
    "membind",
    "model_path",
    "busy",
    "served",
    "live_cpus",
    "affinity_ok",
)


def _as_routed(slot: dict, routing: dict | None) -> dict:
    """A slot as this shard's table has it (the supervisor's newest: a peer's copy may be a
    round older, and say starting after systemd heard READY=1), with what the shard that routes
    to it sees of that same process."""
    if routing is None or routing.get("pid") != slot.get("pid"):
        return slot
    return {**slot, **{k: routing[k] for k in ROUTER_SIDE if k in routing}}


def _sums(counters) -> dict:
    total: dict = {}
    for counter in counters:
        for key, value in counter.items():
            total[key] = total.get(key, 0) + value
    return total
