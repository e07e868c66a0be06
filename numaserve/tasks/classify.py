"""classify: a sequence classifier's label and probabilities for a text or a pair of texts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from numaserve.tasks.agreement import Verdict, agreement_verdict
from numaserve.tasks.base import Head, Output, Task, labels_of, softmax

# transformers' `problem_type` for a model that scores each label on its own (sigmoid);
# anything else is one label of many (softmax).
MULTI_LABEL = "multi_label_classification"


@dataclass(frozen=True)
class ClassifyResult:
    label: str
    probs: tuple[float, ...]


@dataclass(frozen=True)
class Classification:
    label: str
    probs: tuple[float, ...]  # in the model's label order
    tokens: int
    truncated: bool


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
            ClassifyResult(self.labels[int(p.argmax())], tuple(float(x) for x in p)) for p in probs
        ]

    def describe(self) -> dict:
        return {"labels": list(self.labels)}


class Classify(Task):
    name = "classify"
    output = Output.SEQUENCE_LOGITS
    takes_pairs = True
    reads_pairs = True

    def head(self, facts, width: int, directory: Path, path: str) -> Head:
        return Classifier(labels_of(facts, width), facts.problem_type == MULTI_LABEL)

    def to_wire(self, result: ClassifyResult) -> dict:
        return {"label": result.label, "probs": list(result.probs)}

    def from_wire(self, result: dict) -> Classification:
        probs = tuple(result["probs"])
        return Classification(result["label"], probs, result["tokens"], result["truncated"])

    def gate_answers(self, results, inputs, texts, labels, tokenizer) -> list:
        return [r.label for r in results]

    def gate_verdict(self, answers: list, reference: list) -> Verdict:
        return agreement_verdict(answers, reference, "texts")


CLASSIFY = Classify()
