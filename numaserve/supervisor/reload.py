"""A reload (SIGHUP): the new config applied while the server serves.

Each READY slot whose instance changed is replaced by one started from the new config, one
slot at a time, and the old instance stops only once its replacement is READY, so that
capacity never drops by more than one instance. With `models:`, a reload may also remove
models (their router shards drain, then their instances stop) and add models (placed on the
cores left free, with router shards of their own), while the models it keeps serve on.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from numaserve.config import Config, ConfigError, load_config
from numaserve.host.ledger import held_cpus, without
from numaserve.host.placement import PlacementError, Plan, plan_placement, replan
from numaserve.specs import Deployment, WorkerSpec
from numaserve.supervisor.children import Child, State
from numaserve.supervisor.reporting import Mood

if TYPE_CHECKING:
    from numaserve.supervisor.arbiter import Supervisor

log = logging.getLogger("numaserve.supervisor")


@dataclass
class Reload:
    config: Config
    plan: Plan
    deployment: Deployment
    waiting: deque[str]  # slots still to restart, in plan order
    by_model: bool = False  # two `models:` configs: models may be removed and added
    removed: tuple[str, ...] = ()  # models leaving the server
    added: tuple[str, ...] = ()  # models new to it
    draining: list[Child] = field(default_factory=list)  # the removed models' shards
    stopping: list[Child] = field(default_factory=list)  # and their instances, after them
    reshaped: bool = False  # removed models stopped, added ones started
    replacement: Child | None = None  # the new instance of the slot being restarted
    final_table: int | None = None  # the slot table sent once every slot has its new instance
    resume: Mood = Mood.SERVING  # the server's mood again if the reload is aborted

    def spec(self, name: str) -> WorkerSpec:
        return next(w for w in self.deployment.workers if w.slot.name == name)

    def advance(self, sup: Supervisor, now: float) -> None:
        """One step of the reload, each turn of the loop."""
        if sup.prepare is not None:
            return  # no process changes before the new models' artifacts are ready
        if self.by_model and not (self.reshaped or self._reshape(sup)):
            return
        if any(
            w.state == State.STARTING for w in sup.workers.values() if w.model_name in self.added
        ):
            return  # the changed models roll once the added ones are up
        if self.replacement is None:
            if not self.waiting:
                if self._shards_show_final_table(sup):
                    self._done(sup)
                return
            name = self.waiting.popleft()
            self.replacement = Child.for_worker(self.spec(name))
            self.replacement.restarts = sup.workers[name].restarts
            sup.spawn(self.replacement)
        elif self.replacement.state == State.READY:
            old = sup.workers[self.replacement.name]
            sup.workers[old.name] = self.replacement
            self.replacement = None
            sup.retired.append(old)
            sup.terminate(old)
        elif (
            self.replacement.state == State.STARTING
            and now - self.replacement.started_at > sup.config.supervisor.start_timeout_s
        ):
            self.abort(sup, f"the new {self.replacement.name} was not ready in time")

    def _done(self, sup: Supervisor) -> None:
        sup.config = self.config
        sup.reload = None
        log.info("reload: done", extra={"event": "reload"})
        sup.mood = Mood.STARTING  # READY=1 again for systemd, once it serves

    def abort(self, sup: Supervisor, why: str) -> None:
        """Back to what runs: the replacement starting and the model being prepared stop."""
        sup.reload = None
        sup.mood = self.resume
        if self.by_model and not self.reshaped and self.plan != sup.plan:
            _hold(sup, sup.plan)  # the cores it would have added are not ours
        if sup.prepare is not None:
            sup.retired.append(sup.prepare)  # reaped as a replaced process
            sup.terminate(sup.prepare)
            sup.prepare = None
        if self.replacement and self.replacement.pid is not None:
            sup.retired.append(self.replacement)
            sup.terminate(self.replacement)
        log.error(
            "reload aborted (%s); the running instances keep serving",
            why,
            extra={"event": "reload"},
        )

    def _shards_show_final_table(self, sup: Supervisor) -> bool:
        """Whether every serving shard has answered the slot table of the reload's end, so
        that `numaserve status` asked after `reload: done` shows the new instances."""
        if self.final_table is None:
            sup.send_slots()
            self.final_table = sup.shards.sent
        serving = [v for v in sup.shards if v.child.state == State.READY]
        return sup.shards.all_acked(self.final_table, serving)

    def _reshape(self, sup: Supervisor) -> bool:
        """Removed models out, then added models in; True once done. The removed models'
        shards drain first (their instances finish what they hold), then their instances
        stop; only then do the frontend's routes change and the added models start, on cores
        the removed ones may have held."""
        if self.removed and not (self.draining or self.stopping):
            for view in [v for v in sup.shards if v.child.model_name in self.removed]:
                sup.shards.views.remove(view)
                view.link.close()
                self.draining.append(view.child)
                sup.terminate(view.child)
            self.stopping = [w for w in sup.workers.values() if w.model_name in self.removed]
            for child in self.stopping:
                del sup.workers[child.name]
            sup.retired += [*self.draining, *self.stopping]
        if any(c.pid is not None for c in self.draining):
            return False
        for child in self.stopping:
            if child.pid is not None and child.term_sent_at is None:
                sup.terminate(child)
        if any(c.pid is not None for c in self.stopping):
            return False
        self._take_up(sup)
        self.reshaped = True
        return True

    def _take_up(self, sup: Supervisor) -> None:
        """The new shape: the frontend's routes, the added models' shards and instances, and
        our ledger entry."""
        new, running = self.deployment, sup.deployment
        frontend = running.frontend
        if sup.frontend and frontend and new.frontend and new.frontend.routes != frontend.routes:
            frontend = dataclasses.replace(frontend, routes=new.frontend.routes)
            sup.system.write_file(frontend.routes_file, frontend.to_json())
            sup.frontend.spec, sup.frontend.argv = frontend, frontend.argv()  # a restart too
            sup.signal(sup.frontend, signal.SIGHUP)
        for spec in new.routers:
            if spec.model_name in self.added:
                sup.spawn(sup.add_shard(spec).child)
        for spec in new.workers:
            if spec.slot.model in self.added:
                sup.workers[spec.slot.name] = Child.for_worker(spec)
                sup.spawn(sup.workers[spec.slot.name])
        if self.plan != sup.plan:
            _hold(sup, self.plan)
        # What runs now: the kept shards as they were started (their settings apply at a
        # restart), the added ones, and the new instances' specs.
        routers = [s for s in running.routers if s.model_name not in self.removed]
        routers += [s for s in new.routers if s.model_name in self.added]
        routers.sort(key=lambda spec: spec.shard)
        sup.plan, sup.config = self.plan, self.config  # a retry compares with what runs now
        sup.deployment = Deployment(tuple(routers), frontend, new.workers)


def begin_reload(sup: Supervisor) -> None:
    """SIGHUP: the config file read again and its reload begun, unless one is under way."""
    if sup.stopping:
        return
    if sup.reload or sup.prepare:
        what = "reload" if sup.reload else "preparing the model"
        log.info("%s already under way; SIGHUP ignored", what, extra={"event": "reload"})
        return
    sup.reload = plan_reload(sup)
    if sup.reload is None:
        return
    sup.mood = Mood.RELOADING
    sup.notifier.reloading("reloading")
    before = {m.name: m.model for m in sup.config.models}
    new = sup.reload.config.models
    if any(m.backend == "onnxruntime" and m.model != before.get(m.name) for m in new):
        sup.start_prepare()


def _hold(sup: Supervisor, plan: Plan) -> None:
    """Our ledger entry, holding what `plan` holds."""
    if not sup.ledger:
        return
    try:
        with sup.ledger.locked():
            sup.ledger.update(held_cpus(plan, sup.topo))
    except OSError as e:
        log.error("the core ledger entry could not be updated: %s", e, extra={"event": "ledger"})


def plan_reload(sup: Supervisor) -> Reload | None:
    """The reload the config file asks for now, with what it cannot apply logged; None (and
    an error logged) where the file cannot be read or placed."""
    current = sup.config
    try:
        config = load_config(sup.config_path)
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
    waiting = deque(
        w.slot.name
        for w in new.workers
        if w.slot.name in sup.workers
        and sup.workers[w.slot.name].state == State.READY
        and (not by_model or sup.workers[w.slot.name].argv != w.argv())
    )
    kept = sorted(
        {w.slot.model for w in new.workers if w.slot.name in sup.workers}
        - {sup.workers[name].model_name for name in waiting}
    )
    log.info(
        "reload: %srestarting %d instance(s) one at a time%s",
        "".join(
            f"{what} model(s) {', '.join(names)}; "
            for what, names in (("removing", removed), ("adding", added))
            if names
        ),
        len(waiting),
        f"; unchanged, kept running: {', '.join(kept)}" if by_model and kept else "",
        extra={"event": "reload"},
    )
    return Reload(config, plan, new, waiting, by_model, removed, added, resume=sup.mood)


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
