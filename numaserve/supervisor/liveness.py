"""Whether each process is alive and well, judged each turn from what the router shards hear
and the clock: a process is READY once its shard routes to it, killed when it is not ready
within start_timeout_s or falls silent, SIGKILLed when it outlasts its SIGTERM, and restarted
when its backoff is over. The arbiter calls `check`; every effect goes through it."""

from __future__ import annotations

import logging
import signal
from typing import TYPE_CHECKING

from numaserve import exitcodes
from numaserve.specs import HttpSpec
from numaserve.supervisor.children import Child, State

if TYPE_CHECKING:
    from numaserve.supervisor.arbiter import Supervisor

log = logging.getLogger("numaserve.supervisor")


def check(sup: Supervisor, now: float) -> None:
    """Each turn: who is ready, who is silent, who is late to stop, who may restart."""
    routed = sup.shards.routed_pids(now)
    front_ready(sup, routed)
    replacement = sup.reconcile.replacement if sup.reconcile else None
    for child in [*sup.workers.values(), *([replacement] if replacement else [])]:
        heard = routed.get(child.shard)
        if child.state == State.STARTING:
            check_started(sup, child, now, heard)
        elif child.state == State.READY and heard is not None and not sup.stopping:
            check_heard(sup, child, now, heard)
    for child in sup.all_children():
        timers(sup, child, now)


def front_ready(sup: Supervisor, routed: dict[int, set[int] | None]) -> None:
    """A shard is READY once it answers; the frontend and the HTTP fronts once any shard
    does: they have no socket of their own to the supervisor, and one that cannot listen
    exits first."""
    endpoint = sup.config.server.endpoint
    for router in sup.routers:
        if router.state == State.STARTING and routed[router.shard] is not None:
            sup.set_state(
                router, State.READY, f"ready {router.name}, clients on {endpoint}", "ready"
            )
    answered = any(pids is not None for pids in routed.values())
    fronts = [(sup.frontend, endpoint)] if sup.frontend else []
    fronts += [(front, f"http://{sup.config.server.http}") for front in sup.http]
    for front, where in fronts:
        if front.state == State.STARTING and answered:
            sup.set_state(front, State.READY, f"ready {front.name}, clients on {where}", "ready")


def timers(sup: Supervisor, child: Child, now: float) -> None:
    """SIGKILL for one that did not stop in time; the restart of one in BACKOFF."""
    if (
        child.term_sent_at is not None
        and child.pid is not None
        and now - child.term_sent_at > _kill_after(sup, child)
    ):
        log.warning("%s did not stop in time: SIGKILL", child.name, extra={"event": "kill"})
        sup.signal(child, signal.SIGKILL)
        child.term_sent_at = float("inf")  # once
    if child.state == State.BACKOFF and now >= child.retry_at and not sup.stopping:
        child.restarts += 1
        log.info("restart %s (restart %d)", child.name, child.restarts, extra={"event": "restart"})
        sup.spawn(child)


def check_started(sup: Supervisor, child: Child, now: float, routed: set[int] | None) -> None:
    """STARTING -> READY once the router hears it; killed after start_timeout_s."""
    timeout = sup.config.supervisor.start_timeout_s
    if routed is not None and child.pid in routed:
        message = f"ready {child.name} pid {child.pid} in {now - child.started_at:.1f} s"
        sup.set_state(child, State.READY, message, "ready")
    elif now - child.started_at > timeout and child.term_sent_at is None:
        log.warning(
            "%s not ready after %.0f s: killing it",
            child.name,
            timeout,
            extra={"event": "timeout"},
        )
        child.term_sent_at = now
        sup.signal(child, signal.SIGKILL)


def check_heard(sup: Supervisor, child: Child, now: float, routed: set[int]) -> None:
    """A READY instance the router stops hearing (hung, or stopped) gets SIGTERM, then
    SIGKILL; its exit then restarts it."""
    server = sup.config.server
    silence_limit = 2 * server.heartbeat_ms * server.heartbeat_liveness / 1000 + 1
    if child.pid in routed:
        child.unrouted_since = None
    elif child.unrouted_since is None:
        child.unrouted_since = now
    elif now - child.unrouted_since > silence_limit and child.term_sent_at is None:
        log.warning(
            "%s stopped heartbeating: SIGTERM, then SIGKILL",
            child.name,
            extra={"event": "hung"},
        )
        child.term_sent_at = now
        sup.signal(child, signal.SIGTERM)


def _kill_after(sup: Supervisor, child: Child) -> float:
    s = sup.config.supervisor
    draining = (
        child in sup.routers
        or isinstance(child.spec, HttpSpec)
        or bool(sup.reconcile and child in sup.reconcile.draining)
    )
    return s.drain_timeout_s + s.kill_timeout_s if draining else s.kill_timeout_s


def cannot_serve(sup: Supervisor) -> int | None:
    """With a router shard, the frontend or every worker FATAL, the server cannot serve as
    planned: the exit code to stop with (the FATAL ones', where they agree on a code that
    no restart can fix), said in the log; None while it can serve."""
    if sup.stopping:
        return None
    workers = list(sup.workers.values())
    front = sup.front()
    if not any(c.state == State.FATAL for c in front) and not all(
        w.state == State.FATAL for w in workers
    ):
        return None
    codes = {c.exit_code for c in [*front, *workers] if c.state == State.FATAL}
    code = codes.pop() if len(codes) == 1 and codes <= exitcodes.NEVER_RESTART else 1
    log.error("fatal: no instance can serve; stopping (exit %d)", code, extra={"event": "fatal"})
    return code
