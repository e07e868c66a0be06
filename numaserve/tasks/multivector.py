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

Rows travel as little-endian float32 bytes, `tokens` of them, `dim` wide.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, replace
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING

from numaserve.checkpoint.errors import ModelLoadError
from numaserve.checkpoint.files import read_json
from numaserve.tasks.agreement import Verdict, cosine_verdict
from numaserve.tasks.base import Answers, Bad, Head, Output, Task
from numaserve.tasks.prompts import PROMPTS_FILE, Prompts, Text
from numaserve.tasks.rerank import RERANK, Ranking
from numaserve.wire import protocol

if TYPE_CHECKING:
    import numpy as np

    from numaserve.tasks.pooling import Dense

QUERY, DOCUMENT = "query", "document"
SIDES = (QUERY, DOCUMENT)
# encode_document's prompt: the first of these the model has (sentence-transformers' order).
DOCUMENT_PROMPTS = ("document", "passage", "corpus")
# The module types of a MultiVectorEncoder numaserve runs, by class name.
TRANSFORMER, DENSE, NORMALIZE, MASK = "Transformer", "Dense", "Normalize", "MultiVectorMask"
STRATEGIES = ("fixed", "min")
MAX_POOL_FACTOR = 32  # token pooling keeps a document's vectors over this, at least
PYLATE_V3 = "ColBERT"  # config_sentence_transformers.json's model_type in PyLate's older saves
# The top-level keys of those saves' config_sentence_transformers.json.
PYLATE_KEYS = (
    "query_length",
    "document_length",
    "do_query_expansion",
    "attend_to_expansion_tokens",
    "attend_to_mask_tokens",
    "query_prefix",
    "document_prefix",
    "skiplist_words",
)


@dataclass(frozen=True)
class MultiVectors:
    """A text's vectors: one row per token that counts (`vectors.shape[0]`)."""

    vectors: np.ndarray  # float32, (rows, dim); unit length where the model normalizes
    tokens: int  # the tokens the model read
    truncated: bool


@dataclass(frozen=True)
class Expansion:
    """ColBERT's query expansion (sentence-transformers' QueryExpansionConfig): a query shorter
    than `length` tokens is padded to it with `token_id`; `fixed` also cuts longer ones."""

    strategy: str
    attend: bool
    token_id: int
    length: int


@dataclass(frozen=True)
class Sides:
    """How a late-interaction checkpoint reads a text on each side, from its own files."""

    prompts: dict[str, str]  # the model's prompts, by name
    query_length: int | None
    document_length: int | None
    expansion: Expansion | None
    skip_ids: frozenset[int]  # the skiplist's tokens, by id
    skip_sides: tuple[str, ...]  # the sides whose vectors leave them out
    dense: tuple[Dense, ...]
    normalize: bool

    @classmethod
    def read(cls, directory: Path, path: str) -> Sides:
        """A save of sentence-transformers 6, or PyLate's older one (its settings at the top
        of config_sentence_transformers.json, and only a Transformer and a Dense), read as
        MultiVectorEncoder converts it: the punctuation skiplist on documents unless it names
        another, and Normalize."""
        root = Path(directory)
        config = _json(root / PROMPTS_FILE)
        legacy = config.get("model_type") == PYLATE_V3
        modules = _modules(root, path, legacy)
        kinds = [_kind(m) for m in modules]
        saved = _json(root / _path(modules[0]) / "sentence_bert_config.json")
        transformer = {**_legacy_knobs(config), **saved}  # the module's own file wins
        if legacy:
            words = config.get("skiplist_words")
            mask = {"skiplist_words": list(string.punctuation) if words is None else words}
        else:
            mask = _json(root / _path(modules[-1]) / "config.json")
        if mask.get("keep_only_token_ids"):
            raise ModelLoadError(
                f"{path}: its MultiVectorMask keeps only some token ids (an image model's "
                "patches); numaserve serves text models"
            )
        vocabulary = _Vocabulary.read(root, path)
        skiplist = [vocabulary.id_of(w) for w in mask.get("skiplist_words") or ()]
        skip_sides = mask.get("skiplist_tasks") or [DOCUMENT]
        from numaserve.tasks.pooling import Dense  # numpy: only once the process is pinned

        dense = tuple(
            Dense.read(root / _path(m), _path(m), reads="token_embeddings")
            for m, kind in zip(modules, kinds, strict=True)
            if kind == DENSE
        )
        return cls(
            _prompts(config),
            _length(transformer, "query_length", path),
            _length(transformer, "document_length", path),
            _expansion(transformer.get("query_expansion"), vocabulary, path),
            frozenset(i for i in skiplist if i is not None),
            (skip_sides,) if isinstance(skip_sides, str) else tuple(skip_sides),
            dense,
            legacy or NORMALIZE in kinds,
        )

    def query_cut(self) -> int | None:
        """The tokens a query keeps at most."""
        expansion = self.expansion
        if expansion is not None and expansion.strategy == "fixed":
            return expansion.length
        return self.query_length

    def prompt(self, side: str) -> str:
        if side == QUERY:
            return self.prompts.get(QUERY, "")
        return next((self.prompts[n] for n in DOCUMENT_PROMPTS if n in self.prompts), "")


