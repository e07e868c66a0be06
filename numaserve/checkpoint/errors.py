"""What goes wrong reading a checkpoint, for every reader of one to raise and catch."""

from __future__ import annotations


class ModelLoadError(RuntimeError):
    """The model (or its tokenizer) cannot be loaded. Retrying will not help."""


class MissingRuntime(ModelLoadError):
    """The backend's runtime is not installed here (an image without torch, say)."""
