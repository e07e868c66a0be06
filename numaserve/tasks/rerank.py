"""rerank: a cross-encoder's score for each (query, document) pair, answered best first
where `top_k` asks for the best k only."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from numaserve.checkpoint.errors import ModelLoadError
from numaserve.checkpoint.files import read_json
from numaserve.tasks.agreement import Verdict, agreement_verdict
from numaserve.tasks.base import Bad, Head, Output, RawScores, Task, flag_option, windows_option
from numaserve.wire.protocol import check_text

GATE_DOCUMENTS = 8  # the documents each query of the accuracy gate ranks
TOP = 3  # the top documents whose order the gate reports

# What a cross-encoder's one logit becomes: sentence-transformers' CrossEncoder applies the
# activation its config names (Sigmoid unless it says otherwise).
ACTIVATIONS = ("Sigmoid", "Identity")


@dataclass(frozen=True)
class Scored:
    score: float  # after the activation
    logit: float  # the model's own output


@dataclass(frozen=True)
class Ranked:
    index: int  # the document's place in the request
    score: float  # the cross-encoder's score for (query, document)
    tokens: int  # of the pair, special tokens included (of every window scored)
    truncated: bool  # the document was cut: to max_length, or to max_chunks_per_doc windows
    logit: float | None = None  # the model's own output, where asked for
    chunks: int = 1  # the windows of the document scored; its score is the best one's


def activation(directory: str | Path, path: str) -> str:
    """The name of the activation sentence-transformers applies to this cross-encoder's
    logit (config_sentence_transformers.json, or config.json's `sentence_transformers` in
    older saves); refused where numaserve does not have it."""
    root = Path(directory)
    saved = root / "config_sentence_transformers.json"
    settings = read_json(saved) if saved.is_file() else {}
    if "activation_fn" not in settings:
        settings = read_json(root / "config.json").get("sentence_transformers") or {}
    name = str(settings.get("activation_fn") or "Sigmoid").rsplit(".", 1)[-1]
    if name not in ACTIVATIONS:
        known = ", ".join(ACTIVATIONS)
        raise ModelLoadError(
            f"{path}: its cross-encoder activation is {name}; numaserve applies {known}"
        )
    return name


class Scorer(Head):
    def __init__(self, activation: str):
        self.sigmoid = activation == "Sigmoid"

    def __call__(self, out, mask, batch):
        logits = out[:, 0]
        scores = logits
        if self.sigmoid:
            import numpy as np

            scores = 1 / (1 + np.exp(-logits))
        return [Scored(float(s), float(x)) for s, x in zip(scores, logits, strict=True)]


def ranked(results: list[dict], top_k: int | None) -> list[dict]:
    """Each document's score with its index; with top_k, the best k only, best first
    (documents that score the same keep their order)."""
    results = [{"index": i, **result} for i, result in enumerate(results)]
    if top_k is None:
        return results
    return sorted(results, key=lambda r: -r["score"])[:top_k]


class Ranking(RawScores):
    raw = "logit"

    def finish(self, request, encoded, results):
        for result, enc in zip(results, encoded, strict=True):
            result["chunks"] = len(enc.windows)
        return ranked(super().finish(request, encoded, results), request.options["top_k"])

    def best(self, kept: dict, new: dict) -> dict:
        """A long document scores its best window's score."""
        return new if new["score"] > kept["score"] else kept


class Rerank(Task):
    name = "rerank"
    output = Output.SEQUENCE_LOGITS
    reads_pairs = True
    inputs_are = "documents"
    option_keys = ("query", "top_k", "raw_scores", "max_chunks_per_doc")
    reads_windows = windows_by_default = True

    def options(self, body: dict, bad: Bad) -> dict:
        query, top_k = body.get("query"), body.get("top_k")
        check_text(query, "query", bad)
        if top_k is not None and (
            isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1
        ):
            raise bad("top_k must be an integer of at least 1")
        chunks = windows_option(body, bad)
        return {
            "query": query,
            "top_k": top_k,
            "raw_scores": flag_option(body, "raw_scores", bad),
            "max_chunks_per_doc": chunks,
        }

    def inputs(self, request) -> list:
        return [(request.options["query"], document) for document in request.texts]

    def check_checkpoint(self, directory: Path, path: str) -> None:
        activation(directory, path)

    def head(self, facts, width: int, directory: Path, path: str) -> Head:
        if width != 1:
            raise ModelLoadError(
                f"{path} has {width} labels; a reranker (a cross-encoder) has one "
                "score: serve this model with task: classify"
            )
        return Scorer(activation(directory, path))

    def to_wire(self, result: Scored) -> dict:
        return {"score": result.score, "logit": result.logit}

    def answers(self, tokenizer, prompts) -> Ranking:
        return Ranking()

    def from_wire(self, result: dict) -> Ranked:
        return Ranked(
            result["index"],
            result["score"],
            result["tokens"],
            result["truncated"],
            result.get("logit"),
            result.get("chunks", 1),
        )

    def gate_inputs(self, tokenizer, texts: list[str]) -> list:
        """Each text's opening words ask for it among itself and the next texts."""
        n = GATE_DOCUMENTS
        queries = [" ".join(t.split()[:8]) for t in texts]
        return tokenizer.encode(
            [(q, texts[(i + k) % len(texts)]) for i, q in enumerate(queries) for k in range(n)]
        )

    def gate_lengths(self, inputs: list) -> list[int]:
        """Each query's longest pair."""
        n = GATE_DOCUMENTS
        return [max(len(e.ids) for e in inputs[i : i + n]) for i in range(0, len(inputs), n)]

    def gate_answers(self, results, inputs, texts, labels, tokenizer) -> list:
        """Each query's documents, best first."""
        n = GATE_DOCUMENTS
        return [
            tuple(sorted(range(n), key=lambda k: -results[i + k].score))
            for i in range(0, len(results), n)
        ]

    def gate_verdict(self, answers: list, reference: list) -> Verdict:
        """The top document, as users act on it; and how often the top three came in
        fp32's order."""
        verdict = agreement_verdict([a[0] for a in answers], [r[0] for r in reference], "queries")
        same = sum(a[:TOP] == r[:TOP] for a, r in zip(answers, reference, strict=True))
        return Verdict(
            verdict.passed,
            f"{verdict.figure}; the top {TOP} in fp32's order for {same / len(answers):.1%}",
        )


RERANK = Rerank()
