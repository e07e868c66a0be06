"""One supervised process per slot: its states, its timers, and what happens when it exits.

After supervisord: a process counts as up only once it has been READY for `stable_s`
(`startsecs`); one that keeps exiting before that backs off, exponentially, and after
`max_quick_exits` in a row goes FATAL instead of looping. After circus: a restarted worker keeps
its slot, so it comes back on the same CPUs and node.

A `Child` is the only writer of its own fields. What its judgements imply for the OS (spawn
it, signal it, tell the shards of its new state) it returns as actions, which the arbiter alone
carries out: so every rule here is tested on plain objects and a clock.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from numaserve.config.schema import DEFAULT_MODEL, SupervisorConfig
from numaserve.host.cpuset import Binding, CPUSet
from numaserve.monitoring.snapshot import Process
from numaserve.processes import exitcodes
from numaserve.processes.specs import FrontendSpec, FrontSpec, RouterSpec, WorkerSpec
from numaserve.status.report import SlotEntry

log = logging.getLogger("numaserve.supervisor")


class State(str, Enum):
    STARTING = "starting"  # spawned; not yet heard by the router
    READY = "ready"  # the router sends it work
    DRAINING = "draining"  # asked to stop (SIGTERM); finishing what it has
    STOPPED = "stopped"
    BACKOFF = "backoff"  # exited unexpectedly; restarted at `retry_at`
    FATAL = "fatal"  # never restarted: a config or model error, or too many quick exits


# Where each state may go (supervisord's `_assertInState`). Staying put is always allowed.
# STOPPED -> FATAL and BACKOFF -> FATAL: the spawn itself failed. FATAL -> STOPPED: a reload
# or a stop retires a slot that had given up.
TRANSITIONS: dict[State, frozenset[State]] = {
    State.STOPPED: frozenset({State.STARTING, State.FATAL}),
    State.STARTING: frozenset(
        {State.READY, State.DRAINING, State.STOPPED, State.BACKOFF, State.FATAL}
    ),
    State.READY: frozenset({State.DRAINING, State.STOPPED, State.BACKOFF, State.FATAL}),
    State.DRAINING: frozenset({State.STOPPED}),
    State.BACKOFF: frozenset({State.STARTING, State.STOPPED, State.FATAL}),
    State.FATAL: frozenset({State.STOPPED}),
}


class TransitionError(AssertionError):
    """A state change the table above does not allow: a bug in the supervisor."""


# -- what a child's judgements ask the arbiter to do -------------------------------------------


@dataclass(frozen=True)
class Spawn:
    child: Child


@dataclass(frozen=True)
class Signal:
    child: Child
    sig: int


@dataclass(frozen=True)
class Terminate:
    """SIGTERM, the child entering `state` (DRAINING: it finishes what it holds)."""

    child: Child
    state: State = State.DRAINING


@dataclass(frozen=True)
class Announce:
    """A state change the shards (a fresh slot table) and the log hear of at once."""

    child: Child
    state: State
    message: str
    event: str


ChildAction = Spawn | Signal | Terminate | Announce


@dataclass(frozen=True)
class Limits:
    """The clock's rules for one child, from the config: how long it may take to start, to be
    silent while READY, and to stop after SIGTERM."""

    start_timeout_s: float
    silence_s: float
    kill_after_s: float


S = TypeVar("S", WorkerSpec, RouterSpec, FrontendSpec, FrontSpec)

# A child's kind, by the type of its spec (None: `numaserve prepare`, which has none).
KINDS = {
    RouterSpec: "router",
    FrontendSpec: "frontend",
    FrontSpec: "front",
    WorkerSpec: "worker",
    type(None): "prepare",
}


@dataclass(eq=False)
class Child:
    """One supervised process: a router shard, the ZeroMQ frontend, a front (HTTP and gRPC),
    or one slot's worker."""

    name: str
    argv: list[str]
    # What it runs from: a worker's spec (which holds the plan's own Slot), a shard's, the
    # frontend's; None for `numaserve prepare`. Where it runs is read from there, not copied.
    spec: WorkerSpec | RouterSpec | FrontendSpec | FrontSpec | None = None
    state: State = State.STOPPED
    pid: int | None = None
    started_at: float = 0.0
    ready_at: float | None = None
    unrouted_since: float | None = None  # READY, alive, but the router no longer hears it
    term_sent_at: float | None = None
    killed: bool = False  # numaserve sent it SIGKILL
    retry_at: float = 0.0
    restarts: int = 0
    quick_exits: int = 0
    generation: int = 0  # of the deployment it was made for: the start's 0, each reload's one more
    exit_code: int | None = None
    last_exit: str = ""

    @classmethod
    def for_worker(cls, spec: WorkerSpec, restarts: int = 0, generation: int = 0) -> Child:
        """`restarts`: the slot's count so far, where this replaces its instance;
        `generation`: the reload's it is made for (rollout.Wanted)."""
        return cls(spec.slot.name, spec.argv(), spec, restarts=restarts, generation=generation)

    @classmethod
    def for_shard(cls, spec: RouterSpec) -> Child:
        return cls(f"router-{spec.shard}" if spec.frontend else "router", spec.argv(), spec)

    @classmethod
    def for_frontend(cls, spec: FrontendSpec) -> Child:
        return cls("frontend", spec.argv(), spec)

    @classmethod
    def for_front(cls, spec: FrontSpec) -> Child:
        return cls(f"front-{spec.index}", spec.argv(), spec)

    def spec_as(self, kind: type[S]) -> S:
        """Its spec, which must be a `kind` (a shard's RouterSpec, a front's FrontSpec)."""
        if not isinstance(self.spec, kind):
            raise TypeError(
                f"{self.name} runs from a {type(self.spec).__name__}, not a {kind.__name__}"
            )
        return self.spec

    @property
    def kind(self) -> str:
        """What it is, read from what it runs: router, frontend, front, worker, or prepare."""
        return KINDS[type(self.spec)]

    @property
    def pool(self) -> str | None:
        return self.spec.slot.pool if isinstance(self.spec, WorkerSpec) else None

    @property
    def binding(self) -> Binding:
        return self.spec.binding if self.spec is not None else Binding()

    @property
    def shard(self) -> int:
        """A worker's: the router shard that routes to it; a shard's: its own index."""
        return self.spec.shard if isinstance(self.spec, (WorkerSpec, RouterSpec)) else 0

    @property
    def model_name(self) -> str:
        if isinstance(self.spec, WorkerSpec):
            return self.spec.slot.model
        return self.spec.model_name if isinstance(self.spec, RouterSpec) else DEFAULT_MODEL

    def change_state(self, new: State, now: float) -> None:
        """The one way a child's state changes; READY notes when (for `stable_s`)."""
        if new is not self.state and new not in TRANSITIONS[self.state]:
            raise TransitionError(f"{self.name}: {self.state.value} -> {new.value}")
        self.state = new
        if new is State.READY:
            self.ready_at = now

    def respec(self, spec: FrontendSpec | WorkerSpec) -> None:
        """What it runs from now on: the frontend's new routes (they apply now, on SIGHUP, and
        at any restart); an instance's spec with its prepared digest, before it first starts."""
        self.spec, self.argv = spec, spec.argv()

    # -- what happened to it -----------------------------------------------------------------

    def spawned(self, pid: int, now: float) -> None:
        """A new process runs it: every timer of the last one is over."""
        self.pid, self.started_at = pid, now
        self.term_sent_at = self.unrouted_since = self.ready_at = None
        self.killed = False

    def signalled(self, sig: int) -> None:
        self.killed = self.killed or sig == signal.SIGKILL

    def terminating(self, state: State, now: float) -> None:
        """SIGTERM sent now (or, with no process, nothing left to stop)."""
        if self.pid is None:
            self.change_state(State.STOPPED, now)
            return
        self.change_state(state, now)
        self.term_sent_at = now

    def exited(self, code: int) -> None:
        """`code` is negative for a signal."""
        self.pid = None
        self.exit_code = code
        self.last_exit = describe_exit(code, self.killed)

    def crashed(self, code: int, now: float, policy: SupervisorConfig) -> Announce:
        """An exit it should not have made, counted in `quick_exits`: BACKOFF, with its retry
        time, or FATAL."""
        if code in exitcodes.NEVER_RESTART:
            why = f"{exitcodes.DESCRIPTION[code]}; not restarting it (see its log lines above)"
            return self._fatal(why)
        was_up = self.ready_at is not None and now - self.ready_at >= policy.stable_s
        self.quick_exits = 0 if was_up else self.quick_exits + 1
        if self.quick_exits >= policy.max_quick_exits:
            return self._fatal(
                f"exited {policy.max_quick_exits} times in a row before it had been ready for "
                f"{policy.stable_s:g} s (supervisor.stable_s); not restarting it"
            )
        delay = backoff_delay(self.quick_exits, policy)
        self.retry_at = now + delay
        why = f"restarting in {delay:.1f} s"
        return Announce(self, State.BACKOFF, f"backoff {self.name}: {why}", "backoff")

    def _fatal(self, why: str) -> Announce:
        return Announce(self, State.FATAL, f"fatal: {self.name} {why}", "fatal")

    # -- its timers, each turn ---------------------------------------------------------------

    def judge_start(
        self, now: float, routed: set[int] | None, limits: Limits
    ) -> ChildAction | None:
        """STARTING -> READY once its shard hears it; SIGKILL after start_timeout_s."""
        if routed is not None and self.pid in routed:
            message = f"ready {self.name} pid {self.pid} in {now - self.started_at:.1f} s"
            return Announce(self, State.READY, message, "ready")
        if now - self.started_at > limits.start_timeout_s and self.term_sent_at is None:
            log.warning(
                "%s not ready after %.0f s: killing it",
                self.name,
                limits.start_timeout_s,
                extra={"event": "timeout"},
            )
            self.term_sent_at = now
            return Signal(self, signal.SIGKILL)
        return None

    def judge_heard(self, now: float, routed: set[int], limits: Limits) -> ChildAction | None:
        """A READY instance its shard stops hearing (hung, or stopped) gets SIGTERM, then
        SIGKILL (`timers`); its exit then restarts it."""
        if self.pid in routed:
            self.unrouted_since = None
        elif self.unrouted_since is None:
            self.unrouted_since = now
        elif now - self.unrouted_since > limits.silence_s and self.term_sent_at is None:
            log.warning(
                "%s stopped heartbeating: SIGTERM, then SIGKILL",
                self.name,
                extra={"event": "hung"},
            )
            self.term_sent_at = now
            return Signal(self, signal.SIGTERM)
        return None

    def timers(self, now: float, limits: Limits, may_restart: bool) -> ChildAction | None:
        """SIGKILL once when it outlasts its SIGTERM; its restart when its backoff is over."""
        if (
            self.term_sent_at is not None
            and self.pid is not None
            and now - self.term_sent_at > limits.kill_after_s
        ):
            log.warning("%s did not stop in time: SIGKILL", self.name, extra={"event": "kill"})
            return self.kill_now()
        if self.state == State.BACKOFF and now >= self.retry_at and may_restart:
            self.restarts += 1
            log.info(
                "restart %s (restart %d)", self.name, self.restarts, extra={"event": "restart"}
            )
            return Spawn(self)
        return None

    def kill_now(self) -> Signal:
        """SIGKILL, once: no timer sends it again."""
        self.term_sent_at = float("inf")
        return Signal(self, signal.SIGKILL)

    def stop_now(self, now: float) -> Terminate | None:
        """Part of a stop: SIGTERM for a process not yet told; a slot with none, STOPPED
        (FATAL stays FATAL, so the stop's log and status say why it gave up)."""
        if self.pid is not None:
            return Terminate(self) if self.term_sent_at is None else None
        if self.state != State.FATAL:
            self.change_state(State.STOPPED, now)
        return None

    def slot(self, live_cpus: CPUSet | None) -> SlotEntry:
        """Its entry in the slot table the shards get; `live_cpus`: its affinity, read now."""
        return SlotEntry(
            name=self.name,
            pool=self.pool,
            state=self.state.value,
            pid=self.pid,
            binding=self.binding,
            model_name=self.model_name,
            shard=self.shard,
            restarts=self.restarts,
            last_exit=self.last_exit,
            live_cpus=live_cpus,
        )

    def process(self) -> Process:
        """As /metrics and the probes see it."""
        return Process(
            self.kind,
            self.name,
            self.state.value,
            self.pid,
            self.binding,
            self.pool,
            self.model_name,
            self.restarts,
        )


def describe_exit(code: int, killed_by_us: bool) -> str:
    """`code` as os.waitstatus_to_exitcode gives it: negative for a signal."""
    if code >= 0:
        return f"exit {code} ({exitcodes.DESCRIPTION.get(code, 'error')})"
    text = f"killed by {exitcodes.signal_name(-code)}"
    if -code == signal.SIGKILL and not killed_by_us:
        text += (
            " (not by numaserve: possibly the out-of-memory killer, see dmesg, or another process)"
        )
    return text


def backoff_delay(quick_exits: int, policy: SupervisorConfig) -> float:
    """Doubles with each quick exit in a row, from backoff_initial_s up to backoff_max_s."""
    return min(policy.backoff_max_s, policy.backoff_initial_s * 2 ** max(0, quick_exits - 1))
