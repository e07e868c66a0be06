"""The one way the running processes change shape: to a wanted deployment, step by step.

At start the wanted deployment is the plan's and nothing runs yet; on a reload (SIGHUP,
reload.py) it is the new config's, and it may remove models (their router shards drain, then
their instances stop), add models (placed on the cores left free, with router shards of their
own) and renew instances, one slot at a time, the old instance stopping only once its
replacement is READY, so that capacity never drops by more than one instance.

A `Reconcile` reads what runs (`Running`, the arbiter's, never written here) and the clock, and
returns the actions that bring it one step nearer the wanted deployment; the arbiter carries
them out. It writes only its own progress: which slots are still to renew, the replacement it
started, the children of removed models it waits for.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from numaserve.config.schema import Config
from numaserve.host.placement import Plan
from numaserve.processes.specs import Deployment, FrontendSpec, WorkerSpec
from numaserve.supervisor.children import Child, ChildAction, Spawn, State, Terminate
from numaserve.supervisor.reporting import Mood

log = logging.getLogger("numaserve.supervisor")


@dataclass(frozen=True)
class Running:
    """What runs now, as the arbiter holds it."""

    config: Config
    plan: Plan
    deployment: Deployment
    workers: Mapping[str, Child]
    routers: tuple[Child, ...]
    frontend: Child | None
    http: tuple[Child, ...]
    preparing: bool  # `numaserve prepare` runs: no process changes before its artifacts


# -- what a reconcile asks the arbiter to do, besides a child's own actions ----------------------


@dataclass(frozen=True)
class Adopt:
    """A new child joins the running set (a shard: with its link), before its Spawn."""

    child: Child


@dataclass(frozen=True)
class Leave:
    """A child leaves the running set; it is reaped as retired. `drain`: SIGTERM it now (a
    removed model's shard); otherwise it is stopped later (its instances, once the shards have
    drained)."""

    child: Child
    drain: bool


@dataclass(frozen=True)
class Replace:
    """The READY replacement takes its slot; the old instance retires and drains."""

    new: Child


@dataclass(frozen=True)
class Reroute:
    """The frontend's routes, written to its routes file, and SIGHUP to read them."""

    spec: FrontendSpec


@dataclass(frozen=True)
class RenewHttp:
    """New HTTP fronts start beside the old on the same port (SO_REUSEPORT); the old drain."""

    fronts: tuple[Child, ...]


@dataclass(frozen=True)
class Hold:
    """Our core ledger entry, holding what `plan` holds."""

    plan: Plan


@dataclass(frozen=True)
class Reshaped:
    """What runs now: the removed models gone, the added ones started."""

    plan: Plan
    config: Config
    deployment: Deployment


@dataclass(frozen=True)
class Started:
    """The start's every process is spawned: liveness looks after them from here."""


@dataclass(frozen=True)
class Renewed:
    """Every slot has its new instance: the reload ends once the shards show it."""


@dataclass(frozen=True)
class Abort:
    why: str


Action = (
    ChildAction
    | Adopt
    | Leave
    | Replace
    | Reroute
    | RenewHttp
    | Hold
    | Reshaped
    | Started
    | Renewed
    | Abort
)


