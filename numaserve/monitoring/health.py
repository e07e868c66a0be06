"""The probes' verdicts: /healthz (alive) and /readyz (ready for traffic), from a Snapshot.

Alive: the supervisor's loop is turning, and every router shard answered it lately. A load
balancer or Kubernetes restarts what fails this. Ready: alive, not stopping, and every pool
has a ready instance in some shard; what fails this is taken out of rotation, not restarted
(an instance restarting, a drain).
"""

from __future__ import annotations

from numaserve.monitoring.snapshot import Snapshot

# The supervisor's loop turns every 0.1 s and polls the shards every 0.25 s (their whole
# reports once a second); these leave room for a loaded host without hiding a hang for long.
LOOP_STALE_S = 5.0
SHARD_STALE_S = 5.0


def alive(snapshot: Snapshot | None, now: float) -> list[str]:
    """What is wrong, in words; empty when alive."""
    if snapshot is None:
        return ["the supervisor has not finished starting"]
    problems = []
    if now - snapshot.taken > LOOP_STALE_S:
        problems.append(f"the supervisor's loop has not turned for {now - snapshot.taken:.1f} s")
    for shard, age in enumerate(snapshot.shard_age):
        if age is None:
            problems.append(f"router shard {shard} has not answered the supervisor yet")
        elif age > SHARD_STALE_S:
            problems.append(f"router shard {shard} has not answered for {age:.1f} s")
    return problems


def ready(snapshot: Snapshot | None, now: float) -> list[str]:
    problems = alive(snapshot, now)
    if snapshot is None:
        return problems
    if snapshot.stopping:
        problems.append("the server is stopping")
    # Ready where the supervisor says so (it knows of an exit at once) and a shard routes to
    # it (the router drops a silent instance only after its heartbeats expire).
    supervised = {(p.model_name, p.pool) for p in snapshot.instances() if p.state == "ready"}
    routed = dict.fromkeys(snapshot.pools, 0)
    for status in snapshot.shards:
        for pool in status.pools if status else ():
            key = (pool.model_name, pool.name)
            if key in routed:
                routed[key] += pool.ready
    several = len({model for model, _ in snapshot.pools}) > 1
    problems += [
        f"pool {f'{model}.' * several}{name} has no ready instance"
        for (model, name), n in routed.items()
        if n == 0 or (model, name) not in supervised
    ]
    return problems
