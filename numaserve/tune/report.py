"""What tune tells: the winner among the verified configurations, the table printed, and the
comment at the head of the file it writes."""

from __future__ import annotations

from numaserve.tune.search import Candidate, Prediction
from numaserve.tune.verify import Verified


def winner(results: list[Verified], p99_ms: float) -> Verified | None:
    """The verified configuration with the most throughput within the target; the config as
    given (first) wins a tie, and only a measured gain replaces it."""
    scored = [(r, r.best(p99_ms)) for r in results]
    scored = [(r, s) for r, s in scored if s is not None]
    if not scored:
        return None
    return max(scored, key=lambda rs: rs[1].texts_per_s)[0]


def _shape(c: Candidate | None) -> str:
    return "as given" if c is None else c.describe()


def table(
    rows: list[tuple[str, Candidate | None, Prediction | None, Verified]], p99_ms: float
) -> str:
    lines = [
        f"{'config':<8} {'predicted/s':>11} {'p99 ms':>7} {'measured/s':>10} {'p99 ms':>7} "
        f"{'clients':>7}  shape"
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
        lines.append(f"{label:<8} {pred} {meas}  {shape}")
    return "\n".join(lines)


def comment(facts: list[str], printed_table: str, chosen: str) -> list[str]:
    return [
        "Written by `numaserve tune`.",
        *facts,
        "",
        "Texts a second within the p99 target: predicted from the measured curves, and",
        "measured on a real server under `numaserve bench`'s closed loop (cache off):",
        *printed_table.splitlines(),
        "",
        f"This file: {chosen}.",
        "",
    ]
