"""classify: a sequence classifier's label and probabilities for a text or a pair of texts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from numaserve.tasks.agreement import Verdict, agreement_verdict
from numaserve.tasks.base import (
    Bad,
    Head,
    Output,
    RawScores,
    Task,
    flag_option,
    labels_of,
    softmax,
)

# transformers' `problem_type` for a model that scores each label on its own (sigmoid);
# anything else is one label of many (softmax).
MULTI_LABEL = "multi_label_classification"


@dataclass(frozen=True)
class ClassifyResult:
    label: str
    probs: tuple[float, ...]
    logits: tuple[float, ...]


@dataclass(frozen=True)
class Classification:
    label: str
    probs: tuple[float, ...]  # in the model's label order
    tokens: int
    truncated: bool
    logits: tuple[float, ...] | None = None  # the model's own output, where asked for


class Logits(RawScores):
    raw = "logits"


class Classifier(Head):
    def __init__(self, labels: tuple[str, ...], multi_label: bool):
        self.labels, self.multi_label = labels, multi_label

    def __call__(self, out, mask, batch):
        if self.multi_label:  # each label's own probability; `label` is the likeliest
            import numpy as np

            probs = 1 / (1 + np.exp(-out))
        else:
            probs = softmax(out)
        return [
            ClassifyResult(
                self.labels[int(p.argmax())], tuple(float(x) for x in p), tuple(map(float, o))
            )
            for p, o in zip(probs, out, strict=True)
        ]

    def describe(self) -> dict:
        return {"labels": list(self.labels)}


class Classify(Task):
    name = "classify"
    output = Output.SEQUENCE_LOGITS
    takes_pairs = True
    reads_pairs = True
    option_keys = ("raw_scores",)

    def options(self, body: dict, bad: Bad) -> dict:
        return {"raw_scores": flag_option(body, "raw_scores", bad)}

    def head(self, facts, width: int, directory: Path, path: str) -> Head:
        return Classifier(labels_of(facts, width), facts.problem_type == MULTI_LABEL)

    def to_wire(self, result: ClassifyResult) -> dict:
        return {"label": result.label, "probs": list(result.probs), "logits": list(result.logits)}

    def answers(self, tokenizer, prompts) -> Logits:
        return Logits()

    def from_wire(self, result: dict) -> Classification:
        probs, logits = tuple(result["probs"]), result.get("logits")
        return Classification(
            result["label"],
            probs,
            result["tokens"],
            result["truncated"],
            tuple(logits) if logits is not None else None,
        )

    def gate_answers(self, results, inputs, texts, labels, tokenizer) -> list:
        """Each text's label and its probabilities."""
        return [(r.label, r.probs) for r in results]

    def gate_verdict(self, answers: list, reference: list) -> Verdict:
        """The label, as users act on it; the largest probability difference, to show how
        near a flip the rest came."""
        verdict = agreement_verdict([a[0] for a in answers], [r[0] for r in reference], "texts")
        drift = max(
            max(abs(x - y) for x, y in zip(a[1], r[1], strict=True))
            for a, r in zip(answers, reference, strict=True)
        )
        return Verdict(
            verdict.passed, f"{verdict.figure}; largest probability difference {drift:.4f}"
        )


CLASSIFY = Classify()
