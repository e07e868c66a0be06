"""How every child process begins, the same way whatever it runs (an instance, a router shard,
the frontend, an HTTP front, tune's probe): its spec read and its logging set up, death with
its parent, its CPUs and memory bound and checked, and, where numactl is installed, the process
started over under it, so that the interpreter's own start-up pages sit on its node too. Tune's
probe begins as an instance does, so that it measures what an instance runs."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from numaserve.host.cpuset import Binding
from numaserve.host.pinning import (
    BOUND_BY,
    BOUND_BY_CPUSET,
    PinningError,
    pin_current_process,
    restart_under_numactl,
)
from numaserve.processes import exitcodes
from numaserve.processes.lifecycle import die_with_parent, read_spec

S = TypeVar("S")


@dataclass(frozen=True)
class Began(Generic[S]):
    spec: S  # of the type asked for: a RouterSpec, a WorkerSpec, ...
    method: str | None  # how its memory is bound (pinning.BOUND_BY); None: it names no CPUs
    binding: Binding  # as the kernel agreed to it; empty: not pinned


def begin(
    spec_type: type[S],
    argv: list[str] | None,
    log: logging.Logger,
    *,
    bad_spec: int = exitcodes.MODEL,
    parent: int | None = None,
) -> Began[S] | int:
    """The process begun, or the exit code to leave with: `bad_spec` for a spec that cannot
    be read, PINNING for CPUs or memory that cannot be bound. `parent`: the pid to die with
    (by default the supervisor's, from the environment). The spec's `binding` says
    where it runs (none: anywhere); its `use_numactl`, where present, whether to start over
    under numactl."""
    spec: Any = read_spec(spec_type, spec_type.module, argv, log)  # type: ignore[attr-defined]
    if spec is None:
        return bad_spec
    die_with_parent(parent)
    if not spec.binding:
        return Began(spec, None, Binding())
    try:
        method, cpus, nodes = pin_current_process(spec.binding.cpus, spec.binding.nodes)
    except PinningError as e:
        log.error("cannot pin to %s: %s", spec.binding, e)
        return exitcodes.PINNING
    binding = Binding.of(cpus, nodes)
    if method == BOUND_BY_CPUSET:
        log.info("memory bound by %s", BOUND_BY[method])
    if getattr(spec, "use_numactl", True):
        restart_under_numactl(method, binding, spec.argv(), log)
    return Began(spec, method, binding)


def import_numpy() -> None:
    """numpy, imported once the process is pinned (a thread pool it starts inherits the
    binding) and before it serves: a router shard and an HTTP front import it where a reply
    first needs it, and that first import (60-70 ms here) fell on the first request after
    every start."""
    import numpy  # noqa: F401
