"""Whether each process is alive and well, judged each turn from what the router shards hear
and the clock: a process is READY once its shard routes to it, killed when it is not ready
within start_timeout_s or falls silent, SIGKILLed when it outlasts its SIGTERM, and restarted
when its backoff is over. Each child judges itself (children.py); this says which judgement
applies to whom, and returns the actions for the arbiter to carry out."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from numaserve.config.schema import Config
from numaserve.processes import exitcodes
from numaserve.supervisor.children import Announce, Child, ChildAction, Limits, State

log = logging.getLogger("numaserve.supervisor")
Routed = Mapping[int, "set[int] | None"]  # per shard, the workers it hears (None: no word)


def limits(config: Config, draining: bool) -> Limits:
    """The clock's rules from the config. `draining`: a router shard or a front, which
    gets drain_timeout_s to finish what it holds before its kill timeout starts."""
    s, server = config.supervisor, config.server
    silence = 2 * server.heartbeat_ms * server.heartbeat_liveness / 1000 + 1
    kill_after = s.drain_timeout_s + s.kill_timeout_s if draining else s.kill_timeout_s
    return Limits(s.start_timeout_s, silence, kill_after)


def fronts_ready(
    routers: list[Child], fronts: list[tuple[Child, str]], routed: Routed, endpoint: str
) -> list[Announce]:
    """A shard is READY once it answers; the frontend and the fronts (`fronts`: each
    with where its clients connect; a front only once it listens, arbiter.listening) once
    any shard does: they have no socket of their own to the supervisor."""
    ready = [
        Announce(r, State.READY, f"ready {r.name}, clients on {endpoint}", "ready")
        for r in routers
        if r.state == State.STARTING and routed[r.shard] is not None
    ]
    if any(pids is not None for pids in routed.values()):
        ready += [
            Announce(front, State.READY, f"ready {front.name}, clients on {where}", "ready")
            for front, where in fronts
            if front.state == State.STARTING
        ]
    return ready


def instances_heard(
    instances: list[Child], routed: Routed, now: float, rules: Limits, stopping: bool
) -> list[ChildAction]:
    """Each instance judged by what its shard hears: ready, late to start, or silent."""
    actions = []
    for child in instances:
        heard = routed.get(child.shard)
        action = None
        if child.state == State.STARTING:
            action = child.judge_start(now, heard, rules)
        elif child.state == State.READY and heard is not None and not stopping:
            action = child.judge_heard(now, heard, rules)
        if action is not None:
            actions.append(action)
    return actions


def cannot_serve(front: list[Child], workers: list[Child]) -> int | None:
    """With a router shard, the frontend or every worker FATAL, the server cannot serve as
    planned: the exit code to stop with (the FATAL ones', where they agree on a code that
    no restart can fix), said in the log; None while it can serve."""
    if not any(c.state == State.FATAL for c in front) and not all(
        w.state == State.FATAL for w in workers
    ):
        return None
    codes = {c.exit_code for c in [*front, *workers] if c.state == State.FATAL}
    code = codes.pop() if len(codes) == 1 and codes <= exitcodes.NEVER_RESTART else 1
    log.error("fatal: no instance can serve; stopping (exit %d)", code, extra={"event": "fatal"})
    return code
