"""What the supervisor knows of the whole server at one moment: the input of /metrics,
/healthz and /readyz.

The supervisor's loop builds one every turn and hands it over whole (one reference swap), so
the HTTP thread never reads a state the loop is changing. The router shards' parts are their
latest reports to the supervisor (a second old at most, while they answer).
"""

from __future__ import annotations

from dataclasses import dataclass

from numaserve.host.cpuset import Binding
from numaserve.status.report import ShardReport


@dataclass(frozen=True)
class Process:
    """One process the supervisor runs, as /metrics and the probes see it."""

    kind: str  # worker, router, frontend, front, prepare
    name: str
    state: str
    pid: int | None
    binding: Binding = Binding()
    pool: str | None = None  # a worker's
    model_name: str | None = None
    restarts: int = 0


@dataclass(frozen=True)
class Snapshot:
    taken: float  # the supervisor loop's monotonic clock when it built this
    stopping: bool
    # Per model: version, backend, model (its path), task, quantize; and model_name, where
    # there are several.
    build: tuple[dict[str, str], ...]
    pools: tuple[tuple[str, str], ...]  # (model name, pool name) of every configured pool
    processes: tuple[Process, ...]  # every process the supervisor runs
    # Per router shard, in shard order: its latest report (None until its first), and how many
    # seconds before `taken` it last answered the supervisor (None: never yet).
    shards: tuple[ShardReport | None, ...] = ()
    shard_age: tuple[float | None, ...] = ()
    supervisor_pid: int = 0
    front_stats: tuple[str, ...] = ()  # the fronts' stats files (front/stats.py)

    def instances(self) -> list[Process]:
        return [p for p in self.processes if p.kind == "worker"]
