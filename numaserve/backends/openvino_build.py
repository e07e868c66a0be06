"""What OpenVINO compiles, built by `numaserve prepare`: for fp32 and bf16 the fp32 ONNX
artifact (onnx_build.py); for int8 a model of its own, the checkpoint converted by OpenVINO's
own PyTorch frontend and quantized by NNCF's post-training quantization (weights and
activations in int8, their scales calibrated on texts), as optimum-intel and
sentence-transformers' OpenVINO backend make theirs.
Built once and kept (artifacts.py) at CACHE/openvino/KEY/model/ (model.xml, model.bin).

Calibration runs the fp32 model on texts of numaserve's corpus that the accuracy gate does not
judge on (short sentences and passages of every length), so that the gate's verdict is not
a test on its own training set. On a CPU whose int8 products sum pairs into int16 (AVX2
without VNNI), NNCF's overflow fix halves the weights' range in every layer, as onnx_build's
`reduce_range` does; elsewhere the full 8 bits are kept.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

from numaserve.backends import onnx_build
from numaserve.backends.artifacts import (
    Build,
    build_main,
    built_in_child,
    checkpoint_artifact,
    checkpoint_key,
    installed_version,
)
from numaserve.backends.base import full_range_int8
from numaserve.backends.openvino import inference_precision
from numaserve.backends.openvino_runtime import import_openvino
from numaserve.config.schema import ModelConfig
from numaserve.tasks import TASKS

FORMAT = 1  # bump when the build steps change, so old models are not reused
CALIBRATION_TEXTS = 128  # half short sentences, half passages of every length
INSTALL_HINT = (
    "model.backend openvino with quantize: int8 needs the nncf package (NNCF, OpenVINO's "
    "quantizer), a numaserve dependency that is missing here: reinstall numaserve, or set "
    "model.quantize: none"
)


def artifact_key(
    model_dir: Path, config: ModelConfig, full_range: bool, digest: str | None = None
) -> str:
    options = {
        "format": FORMAT,
        "max_length": config.max_length,  # the calibration's longest texts
        # From package metadata: importing them would cost the worker memory it never uses.
        "openvino": importlib.metadata.version("openvino"),
        "nncf": installed_version("nncf"),  # None: not installed, and the build says so
    }
    return checkpoint_key(model_dir, config, full_range, options, digest)


def ensure_int8_model(
    model_dir: Path,
    config: ModelConfig,
    full_range: bool,
    root: Path | None = None,
    digest: str | None = None,
) -> Path:
    """The int8 model's IR (model.xml, its weights beside it), built first if it is missing
    or does not match its digest."""
    key = artifact_key(model_dir, config, full_range, digest)
    build = Build("the OpenVINO int8 model", "numaserve.backends.openvino_build", config)
    return built_in_child("openvino", key, "model", build, root, full_range) / "model.xml"


def fp32_artifact_config(config: ModelConfig) -> ModelConfig:
    """The config whose ONNX artifact OpenVINO compiles: the fp32 one, shared with
    onnxruntime's (OpenVINO applies its precision when it compiles)."""
    return dataclasses.replace(config, backend="onnxruntime", quantize="none", keep_fp32=())


def artifact_for(config: ModelConfig, isa: tuple[str, ...] = (), digest: str | None = None) -> Path:
    """What OpenVINO compiles, built now if it is missing: int8's own model, else the fp32
    ONNX artifact. A CPU without the precision (bf16), or an installation without OpenVINO,
    fails here, before any instance starts."""
    inference_precision(config, isa)
    import_openvino()
    if config.quantize != "int8":
        return onnx_build.artifact_for(fp32_artifact_config(config), isa, digest)
    full_range = full_range_int8(isa)
    return checkpoint_artifact(
        config, lambda directory: ensure_int8_model(directory, config, full_range, digest=digest)
    )


def calibration_texts(count: int = CALIBRATION_TEXTS) -> list[str]:
    """Short sentences and passages of every length that the gate does not judge on."""
    from numaserve.backends.gate import gate_corpus, gate_texts
    from numaserve.corpus import stdlib_passages, stdlib_sentences

    judged = set(gate_corpus())
    sentences = [s for s in stdlib_sentences() if s not in judged]
    passages = [p for p in stdlib_passages() if p not in judged]
    short = sentences[:: max(1, len(sentences) // (count // 2))][: count // 2]
    return short + gate_texts(passages, count - len(short))


def convert(model, config: ModelConfig):
    """The torch model (onnx_build.graph_module's, the tensor the task reads) in OpenVINO's
    form, by its PyTorch frontend, with the inputs and output named as in the ONNX export."""
    import torch

    from numaserve.backends.onnx_build import graph_module
    from numaserve.backends.openvino_runtime import import_openvino

    ov = import_openvino()
    module, inputs, output = graph_module(model, config)
    example = tuple(torch.ones((1, 8), dtype=torch.long) for _ in inputs)
    with warnings.catch_warnings(), torch.no_grad():  # the tracer's notes on fixed paths
        warnings.simplefilter("ignore")
        converted = ov.convert_model(module, example_input=example)
    for port, name in zip(converted.inputs, inputs, strict=True):
        port.get_tensor().set_names({name})
    converted.outputs[0].get_tensor().set_names({output})
    return converted


def build(model, config: ModelConfig, destination: Path, full_range: bool) -> None:
    """Convert, calibrate, quantize and save. Its errors are reported by main()."""
    import numpy as np

    from numaserve.backends.openvino_runtime import import_openvino
    from numaserve.backends.tokenizer import Tokenizer

    ov = import_openvino()  # first: it switches NNCF's usage statistics off too
    try:
        import nncf
        from nncf.quantization.advanced_parameters import (
            AdvancedQuantizationParameters,
            OverflowFix,
        )
    except ImportError:
        from numaserve.checkpoint.errors import ModelLoadError

        raise ModelLoadError(INSTALL_HINT) from None

    converted = convert(model, config)
    inputs = {port.get_any_name() for port in converted.inputs}
    tokenizer = Tokenizer(config.path, config.max_length, truncate=True)
    feeds = []  # as the task reads them: a reranker's (query, passage) pairs
    for encoded in TASKS[config.task].gate_inputs(tokenizer, calibration_texts()):
        ids = np.array([encoded.ids], dtype=np.int64)
        given = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        if "token_type_ids" in inputs:
            given["token_type_ids"] = np.zeros_like(ids)
            given["token_type_ids"][0, encoded.second or ids.shape[1] :] = 1
        feeds.append(given)
    feeds = feeds[: 2 * CALIBRATION_TEXTS]  # a reranker's gate asks several pairs a text
    overflow = OverflowFix.DISABLE if full_range else OverflowFix.ENABLE
    quantized = nncf.quantize(
        converted,
        nncf.Dataset(feeds),
        model_type=nncf.ModelType.TRANSFORMER,  # LayerNorm, softmax and friends stay fp32
        subset_size=len(feeds),
        advanced_parameters=AdvancedQuantizationParameters(overflow_fix=overflow),
    )
    work = Path(tempfile.mkdtemp(dir=destination.parent, prefix="build-"))
    try:
        ov.save_model(quantized, str(work / "model.xml"), compress_to_fp16=False)
        os.replace(work, destination)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """The build child: ensure_int8_model runs it and reads its last stderr line on failure."""
    failure = (
        "OpenVINO cannot convert or quantize {path} ({cause}); serve it with "
        "model.backend: onnxruntime"
    )
    return build_main(argv, "numaserve.backends.openvino_build", build, failure)


if __name__ == "__main__":
    sys.exit(main())
