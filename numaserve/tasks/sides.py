"""How a late-interaction (ColBERT) checkpoint reads a text on each side, from its own files:
its prompts, its query and document lengths, its query expansion, its skiplist and its Dense and
Normalize modules, as sentence-transformers 6's MultiVectorEncoder saves them or converts
PyLate's older saves (tasks/multivector.py serves them)."""

from __future__ import annotations

import string
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from numaserve.checkpoint.errors import ModelLoadError
from numaserve.checkpoint.files import read_modules, read_object
from numaserve.tasks.prompts import PROMPTS_FILE, Prompts

if TYPE_CHECKING:
    from numaserve.tasks.pooling import Dense

QUERY, DOCUMENT = "query", "document"
SIDES = (QUERY, DOCUMENT)
# encode_document's prompt: the first of these the model has (sentence-transformers' order).
DOCUMENT_PROMPTS = ("document", "passage", "corpus")
# The module types of a MultiVectorEncoder numaserve runs, by class name.
TRANSFORMER, DENSE, NORMALIZE, MASK = "Transformer", "Dense", "Normalize", "MultiVectorMask"
STRATEGIES = ("fixed", "min")
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
        """A save of sentence-transformers 6, or PyLate's (its settings at the top of
        config_sentence_transformers.json, and only a Transformer and a Dense; `model_type:
        ColBERT` in older saves, none in PyLate 1.2's), read as MultiVectorEncoder converts
        it: the punctuation skiplist on documents unless it names another (or, without a
        model_type, names no prefixes either), and Normalize."""
        root = Path(directory)
        config = read_object(root / PROMPTS_FILE)
        model_type = config.get("model_type")
        legacy = model_type == PYLATE_V3 or (model_type is None and _pylate_keys(config))
        modules, kinds = _modules(root, path, legacy)
        saved = read_object(root / _path(modules[0]) / "sentence_bert_config.json")
        transformer = {**_legacy_knobs(config), **saved}  # the module's own file wins
        if legacy:
            words = config.get("skiplist_words")
            if words is None:
                prefixed = "query_prefix" in config or "document_prefix" in config
                words = list(string.punctuation) if model_type or prefixed else []
            mask = {"skiplist_words": words}
        else:
            mask = read_object(root / _path(modules[-1]) / "config.json")
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

    def prompt(self, name: str | None) -> str:
        return self.sides.prompt(side_of(name))

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


# -- reading the checkpoint --------------------------------------------------------------------


def _modules(root: Path, path: str, legacy: bool) -> tuple[list[dict], list[str]]:
    """The modules and their kinds, in an order numaserve runs."""
    modules, kinds = read_modules(
        root,
        f"{path} has no modules.json: task: multivector serves a late-interaction model as "
        "sentence-transformers' MultiVectorEncoder saves it",
    )
    if legacy and kinds[:1] == [TRANSFORMER] and set(kinds[1:]) <= {DENSE}:
        return modules, kinds
    body = kinds[1:-1]
    expected = [*[DENSE] * body.count(DENSE), *[NORMALIZE] * (NORMALIZE in body)]
    if kinds[:1] != [TRANSFORMER] or kinds[-1:] != [MASK] or body != expected:
        raise ModelLoadError(
            f"{root / 'modules.json'}: its modules run {' -> '.join(kinds) or 'nothing'}; numaserve runs "
            f"a MultiVectorEncoder of {TRANSFORMER}, any {DENSE} modules, {NORMALIZE}, then "
            f"{MASK}, in that order"
        )
    return modules, kinds


def _legacy_knobs(config: dict) -> dict:
    """The Transformer's settings an older save keeps at its top level (PyLate's
    `query_length`, `document_length`, `do_query_expansion`, `attend_to_expansion_tokens`),
    in sentence-transformers 6's shape: expansion on, fixed at `query_length` (32 unless it
    says), unless `do_query_expansion` is false."""
    knobs = {k: config[k] for k in ("query_length", "document_length") if config.get(k) is not None}
    if "query_expansion" in config:
        return {**knobs, "query_expansion": config["query_expansion"]}
    if not _pylate_keys(config):
        return knobs
    if config.get("do_query_expansion") is False:
        return {**knobs, "query_expansion": None}
    attend = config.get("attend_to_expansion_tokens", config.get("attend_to_mask_tokens"))
    length = knobs.pop("query_length", None) or 32
    return {
        **knobs,
        "query_expansion": {"strategy": "fixed", "attend": bool(attend), "length": length},
    }


def _pylate_keys(config: dict) -> bool:
    """Whether a config_sentence_transformers.json holds PyLate's settings at its top."""
    return any(key in config for key in PYLATE_KEYS)


def _prompts(config: dict) -> dict[str, str]:
    """The model's prompts, an older save's query and document markers before its own."""
    prompts = dict(config.get("prompts") or {})
    for key, side in (("query_prefix", QUERY), ("document_prefix", DOCUMENT)):
        if key in config:
            prefix = config[key] or ""
            prompts[side] = prefix + (prompts.get(side) or "").removeprefix(prefix)
    return prompts


def _path(module: dict) -> str:
    return str(module.get("path", ""))


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
        config = read_object(root / "tokenizer_config.json")
        mask = config.get("mask_token")
        mask = mask.get("content") if isinstance(mask, dict) else mask
        return cls(tokenizer.get_vocab(with_added_tokens=True), mask)

    def id_of(self, token: str) -> int | None:
        return self.ids.get(token)
