"""The server's phase: one value, held by the arbiter and changed only along NEXT's arrows
(`check_next`), as a child's state changes only along children.py's table.

Each phase holds what only it needs: the start's prepare and the deployment it starts once
the model is ready (`Preparing`); the start's deployment until every process has started
(`Starting`; a reload that renewed every slot comes back here, so that systemd hears READY=1
again once the server serves); the reload's wanted deployment, its prepare and the new
instance starting in a slot (`Reloading`); the stop under way (`Stopping`); the exit code
(`Ended`). What systemd hears follows from it (the arbiter's `enter`), and so does the mood
`numaserve status` and /metrics show. Adding a phase (a pause, a drain before a reload) is a
class here, its arrows in NEXT, and what the arbiter does in it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, TypeVar

from numaserve.supervisor.children import Child
from numaserve.supervisor.reporting import Mood
from numaserve.supervisor.rollout import Wanted
from numaserve.supervisor.stop import Stop


@dataclass(frozen=True)
class Created:
    """Made, its loop not yet begun: nothing runs."""

    mood: ClassVar[Mood] = Mood.STARTING


@dataclass(frozen=True)
class Preparing:
    """`numaserve prepare` runs before any instance starts; then `wanted` starts."""

    wanted: Wanted
    prepare: Child
    mood: ClassVar[Mood] = Mood.PREPARING


@dataclass(frozen=True)
class Starting:
    """The processes come up; READY=1 once they serve. `wanted`: the start's deployment,
    until every process of it has been started (None after, and after a reload)."""

    wanted: Wanted | None = None
    mood: ClassVar[Mood] = Mood.STARTING


@dataclass(frozen=True)
class Serving:
    """Told READY=1; liveness keeps every process running."""

    mood: ClassVar[Mood] = Mood.SERVING


@dataclass(frozen=True)
class Reloading:
    """A SIGHUP's config being applied: its model prepared (`prepare`, where it needs new
    artifacts), then what it adds started and its slots renewed one at a time
    (`replacement`: the new instance starting in a slot), done once every serving shard has
    answered the slot table that shows it all (`final_table`)."""

    wanted: Wanted
    prepare: Child | None = None
    replacement: Child | None = None
    final_table: int | None = None
    mood: ClassVar[Mood] = Mood.RELOADING


@dataclass(frozen=True)
class Stopping:
    """Draining, then every process stops (stop.py says in what order)."""

    stop: Stop
    mood: ClassVar[Mood] = Mood.STOPPING


@dataclass(frozen=True)
class Ended:
    """The loop is over: every process has exited, or none could start."""

    exit_code: int
    mood: ClassVar[Mood] = Mood.STOPPING


Phase = Created | Preparing | Starting | Serving | Reloading | Stopping | Ended
P = TypeVar("P", Created, Preparing, Starting, Serving, Reloading, Stopping, Ended)

# Which phase may follow which; a phase may also follow itself, with what it holds changed.
NEXT: dict[type, tuple[type, ...]] = {
    Created: (Preparing, Starting),
    Preparing: (Starting, Stopping, Ended),  # Ended: the model could not be prepared
    Starting: (Serving, Reloading, Stopping),
    Serving: (Reloading, Stopping),
    # done (READY=1 again once it serves), or aborted: back to what it interrupted
    Reloading: (Starting, Serving, Stopping),
    Stopping: (Ended,),
    Ended: (),
}


class PhaseError(AssertionError):
    """A change of phase its table does not allow: a bug in the arbiter, not a condition."""


def expect(phase: Phase, kind: type[P]) -> P:
    """`phase`, which must be a `kind` (supervisord's _assertInState): what only that phase
    holds is read through it."""
    if not isinstance(phase, kind):
        raise PhaseError(f"the server is {type(phase).__name__}, not {kind.__name__}")
    return phase


def check_next(old: Phase, new: Phase) -> Phase:
    """`new`, where it may follow `old`."""
    if type(new) is not type(old) and type(new) not in NEXT[type(old)]:
        raise PhaseError(f"the server cannot go from {type(old).__name__} to {type(new).__name__}")
    return new
