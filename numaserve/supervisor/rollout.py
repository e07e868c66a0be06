"""A rollout: the one way the running processes change shape, to a wanted deployment, step
by step.

At start the wanted deployment is the plan's and nothing runs yet; on a reload (SIGHUP,
reload.py) it is the new config's, and it may remove models (their router shards drain, then
their instances stop), add models (placed on the cores left free, with router shards of their
own) and renew instances, one slot at a time, the old instance stopping only once its
replacement is READY, so that capacity never drops by more than one instance.

`next_steps` is a pure function of the `Wanted` deployment (plain data, decided once), what
runs (`Running`, the arbiter's) and the clock: it returns the actions that bring what runs one
step nearer, and the arbiter carries them out. It keeps no progress of its own, and tracks
none by the identity of a live object: how far a reload has come is read from what runs, by
value (the removed models' children still in the running set or still alive among the retired
ones; the generation of the running shape, one more at each reload once it is taken up; the
replacement starting; which of the slots to renew still run an instance of an older
generation).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from numaserve.config.schema import Config
from numaserve.host.placement import Plan
from numaserve.processes.specs import Deployment, FrontendSpec, WorkerSpec
from numaserve.supervisor.children import Child, ChildAction, Spawn, State, Terminate
from numaserve.supervisor.reporting import Mood
from numaserve.supervisor.roster import Roster

log = logging.getLogger("numaserve.supervisor")


@dataclass(frozen=True)
class Shape:
    """What the server runs as, one value: its config, the plan placed from it, the
    processes' specs deployed from both, and which generation of them (the start's 0, one
    more each reload that reshapes). The arbiter replaces it whole."""

    config: Config
    plan: Plan
    deployment: Deployment
    generation: int = 0


@dataclass(frozen=True)
class Running:
    """What runs now, as the arbiter holds it."""

    config: Config
    plan: Plan
    deployment: Deployment
    roster: Roster  # the arbiter's, read here, changed only by the actions it carries out
    preparing: bool  # `numaserve prepare` runs: no process changes before its artifacts
    replacement: Child | None = None  # a reload's new instance of a slot, while it starts
    generation: int = 0  # of the shape that runs: the start's 0, one more each reload's


# -- what a rollout asks the arbiter to do, besides a child's own actions -----------------------


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
class Renew:
    """A slot's new instance starts beside the old one, as the replacement."""

    new: Child


@dataclass(frozen=True)
class Replace:
    """The READY replacement takes its slot; the old instance retires and drains."""

    new: Child


@dataclass(frozen=True)
class Reroute:
    """The frontend's routes, written to its routes file, and SIGHUP to read them."""

    spec: FrontendSpec


@dataclass(frozen=True)
class RenewFronts:
    """New fronts start beside the old on the same ports (SO_REUSEPORT); the old drain."""

    fronts: tuple[Child, ...]


@dataclass(frozen=True)
class Hold:
    """Our core ledger entry, holding what `plan` holds."""

    plan: Plan


@dataclass(frozen=True)
class Reshaped:
    """What runs now: the removed models gone, the added ones started."""

    shape: Shape


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
    | Renew
    | Replace
    | Reroute
    | RenewFronts
    | Hold
    | Reshaped
    | Started
    | Renewed
    | Abort
)


@dataclass(frozen=True)
class Wanted:
    """A deployment to bring the running children to: the start's (every process, from none)
    or a reload's (reload.plan_reload): the models leaving drain (their shards) and stop (their
    instances); then the frontend's routes change and every wanted process not yet started
    starts (at start, all of them; on a reload, the models it adds); once those are up, each
    slot in `renew` gets a new instance, one at a time, its old one stopping once the new one
    is READY. The same steps whatever form the config was written in."""

    config: Config
    plan: Plan
    deployment: Deployment
    renew: tuple[str, ...] = ()  # the slots whose instances a reload replaces, in plan order
    removed: tuple[str, ...] = ()  # models leaving the server
    added: tuple[str, ...] = ()  # models new to it (at start: every one)
    reloading: bool = True  # False: the start, which renews nothing and has nothing to abort to
    resume: Mood = Mood.SERVING  # the server's mood again if the reload is aborted
    generation: int = 0  # its number: the start's 0, each reload one more than what runs

    @classmethod
    def start(cls, config: Config, plan: Plan, deployment: Deployment) -> Wanted:
        """Every process of the deployment, from none."""
        models = tuple(m.name for m in config.models)
        return cls(config, plan, deployment, added=models, reloading=False)

    def spec(self, name: str) -> WorkerSpec:
        return next(w for w in self.deployment.workers if w.slot.name == name)

    def reshaped(self, running: Running) -> bool:
        """The removed models gone and the added ones taken up: its shape is what runs."""
        return running.generation == self.generation


def to_renew(wanted: Wanted, running: Running) -> list[str]:
    """The slots still to renew, in order: those whose instance is of an older generation."""
    workers = running.roster.workers
    return [
        name
        for name in wanted.renew
        if name in workers and workers[name].generation < wanted.generation
    ]


