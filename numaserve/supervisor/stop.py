"""A stop (SIGTERM, SIGINT, or a server that can no longer serve): the fronts drain first
(they stop listening and answer what they hold, which the shards still serve); then the router
shards, answering what they hold while the frontend carries their last replies; then every
other process gets SIGTERM, and SIGKILL if it outlasts kill_timeout_s. A second SIGINT kills
every process at once.

`Stop` decides, from the children and the clock, what to signal next and when the stop is
over; the arbiter carries it out."""

from __future__ import annotations

import dataclasses
import logging
import signal
from collections.abc import Iterable
from dataclasses import dataclass

from numaserve.supervisor.children import Child, Signal, Terminate

log = logging.getLogger("numaserve.supervisor")
FAST_STOP_EXIT = 128 + signal.SIGINT


def _stop_all(children: Iterable[Child], now: float) -> list[Terminate]:
    return [action for child in children if (action := child.stop_now(now)) is not None]


@dataclass(frozen=True)
class Stop:
    code: int = 0  # the exit code once every process is gone
    fast: bool = False  # killed rather than drained

    def begin(self, why: str, drain_timeout_s: float, fronts: list[Child], now: float):
        """The fronts drain first."""
        log.info(
            "drain: %s: the router shards finish requests in flight (%.0f s at most), then the "
            "workers stop",
            why,
            drain_timeout_s,
            extra={"event": "drain"},
        )
        return _stop_all(fronts, now)

    def next_steps(
        self, fronts: list[Child], routers: list[Child], everyone: list[Child], now: float
    ) -> tuple[list[Terminate], int | None]:
        """What to stop next, and the exit code once every process is gone (None before)."""
        if any(front.pid is not None for front in fronts):
            return [], None  # the fronts answer what they hold
        actions = _stop_all(routers, now)
        if any(router.pid is not None for router in routers):
            return actions, None  # still draining; the frontend carries their last replies
        live = [c for c in everyone if c.pid is not None]
        if live:
            return _stop_all(live, now), None
        _stop_all(everyone, now)  # each slot STOPPED, but a FATAL one
        log.info("stopped", extra={"event": "stopped"})
        return [], FAST_STOP_EXIT if self.fast else self.code

    def kill(self, everyone: list[Child]) -> tuple[Stop, list[Signal]]:
        """This stop made fast, and every process's SIGKILL."""
        log.warning(
            "fast stop: killing every process now; requests in flight are lost",
            extra={"event": "fast-stop"},
        )
        return dataclasses.replace(self, fast=True), [child.kill_now() for child in everyone]
