"""What tune tells: the winner among the verified configurations, the table printed, and the
comment at the head of the file it writes."""

from __future__ import annotations

from numaserve.backends.race import Standing
from numaserve.backends.race import winner as race_winner
from numaserve.tune.search import Candidate, Prediction
from numaserve.tune.verify import Verified


def winner(results: list[Verified], p99_ms: float) -> Verified | None:
    """Of the verified configurations that served within the target in every round, the
    first listed (the config as given, first) that none leads by more than the rounds'
    spread of its lead (backends/race.py's `winner`). With one round only there is no
    spread to judge by, and the first stays. None where none held."""
    held = {r.label: (r, rounds) for r in results if (rounds := r.rounds(p99_ms))}
    if not held:
        return None
    n = min(len(rounds) for _, rounds in held.values())  # the rounds that every one ran
    if n < 2:
        return next(iter(held.values()))[0]
    standings = [
        Standing(label, tuple(1e3 / max(x, 1e-9) for x in rounds[:n]))
        for label, (_, rounds) in held.items()
    ]
    first, _ = race_winner(standings)
    return held[first.name][0]


def _shape(c: Candidate | None) -> str:
    return "as given" if c is None else c.describe()


def table(
    rows: list[tuple[str, Candidate | None, Prediction | None, Verified]], p99_ms: float
) -> str:
    lines = [
        f"{'config':<8} {'predicted/s':>11} {'p99 ms':>7} {'measured/s':>10} {'p99 ms':>7} "
        f"{'clients':>7} {'rounds/s':>14}  shape"
    ]
    for label, candidate, predicted, verified in rows:
        best = verified.best(p99_ms)
        pred = (
            f"{predicted.texts_per_s:>11.1f} {predicted.p99_ms:>7.1f}"
            if predicted
            else f"{'-':>11} {'-':>7}"
        )
        if best is None:
            meas = f"{'-':>10} {'-':>7} {'-':>7}"
        else:
            meas = f"{best.texts_per_s:>10.1f} {best.p99_ms:>7.1f} {best.clients:>7}"
        shape = _shape(candidate) + (f" ({verified.failure})" if verified.failure else "")
        rounds = "/".join(f"{x:.0f}" for x in verified.rounds(p99_ms)) or "-"
        lines.append(f"{label:<8} {pred} {meas} {rounds:>14}  {shape}")
    return "\n".join(lines)


def comment(facts: list[str], printed_table: str, chosen: str) -> list[str]:
    return [
        "Written by `numaserve tune`.",
        *facts,
        "",
        "Texts a second within the p99 target: predicted from the measured curves, and",
        "measured on a real server under `numaserve bench`'s closed loop (cache off), the",
        "best step, then that step again on a server started anew, each round in turns:",
        *printed_table.splitlines(),
        "",
        f"This file: {chosen}.",
        "",
    ]
