"""ner: a token classifier's named entities, with character spans of the text.

The worker sends each token's probabilities; the router shard, which has the text and the
tokenizer's offsets, turns them into entities (entities.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from numaserve.tasks.agreement import Verdict, f1_verdict
from numaserve.tasks.base import Answers, Bad, Head, Output, Task, labels_of, softmax
from numaserve.wire import protocol

# How tokens become entities, as transformers' token-classification pipeline names it.
AGGREGATIONS = ("none", "simple", "first", "average", "max")
DEFAULT_AGGREGATION = "simple"


@dataclass(frozen=True)
class Entity:
    label: str  # the entity type ("PER"); with aggregation "none", the token's label ("B-PER")
    score: float
    start: int  # character span in the text: text[start:end]
    end: int
    text: str
    index: int | None = None  # aggregation "none": the token's place among the text's tokens


@dataclass(frozen=True)
class Entities:
    entities: list[Entity]
    tokens: int
    truncated: bool


class TokenScores(Head):
    def __init__(self, labels: tuple[str, ...]):
        self.labels = labels

    def __call__(self, out, mask, batch):
        """Each token's probabilities, the padding cut off."""
        import numpy as np

        probs = softmax(out).astype(np.float32)
        return [probs[row, : len(seq)] for row, seq in enumerate(batch)]

    def describe(self) -> dict:
        return {"labels": list(self.labels)}


class Found(Answers):
    """Each text's entities from its tokens' probabilities."""

    def __init__(self, word_aware: bool):
        # numpy only where entities are found: importing it starts OpenBLAS's threads, and
        # only a router with a ner model needs it (after it has pinned itself).
        from numaserve.tasks import entities

        self.find = entities.entities
        self.word_aware = word_aware
        # The model's labels, as its instances announce them in READY: every result (and so
        # every cache entry) comes from an instance that has.
        self.labels: tuple[str, ...] = ()

    def learn(self, labels: tuple[str, ...]) -> None:
        if labels:
            self.labels = labels

    def finish(self, request, encoded, results):
        aggregation = request.options["aggregation"]
        for text, enc, result in zip(request.texts, encoded, results, strict=True):
            scores = protocol.embedding_from_wire(result.pop("scores"))
            rows = scores.reshape(len(enc.ids), len(self.labels))
            result["entities"] = self.find(
                text, enc.tokens, rows, self.labels, aggregation, self.word_aware
            )
        return results


class Ner(Task):
    name = "ner"
    output = Output.TOKEN_LOGITS
    option_keys = ("aggregation",)
    needs_tokens = True

    def options(self, body: dict, bad: Bad) -> dict:
        aggregation = body.get("aggregation", DEFAULT_AGGREGATION)
        if aggregation not in AGGREGATIONS:
            raise bad(f"aggregation must be one of {', '.join(AGGREGATIONS)}")
        return {"aggregation": aggregation}

    def head(self, facts, width: int, directory: Path, path: str) -> Head:
        return TokenScores(labels_of(facts, width))

    def to_wire(self, result) -> dict:
        return {"scores": protocol.embedding_to_wire(result.ravel())}  # row by row, float32

    def answers(self, tokenizer, prompts) -> Answers:
        return Found(tokenizer.word_aware)

    def from_wire(self, result: dict) -> Entities:
        found = [Entity(**e) for e in result["entities"]]
        return Entities(found, result["tokens"], result["truncated"])

    def gate_inputs(self, tokenizer, texts: list[str]) -> list:
        return tokenizer.encode_tagged(texts)

    def gate_answers(self, results, inputs, texts, labels, tokenizer) -> list:
        """Each text's entities (the default aggregation), as (start, end, label)."""
        from numaserve.tasks.entities import entities

        return [
            {
                (e["start"], e["end"], e["label"])
                for e in entities(
                    text, encoded.tokens, scores, labels, DEFAULT_AGGREGATION, tokenizer.word_aware
                )
            }
            for text, encoded, scores in zip(texts, inputs, results, strict=True)
        ]

    def gate_verdict(self, answers: list, reference: list) -> Verdict:
        return f1_verdict(answers, reference)


NER = Ner()
