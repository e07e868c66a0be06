"""A stop (SIGTERM, SIGINT, or a server that can no longer serve): the HTTP fronts drain first
(they stop listening and answer what they hold, which the shards still serve); then the router
shards, answering what they hold while the frontend carries their last replies; then every
other process gets SIGTERM, and SIGKILL if it outlasts kill_timeout_s. A second SIGINT kills
every process at once."""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING

from numaserve.supervisor.children import State

if TYPE_CHECKING:
    from numaserve.supervisor.arbiter import Supervisor

log = logging.getLogger("numaserve.supervisor")
FAST_STOP_EXIT = 128 + signal.SIGINT


@dataclass
class Stop:
    code: int = 0  # the exit code once every process is gone
    fast: bool = False  # killed rather than drained

    def begin(self, sup: Supervisor, why: str) -> None:
        if sup.prepare:
            sup.terminate(sup.prepare)
        log.info(
            "drain: %s: the router shards finish requests in flight (%.0f s at most), then the "
            "workers stop",
            why,
            sup.config.supervisor.drain_timeout_s,
            extra={"event": "drain"},
        )
        sup.notifier.stopping("draining")
        self._drain(sup, sup.http)

    def _drain(self, sup: Supervisor, children) -> None:
        for child in children:
            if child.pid is not None:
                if child.term_sent_at is None:
                    sup.terminate(child)
            elif child.state != State.FATAL:
                child.change_state(State.STOPPED, sup.system.now())

    def advance(self, sup: Supervisor) -> int | None:
        """The exit code once every process is gone; None before."""
        if any(front.pid is not None for front in sup.http):
            return None  # the HTTP fronts answer what they hold
        self._drain(sup, sup.routers)
        if any(router.pid is not None for router in sup.routers):
            return None  # still draining; the frontend carries their last replies
        live = [c for c in sup.all_children() if c.pid is not None]
        for child in live:
            if child.term_sent_at is None:
                sup.terminate(child)
        if live:
            return None
        for child in sup.all_children():
            if child.state != State.FATAL:
                child.change_state(State.STOPPED, sup.system.now())
        log.info("stopped", extra={"event": "stopped"})
        return FAST_STOP_EXIT if self.fast else self.code

    def kill(self, sup: Supervisor) -> None:
        log.warning(
            "fast stop: killing every process now; requests in flight are lost",
            extra={"event": "fast-stop"},
        )
        self.fast = True
        for child in sup.all_children():
            child.term_sent_at = float("inf")
            sup.signal(child, signal.SIGKILL)
