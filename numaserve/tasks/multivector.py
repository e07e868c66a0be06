"""multivector: late interaction (ColBERT). Each text becomes one vector per token, as
sentence-transformers' MultiVectorEncoder saves such a model: its Transformer, Dense
projections of every token vector, Normalize, then a MultiVectorMask that says which tokens
count. A query scores a document by MaxSim: each query vector's best match, summed.

A text is read on one of two sides, as `encode_query` and `encode_document` read it: a request's
`prompt_name` "query", else "document". Each side has its own prompt, its own length, and its
own treatment:
- a query is cut to its length and, with query expansion, padded to it with the expansion
  token (the tokenizer's [MASK]): those positions are scored, and attended to by the encoder
  only where the checkpoint says `attend` (the router does the cut and the padding; the worker
  reads the trailing expansion tokens of an input as such: `Multi.attended`);
- a document is cut to its length, and loses the skiplist's tokens (punctuation, as ColBERT
  has it) from its vectors (the router drops them from the worker's rows: `Kept`).
How a checkpoint says all this, tasks/sides.py reads.

Rows travel as little-endian float32 bytes, `tokens` of them, `dim` wide.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING

from numaserve.tasks.agreement import Verdict, cosine_verdict
from numaserve.tasks.base import Answers, Bad, Head, Output, Task
from numaserve.tasks.prompts import Prompts
from numaserve.tasks.rerank import RERANK, Ranking
from numaserve.tasks.sides import DOCUMENT, QUERY, SIDES, SidedPrompts, Sides, side_of
from numaserve.wire import protocol

if TYPE_CHECKING:
    import numpy as np

MAX_POOL_FACTOR = 32  # pool_factor's largest: a document's vectors to a 32nd at most


@dataclass(frozen=True)
class MultiVectors:
    """A text's vectors: one row per token that counts (`vectors.shape[0]`)."""

    vectors: np.ndarray  # float32, (rows, dim); unit length where the model normalizes
    tokens: int  # the tokens the model read
    truncated: bool


class Multi(Head):
    """Every token vector of each input, projected and normalized as the checkpoint's modules
    say; the router keeps those that count."""

    def __init__(self, sides: Sides, width: int):
        self.sides = sides
        self.dim = sides.dense[-1].out_features if sides.dense else width
        self.hides_tokens = sides.expansion is not None and not sides.expansion.attend

    def attended(self, batch: list[list[int]]) -> list[int] | None:
        """How many of each input's tokens the encoder attends to: a query's expansion tokens
        at its end are read but not attended, unless the checkpoint says `attend`."""
        expansion = self.sides.expansion
        if expansion is None or expansion.attend:
            return None
        pad = expansion.token_id
        counts = []
        for ids in batch:
            n = len(ids)
            while n > 1 and ids[n - 1] == pad:
                n -= 1
            counts.append(n)
        return counts

    def __call__(self, out, mask, batch):
        import numpy as np

        results = []
        for row, ids in zip(out, batch, strict=True):
            vectors = row[: len(ids)]
            for layer in self.sides.dense:
                vectors = layer(vectors.astype(np.float32, copy=False))
            if self.sides.normalize:
                norms = np.linalg.norm(vectors, axis=1, keepdims=True)
                vectors = vectors / np.maximum(norms, 1e-12)
            results.append(np.ascontiguousarray(vectors, dtype=np.float32))
        return results

    def describe(self) -> dict:
        return {"dim": self.dim}


class Kept(Answers):
    """Drops the rows of skiplisted tokens on the sides the skiplist applies to, window by
    window; a long document's windows give all their rows (MaxSim then takes each query
    vector's best match anywhere in it); for a rerank, scores each document by MaxSim
    against the query."""

    def __init__(self, sides: Sides):
        self.sides = sides

    def arrived(self, request, index, ids, result):
        if self.side(request, index) in self.sides.skip_sides and self.sides.skip_ids:
            import numpy as np

            keep = ~np.isin(np.array(ids), self.skipped)
            if not keep.all():
                result = {**result, "vectors": protocol.embedding_to_wire(rows_of(result)[keep])}
        return result

    @functools.cached_property
    def skipped(self) -> np.ndarray:
        import numpy as np

        return np.array(sorted(self.sides.skip_ids))

    def best(self, kept: dict, new: dict) -> dict:
        import numpy as np

        rows = np.concatenate([rows_of(kept), rows_of(new)])
        return {**kept, "vectors": protocol.embedding_to_wire(rows)}

    @staticmethod
    def side(request, index: int) -> str:
        """The side input `index` of `request` is read on: a rerank's query, then its
        documents (encode_for); the side a request names."""
        if request.op == RERANK.name:
            return QUERY if index == 0 else DOCUMENT
        return side_of(request.options.get("prompt_name"))

    def finish(self, request, encoded, results):
        factor = request.options.get("pool_factor")
        if factor and factor > 1:
            for i, result in enumerate(results):
                if self.side(request, i) == DOCUMENT:
                    result["vectors"] = protocol.embedding_to_wire(
                        token_pooled(rows_of(result), factor)
                    )
        if request.op != RERANK.name:
            return results
        return Ranking().finish(request, encoded[1:], maxsim(results[0], results[1:]))


def rows_of(result: dict) -> np.ndarray:
    """A result's rows, `dim` wide."""
    return protocol.embedding_from_wire(result["vectors"]).reshape(-1, result["dim"])


