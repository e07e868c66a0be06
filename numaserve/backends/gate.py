"""The accuracy gate: whether a model path (a backend and a precision) answers closely enough
to the checkpoint in fp32 to be served, measured on prose of every length.

Short sentences hide int8's errors: they grow with length (docs/accuracy.md). The texts are
passages of the standard library's docstrings, 2-300 words (loadgen/corpus.py), that ship
with every Python. The bars, for each task:
- embed: cosine to fp32 at least 0.99 on 99% of texts and at least 0.98 on every one;
- classify: the same label as fp32 on at least 98% of texts;
- rerank: the same top document as fp32 for at least 98% of queries;
- ner: entity F1 against fp32's entities at least 98%.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from numaserve.backends.tokenizer import Encoded, Tokenizer
from numaserve.tasks.entities import entities

GATE_TEXTS = 320
COSINE_BAR, COSINE_SHARE, COSINE_FLOOR = 0.99, 0.99, 0.98
AGREEMENT = 0.98  # classify labels, rerank top documents, ner entity F1
DOCUMENTS_PER_QUERY = 8


@dataclass(frozen=True)
class Verdict:
    passed: bool
    figure: str  # what was measured against what the bar is, for the log and the refusal


def cosine_verdict(candidate: np.ndarray, reference: np.ndarray) -> Verdict:
    """Embeddings, one row per text."""
    cosine = (candidate * reference).sum(1) / (
        np.linalg.norm(candidate, axis=1) * np.linalg.norm(reference, axis=1)
    )
    share, lowest = float((cosine >= COSINE_BAR).mean()), float(cosine.min())
    return Verdict(
        share >= COSINE_SHARE and lowest >= COSINE_FLOOR,
        f"cosine to fp32 >= {COSINE_BAR} on {share:.1%} of {len(cosine)} texts (bar "
        f"{COSINE_SHARE:.0%}), lowest {lowest:.4f} (bar {COSINE_FLOOR}), median "
        f"{float(np.median(cosine)):.4f}",
    )


def agreement_verdict(candidate: Sequence, reference: Sequence, what: str) -> Verdict:
    """The same decision (a label, a top document) as fp32's, for `what` (texts, queries)."""
    same = sum(a == b for a, b in zip(candidate, reference, strict=True))
    share = same / len(reference)
    return Verdict(
        share >= AGREEMENT,
        f"the same as fp32 for {same} of {len(reference)} {what}: {share:.1%} (bar {AGREEMENT:.0%})",
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


def gate_texts(passages: Sequence[str], count: int = GATE_TEXTS) -> list[str]:
    """`count` passages spread evenly over the lengths (by rank), shortest to longest."""
    ranked = sorted(passages, key=lambda t: (len(t.split()), t))
    step = len(ranked) / count
    return [ranked[int(i * step)] for i in range(count)]


class Gate:
    """The inputs of one task's gate and fp32's answers to them; judge() runs a candidate."""

    def __init__(self, task: str, tokenizer: Tokenizer, texts: list[str], reference) -> None:
        self.task = task
        self.texts = texts
        self.word_aware = tokenizer.word_aware
        if task == "rerank":  # each text's opening words ask for it among its neighbours
            queries = [" ".join(t.split()[:8]) for t in texts]
            n = DOCUMENTS_PER_QUERY
            self.inputs = tokenizer.encode(
                [(q, texts[(i + k) % len(texts)]) for i, q in enumerate(queries) for k in range(n)]
            )
        elif task == "ner":
            self.inputs = tokenizer.encode_tagged(texts)
        else:
            self.inputs = tokenizer.encode(texts)
        self.reference = self.decisions(reference)

    def judge(self, candidate) -> Verdict:
        answers = self.decisions(candidate)
        if self.task == "embed":
            return cosine_verdict(np.stack(answers), np.stack(self.reference))
        if self.task == "ner":
            return f1_verdict(answers, self.reference)
        what = "queries" if self.task == "rerank" else "texts"
        return agreement_verdict(answers, self.reference, what)

    def decisions(self, model) -> list:
        """What the gate compares: vectors, labels, top documents, entity sets."""
        out = [model.run([list(e.ids)], [e.second])[0] for e in self.inputs]
        if self.task == "embed":
            return out
        if self.task == "classify":
            return [r.label for r in out]
        if self.task == "rerank":
            n = DOCUMENTS_PER_QUERY
            return [int(np.argmax(out[i : i + n])) for i in range(0, len(out), n)]
        return [
            self._entities(text, encoded, scores, model.labels)
            for text, encoded, scores in zip(self.texts, self.inputs, out, strict=True)
        ]

    def _entities(self, text: str, encoded: Encoded, scores: np.ndarray, labels) -> set:
        found = entities(text, encoded.tokens, scores, labels, "simple", self.word_aware)
        return {(e["start"], e["end"], e["label"]) for e in found}
