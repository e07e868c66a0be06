"""A reload (SIGHUP): what the config file read again wants, carried out by a Reconcile
(reconcile.py) while the server serves.

What a reload renews depends on what the file's models mean: a server whose requests name their
model (`models:`) keeps the models it keeps where they are and renews only the instances whose
model's settings changed, and may remove and add models; a server of one unnamed model
(`model:`) renews every instance (new weights at the same path load too).
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from numaserve.config.ports import Ports
from numaserve.config.precisions import needs_prepare
from numaserve.config.schema import Config, ConfigError, load_config
from numaserve.host.ledger import Ledger, held_cpus, without
from numaserve.host.placement import PlacementError, Plan, plan_placement, replan
from numaserve.host.topology import CPUTopology
from numaserve.processes.specs import Deployment, deployment
from numaserve.supervisor.children import State
from numaserve.supervisor.reconcile import Reconcile, Running
from numaserve.supervisor.reporting import Mood

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


def needs_new_artifacts(current: Config, new: Config) -> bool:
    """Whether a reload to `new` must run `numaserve prepare` before any instance (re)starts:
    a model that needs it and whose settings changed, or that is new."""
    before = {m.name: m.model for m in current.models}
    return any(
        needs_prepare(m.backend, m.quantize) and m.model != before.get(m.name) for m in new.models
    )


def plan_reload(site: Site, running: Running, mood: Mood) -> Reconcile | None:
    """The reload the config file asks for now, with what it cannot apply logged; None (and
    an error logged) where the file cannot be read or placed. `mood`: the server's, to go
    back to if the reload is aborted."""
    current, ledger, workers = running.config, site.ledger, running.workers
    try:
        config = site.ports.apply(load_config(site.config_path))
        by_model = config.named and current.named
        removed, added = model_changes(current, config) if by_model else ((), ())
        with ledger.locked() if ledger and by_model else nullcontext():
            plan = (
                _replan(site, running.plan, config)
                if by_model
                else plan_placement(site.topo, config.placement, config.models, config.named)
            )
            shaped = _keep_shards(config, current) if by_model else config
            new = site.deploy(shaped, plan, running.deployment.shard_numbers())
            if ledger and by_model and plan != running.plan:  # ours until the reload ends
                both = {*held_cpus(running.plan, site.topo), *held_cpus(plan, site.topo)}
                ledger.update(tuple(sorted(both)))
    except (ConfigError, PlacementError, OSError) as e:
        log.error("reload failed, keeping the running config: %s", e, extra={"event": "reload"})
        return None
    for change in _unapplied(current, config, running.deployment, new, by_model):
        log.warning("reload: %s; it applies at the next restart", change, extra={"event": "reload"})
    # `model:`: every instance restarts (new weights at the same path load too). `models:`:
    # only the instances whose model's settings changed; the others keep serving.
    renew = deque(
        w.slot.name
        for w in new.workers
        if w.slot.name in workers
        and workers[w.slot.name].state == State.READY
        and (not by_model or workers[w.slot.name].argv != w.argv())
    )
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
        f"; unchanged, kept running: {', '.join(kept)}" if by_model and kept else "",
        extra={"event": "reload"},
    )
    return Reconcile(config, plan, new, renew, removed, added, resume=mood)


def _unapplied(
    current: Config, config: Config, running: Deployment, new: Deployment, by_model: bool
) -> list[str]:
    changes = unapplied_changes(running, new, by_model)
    if by_model and config.server.routers != current.server.routers:
        changes.append("server.routers changed")
    if by_model:
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
    """(removed, added) model names, for two `models:` configs. Raises PlacementError where a
    kept model's pools would move its running instances: that needs a restart."""
    before = {m.name: m for m in current.models}
    after = {m.name: m for m in new.models}

    def shape(name: str, models: dict) -> list:
        return [
            (p.name, p.cores_per_instance, p.instances, p.core_types) for p in models[name].pools
        ]

    for name in before.keys() & after.keys():
        if shape(name, before) != shape(name, after):
            raise PlacementError(
                f"model {name!r}: its pools' names, instances, cores_per_instance or core_types "
                "changed, which would move its running instances. Restart the server for that, "
                "or remove the model in one reload and add it back in the next"
            )
    removed = tuple(name for name in before if name not in after)
    added = tuple(name for name in after if name not in before)
    return removed, added


def unapplied_changes(current: Deployment, new: Deployment, by_model: bool = False) -> list[str]:
    """What a reload cannot change while serving; it applies at the next restart.
    `by_model`: two `models:` configs, where models may come and go: only the kept models'
    shards are compared, the frontend's routes change live, and the kept models' instances
    stay where they are (host/placement.replan)."""
    changes = []
    kept = {r.model_name for r in current.routers} & {r.model_name for r in new.routers}

    def routers(d: Deployment) -> list[str]:
        return [r.to_json() for r in d.routers if not by_model or r.model_name in kept]

    def frontend(d: Deployment) -> object:
        if d.frontend is None or not by_model:
            return d.frontend
        return (d.frontend.endpoint, d.frontend.max_message_bytes, d.frontend.curve)

    if routers(new) != routers(current) or frontend(new) != frontend(current):
        changes.append("router and server settings changed")
    names = {w.slot.name for w in new.workers}
    if not by_model and names != {w.slot.name for w in current.workers}:
        changes.append("the placement changed")
    return changes