class SidedPrompts(Prompts):
    """The router's view of a late-interaction model's inputs: the side's prompt before each
    text, then, once tokenized, the side's cut and a query's expansion."""

    def __init__(self, sides: Sides):
        super().__init__(sides.prompts, None)
        self.sides = sides

    def applied(self, name: str | None, texts: list[Text]) -> list[Text]:
        prompt = self.sides.prompt(side_of(name))
        return [prompt + t if isinstance(t, str) else t for t in texts] if prompt else texts

    def fitted(self, name: str | None, encoded: list) -> list:
        sides = self.sides
        cut = sides.query_cut() if side_of(name) == QUERY else sides.document_length
        encoded = [_cut(e, cut) for e in encoded] if cut else encoded
        expansion = sides.expansion
        if side_of(name) != QUERY or expansion is None:
            return encoded
        pad = expansion.token_id
        return [replace(e, ids=e.ids + (pad,) * (expansion.length - len(e.ids))) for e in encoded]


def side_of(prompt_name: str | None) -> str:
    return QUERY if prompt_name == QUERY else DOCUMENT


def _cut(encoded, length: int):
    """A text cut to `length` tokens as the tokenizer cuts it: its first tokens, then its
    closing special token (single texts: [CLS] ... [SEP])."""
    ids = encoded.ids
    if len(ids) <= length:
        return encoded
    return replace(encoded, ids=ids[: length - 1] + ids[-1:], truncated=True)


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
    """Drops the rows of skiplisted tokens on the sides the skiplist applies to; for a
    rerank, scores each document by MaxSim against the query."""

    def __init__(self, sides: Sides):
        self.sides = sides

    def finish(self, request, encoded, results):
        if request.op == RERANK.name:  # the query first, then the documents (encode_for)
            sides = [QUERY] + [DOCUMENT] * (len(results) - 1)
        else:
            sides = [side_of(request.options.get("prompt_name"))] * len(results)
        factor = request.options.get("pool_factor")
        for result, enc, side in zip(results, encoded, sides, strict=True):
            if side in self.sides.skip_sides and self.sides.skip_ids:
                self._skip(result, enc)
            if factor and factor > 1 and side == DOCUMENT:
                rows = protocol.embedding_from_wire(result["vectors"]).reshape(-1, result["dim"])
                result["vectors"] = protocol.embedding_to_wire(token_pooled(rows, factor))
        if request.op != RERANK.name:
            return results
        return Ranking().finish(request, encoded[1:], maxsim(results[0], results[1:]))

    def _skip(self, result: dict, encoded) -> None:
        import numpy as np

        keep = [i for i, token in enumerate(encoded.ids) if token not in self.sides.skip_ids]
        if len(keep) < len(encoded.ids):
            rows = protocol.embedding_from_wire(result["vectors"]).reshape(-1, result["dim"])
            result["vectors"] = protocol.embedding_to_wire(rows[np.array(keep, dtype=int)])


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

    def encode_for(self, request, tokenizer, prompts) -> list:
        """A rerank's query, read as a query, then its documents, read as documents."""
        cut = dict(truncate=request.truncate, left=request.cuts_left)
        query = [request.options["query"]]
        documents = list(request.texts)
        return [
            *prompts.fitted(QUERY, tokenizer.encode(prompts.applied(QUERY, query), **cut)),
            *prompts.fitted(
                DOCUMENT, tokenizer.encode(prompts.applied(DOCUMENT, documents), **cut)
            ),
        ]

    def check_checkpoint(self, directory: Path, path: str) -> None:
        Sides.read(directory, path)

    def head(self, facts, width: int, directory: Path, path: str) -> Head:
        return Multi(Sides.read(Path(directory), path), width)

    def to_wire(self, result) -> dict:
        return {"vectors": protocol.embedding_to_wire(result), "dim": result.shape[1]}

    def from_wire(self, result: dict) -> MultiVectors:
        rows = protocol.embedding_from_wire(result["vectors"]).reshape(-1, result["dim"])
        return MultiVectors(rows, result["tokens"], result["truncated"])

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


# -- reading the checkpoint --------------------------------------------------------------------