@dataclass
class Reconcile:
    """The running children brought to a wanted deployment, one step each turn of the loop:
    the models leaving drain (their shards) and stop (their instances); then the frontend's
    routes change and every wanted process not yet started starts (at start, all of them; on a
    reload, the models it adds); once those are up, each slot in `renew` gets a new instance,
    one at a time, its old one stopping once the new one is READY.

    What is wanted is decided before (reload.plan_reload, or the start): this runs it, the
    same way whatever form the config was written in."""

    config: Config
    plan: Plan
    deployment: Deployment
    renew: deque[str]  # slots whose instance is still to be replaced, in plan order
    removed: tuple[str, ...] = ()  # models leaving the server
    added: tuple[str, ...] = ()  # models new to it (at start: every one)
    reloading: bool = True  # False: the start, which renews nothing and has nothing to abort to
    left: bool = False  # the removed models' children have left the running set
    draining: list[Child] = field(default_factory=list)  # the removed models' shards
    stopping: list[Child] = field(default_factory=list)  # and their instances, after them
    reshaped: bool = False  # removed models stopped, added ones started
    replacement: Child | None = None  # the new instance of the slot being restarted
    resume: Mood = Mood.SERVING  # the server's mood again if the reload is aborted

    def spec(self, name: str) -> WorkerSpec:
        return next(w for w in self.deployment.workers if w.slot.name == name)

    @classmethod
    def start(cls, config: Config, plan: Plan, deployment: Deployment) -> Reconcile:
        """Every process of the deployment, from none."""
        models = tuple(m.name for m in config.models)
        return cls(config, plan, deployment, deque(), added=models, reloading=False)

    def waits_for(self, child: Child) -> bool:
        """A removed model's shard, still draining: it gets its drain timeout."""
        return child in self.draining

    def advance(self, running: Running, now: float) -> list[Action]:
        """One step, each turn of the loop."""
        if running.preparing:
            return []  # no process changes before the new models' artifacts are ready
        if not self.reshaped:
            actions = self._reshape(running)
            if not self.reshaped:
                return actions
            if not self.reloading:
                return [*actions, Started()]
            if any(isinstance(a, Adopt) and a.child.pool for a in actions):
                return actions  # the changed models roll once the added ones are up
            return actions + self._roll(running, now)
        return self._roll(running, now)

    def _roll(self, running: Running, now: float) -> list[Action]:
        """The next slot's new instance, or the one starting watched."""
        if any(
            w.state == State.STARTING
            for w in running.workers.values()
            if w.model_name in self.added
        ):
            return []  # the changed models roll once the added ones are up
        replacement = self.replacement
        if replacement is None:
            if not self.renew:
                return [Renewed()]
            name = self.renew.popleft()
            self.replacement = Child.for_worker(self.spec(name), running.workers[name].restarts)
            return [Spawn(self.replacement)]
        if replacement.state == State.READY:
            self.replacement = None
            return [Replace(replacement)]
        if (
            replacement.state == State.STARTING
            and now - replacement.started_at > self.config.supervisor.start_timeout_s
        ):
            return [Abort(f"the new {replacement.name} was not ready in time")]
        return []

    def _reshape(self, running: Running) -> list[Action]:
        """Removed models out, then added models in; `reshaped` once done. The removed models'
        shards drain first (their instances finish what they hold), then their instances
        stop; only then do the frontend's routes change and the added models start, on cores
        the removed ones may have held."""
        actions: list[Action] = []
        if self.removed and not self.left:
            self.left = True
            self.draining = [r for r in running.routers if r.model_name in self.removed]
            self.stopping = [w for w in running.workers.values() if w.model_name in self.removed]
            actions += [Leave(child, drain=True) for child in self.draining]
            actions += [Leave(child, drain=False) for child in self.stopping]
            return actions  # the shards have only now been told
        if any(c.pid is not None for c in self.draining):
            return actions
        actions += [
            Terminate(c) for c in self.stopping if c.pid is not None and c.term_sent_at is None
        ]
        if any(c.pid is not None for c in self.stopping):
            return actions
        self.reshaped = True
        return actions + self._take_up(running)

    def _take_up(self, running: Running) -> list[Action]:
        """The new shape: the frontend's routes, the added models' shards and instances, every
        wanted process not yet started started, and our ledger entry."""
        new, old = self.deployment, running.deployment
        actions: list[Action] = []
        frontend = old.frontend
        if (
            running.frontend
            and frontend
            and new.frontend
            and new.frontend.routes != frontend.routes
        ):
            frontend = dataclasses.replace(frontend, routes=new.frontend.routes)
            actions.append(Reroute(frontend))
        shards = {child.shard for child in running.routers}
        joining = [
            Child.for_shard(spec)
            for spec in new.routers
            if spec.model_name in self.added and spec.shard not in shards
        ]
        joining += [
            Child.for_worker(spec)
            for spec in new.workers
            if spec.slot.model in self.added and spec.slot.name not in running.workers
        ]
        actions += [Adopt(child) for child in joining]
        fresh = [
            *running.routers,
            *[c for c in joining if not c.pool],
            *([running.frontend] if running.frontend else []),
            *running.http,
            *running.workers.values(),
            *[c for c in joining if c.pool],
        ]
        # Never started: the start's every process, a reload's added ones.
        actions += [
            Spawn(c)
            for c in fresh
            if c.state is State.STOPPED and c.pid is None and not c.started_at
        ]
        if new.http != old.http:
            actions.append(RenewHttp(tuple(Child.for_http(spec) for spec in new.http)))
        if self.plan != running.plan:
            actions.append(Hold(self.plan))
        # What runs now: the kept shards as they were started (their settings apply at a
        # restart), the added ones, and the new instances' specs.
        kept = {*self.removed, *self.added}
        routers = [s for s in old.routers if s.model_name not in kept]
        routers += [s for s in new.routers if s.model_name in self.added]
        routers.sort(key=lambda spec: spec.shard)
        deployment = Deployment(tuple(routers), frontend, new.workers, new.http)
        return [*actions, Reshaped(self.plan, self.config, deployment)]
