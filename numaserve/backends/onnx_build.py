"""ONNX Runtime artifacts: exported, graph-optimised and quantised once, kept on disk
(artifacts.py), and shared by every worker that serves the same model with the same options.

An artifact lives at CACHE/onnx/KEY/model.onnx, where KEY hashes the model's files, the
options and the ONNX Runtime version that optimised it. Not torch's: a runtime without torch
(the container image) must find what a build stage with torch exported, and another torch
exports an equivalent graph. The build runs in a child process (`python -m
numaserve.backends.onnx_build`): export loads the torch model, and a worker that built in
process kept 2 GB it never used again; the child gives it all back when it exits.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

from numaserve.backends.artifacts import (
    Build,
    build_main,
    built_in_child,
    checkpoint_artifact,
    checkpoint_key,
)
from numaserve.backends.base import full_range_int8, uses_token_types
from numaserve.backends.precision import kept_in_fp32, onnx_module_path
from numaserve.checkpoint.errors import ModelLoadError
from numaserve.config.schema import ModelConfig
from numaserve.tasks import TASKS

log = logging.getLogger(__name__)
# Bump when the build steps change, so old artifacts are not reused (2: a checkpoint without its
# task's head is refused, where 1 exported the head transformers made up).
FORMAT = 2
OPSET = 17


def artifact_key(
    model_dir: Path, config: ModelConfig, full_range: bool, digest: str | None = None
) -> str:
    options = {
        "format": FORMAT,
        "quantize": config.quantize,
        "opset": OPSET,
        # From package metadata: importing it would cost the worker memory it never uses.
        "onnxruntime": importlib.metadata.version("onnxruntime"),
    }
    if config.quantize == "int8" and config.keep_fp32:
        options["keep_fp32"] = sorted(config.keep_fp32)
    return checkpoint_key(model_dir, config, full_range, options, digest)


def artifact_for(config: ModelConfig, isa: tuple[str, ...] = (), digest: str | None = None) -> Path:
    """The model's ONNX artifact for this CPU, built now if it is missing (prepare, `auto`'s
    judging). `digest`: the checkpoint's, where the caller has it."""
    full_range = full_range_int8(isa)
    return checkpoint_artifact(
        config, lambda directory: ensure_artifact(directory, config, full_range, digest=digest)
    )


def ensure_artifact(
    model_dir: Path,
    config: ModelConfig,
    full_range: bool,
    root: Path | None = None,
    digest: str | None = None,
) -> Path:
    """The artifact's path, built first if it is missing or does not match its digest.
    `digest`: the checkpoint's, where the caller has it (artifacts.model_digest)."""
    key = artifact_key(model_dir, config, full_range, digest)
    build = Build("the ONNX artifact", "numaserve.backends.onnx_build", config)
    return built_in_child("onnx", key, "model.onnx", build, root, full_range)


def fp32_nodes(graph_path: Path, model, keep_fp32) -> list[str]:
    """The names of the graph's MatMul and Gemm nodes that compute the Linear layers
    `keep_fp32` names, for the quantizer to leave alone (none without it: the graph is not
    read)."""
    if not keep_fp32:
        return []
    import onnx

    from numaserve.backends.torch import linear_layers

    kept = kept_in_fp32(linear_layers(model), keep_fp32)
    nodes = {
        node.name: onnx_module_path(node.name)
        for node in onnx.load(str(graph_path)).graph.node
        if node.op_type in ("MatMul", "Gemm")
    }
    lost = kept - set(nodes.values())
    if lost:
        raise ModelLoadError(
            f"model.keep_fp32: the optimized ONNX graph has no MatMul left for "
            f"{', '.join(sorted(lost)[:3])} (fused into another operator); "
            "serve it with model.backend: torch"
        )
    # The quantizer first turns each Gemm into a MatMul named after it, plus "_MatMul".
    excluded = [name for name, path in nodes.items() if path in kept]
    return excluded + [f"{name}_MatMul" for name in excluded]


