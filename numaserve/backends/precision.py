"""Which Linear layers stay in fp32 when the model is quantized to int8 (`model.keep_fp32`).

int8 moves a weak or narrow-margin model's decisions (a cross-encoder's top document, a
tagger's entities: docs/accuracy.md); keeping the layers that move them in fp32 buys the
decisions back for part of int8's speed. Both backends name layers the same way: the module
path inside the transformers model, e.g. `bert.encoder.layer.5.output.dense` or `classifier`.
"""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase

from numaserve.checkpoint.errors import ModelLoadError

ONNX_PREFIX = "/model/"  # onnx_build exports the transformers model as the attribute `model`


def kept_in_fp32(linear_names: Iterable[str], patterns: Iterable[str]) -> set[str]:
    """The Linear layers that `patterns` (shell globs over module paths) keep in fp32. A
    pattern that matches no Linear layer is an error: a typo must not quietly quantize."""
    names = list(linear_names)
    kept: set[str] = set()
    for pattern in patterns:
        matched = {n for n in names if fnmatchcase(n, pattern)}
        if not matched:
            examples = ", ".join(names[:2] + names[-2:])
            raise ModelLoadError(
                f"model.keep_fp32: {pattern!r} matches none of the model's {len(names)} "
                f"Linear layers (module paths such as {examples})"
            )
        kept |= matched
    return kept


def onnx_module_path(node_name: str) -> str | None:
    """The module path an exported MatMul or Gemm node came from, from its name
    (`/model/bert/encoder/layer.0/output/dense/MatMul` -> `bert.encoder.layer.0.output.dense`);
    None for a node that does not carry one."""
    if not node_name.startswith(ONNX_PREFIX) or "/" not in node_name[len(ONNX_PREFIX) :]:
        return None
    return node_name[len(ONNX_PREFIX) :].rsplit("/", 1)[0].replace("/", ".")
