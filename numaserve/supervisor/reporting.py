"""What the supervisor says of the whole server: its mood, the one line systemd shows
(STATUS=) and when it tells systemd, and the snapshot /metrics and the probes read."""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

from numaserve import __version__
from numaserve.config.schema import Config
from numaserve.monitoring.snapshot import Snapshot
from numaserve.supervisor.children import Child
from numaserve.supervisor.router_link import ShardLinks
from numaserve.supervisor.sdnotify import Notifier


class Mood(str, Enum):
    """The server as a whole; one at a time."""

    PREPARING = "preparing the model"  # `numaserve prepare` runs before any instance starts
    STARTING = "starting"  # processes start; systemd not yet told READY=1
    SERVING = "serving"  # told READY=1
    RELOADING = "reloading"  # a SIGHUP's config is being applied
    STOPPING = "stopping"  # draining, then every process stops


PREFIX = {
    Mood.PREPARING: "preparing the model: ",
    Mood.RELOADING: "reloading: ",
    Mood.STOPPING: "stopping: ",
}


def summary(mood: Mood, workers: Iterable[Child], routers: list[Child]) -> str:
    """'2 ready, 1 backoff; router ready': the instances by state, then the shards ('routers
    ready' where all are, 'routers: 1 ready, 1 starting' where they differ)."""
    parts = _by_state(workers)
    if not routers:  # none started yet
        return f"{PREFIX.get(mood, '')}{parts}"
    shards = "router" if len(routers) == 1 else "routers"
    states = {r.state for r in routers}
    said = (
        f"{shards} {states.pop().value}" if len(states) == 1 else f"{shards}: {_by_state(routers)}"
    )
    return f"{PREFIX.get(mood, '')}{parts}; {said}"


def _by_state(children: Iterable[Child]) -> str:
    """'2 ready, 1 backoff'."""
    counts: dict[str, int] = {}
    for child in children:
        counts[child.state.value] = counts.get(child.state.value, 0) + 1
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))


def snapshot(
    now: float,
    config: Config,
    mood: Mood,
    processes: list[Child],
    shards: ShardLinks,
    supervisor_pid: int,
    front_stats: tuple[str, ...] = (),
) -> Snapshot:
    """The whole server as /metrics and the probes see it. `processes`: the current ones (not
    those a reload retired, nor a replacement still starting under its slot's name)."""
    named = config.named
    return Snapshot(
        taken=now,
        stopping=mood is Mood.STOPPING,
        build=tuple(
            {
                "version": __version__,
                "backend": m.backend,
                "model": m.path,
                "task": m.task,
                "quantize": m.quantize,
                **({"model_name": m.name} if named else {}),
            }
            for m in config.models
        ),
        pools=tuple((m.name, p.name) for m in config.models for p in m.pools),
        processes=tuple(c.process() for c in processes),
        shards=tuple(v.status for v in shards),
        shard_age=tuple(now - v.heard_at if v.routed is not None else None for v in shards),
        supervisor_pid=supervisor_pid,
        front_stats=front_stats,
    )


class Announcer:
    """What systemd hears each turn: READY=1 when the server comes to serve, STATUS= when the
    summary line changes, and the watchdog's keep-alive in time."""

    def __init__(self, notifier: Notifier) -> None:
        self.notifier = notifier
        self.last_status = ""
        self.next_watchdog = 0.0

    def turn(self, now: float, status: str, ready: bool) -> None:
        if ready:
            self.notifier.ready(status)
        elif status != self.last_status:
            self.notifier.status(status)
        self.last_status = status
        interval = self.notifier.watchdog_interval
        if interval and now >= self.next_watchdog:
            self.next_watchdog = now + interval
            self.notifier.watchdog()