def bidirectional_masks(model, attention_mask):
    """The attention masks of a bidirectional Gemma3 (EmbeddingGemma), made here from the
    padding mask in ops the exporter traces; None for every other model, which makes its own.
    transformers builds Gemma3's with torch.vmap, which the ONNX exporter cannot trace
    (`RuntimeError: unordered_map::at`); the model takes ready masks by layer type, as
    `generate` passes them. Full attention: every real token; sliding: the real tokens less
    than `sliding_window` positions away on either side."""
    import torch

    config = model.config
    if config.model_type != "gemma3_text" or not getattr(config, "use_bidirectional_attention", 0):
        return None
    real = attention_mask.bool()[:, None, None, :]  # (batch, 1, 1, kv)
    length = attention_mask.shape[1]
    positions = torch.arange(length, device=attention_mask.device)
    near = (positions[:, None] - positions[None, :]).abs() < config.sliding_window  # (q, kv)
    full = real.expand(-1, -1, length, -1)
    sliding = real & near[None, None]
    if config._attn_implementation == "eager":  # additive float masks, not boolean
        low = torch.finfo(torch.float32).min
        full, sliding = (torch.where(m, 0.0, low) for m in (full, sliding))
    return {"full_attention": full, "sliding_attention": sliding}


def graph_module(model, config: ModelConfig):
    """The torch module an exporter traces, its inputs' names and its one output's: the
    model's tensor that the task reads (`logits` or `last_hidden_state`), from the inputs it
    takes (`token_type_ids` where a pair's second text has type 1)."""
    import torch

    output = "logits" if TASKS[config.task].output.logits else "last_hidden_state"
    inputs = ["input_ids", "attention_mask"]
    if uses_token_types(TASKS[config.task], getattr(model.config, "type_vocab_size", 0) or 0):
        inputs.append("token_type_ids")

    class Outputs(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors):
            given = dict(zip(inputs, tensors, strict=True))
            masks = bidirectional_masks(model, given["attention_mask"])
            if masks is not None:
                given["attention_mask"] = masks
            return getattr(self.model(**given), output)

    return Outputs().eval(), inputs, output


def build(model, config: ModelConfig, destination: Path, full_range: bool) -> None:
    """Export (dynamic batch and sequence axes), optimise, and quantise when asked. Its
    errors are reported by main(), the one place that words them."""
    import onnx
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers import optimizer

    module, inputs, output = graph_module(model, config)
    work = Path(tempfile.mkdtemp(dir=destination.parent, prefix="build-"))
    exported, optimized, quantized = work / "export.onnx", work / "opt.onnx", work / "int8.onnx"
    example = tuple(torch.ones((1, 8), dtype=torch.long) for _ in inputs)
    axes = {0: "batch", 1: "sequence"}
    logging.disable(logging.INFO)  # onnxruntime's tools log every tensor at INFO, on root
    try:
        with warnings.catch_warnings():  # the tracer's notes on code paths it fixed as traced
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module,
                example,
                str(exported),
                input_names=inputs,
                output_names=[output],
                dynamic_axes={name: axes for name in [*inputs, output]},
                opset_version=OPSET,
                dynamo=False,
            )
        # num_heads/hidden_size 0: read from the graph.
        optimizer.optimize_model(
            str(exported), model_type="bert", num_heads=0, hidden_size=0
        ).save_model_to_file(str(optimized))
        result = optimized
        if config.quantize == "int8":
            quantize_dynamic(
                str(optimized),
                str(quantized),
                nodes_to_exclude=fp32_nodes(optimized, model, config.keep_fp32),
                weight_type=QuantType.QInt8,
                per_channel=True,  # per-channel scales, as the torch backend uses
                reduce_range=not full_range,  # 7-bit weights where int16 sums would saturate
                extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
            )
            result = quantized
        os.replace(result, destination)
    finally:
        logging.disable(logging.NOTSET)
        shutil.rmtree(work)


def main(argv: list[str] | None = None) -> int:
    """The build child: ensure_artifact runs it and reads its last stderr line on failure."""
    failure = "cannot export {path} to ONNX ({cause}); serve it with model.backend: torch"
    return build_main(argv, "numaserve.backends.onnx_build", build, failure)


if __name__ == "__main__":
    sys.exit(main())
