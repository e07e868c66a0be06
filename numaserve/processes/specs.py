"""What each process of a server is told: the specs a Plan becomes. Pure data.

The supervisor builds them (`deployment`) and hands each child its spec as JSON on the command
line; the router and the workers parse it back. Keeping them here, apart from the code that
runs them, lets the supervisor import neither the router nor any model runtime.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from numaserve.config.runtimes import needs_prepare
from numaserve.config.schema import (
    DEFAULT_MODEL,
    Config,
    ConfigError,
    CurveConfig,
    ModelConfig,
    PoolConfig,
    ServedModel,
    ServerConfig,
    from_mapping,
)
from numaserve.host.cpuset import Binding, CPUSet, plain
from numaserve.host.placement import Plan, Slot
from numaserve.host.shards import plan_model_shards
from numaserve.host.topology import CPUTopology
from numaserve.processes.prepared import Prepared


class JSONSpec:
    """A frozen dataclass handed to a child process as JSON on its command line."""

    module: ClassVar[str]  # the child's `python -m` module
    __dataclass_fields__: ClassVar[dict[str, Any]]  # each subclass is a dataclass

    @classmethod
    def from_json(cls, text: str):
        what = f"{cls.__name__} (JSON)"
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{what}: not JSON: {e}") from None
        return from_mapping(cls, data, what)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), default=plain)

    def argv(self) -> list[str]:
        """The child's command line: a fresh interpreter (as multiprocessing's spawn), never
        a fork of a process whose thread pools may be running."""
        return [sys.executable, "-m", self.module, "--spec", self.to_json()]


@dataclass(frozen=True)
class RouterSpec(JSONSpec):
    """One router shard (the only one, by default)."""

    module = "numaserve.router"

    workers_endpoint: str
    pools: tuple[PoolConfig, ...]
    model: ModelConfig = field(default_factory=ModelConfig)
    model_name: str = DEFAULT_MODEL  # what a request names it by
    server: ServerConfig = field(default_factory=ServerConfig)
    binding: Binding = Binding()  # reserved CPUs to pin to; empty: not pinned
    drain_timeout_s: float = 30.0
    shard: int = 0
    # Where the frontend hands out requests (ipc), for the shard to connect to; None: the
    # router binds server.endpoint itself (one shard, no frontend).
    frontend: str | None = None
    # Every shard's address for requests its peers pass on (router/handover.py), by shard.
    handovers: tuple[str, ...] = ()
    # Its private client socket (ipc), for the HTTP fronts and for its peers' handovers, beside
    # server.endpoint or the frontend; plain, never CurveZMQ: only this server's user reaches it.
    local: str | None = None


@dataclass(frozen=True)
class Route:
    """Where the frontend hands one model's requests: its shards connect to `shards`."""

    model: str
    shards: str  # ipc


@dataclass(frozen=True)
class FrontendSpec(JSONSpec):
    """The one endpoint in front of several router shards, of one model or of several
    (router/frontend.py)."""

    module = "numaserve.router.frontend"

    endpoint: str  # server.endpoint, for clients
    routes: tuple[Route, ...]  # by model, in config order
    max_message_bytes: int
    by_model: bool = False  # read each request's `model` (a `models:` config); else a proxy
    # by_model: where a reload writes the new FrontendSpec before it sends SIGHUP
    routes_file: str | None = None
    curve: CurveConfig | None = None  # server.curve, for the client endpoint
    binding: Binding = Binding()  # the reserved CPUs; empty: not pinned


@dataclass(frozen=True)
class FrontModel:
    """A model as a front serves it: its name, settings, and its shards' local sockets."""

    name: str
    model: ModelConfig
    shards: tuple[str, ...]
    # What `numaserve prepare` resolved (WorkerSpec.prepared), for /info; "": nothing.
    prepared: str = field(default="", metadata={"empty": True})


@dataclass(frozen=True)
class FrontSpec(JSONSpec):
    """One front process (numaserve/fronts.py): all of them serve the HTTP API on server.http
    and the gRPC API on server.grpc (each port shared by SO_REUSEPORT), each handing its
    requests to the models' shards."""

    module = "numaserve.fronts"

    models: tuple[FrontModel, ...]  # in config order: the first is the default
    named: bool  # a `models:` server: requests name their model
    server: ServerConfig = field(default_factory=ServerConfig)
    index: int = 0
    stats_file: str | None = None  # where it writes its request counts, for /metrics
    binding: Binding = Binding()  # its node's router shards' reserved CPUs; empty: not pinned
    drain_timeout_s: float = 30.0

    def where(self) -> str:
        """Where its clients connect: http://HOST:PORT, grpc://HOST:PORT, or both."""
        apis = (("http", self.server.http), ("grpc", self.server.grpc))
        return " and ".join(f"{scheme}://{address}" for scheme, address in apis if address)


