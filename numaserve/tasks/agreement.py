"""How close a model path's answers are to the checkpoint's in fp32, for each kind of answer
a task gives, and the bars the accuracy gate (backends/gate.py) holds them to:
- vectors: cosine at least 0.99 on 99% of texts and at least 0.98 on every one;
- decisions (a label, a top document): the same as fp32's on at least 98%;
- entities: F1 against fp32's at least 98%.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

COSINE_BAR, COSINE_SHARE, COSINE_FLOOR = 0.99, 0.99, 0.98
AGREEMENT = 0.98  # labels, top documents, entity F1


@dataclass(frozen=True)
class Verdict:
    passed: bool
    figure: str  # what was measured against what the bar is, for the log and the refusal


def cosine_verdict(candidate: Sequence, reference: Sequence, what: str = "texts") -> Verdict:
    """Vectors, one per text (or per token: `what` names them)."""
    import numpy as np

    a, b = np.stack(candidate), np.stack(reference)
    cosine = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    share, lowest = float((cosine >= COSINE_BAR).mean()), float(cosine.min())
    return Verdict(
        share >= COSINE_SHARE and lowest >= COSINE_FLOOR,
        f"cosine to fp32 >= {COSINE_BAR} on {share:.1%} of {len(cosine)} {what} (bar "
        f"{COSINE_SHARE:.0%}), lowest {lowest:.4f} (bar {COSINE_FLOOR}), median "
        f"{float(np.median(cosine)):.4f}",
    )


def agreement_verdict(candidate: Sequence, reference: Sequence, what: str) -> Verdict:
    """The same decision (a label, a top document) as fp32's, for `what` (texts, queries)."""
    same = sum(a == b for a, b in zip(candidate, reference, strict=True))
    share = same / len(reference)
    return Verdict(
        share >= AGREEMENT,
        f"the same as fp32 for {same} of {len(reference)} {what}: {share:.1%} "
        f"(bar {AGREEMENT:.0%})",
    )


def f1_verdict(candidate: Sequence[set], reference: Sequence[set]) -> Verdict:
    """Entities, a set of (start, end, label) per text; fp32's are the truth."""
    found = sum(len(c) for c in candidate)
    expected = sum(len(r) for r in reference)
    right = sum(len(c & r) for c, r in zip(candidate, reference, strict=True))
    f1 = 1.0 if found == expected == 0 else 2 * right / (found + expected)
    return Verdict(
        f1 >= AGREEMENT,
        f"entity F1 against fp32 {f1:.1%} ({expected} entities; bar {AGREEMENT:.0%})",
    )
