"""A reload (SIGHUP): what the config file read again wants, carried out step by step
(rollout.py) while the server serves.

One algorithm, whatever form the config is in (`model:` is one model named `default`): the
models the file no longer names are removed, those it newly names are added on the cores left
free, the kept ones stay where they are (their placement changes only at a restart), and each
instance whose spec changed renews, one at a time. The one difference: a server of one unnamed
model renews every instance, since new weights at the same path show in no spec.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from numaserve.config.ports import Ports
from numaserve.config.runtimes import needs_prepare
from numaserve.config.schema import Config, ConfigError, load_config
from numaserve.host.ledger import Ledger, held_cpus, without
from numaserve.host.placement import PlacementError, Plan, replan
from numaserve.host.topology import CPUTopology
from numaserve.processes.prepared import readable
from numaserve.processes.specs import Deployment, deployment, with_digests
from numaserve.supervisor.children import Child, State
from numaserve.supervisor.reporting import Mood
from numaserve.supervisor.rollout import Running, Wanted

log = logging.getLogger("numaserve.supervisor")


@dataclass(frozen=True)
class Site:
    """Where a server runs, fixed at its start: its config file (read again at each reload),
    the ports its command line moved, the machine, its private runtime directory and the
    host's core ledger."""

    config_path: str
    topo: CPUTopology
    runtime_dir: Path
    ports: Ports
    ledger: Ledger | None = None

    def deploy(
        self, config: Config, plan: Plan, numbers: dict[str, tuple[int, ...]] | None = None
    ) -> Deployment:
        return deployment(config, plan, self.topo, self.runtime_dir, numbers)


def with_records(deployment: Deployment) -> Deployment:
    """`deployment` with each instance's spec carrying its pool's digest of what `numaserve
    prepare` resolved, where its record has been written."""
    records = readable(w.prepared for w in deployment.workers if w.prepared)
    return with_digests(deployment, records)


def needs_new_artifacts(current: Config, new: Config) -> bool:
    """Whether a reload to `new` must run `numaserve prepare` before any instance (re)starts:
    a model that needs it and whose settings changed, or that is new."""
    before = {m.name: m.model for m in current.models}
    return any(
        needs_prepare(m.backend, m.quantize) and m.model != before.get(m.name) for m in new.models
    )


def plan_reload(site: Site, running: Running, mood: Mood) -> Wanted | None:
    """The reload the config file asks for now, with what it cannot apply logged; None (and
    an error logged) where the file cannot be read or placed. `mood`: the server's, to go
    back to if the reload is aborted."""
    current, ledger, workers = running.config, site.ledger, running.roster.workers
    try:
        config = site.ports.apply(load_config(site.config_path))
        removed, added = model_changes(current, config)
        with ledger.locked() if ledger else nullcontext():
            plan = _replan(site, running.plan, config)
            new = with_records(
                site.deploy(_keep_shards(config, current), plan, running.deployment.shard_numbers())
            )
            if ledger and plan != running.plan:  # ours until the reload ends
                ledger.update(held_cpus(running.plan, site.topo) | held_cpus(plan, site.topo))
    except (ConfigError, PlacementError, OSError) as e:
        log.error("reload failed, keeping the running config: %s", e, extra={"event": "reload"})
        return None
    for change in _unapplied(current, config, running.deployment, new):
        log.warning("reload: %s; it applies at the next restart", change, extra={"event": "reload"})
    renew = renewing(config, new, workers)
    kept = sorted(
        {w.slot.model for w in new.workers if w.slot.name in workers}
        - {workers[name].model_name for name in renew}
    )
    log.info(
        "reload: %srestarting %d instance(s) one at a time%s",
        "".join(
            f"{what} model(s) {', '.join(names)}; "
            for what, names in (("removing", removed), ("adding", added))
            if names
        ),
        len(renew),
        f"; unchanged, kept running: {', '.join(kept)}" if kept else "",
        extra={"event": "reload"},
    )
    generation = running.generation + 1
    return Wanted(config, plan, new, renew, removed, added, resume=mood, generation=generation)


