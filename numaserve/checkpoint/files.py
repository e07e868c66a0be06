"""What a checkpoint's own files say: its JSON files read with errors that name them, and
the longest input it takes (sentence-transformers' `max_seq_length`, else its tokenizer's)."""

from __future__ import annotations

import json
from pathlib import Path

from numaserve.checkpoint.errors import ModelLoadError
from numaserve.checkpoint.paths import resolve_model_path


def checkpoint_max_length(path: str, task: str = "embed") -> tuple[int, str, str] | None:
    """The length the checkpoint's own library cuts texts to, and what says so: the
    `max_seq_length` of a sentence-transformers checkpoint's Transformer module
    (sentence_bert_config.json, what its `encode` cuts to; a late-interaction model's
    `document_length` first); for a reranker without one, its
    tokenizer's `model_max_length` within the model's positions (what CrossEncoder cuts
    to): (length, its key, its file). None: the checkpoint does not say, or is not a directory here (its load will say
    why)."""
    try:
        root = Path(resolve_model_path(path))
    except ModelLoadError:
        return None
    config = _transformer_directory(root) / "sentence_bert_config.json"
    places = [(config, "max_seq_length")]
    if task == "multivector":  # documents are cut to their own length (queries are shorter)
        top = root / "config_sentence_transformers.json"  # where PyLate's older saves say it
        places = [(config, "document_length"), (top, "document_length"), *places]
    for file, key in places:
        value = read_object(file).get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelLoadError(f"{file}: {key} must be a positive integer; got {value!r}")
            return value, key, file.name
    if task == "rerank":
        return _tokenizer_max_length(root)
    return None


def prefix_tokens(path: str) -> tuple[str, ...]:
    """The query and document markers an older late-interaction save inserts as tokens
    (PyLate's top-level `query_prefix` and `document_prefix`: "[Q] ", "[unused0]"), which
    its tokenizer must read as one token each, as sentence-transformers registers them."""
    try:
        root = Path(resolve_model_path(path))
    except ModelLoadError:
        return ()
    data = read_object(root / "config_sentence_transformers.json")
    found = (data.get(key) for key in ("query_prefix", "document_prefix"))
    return tuple(p for p in found if isinstance(p, str) and p.strip())


def _tokenizer_max_length(root: Path) -> tuple[int, str, str] | None:
    """A tokenizer's model_max_length, where it is a length the model's positions hold
    (transformers writes a huge number where a tokenizer sets none)."""
    value = read_object(root / "tokenizer_config.json").get("model_max_length")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    positions = read_object(root / "config.json").get("max_position_embeddings")
    if isinstance(positions, int) and not isinstance(positions, bool) and value > positions:
        return None
    return value, "tokenizer's model_max_length", "tokenizer_config.json"


def _transformer_directory(root: Path) -> Path:
    """Where modules.json puts the Transformer module: the top directory, as a rule."""
    listed = read_json(root / "modules.json") if (root / "modules.json").is_file() else []
    for module in listed if isinstance(listed, list) else []:
        if isinstance(module, dict) and str(module.get("type", "")).endswith("Transformer"):
            return root / str(module.get("path", ""))
    return root


def read_modules(root: Path, missing: str) -> tuple[list[dict], list[str]]:
    """A sentence-transformers checkpoint's modules.json, and each module's class name (their
    module paths moved between versions); a ModelLoadError saying `missing` where it has none."""
    path = root / "modules.json"
    if not path.is_file():
        raise ModelLoadError(missing)
    modules = read_json(path)
    return modules, [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]


def read_object(path: Path) -> dict:
    """A checkpoint's JSON file that holds an object; {} where there is no such file, or it
    holds something else."""
    data = read_json(path) if path.is_file() else {}
    return data if isinstance(data, dict) else {}


def read_json(path: Path):
    """A checkpoint's JSON file; a clear ModelLoadError if it cannot be read."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read {path}: {type(e).__name__}: {e}") from None
