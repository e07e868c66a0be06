"""The one way the running processes change shape: to a wanted deployment, step by step.

At start the wanted deployment is the plan's and nothing runs yet; on a reload (SIGHUP,
reload.py) it is the new config's, and it may remove models (their router shards drain, then
their instances stop), add models (placed on the cores left free, with router shards of their
own) and renew instances, one slot at a time, the old instance stopping only once its
replacement is READY, so that capacity never drops by more than one instance.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from numaserve import exitcodes
from numaserve.config import Config
from numaserve.host.ledger import held_cpus
from numaserve.host.placement import Plan
from numaserve.specs import Deployment, WorkerSpec
from numaserve.supervisor.children import Child, State, describe_exit
from numaserve.supervisor.reporting import Mood

if TYPE_CHECKING:
    from numaserve.supervisor.arbiter import Supervisor

log = logging.getLogger("numaserve.supervisor")


@dataclass
class Reconcile:
    """The running children brought to a wanted deployment, one step each turn of the loop:
    the models leaving drain (their shards) and stop (their instances); then the frontend's
    routes change and every wanted process not yet started starts (at start, all of them; on a
    reload, the models it adds); once those are up, each slot in `renew` gets a new instance,
    one at a time, its old one stopping once the new one is READY; and a reload is done once
    every serving shard has answered the slot table that shows it.

    What is wanted is decided before (reload.plan_reload, or the start): this runs it, the
    same way whatever form the config was written in."""

    config: Config
    plan: Plan
    deployment: Deployment
    renew: deque[str]  # slots whose instance is still to be replaced, in plan order
    removed: tuple[str, ...] = ()  # models leaving the server
    added: tuple[str, ...] = ()  # models new to it (at start: every one)
    reloading: bool = True  # False: the start, which renews nothing and has nothing to abort to
    draining: list[Child] = field(default_factory=list)  # the removed models' shards
    stopping: list[Child] = field(default_factory=list)  # and their instances, after them
    reshaped: bool = False  # removed models stopped, added ones started
    replacement: Child | None = None  # the new instance of the slot being restarted
    final_table: int | None = None  # the slot table sent once every slot has its new instance
    resume: Mood = Mood.SERVING  # the server's mood again if the reload is aborted

    def spec(self, name: str) -> WorkerSpec:
        return next(w for w in self.deployment.workers if w.slot.name == name)

    @classmethod
    def start(cls, sup: Supervisor) -> Reconcile:
        """Every process of the deployment, from none."""
        deployment, models = sup.deployment, tuple(m.name for m in sup.config.models)
        return cls(sup.config, sup.plan, deployment, deque(), added=models, reloading=False)

    def prepared(self, sup: Supervisor, code: int) -> None:
        """`numaserve prepare` exited with `code`: the start goes on, or the server cannot
        start; a reload goes on, or is aborted."""
        if self.reloading and code != 0:
            self.abort(sup, f"the changed model could not be prepared (exit {code})")
        elif self.reloading:
            log.info("reload: the changed model's artifact is ready", extra={"event": "reload"})
        elif code != 0:
            log.error(
                "fatal: the model could not be prepared (%s; its log lines above say why)",
                describe_exit(code, killed_by_us=False),
                extra={"event": "fatal"},
            )
            sup.exit_code = exitcodes.MODEL
            sup.reconcile = None  # nothing starts
        else:
            sup.mood = Mood.STARTING
            self.advance(sup, sup.system.now())

    def advance(self, sup: Supervisor, now: float) -> None:
        """One step, each turn of the loop."""
        if sup.prepare is not None:
            return  # no process changes before the new models' artifacts are ready
        if not (self.reshaped or self._reshape(sup)):
            return
        if not self.reloading:
            sup.reconcile = None  # started: liveness looks after them from here
            return
        if any(
            w.state == State.STARTING for w in sup.workers.values() if w.model_name in self.added
        ):
            return  # the changed models roll once the added ones are up
        if self.replacement is None:
            if not self.renew:
                if self._shards_show_final_table(sup):
                    self._done(sup)
                return
            name = self.renew.popleft()
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
        sup.reconcile = None
        log.info("reload: done", extra={"event": "reload"})
        sup.mood = Mood.STARTING  # READY=1 again for systemd, once it serves

    def abort(self, sup: Supervisor, why: str) -> None:
        """Back to what runs: the replacement starting and the model being prepared stop."""
        sup.reconcile = None
        sup.mood = self.resume
        if not self.reshaped and self.plan != sup.plan:
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
        """The new shape: the frontend's routes, the added models' shards and instances, every
        wanted process not yet started started, and our ledger entry."""
        new, running = self.deployment, sup.deployment
        frontend = running.frontend
        if sup.frontend and frontend and new.frontend and new.frontend.routes != frontend.routes:
            frontend = dataclasses.replace(frontend, routes=new.frontend.routes)
            sup.system.write_file(frontend.routes_file, frontend.to_json())
            sup.frontend.spec, sup.frontend.argv = frontend, frontend.argv()  # a restart too
            sup.signal(sup.frontend, signal.SIGHUP)
        shards = {child.shard for child in sup.routers}
        for spec in new.routers:
            if spec.model_name in self.added and spec.shard not in shards:
                sup.add_shard(spec)
        for spec in new.workers:
            if spec.slot.model in self.added and spec.slot.name not in sup.workers:
                sup.workers[spec.slot.name] = Child.for_worker(spec)
        for child in [*sup.front(), *sup.workers.values()]:
            if child.state is State.STOPPED and child.pid is None and not child.started_at:
                sup.spawn(child)  # never started: the start's every process, a reload's added
        if new.http != running.http:
            _renew_http(sup, new)
        if self.plan != sup.plan:
            _hold(sup, self.plan)
        # What runs now: the kept shards as they were started (their settings apply at a
        # restart), the added ones, and the new instances' specs.
        routers = [s for s in running.routers if s.model_name not in {*self.removed, *self.added}]
        routers += [s for s in new.routers if s.model_name in self.added]
        routers.sort(key=lambda spec: spec.shard)
        sup.plan, sup.config = self.plan, self.config  # a retry compares with what runs now
        sup.deployment = Deployment(tuple(routers), frontend, new.workers, new.http)


def _renew_http(sup: Supervisor, new: Deployment) -> None:
    """The HTTP fronts for the new models: each new one starts beside the old, on the same port
    (SO_REUSEPORT), and the old one drains; no connection is refused meanwhile."""
    old = {child.spec.index: child for child in sup.http}
    sup.http = [Child.for_http(spec) for spec in new.http]
    for child in sup.http:
        sup.spawn(child)
    for child in old.values():
        sup.retired.append(child)
        sup.terminate(child)


def _hold(sup: Supervisor, plan: Plan) -> None:
    """Our ledger entry, holding what `plan` holds."""
    if not sup.ledger:
        return
    try:
        with sup.ledger.locked():
            sup.ledger.update(held_cpus(plan, sup.topo))
    except OSError as e:
        log.error("the core ledger entry could not be updated: %s", e, extra={"event": "ledger"})
