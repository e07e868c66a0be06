"""What a router shard adds to its instances' results before it answers: per task.

embed and classify answer the results as computed; rerank ranks its documents; ner turns each
text's token probabilities into entities (entities.py).
"""

from __future__ import annotations

from numaserve import protocol
from numaserve.backends.tokenizer import Tokenizer


def ranked(results: list[dict], top_k: int | None) -> list[dict]:
    """rerank's answer: each document's score with its index; with top_k, the best k only,
    best first (documents that score the same keep their order)."""
    results = [{"index": i, **result} for i, result in enumerate(results)]
    if top_k is None:
        return results
    return sorted(results, key=lambda r: -r["score"])[:top_k]


class Entities:
    """ner's answers: each text's entities from its tokens' probabilities (entities.py)."""

    def __init__(self, tokenizer: Tokenizer):
        # numpy only where entities are found: importing it starts OpenBLAS's threads, and
        # only a router with a ner model needs it (after it has pinned itself).
        from numaserve.router import entities

        self.find = entities.entities
        self.word_aware = tokenizer.word_aware
        # The model's labels, as its instances announce them in READY: every result (and so
        # every cache entry) comes from an instance that has.
        self.labels: tuple[str, ...] = ()

    def found(self, request: protocol.Request, encoded: list, results: list[dict]) -> list[dict]:
        out = []
        for text, enc, result in zip(request.texts, encoded, results, strict=True):
            scores = protocol.embedding_from_wire(result.pop("scores"))
            rows = scores.reshape(len(enc.ids), len(self.labels))
            result["entities"] = self.find(
                text, enc.tokens, rows, self.labels, request.aggregation, self.word_aware
            )
            out.append(result)
        return out


def finished(
    request: protocol.Request, encoded: list, results: list[dict], entities: Entities | None
) -> list[dict]:
    """The results a request is answered with: each with its token count and truncation,
    then whatever its task adds."""
    results = [
        {**result, "tokens": len(enc.ids), "truncated": enc.truncated}
        for result, enc in zip(results, encoded, strict=True)
    ]
    if request.op == "rerank":
        return ranked(results, request.top_k)
    if entities is not None:
        return entities.found(request, encoded, results)
    return results
