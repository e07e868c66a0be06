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
from typing import TYPE_CHECKING

from numaserve.config import Config, ConfigError, load_config
from numaserve.config_precision import needs_prepare
from numaserve.host.ledger import held_cpus, without
from numaserve.host.placement import PlacementError, Plan, plan_placement, replan
from numaserve.specs import Deployment
from numaserve.supervisor.children import State
from numaserve.supervisor.reconcile import Reconcile
from numaserve.supervisor.reporting import Mood

if TYPE_CHECKING:
    from numaserve.supervisor.arbiter import Supervisor

log = logging.getLogger("numaserve.supervisor")


def begin_reload(sup: Supervisor) -> None:
    """SIGHUP: the config file read again and its reload begun, unless one is under way."""
    if sup.stopping:
        return
    if sup.reconcile or sup.prepare:
        what = "reload" if sup.reconcile else "preparing the model"
        log.info("%s already under way; SIGHUP ignored", what, extra={"event": "reload"})
        return
    sup.reconcile = plan_reload(sup)
    if sup.reconcile is None:
        return
    sup.mood = Mood.RELOADING
    sup.notifier.reloading("reloading")
    before = {m.name: m.model for m in sup.config.models}
    new = sup.reconcile.config.models
    if any(needs_prepare(m.backend, m.quantize) and m.model != before.get(m.name) for m in new):
        sup.start_prepare()


def plan_reload(sup: Supervisor) -> Reconcile | None:
    """The reload the config file asks for now, with what it cannot apply logged; None (and
    an error logged) where the file cannot be read or placed."""
    current = sup.config
    try:
        config = sup.ports.apply(load_config(sup.config_path))
        by_model = config.named and current.named
        removed, added = model_changes(current, config) if by_model else ((), ())
        with sup.ledger.locked() if sup.ledger and by_model else nullcontext():
            plan = _replan(sup, config) if by_model else _plan(sup, config)
            shaped = _keep_shards(config, current) if by_model else config
            new = sup.deploy(shaped, plan, sup.deployment.shard_numbers())
            if sup.ledger and by_model and plan != sup.plan:  # ours until the reload ends
                both = {*held_cpus(sup.plan, sup.topo), *held_cpus(plan, sup.topo)}
                sup.ledger.update(tuple(sorted(both)))
    except (ConfigError, PlacementError, OSError) as e:
        log.error("reload failed, keeping the running config: %s", e, extra={"event": "reload"})
        return None
    for change in _unapplied(current, config, sup.deployment, new, by_model):
        log.warning("reload: %s; it applies at the next restart", change, extra={"event": "reload"})
    # `model:`: every instance restarts (new weights at the same path load too). `models:`:
    # only the instances whose model's settings changed; the others keep serving.
    renew = deque(
        w.slot.name
        for w in new.workers
        if w.slot.name in sup.workers
        and sup.workers[w.slot.name].state == State.READY
        and (not by_model or sup.workers[w.slot.name].argv != w.argv())
    )
    kept = sorted(
        {w.slot.model for w in new.workers if w.slot.name in sup.workers}
        - {sup.workers[name].model_name for name in renew}
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
    return Reconcile(config, plan, new, renew, removed, added, resume=sup.mood)


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


def _plan(sup: Supervisor, config: Config) -> Plan:
    return plan_placement(sup.topo, config.placement, config.models, config.named)


def _replan(sup: Supervisor, config: Config) -> Plan:
    """A `models:` reload's plan: the kept models' instances where they are, the added
    ones on whole cores free of them and of other servers (the ledger, read again under
    its lock: they may have started since we did)."""
    holders = sup.ledger.holders() if sup.ledger else []
    return replan(sup.plan, without(sup.topo, holders), config.placement, config.models)


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
