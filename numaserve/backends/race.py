"""Which of several ways to run the same work is fastest, on a machine that other work may
share: they take turns, round after round, on the same inputs, and a lead counts only where
it is larger than the spread of its ratio from round to round.

Timed one after the other, a candidate that happens to run while a neighbour is busy looks
slow: `quantize: auto` once chose differently from one start to the next on the same CPU, on
single timings 9% apart. Within a round, every candidate runs the same inputs moments apart,
so the ratio of their times cancels the machine's slow and fast spells; across rounds, the
ratios' spread says how much of a lead the noise alone could make.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

ROUNDS = 5


@dataclass(frozen=True)
class Standing:
    name: str
    ms: tuple[float, ...]  # time per input in each round

    @property
    def median(self) -> float:
        return statistics.median(self.ms)


def in_turn(items: Sequence, r: int) -> list:
    """The items in round r's order: from the r-th on, then those before it, so that no one
    always runs first, right after a start or a slow spell."""
    start = r % len(items)
    return [*items[start:], *items[:start]]


def race(
    runners: dict[str, Callable[[list], object]],
    inputs: Sequence,
    rounds: int = ROUNDS,
    warm_every_shape: Collection[str] | None = None,
) -> list[Standing]:
    """Each runner's time per input in each round, in the runners' order. Round r runs every
    rounds-th input from the r-th (inputs sorted by length give each round every length),
    each runner in turn, starting one later each round. Before the first, each runs the
    first round's inputs uncounted, and those in `warm_every_shape` (None: every runner)
    every round's: a runtime's first pass at a shape (OpenVINO compiles one per shape, a
    cost a serving instance pays once) is not its speed."""
    names = list(runners)
    times: dict[str, list[float]] = {name: [] for name in names}
    for name in names:  # each runtime's first passes at the shapes it meets (a compile) uncounted
        every = warm_every_shape is None or name in warm_every_shape
        for r in range(rounds if every else 1):
            runners[name](list(inputs[r::rounds]) or list(inputs))
    for r in range(rounds):
        part = list(inputs[r::rounds]) or list(inputs)
        for name in in_turn(names, r):
            started = time.perf_counter()
            runners[name](part)
            times[name].append((time.perf_counter() - started) * 1e3 / len(part))
    return [Standing(name, tuple(times[name])) for name in names]


def ratios(leader: Standing, rival: Standing) -> list[float]:
    """The rival's time over the leader's, round by round."""
    return [b / a for a, b in zip(leader.ms, rival.ms, strict=True)]


def ahead(leader: Standing, rival: Standing) -> bool:
    """Whether the leader's lead over the rival is larger than the rounds' spread of it."""
    r = ratios(leader, rival)
    return statistics.median(r) - 1 > max(r) - min(r)


def winner(standings: Sequence[Standing]) -> tuple[Standing, Standing]:
    """(the winner, the fastest): the first runner that no other is ahead of beyond the
    rounds' noise (callers list their runners by preference: less memory first), so within
    the noise of the fastest and clearly behind no one; the fastest where every runner has
    one ahead of it (noisy rounds need not agree)."""
    fastest = min(standings, key=lambda s: s.median)
    unbeaten = (s for s in standings if not any(ahead(r, s) for r in standings if r is not s))
    return next(unbeaten, fastest), fastest
