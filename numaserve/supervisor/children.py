"""One supervised process per slot: its states, and what happens when it exits.

After supervisord: a process counts as up only once it has been READY for `stable_s`
(`startsecs`); one that keeps exiting before that backs off, exponentially, and after
`max_quick_exits` in a row goes FATAL instead of looping. After circus: a restarted worker keeps
its slot, so it comes back on the same CPUs and node.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from enum import Enum

from numaserve import exitcodes
from numaserve.config import DEFAULT_MODEL, SupervisorConfig
from numaserve.specs import FrontendSpec, HttpSpec, RouterSpec, WorkerSpec


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


@dataclass(eq=False)
class Child:
    """One supervised process: a router shard, the frontend, an HTTP front, or one slot's
    worker."""

    name: str
    argv: list[str]
    # What it runs from: a worker's spec (which holds the plan's own Slot), a shard's, the
    # frontend's; None for `numaserve prepare`. Where it runs is read from there, not copied.
    spec: WorkerSpec | RouterSpec | FrontendSpec | HttpSpec | None = None
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
    exit_code: int | None = None
    last_exit: str = ""

    @classmethod
    def for_worker(cls, spec: WorkerSpec) -> Child:
        return cls(spec.slot.name, spec.argv(), spec)

    @classmethod
    def for_shard(cls, spec: RouterSpec) -> Child:
        return cls(f"router-{spec.shard}" if spec.frontend else "router", spec.argv(), spec)

    @classmethod
    def for_frontend(cls, spec: FrontendSpec) -> Child:
        return cls("frontend", spec.argv(), spec)

    @classmethod
    def for_http(cls, spec: HttpSpec) -> Child:
        return cls(f"http-{spec.index}", spec.argv(), spec)

    @property
    def pool(self) -> str | None:
        return self.spec.slot.pool if isinstance(self.spec, WorkerSpec) else None

    @property
    def cpus(self) -> tuple[int, ...]:
        if isinstance(self.spec, WorkerSpec):
            return self.spec.slot.cpus
        return self.spec.cpus if self.spec is not None else ()

    @property
    def nodes(self) -> tuple[int, ...]:
        if isinstance(self.spec, WorkerSpec):
            return self.spec.slot.nodes
        return self.spec.nodes if self.spec is not None else ()

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

    def describe(self) -> dict:
        return {
            "name": self.name,
            "pool": self.pool,
            "model_name": self.model_name,
            "state": self.state.value,
            "pid": self.pid,
            "cpus": list(self.cpus),
            "nodes": list(self.nodes),
            "shard": self.shard,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
        }


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


@dataclass(frozen=True)
class Verdict:
    """What becomes of a process that exited when it should not have."""

    state: State  # BACKOFF or FATAL
    delay: float  # BACKOFF: seconds before the restart
    why: str


def after_crash(child: Child, code: int, now: float, policy: SupervisorConfig) -> Verdict:
    """Counts the exit in `child.quick_exits` and says whether, and when, to restart it."""
    if code in exitcodes.NEVER_RESTART:
        why = f"{exitcodes.DESCRIPTION[code]}; not restarting it (see its log lines above)"
        return Verdict(State.FATAL, 0.0, why)
    was_up = child.ready_at is not None and now - child.ready_at >= policy.stable_s
    child.quick_exits = 0 if was_up else child.quick_exits + 1
    if child.quick_exits >= policy.max_quick_exits:
        why = (
            f"exited {policy.max_quick_exits} times in a row before it had been ready for "
            f"{policy.stable_s:g} s (supervisor.stable_s); not restarting it"
        )
        return Verdict(State.FATAL, 0.0, why)
    delay = backoff_delay(child.quick_exits, policy)
    return Verdict(State.BACKOFF, delay, f"restarting in {delay:.1f} s")


def backoff_delay(quick_exits: int, policy: SupervisorConfig) -> float:
    """Doubles with each quick exit in a row, from backoff_initial_s up to backoff_max_s."""
    return min(policy.backoff_max_s, policy.backoff_initial_s * 2 ** max(0, quick_exits - 1))
