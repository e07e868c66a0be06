"""The processes a Plan becomes: one router spec, and one worker spec per slot. Pure data."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from numaserve.config import Config
from numaserve.placement import Plan
from numaserve.router import RouterSpec
from numaserve.topology import CPUTopology
from numaserve.worker import WorkerSpec


@dataclass(frozen=True)
class Deployment:
    router: RouterSpec
    workers: tuple[WorkerSpec, ...]


def deployment(config: Config, plan: Plan, topo: CPUTopology, runtime_dir: Path) -> Deployment:
    """`runtime_dir` holds the router's worker socket: private to this server."""
    workers_endpoint = f"ipc://{runtime_dir}/workers.sock"
    node_of = {cpu: core.node for core in topo.cores for cpu in core.cpus}
    router = RouterSpec(
        workers_endpoint=workers_endpoint,
        pools=config.placement.pools,
        model=config.model,
        server=config.server,
        cpus=plan.reserved_cpus,
        nodes=tuple(sorted({node_of[c] for c in plan.reserved_cpus})),
        drain_timeout_s=config.supervisor.drain_timeout_s,
    )
    pools = {p.name: p for p in config.placement.pools}
    workers = tuple(
        WorkerSpec(
            name=slot.name,
            pool=slot.pool,
            cpus=slot.cpus,
            nodes=slot.nodes,
            threads=slot.threads,
            router=workers_endpoint,
            max_tokens=pools[slot.pool].max_tokens,
            model=config.model,
            isa=topo.isa,
            heartbeat_ms=config.server.heartbeat_ms,
            liveness=config.server.heartbeat_liveness,
        )
        for slot in plan.slots
    )
    return Deployment(router, workers)