def renewing(config: Config, new: Deployment, workers: Mapping[str, Child]) -> tuple[str, ...]:
    """The serving slots whose instance renews: where its spec changed, by value (its model's
    settings, its pool's, or what `numaserve prepare` resolved for its pool: its record's
    digest). A server of one unnamed model (`model:`) renews every one: new weights at the
    same path show in no spec before they are prepared, and SIGHUP after copying them in
    (numaserve.testing's `reload` too) loads them."""
    return tuple(
        w.slot.name
        for w in new.workers
        if w.slot.name in workers
        and workers[w.slot.name].state == State.READY
        and (not config.named or workers[w.slot.name].spec != w)
    )


def _unapplied(current: Config, config: Config, running: Deployment, new: Deployment) -> list[str]:
    changes = unapplied_changes(running, new)
    if config.server.routers != current.server.routers:
        changes.append("server.routers changed")
    placed = ("reserved_cores", "smt")
    changes += [
        f"placement.{key} changed (the instances kept stay where they are)"
        for key in placed
        if getattr(config.placement, key) != getattr(current.placement, key)
    ]
    weights = {m.name: m.weight for m in current.models}
    changes += [
        f"model {m.name!r}'s weight changed (instances stay where they are)"
        for m in config.models
        if m.name in weights and m.weight != weights[m.name]
    ]
    return changes


def _replan(site: Site, plan: Plan, config: Config) -> Plan:
    """A `models:` reload's plan: the kept models' instances where they are, the added
    ones on whole cores free of them and of other servers (the ledger, read again under
    its lock: they may have started since we did)."""
    holders = site.ledger.holders() if site.ledger else []
    return replan(plan, without(site.topo, holders), config.placement, config.models)


def _keep_shards(config: Config, running: Config) -> Config:
    """`config` with the running server.routers: the kept models keep their shards (a
    change applies at a restart)."""
    server = dataclasses.replace(config.server, routers=running.server.routers)
    return dataclasses.replace(config, server=server)


def model_changes(current: Config, new: Config) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(removed, added) model names (a `model:` config's one model is `default`). Raises
    ConfigError for a switch between `model:` and `models:`, and PlacementError where a kept
    model's pools would move its running instances: each needs a restart."""
    if new.named != current.named:
        forms = ("`models:`", "`model:`") if current.named else ("`model:`", "`models:`")
        raise ConfigError(
            f"the config went from {forms[0]} to {forms[1]}, which changes how requests name "
            "their model: restart the server for that"
        )
    before = {m.name: m for m in current.models}
    after = {m.name: m for m in new.models}

    def shape(name: str, models: dict) -> list:
        return [
            (p.name, p.cores_per_instance, p.instances, p.core_types) for p in models[name].pools
        ]

    for name in before.keys() & after.keys():
        if shape(name, before) != shape(name, after):
            readd = ", or remove the model in one reload and add it back in the next"
            raise PlacementError(
                f"model {name!r}: its pools' names, instances, cores_per_instance or core_types "
                "changed, which would move its running instances. Restart the server for "
                f"that{readd if new.named else ''}"
            )
    removed = tuple(name for name in before if name not in after)
    added = tuple(name for name in after if name not in before)
    return removed, added


def unapplied_changes(current: Deployment, new: Deployment) -> list[str]:
    """What a reload cannot change while serving; it applies at the next restart. Only the
    kept models' shards are compared (models may come and go), the frontend's routes change
    live, and the kept models' instances stay where they are (host/placement.replan)."""
    kept = {r.model_name for r in current.routers} & {r.model_name for r in new.routers}

    def routers(d: Deployment) -> list[str]:
        return [r.to_json() for r in d.routers if r.model_name in kept]

    def frontend(d: Deployment) -> object:
        front = d.frontend
        return front and (front.endpoint, front.max_message_bytes, front.curve)

    if routers(new) != routers(current) or frontend(new) != frontend(current):
        return ["router and server settings changed"]
    return []