def _modules(root: Path, path: str, legacy: bool) -> list[dict]:
    modules_file = root / "modules.json"
    if not modules_file.is_file():
        raise ModelLoadError(
            f"{path} has no modules.json: task: multivector serves a late-interaction model as "
            "sentence-transformers' MultiVectorEncoder saves it"
        )
    modules = read_json(modules_file)
    kinds = [_kind(m) for m in modules]
    if legacy and kinds[:1] == [TRANSFORMER] and set(kinds[1:]) <= {DENSE}:
        return modules
    body = kinds[1:-1]
    expected = [*[DENSE] * body.count(DENSE), *[NORMALIZE] * (NORMALIZE in body)]
    if kinds[:1] != [TRANSFORMER] or kinds[-1:] != [MASK] or body != expected:
        raise ModelLoadError(
            f"{modules_file}: its modules run {' -> '.join(kinds) or 'nothing'}; numaserve runs "
            f"a MultiVectorEncoder of {TRANSFORMER}, any {DENSE} modules, {NORMALIZE}, then "
            f"{MASK}, in that order"
        )
    return modules


def _legacy_knobs(config: dict) -> dict:
    """The Transformer's settings an older save keeps at its top level (PyLate's
    `query_length`, `document_length`, `do_query_expansion`, `attend_to_expansion_tokens`),
    in sentence-transformers 6's shape: expansion on, fixed at `query_length` (32 unless it
    says), unless `do_query_expansion` is false."""
    knobs = {k: config[k] for k in ("query_length", "document_length") if config.get(k) is not None}
    if "query_expansion" in config:
        return {**knobs, "query_expansion": config["query_expansion"]}
    if not any(key in config for key in PYLATE_KEYS):
        return knobs
    if config.get("do_query_expansion") is False:
        return {**knobs, "query_expansion": None}
    attend = config.get("attend_to_expansion_tokens", config.get("attend_to_mask_tokens"))
    length = knobs.pop("query_length", None) or 32
    return {
        **knobs,
        "query_expansion": {"strategy": "fixed", "attend": bool(attend), "length": length},
    }


def _prompts(config: dict) -> dict[str, str]:
    """The model's prompts, an older save's query and document markers before its own."""
    prompts = dict(config.get("prompts") or {})
    for key, side in (("query_prefix", QUERY), ("document_prefix", DOCUMENT)):
        if key in config:
            prefix = config[key] or ""
            prompts[side] = prefix + (prompts.get(side) or "").removeprefix(prefix)
    return prompts


def _kind(module: dict) -> str:
    return str(module.get("type", "")).rsplit(".", 1)[-1]


def _path(module: dict) -> str:
    return str(module.get("path", ""))


def _json(path: Path) -> dict:
    data = read_json(path) if path.is_file() else {}
    return data if isinstance(data, dict) else {}


def _length(config: dict, key: str, path: str) -> int | None:
    value = config.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 2):
        raise ModelLoadError(f"{path}: {key} must be an integer of at least 2; got {value!r}")
    return value


def _expansion(config, vocabulary: _Vocabulary, path: str) -> Expansion | None:
    if config is None:
        return None
    strategy, length = config.get("strategy"), config.get("length")
    if strategy not in STRATEGIES or not isinstance(length, int) or length < 2:
        raise ModelLoadError(
            f"{path}: query_expansion must have a strategy of {' or '.join(STRATEGIES)} and a "
            f"length of at least 2; got {config!r}"
        )
    token = config.get("token") or vocabulary.mask
    token_id = vocabulary.id_of(token) if token else None
    if token_id is None:
        raise ModelLoadError(
            f"{path}: query_expansion's token {token!r} is not in the tokenizer's vocabulary"
        )
    return Expansion(strategy, bool(config.get("attend", False)), token_id, length)


@dataclass(frozen=True)
class _Vocabulary:
    """The checkpoint's tokens by id, and its mask token, read without transformers."""

    ids: dict[str, int]
    mask: str | None

    @classmethod
    def read(cls, root: Path, path: str) -> _Vocabulary:
        saved = root / "tokenizer.json"
        if not saved.is_file():
            raise ModelLoadError(
                f"{path}: task: multivector reads the skiplist's and the expansion's tokens from "
                "its tokenizer.json, which it lacks (save the model with a fast tokenizer)"
            )
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(saved))
        config = _json(root / "tokenizer_config.json")
        mask = config.get("mask_token")
        mask = mask.get("content") if isinstance(mask, dict) else mask
        return cls(tokenizer.get_vocab(with_added_tokens=True), mask)

    def id_of(self, token: str) -> int | None:
        return self.ids.get(token)
