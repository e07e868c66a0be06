"""What the supervisor knows of the whole server at one moment: the input of /metrics,
/healthz and /readyz.

The supervisor's loop builds one every turn and hands it over whole (one reference swap), so
the HTTP thread never reads a state the loop is changing. The router shards' parts are their
answers to the supervisor's last poll (a quarter of a second old at most, while they answer).
"""

from __future__ import annotations

from dataclasses import dataclass

from numaserve.status.report import Report


@dataclass(frozen=True)
class Snapshot:
    taken: float  # the supervisor loop's monotonic clock when it built this
    stopping: bool
    # Per model: version, backend, model (its path), task, quantize; and model_name, where
    # there are several.
    build: tuple[dict[str, str], ...]
    pools: tuple[tuple[str, str], ...]  # (model name, pool name) of every configured pool
    # Every process the supervisor runs: Child.describe() plus "kind" (worker, router,
    # frontend, prepare).
    processes: tuple[dict, ...]
    # Per router shard, in shard order: its latest own status (None until it answers) and how
    # many seconds before `taken` it answered.
    shards: tuple[Report | None, ...] = ()
    shard_age: tuple[float | None, ...] = ()
    supervisor_pid: int = 0
    http_stats: tuple[str, ...] = ()  # the HTTP fronts' stats files (http/stats.py)

    def instances(self) -> list[dict]:
        return [p for p in self.processes if p["kind"] == "worker"]