@dataclass(frozen=True)
class WorkerSpec(JSONSpec):
    """Everything a worker needs to pin itself, load the model and find the router."""

    module = "numaserve.worker"

    slot: Slot  # the plan's own record: its name, pool, CPUs, nodes, threads and model's name
    router: str  # the router's worker endpoint
    max_tokens: int  # the pool's length band: warm-up covers up to here
    model: ModelConfig = field(default_factory=ModelConfig)
    # The router's micro-batches (server.max_batch, max_batch_tokens): warm-up runs each path
    # the instance holds at the batch sizes it will meet.
    max_batch: int = 1
    max_batch_tokens: int = 1
    isa: tuple[str, ...] = ()
    heartbeat_ms: int = 500
    liveness: int = 3  # heartbeats the router may miss before we announce ourselves again
    use_numactl: bool = True  # where numactl is installed; else set_mempolicy in-process
    shard: int = 0  # the router shard it serves
    # What `numaserve prepare` resolved for the model (processes/prepared.py): the instance
    # loads its pool's path and artifact from it. "": a model with nothing to prepare (torch,
    # a named precision), which loads the checkpoint as it is.
    prepared: str = field(default="", metadata={"empty": True})
    # Its pool's digest in that record, as the supervisor read it once prepare had written it
    # (Prepared.pool_digest): a reload renews an instance whose digest changed. "": not read.
    prepared_digest: str = field(default="", metadata={"empty": True})

    @property
    def binding(self) -> Binding:
        return self.slot.binding


def record_path(runtime_dir: str | Path, served: ServedModel) -> Path:
    """Where a server's prepare step writes what it resolved for a model (`numaserve
    prepare --record-dir`), and where the model's instances read it. Named for the model's
    settings too: an instance of the settings a reload left behind (an aborted one) reads
    what was resolved for its own, not for the new ones."""
    settings = json.dumps(dataclasses.asdict(served), sort_keys=True).encode()
    return (
        Path(runtime_dir)
        / f"prepared-{served.name}-{hashlib.sha256(settings).hexdigest()[:12]}.json"
    )


def prepared_path(runtime_dir: str | Path, served: ServedModel) -> str:
    """What a process's spec names as the model's record: "" where nothing is prepared."""
    if not needs_prepare(served.backend, served.quantize):
        return ""
    return str(record_path(runtime_dir, served))


def with_digests(deployment: Deployment, records: Mapping[str, Prepared]) -> Deployment:
    """`deployment` with each instance's spec carrying its pool's digest of the record it
    names (`records`: by path, as read; one not there leaves the spec's digest unset)."""
    workers = tuple(
        dataclasses.replace(w, prepared_digest=records[w.prepared].pool_digest(w.slot.pool))
        if w.prepared in records
        else w
        for w in deployment.workers
    )
    return dataclasses.replace(deployment, workers=workers)


def model_key(model: ModelConfig) -> str:
    """What a result depends on, of a model's settings: a worker announces its own in READY,
    and a router shard caches each result under the key of the instance that computed it."""
    return json.dumps(dataclasses.asdict(model), sort_keys=True)


@dataclass(frozen=True)
class Deployment:
    routers: tuple[RouterSpec, ...]  # the shards
    frontend: FrontendSpec | None  # with more than one shard
    workers: tuple[WorkerSpec, ...]
    fronts: tuple[FrontSpec, ...] = ()  # none where server.http and server.grpc are ""

    def shard_numbers(self) -> dict[str, tuple[int, ...]]:
        """Each model's shard numbers: what a reload keeps for the models it keeps."""
        numbers: dict[str, tuple[int, ...]] = {}
        for spec in self.routers:
            numbers[spec.model_name] = (*numbers.get(spec.model_name, ()), spec.shard)
        return numbers