def next_steps(wanted: Wanted, running: Running, now: float) -> list[Action]:
    """The next step, each turn of the loop."""
    if running.preparing:
        return []  # no process changes before the new models' artifacts are ready
    if not wanted.reloading:
        return [*_never_started(running, []), Started()]
    if wanted.reshaped(running):
        return _roll(wanted, running, now)
    actions = _reshape(wanted, running)
    if not any(isinstance(a, Reshaped) for a in actions):
        return actions
    if any(isinstance(a, Adopt) and a.child.pool for a in actions):
        return actions  # the changed models roll once the added ones are up
    return actions + _roll(wanted, running, now)


def _roll(wanted: Wanted, running: Running, now: float) -> list[Action]:
    """The next slot's new instance, or the one starting watched."""
    workers = running.roster.workers
    if any(w.state == State.STARTING for w in workers.values() if w.model_name in wanted.added):
        return []  # the changed models roll once the added ones are up
    replacement = running.replacement
    if replacement is None:
        pending = to_renew(wanted, running)
        if not pending:
            return [Renewed()]
        name = pending[0]
        old = workers[name]
        return [Renew(Child.for_worker(wanted.spec(name), old.restarts, wanted.generation))]
    if replacement.state == State.READY:
        return [Replace(replacement)]
    if (
        replacement.state == State.STARTING
        and now - replacement.started_at > wanted.config.supervisor.start_timeout_s
    ):
        return [Abort(f"the new {replacement.name} was not ready in time")]
    return []


def _reshape(wanted: Wanted, running: Running) -> list[Action]:
    """Removed models out, then added models in (ending with `Reshaped`). The removed models'
    shards drain first (their instances finish what they hold), then their instances stop;
    only then do the frontend's routes change and the added models start, on cores the
    removed ones may have held."""
    removed = set(wanted.removed)
    roster = running.roster
    shards = [r for r in roster.routers if r.model_name in removed]
    instances = [w for w in roster.of("worker") if w.model_name in removed]
    if shards or instances:  # the shards are only now told
        leave: list[Action] = [Leave(c, drain=True) for c in shards]
        return leave + [Leave(c, drain=False) for c in instances]
    leaving = [
        c for c in roster.retired if c.kind in ("router", "worker") and c.model_name in removed
    ]
    if any(c.pid is not None and c.kind == "router" for c in leaving):
        return []  # its shards still drain
    if any(c.pid is not None for c in leaving):
        return [Terminate(c) for c in leaving if c.pid is not None and c.term_sent_at is None]
    return _take_up(wanted, running)


def _never_started(running: Running, joining: list[Child]) -> list[Spawn]:
    """The start's every process, a reload's added ones: the shards first, the instances
    last."""
    roster = running.roster
    fresh = [
        *roster.routers,
        *[c for c in joining if not c.pool],
        *roster.of("frontend"),
        *roster.fronts,
        *roster.of("worker"),
        *[c for c in joining if c.pool],
    ]
    return [
        Spawn(c) for c in fresh if c.state is State.STOPPED and c.pid is None and not c.started_at
    ]


def _take_up(wanted: Wanted, running: Running) -> list[Action]:
    """The new shape: the frontend's routes, the added models' shards and instances, every
    wanted process not yet started started, and our ledger entry."""
    new, old = wanted.deployment, running.deployment
    actions: list[Action] = []
    frontend = old.frontend
    if (
        running.roster.frontend
        and frontend
        and new.frontend
        and new.frontend.routes != frontend.routes
    ):
        frontend = dataclasses.replace(frontend, routes=new.frontend.routes)
        actions.append(Reroute(frontend))
    shards = {child.shard for child in running.roster.routers}
    joining = [
        Child.for_shard(spec)
        for spec in new.routers
        if spec.model_name in wanted.added and spec.shard not in shards
    ]
    joining += [
        Child.for_worker(spec, generation=wanted.generation)
        for spec in new.workers
        if spec.slot.model in wanted.added and spec.slot.name not in running.roster.workers
    ]
    actions += [Adopt(child) for child in joining]
    actions += _never_started(running, joining)
    if new.fronts != old.fronts:
        actions.append(RenewFronts(tuple(Child.for_front(spec) for spec in new.fronts)))
    if wanted.plan != running.plan:
        actions.append(Hold(wanted.plan))
    # What runs now: the kept shards as they were started (their settings apply at a
    # restart), the added ones, and the new instances' specs.
    changed = {*wanted.removed, *wanted.added}
    routers = [s for s in old.routers if s.model_name not in changed]
    routers += [s for s in new.routers if s.model_name in wanted.added]
    routers.sort(key=lambda spec: spec.shard)
    deployment = Deployment(tuple(routers), frontend, new.workers, new.fronts)
    return [*actions, Reshaped(Shape(wanted.config, wanted.plan, deployment, wanted.generation))]
