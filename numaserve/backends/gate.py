"""The accuracy gate: whether a model path (a backend and a precision) answers closely enough
to the checkpoint in fp32 to be served, measured on prose of every length.

Short sentences hide int8's errors: they grow with length (docs/accuracy.md). The texts are
passages of the standard library's docstrings, 2-300 words (corpus.py), that ship with every
Python. What each task compares, and its bar, is the task's (tasks/agreement.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from numaserve.backends.tokenizer import Tokenizer
from numaserve.tasks import TASKS
from numaserve.tasks.agreement import Verdict

GATE_TEXTS = 320


def gate_texts(passages: Sequence[str], count: int | None = None) -> list[str]:
    """`count` passages spread evenly over the lengths (by rank), shortest to longest."""
    count = count or GATE_TEXTS
    ranked = sorted(passages, key=lambda t: (len(t.split()), t))
    step = len(ranked) / count
    return [ranked[int(i * step)] for i in range(count)]


class Gate:
    """One task's gate inputs and fp32's answers to them; judge() runs a candidate."""

    def __init__(self, task: str, tokenizer: Tokenizer, texts: list[str], reference) -> None:
        self.task = TASKS[task]
        self.tokenizer = tokenizer
        self.texts = texts
        self.inputs = self.task.gate_inputs(tokenizer, texts)
        self.reference = self.answers(reference)

    def judge(self, candidate) -> Verdict:
        """The candidate's verdict on every input (its speed is race.py's to measure)."""
        return self.task.gate_verdict(self.answers(candidate), self.reference)

    def answers(self, model) -> list:
        results = [model.run([list(e.ids)], [e.second])[0] for e in self.inputs]
        return self.task.gate_answers(
            results, self.inputs, self.texts, model.labels, self.tokenizer
        )


def run_as_a_pool(model, inputs: list, batch: int = 1) -> None:
    """A candidate on some of the gate's inputs as a pool runs them, what quantize: auto
    times: each alone (a pool at low load), then, for a pool that micro-batches, `batch` at
    a time (under load), each of those passes meeting whatever shapes traffic brings."""
    for e in inputs:
        model.run([list(e.ids)], [e.second])
    if batch > 1:
        for i in range(0, len(inputs), batch):
            group = inputs[i : i + batch]
            model.run([list(e.ids) for e in group], [e.second for e in group])