def token_pooled(rows: np.ndarray, factor: float, protected: int = 1) -> np.ndarray:
    """A document's vectors pooled as sentence-transformers' HierarchicalTokenPooling pools
    them: the first `protected` ([CLS]) kept, the rest clustered by Ward's linkage on cosine
    distance into len // factor clusters, each the mean of its vectors; all made unit length.
    What a store keeps shrinks by the factor, and MaxSim barely moves."""
    import numpy as np
    from scipy.cluster import hierarchy
    from scipy.spatial.distance import squareform

    kept, rest = rows[:protected], rows[protected:]
    clusters = max(int(len(rest) // factor), 1)
    if clusters < len(rest):
        distance = np.clip(1 - rest @ rest.T, 0, 2)
        linkage = hierarchy.linkage(squareform(distance, checks=False), method="ward")
        labels = hierarchy.fcluster(linkage, t=clusters, criterion="maxclust")
        _, cluster = np.unique(labels, return_inverse=True)
        sums = np.zeros((cluster.max() + 1, rows.shape[1]), dtype=np.float32)
        np.add.at(sums, cluster, rest)
        rest = sums / np.bincount(cluster)[:, None]
    pooled = np.concatenate([kept, rest]).astype(np.float32)
    return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)


def maxsim(query: dict, documents: list[dict]) -> list[dict]:
    """Each document's MaxSim against the query (each query vector's best match among the
    document's, summed) as its `logit`, and that sum over the query's vectors as its `score`:
    the mean best cosine, from -1 to 1, where the model normalizes."""
    q = protocol.embedding_from_wire(query["vectors"]).reshape(-1, query["dim"])
    scored = []
    for document in documents:
        d = protocol.embedding_from_wire(document["vectors"]).reshape(-1, document["dim"])
        total = float((q @ d.T).max(axis=1).sum()) if len(d) else 0.0
        scored.append(
            {
                "score": total / max(len(q), 1),
                "logit": total,
                "tokens": document["tokens"],
                "truncated": document["truncated"],
            }
        )
    return scored


class MultiVector(Task):
    name = "multivector"
    output = Output.HIDDEN_STATE
    option_keys = ("prompt_name", "pool_factor")
    cached = False  # a text's vectors are a hundred times a pooled vector's size
    answers_per_token = True
    serves_also = (RERANK.name,)  # by MaxSim

    def options(self, body: dict, bad: Bad) -> dict:
        name, factor = body.get("prompt_name"), body.get("pool_factor")
        if name is not None and name not in SIDES:
            raise bad('prompt_name must be "query" or "document" (the default)')
        if factor is not None and (
            isinstance(factor, bool)
            or not isinstance(factor, int | float)
            or not 1 <= factor <= MAX_POOL_FACTOR
        ):
            raise bad(f"pool_factor must be a number of 1-{MAX_POOL_FACTOR}")
        if factor is not None and factor > 1 and find_spec("scipy") is None:
            raise bad(
                "pool_factor clusters with scipy, which this server lacks (pip install scipy)"
            )
        return {"prompt_name": name, "pool_factor": factor}

    def prompts(self, directory: Path) -> Prompts:
        return SidedPrompts(Sides.read(directory, str(directory)))

    def answers(self, tokenizer, prompts: Prompts) -> Answers:
        assert isinstance(prompts, SidedPrompts)
        return Kept(prompts.sides)

    def encode_for(self, request, tokenizer, prompts, windows) -> list:
        """A rerank's query, read as a query, then its documents, read as documents: a long
        one in up to `windows` windows, each beginning with the documents' prompt."""
        cut = dict(truncate=request.truncate, left=request.cuts_left)
        query = [request.options["query"]]
        documents = list(request.texts)
        if windows > 1:
            read = tokenizer.encode_windows(documents, windows, prompts.prompt(DOCUMENT))
        else:
            read = tokenizer.encode(prompts.applied(DOCUMENT, documents), **cut)
        return [
            *prompts.fitted(QUERY, tokenizer.encode(prompts.applied(QUERY, query), **cut)),
            *prompts.fitted(DOCUMENT, read),
        ]

    def check_checkpoint(self, directory: Path, path: str) -> None:
        Sides.read(directory, path)

    def head(self, facts, width: int, directory: Path, path: str) -> Head:
        return Multi(Sides.read(Path(directory), path), width)

    def to_wire(self, result) -> dict:
        return {"vectors": protocol.embedding_to_wire(result), "dim": result.shape[1]}

    def from_wire(self, result: dict) -> MultiVectors:
        return MultiVectors(rows_of(result), result["tokens"], result["truncated"])

    def gate_inputs(self, tokenizer, texts: list[str]) -> list:
        """Each text as a document, and as a query: expanded, where the model expands them."""
        from numaserve.checkpoint.paths import resolve_model_path

        prompts = SidedPrompts(Sides.read(Path(resolve_model_path(tokenizer.path)), tokenizer.path))
        return [
            e
            for side in SIDES
            for e in prompts.fitted(side, tokenizer.encode(prompts.applied(side, texts)))
        ]

    def gate_verdict(self, answers: list, reference: list) -> Verdict:
        """Every token vector of every text against fp32's."""
        rows = [r for matrix in answers for r in matrix]
        return cosine_verdict(rows, [r for matrix in reference for r in matrix], "token vectors")


MULTIVECTOR = MultiVector()
