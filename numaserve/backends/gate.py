"""The accuracy gate: whether a model path (a backend and a precision) answers closely enough
to the checkpoint in fp32 to be served, judged in each band of lengths on its own.

int8's errors depend on the length: a vector of few tokens averages none of its errors out,
and on CPUs whose int8 product saturates (AVX2 without VNNI) the shortest texts lose most,
while a long passage's errors grow with its length. A share pooled over every length hides
either, so the bar (tasks/agreement.py: the task's own measure) holds in each band of
LENGTH_EDGES. The texts: short ones as users send them and passages of 2-300 words of the
standard library's docstrings (corpus.py), all shipped with numaserve.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from numaserve.tasks import TASKS
from numaserve.tasks.agreement import Verdict

if TYPE_CHECKING:  # an instance reads verdicts (choice.py) and never tokenizes
    from numaserve.backends.tokenizer import Tokenizer

GATE_TEXTS = 320  # passages, spread over their lengths; every short text joins them
# Where one band of lengths (tokens, the special ones counted) ends and the next begins:
# 1-8 (a word or a few: chat lines, titles), 9-16 (queries, captions), 17-64 (sentences),
# 65 and up (passages). A pool whose range crosses an edge is judged in each band.
LENGTH_EDGES = (8, 16, 64)


def gate_texts(passages: Sequence[str], count: int | None = None) -> list[str]:
    """`count` passages spread evenly over the lengths (by rank), shortest to longest."""
    count = count or GATE_TEXTS
    ranked = sorted(passages, key=lambda t: (len(t.split()), t))
    step = len(ranked) / count
    return [ranked[int(i * step)] for i in range(count)]


def gate_corpus() -> list[str]:
    """What the gate judges on: the shipped short texts, then GATE_TEXTS passages."""
    from numaserve.corpus import short_texts, stdlib_passages

    return [*short_texts(), *gate_texts(stdlib_passages())]


@dataclass(frozen=True)
class Span:
    """Texts of first..last tokens."""

    first: int
    last: int

    def __str__(self) -> str:
        return f"{self.first}-{self.last} tokens"

    def holds(self, tokens: int) -> bool:
        return self.first <= tokens <= self.last

    def overlaps(self, other: Span) -> bool:
        return self.first <= other.last and other.first <= self.last

    @classmethod
    def parse(cls, text: str) -> Span:
        first, last = text.split()[0].split("-")
        return cls(int(first), int(last))


def length_bands(first: int, last: int) -> list[Span]:
    """first..last cut at LENGTH_EDGES."""
    cuts = [e for e in LENGTH_EDGES if first <= e < last]
    starts, ends = [first, *(e + 1 for e in cuts)], [*cuts, last]
    return [Span(a, b) for a, b in zip(starts, ends, strict=True)]


@dataclass(frozen=True)
class Judgement:
    """A candidate's verdict in each band of lengths that holds gate texts."""

    bands: dict[Span, Verdict]

    @property
    def passed(self) -> bool:
        return all(v.passed for v in self.bands.values())

    @property
    def figure(self) -> str:
        return "; ".join(f"{span}: {v.figure}" for span, v in self.bands.items())

    @property
    def passes_any(self) -> bool:
        """Whether it passes in some band: a path some pool's band may run."""
        return any(v.passed for v in self.bands.values())

    def within(self, span: Span) -> dict[Span, Verdict]:
        """The verdicts of the bands the span overlaps."""
        return {band: v for band, v in self.bands.items() if band.overlaps(span)}

    def passes(self, span: Span) -> bool:
        """Whether it passes in every band the span overlaps."""
        return all(v.passed for v in self.within(span).values())

    def figure_within(self, span: Span) -> str:
        return "; ".join(f"{band}: {v.figure}" for band, v in self.within(span).items())

    def to_json(self) -> dict:
        return {
            str(span): {"passed": v.passed, "figure": v.figure} for span, v in self.bands.items()
        }

    @classmethod
    def from_json(cls, data: dict) -> Judgement:
        return cls({Span.parse(k): Verdict(v["passed"], v["figure"]) for k, v in data.items()})


class Gate:
    """One task's gate inputs and fp32's answers to them; judge() runs a candidate."""

    def __init__(self, task: str, tokenizer: Tokenizer, texts: list[str], reference) -> None:
        self.task = TASKS[task]
        self.tokenizer = tokenizer
        self.texts = texts
        self.inputs = self.task.gate_inputs(tokenizer, texts)
        self.reference = self.answers(reference)
        lengths = self.task.gate_lengths(self.inputs)
        rows = {  # each band's answers, by their index
            span: [i for i, n in enumerate(lengths) if span.holds(n)]
            for span in length_bands(1, max(lengths))
        }
        self.bands = {span: r for span, r in rows.items() if r}

    def judge(self, candidate) -> Judgement:
        """The candidate's verdict in each band (its speed is race.py's to measure)."""
        answers = self.answers(candidate)
        return Judgement(
            {
                span: self.task.gate_verdict(
                    [answers[i] for i in rows], [self.reference[i] for i in rows]
                )
                for span, rows in self.bands.items()
            }
        )

    def answers(self, model) -> list:
        results = [model.run([list(e.ids)], [e.second])[0] for e in self.inputs]
        return self.task.gate_answers(
            results, self.inputs, self.texts, model.labels, self.tokenizer
        )


def run_in_batches(model, inputs: list, batch: int = 1) -> None:
    """A candidate on some of the gate's inputs as a pool runs them at one load, what
    quantize: auto times: each alone (batch 1: a pool at low load) or `batch` neighbours at a
    time (the micro-batches of a pool under load), each pass meeting whatever shapes traffic
    brings."""
    for i in range(0, len(inputs), batch):
        group = inputs[i : i + batch]
        model.run([list(e.ids) for e in group], [e.second for e in group])
