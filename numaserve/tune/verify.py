"""A configuration measured for real: `numaserve start` on it (numaserve.testing.Server, with
the host's own core ledger, so it plans around other servers), then `numaserve bench`'s closed
loop on the corpus at more and more clients, until p99 passes the target. Its figure is the
best throughput of a step within the target with no errors; later rounds run that step again
(`again`), each on a server started anew, the configurations in turns, so that a lead counts
only where it is larger than its spread from round to round (backends/race.py). The cache is
off: the corpus repeats texts, and a cache hit measures the router, not the configuration."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

from numaserve.host.ledger import LEDGER_ENV
from numaserve.loadgen.bench import closed_loop, drawing, numaserve_target
from numaserve.testing.server import Server

log = logging.getLogger("numaserve.tune")
CLIENTS_PER_INSTANCE = (1, 2, 4, 8)  # the load ladder
MAX_CLIENTS = 64
ROUNDS = 3  # the ladder's, then its best step twice more


@dataclass(frozen=True)
class Step:
    clients: int
    texts_per_s: float
    p99_ms: float
    errors: int


@dataclass(frozen=True)
class Verified:
    label: str
    steps: tuple[Step, ...]
    failure: str | None = None  # why it could not be measured (a server that did not start)
    again: tuple[Step, ...] = ()  # the best step run again, one a later round
    start_s: float = 0.0  # its server's start, to READY: what a later round costs besides its step

    def best(self, p99_ms: float) -> Step | None:
        good = [s for s in self.steps if s.p99_ms <= p99_ms and not s.errors]
        return max(good, key=lambda s: s.texts_per_s, default=None)

    def rounds(self, p99_ms: float) -> tuple[float, ...]:
        """Texts a second in each round: the best step, then each run of it again; none where
        a run missed the target or erred (a lead must hold in every round)."""
        best = self.best(p99_ms)
        if best is None or any(s.p99_ms > p99_ms or s.errors for s in self.again):
            return ()
        return (best.texts_per_s, *(s.texts_per_s for s in self.again))


def ladder(instances: int) -> list[int]:
    return sorted({min(MAX_CLIENTS, instances * m) for m in CLIENTS_PER_INSTANCE})


def verify(
    label: str,
    config_text: str,
    directory: Path,
    texts: list[str],
    task: str,
    clients: list[int],
    p99_ms: float,
    step_seconds: float,
    deadline: float,
    ledger: Path | None,
) -> Verified:
    """`config_text` names its endpoint @ENDPOINT@ and turns metrics and HTTP off. A step at
    each number of `clients` (`ladder`, or the one a round repeats), up to the first that
    misses the target; each sends what the last one's rate (at first, the warm-up's) serves
    in `step_seconds`; no step but the first starts after `deadline` (time.monotonic())."""
    env = {LEDGER_ENV: str(ledger)} if ledger else None
    began = time.monotonic()
    server = Server(directory, config_text, env=env, name=label)
    try:
        try:
            server.wait_ready(timeout=600)
        except AssertionError as e:
            return Verified(label, (), f"the server did not start: {str(e)[-500:]}")
        start_s = time.monotonic() - began
        connect = numaserve_target([server.endpoint], op=task, timeout=30)
        warm = closed_loop(connect, texts, clients[0], 5, op=task, draw=drawing(task))
        rate = warm.summary()["throughput_rps"]
        steps: list[Step] = []
        for n in clients:
            if steps and time.monotonic() + step_seconds > deadline:
                break
            requests = max(10, math.ceil(rate * step_seconds / n))
            r = closed_loop(connect, texts, n, requests, op=task, draw=drawing(task))
            s = r.summary()
            step = Step(
                n,
                s["throughput_rps"],
                s["latency_ms"]["p99"] or math.inf,
                sum(r.errors.values()),
            )
            steps.append(step)
            log.info(
                "%s: %d clients: %.1f texts/s, p99 %.1f ms, %d errors",
                label,
                n,
                step.texts_per_s,
                step.p99_ms,
                step.errors,
                extra={"event": "tune"},
            )
            if step.p99_ms > p99_ms or step.errors:
                break
            rate = step.texts_per_s
        return Verified(label, tuple(steps), start_s=start_s)
    finally:
        server.stop()