def deployment(
    config: Config,
    plan: Plan,
    topo: CPUTopology,
    runtime_dir: Path,
    numbers: Mapping[str, tuple[int, ...]] | None = None,
) -> Deployment:
    """The processes a Plan becomes: router shards of each model, over its own instances, and a
    frontend where there is more than one shard, or models to route by name (`models:`).
    `runtime_dir` holds the routers' private sockets (workers, and the frontend's hand-out):
    private to this server. Shards are numbered across all models; only those of one model
    hand requests to each other. `numbers`: the running server's shard numbers, by model,
    for a reload (host/shards.plan_model_shards)."""
    served = {m.name: m for m in config.models}
    named = config.named  # requests name their model: a frontend routes by it
    shards = [
        (served[name], shard)
        for name, shard in plan_model_shards(plan, topo, config.server.routers, numbers)
    ]
    frontend = None
    # A shard holding a CurveZMQ endpoint cannot also take plain requests from the HTTP fronts
    # on the same socket: the frontend holds the endpoint, and the shard its private socket.
    if len(shards) > 1 or named or (config.server.curve and config.server.http):
        routes = tuple(
            Route(name, f"ipc://{runtime_dir}/frontend{f'-{name}' * named}.sock")
            for name in plan.models
        )
        frontend = FrontendSpec(
            endpoint=config.server.endpoint,
            routes=routes,
            by_model=named,
            routes_file=f"{runtime_dir}/frontend-routes.json" if named else None,
            max_message_bytes=config.server.max_message_bytes,
            curve=config.server.curve,
            binding=Binding.on(plan.reserved_cpus, topo),
        )
    route = {r.model: r.shards for r in frontend.routes} if frontend else {}
    routers = {}
    numbered = max(shard.index for _, shard in shards) + 1
    for model, shard in shards:
        peers = [other.index for m, other in shards if m is model]
        handovers = tuple(
            f"ipc://{runtime_dir}/shard-{i}.sock" if i in peers else "" for i in range(numbered)
        )
        routers[shard.index] = RouterSpec(
            workers_endpoint=f"ipc://{runtime_dir}/workers-{shard.index}.sock",
            pools=model.pools,
            model=model.model,
            model_name=model.name,
            server=config.server,
            binding=shard.binding,
            drain_timeout_s=config.supervisor.drain_timeout_s,
            shard=shard.index,
            frontend=route.get(model.name),
            handovers=handovers if len(peers) > 1 else (),
            local=f"ipc://{runtime_dir}/shard-{shard.index}.sock",
        )
    router_of = {name: routers[shard.index] for _, shard in shards for name in shard.slots}
    workers = tuple(
        WorkerSpec(
            slot=slot,
            router=router_of[slot.name].workers_endpoint,
            max_tokens=next(p for p in served[slot.model].pools if p.name == slot.pool).max_tokens,
            model=served[slot.model].model,
            isa=topo.isa,
            max_batch=config.server.max_batch,
            max_batch_tokens=config.server.max_batch_tokens,
            heartbeat_ms=config.server.heartbeat_ms,
            liveness=config.server.heartbeat_liveness,
            shard=router_of[slot.name].shard,
            prepared=prepared_path(runtime_dir, served[slot.model]),
        )
        for slot in plan.slots
    )
    fronts = front_specs(config, tuple(routers.values()), runtime_dir)
    return Deployment(tuple(routers.values()), frontend, workers, fronts)


def front_specs(
    config: Config, routers: tuple[RouterSpec, ...], runtime_dir: Path
) -> tuple[FrontSpec, ...]:
    """The fronts (HTTP and gRPC): one per NUMA node with shards (server.http_processes:
    auto), each on its node's shards' reserved CPUs (unpinned where none are reserved), each
    handing every model's requests to that model's shards."""
    if not (config.server.http or config.server.grpc):
        return ()
    homes: dict[CPUSet, CPUSet] = {}  # a node's shards' CPUs, by their nodes
    for spec in routers:
        homes[spec.binding.nodes] = homes.get(spec.binding.nodes, CPUSet()) | spec.binding.cpus
    places = [Binding(cpus, nodes) for nodes, cpus in homes.items()]
    wanted = config.server.http_processes
    count = len(places) if wanted == "auto" else wanted
    models = tuple(
        FrontModel(
            model.name,
            model.model,
            tuple(r.local for r in routers if r.model_name == model.name and r.local),
            prepared_path(runtime_dir, model),
        )
        for model in config.models
    )
    return tuple(
        FrontSpec(
            models=models,
            named=config.named,
            server=config.server,
            index=i,
            stats_file=f"{runtime_dir}/front-{i}.json",
            binding=places[i % len(places)],
            drain_timeout_s=config.supervisor.drain_timeout_s,
        )
        for i in range(count)
    )
