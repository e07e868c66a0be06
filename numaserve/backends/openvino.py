"""The OpenVINO backend: the runtime of OpenVINO Model Server and optimum-intel. In fp32 and
bf16 it compiles the same ONNX artifact as the onnxruntime backend's fp32 one (onnx_build.py);
`quantize: int8` runs the model NNCF quantized, weights and activations (openvino_build.py),
as sentence-transformers' OpenVINO backend runs its int8 models.

`quantize: bf16` runs the matrix products in bfloat16 on CPUs that have them in hardware
(AMX, AVX512_BF16): about twice fp32's speed on long texts at fp32's accuracy
(docs/accuracy.md). `quantize: none` asks for f32 outright, since OpenVINO would pick bf16 on
such CPUs by itself. One stream and `threads` threads; they inherit the worker's pinned CPUs
and memory policy, and OpenVINO is told not to re-pin them.
"""

from __future__ import annotations

import numpy as np

from numaserve.backends.artifacts import prepared
from numaserve.backends.base import Load, Model
from numaserve.backends.openvino_runtime import import_openvino
from numaserve.checkpoint.errors import ModelLoadError
from numaserve.config.schema import ModelConfig

BF16_ISA = frozenset({"avx512_bf16", "amx_bf16"})
# Compiled kernels kept per input shape. OpenVINO's default (5000) let one instance grow from
# 220 MB to 3.9 GB under micro-batches of random shapes; 64 held it at 620 MB, 4% slower
# (benchmarks/openvino_shape_cache.py, docs/benchmarks.md#model-paths). None: OpenVINO's own.
RUNTIME_CACHE_SHAPES: int | None = 64


def inference_precision(config: ModelConfig, isa: tuple[str, ...]) -> str:
    """OpenVINO's INFERENCE_PRECISION_HINT for model.quantize on a CPU with these extensions:
    f32 for int8 too, whose int8 operations run in int8 and the rest (softmax, LayerNorm)
    in fp32."""
    if config.quantize == "bf16":
        if not BF16_ISA & set(isa):
            raise ModelLoadError(
                "model.quantize: bf16 needs a CPU with bfloat16 arithmetic (AMX or "
                f"AVX512_BF16); this one has {' '.join(isa) or 'neither'}: use quantize: none "
                "or auto"
            )
        return "bf16"
    return "f32"


class OpenVinoModel(Model):
    def __init__(self, load: Load):
        config, isa, threads, artifact = load.config, load.isa, load.threads, load.artifact
        precision = inference_precision(config, isa)
        ov = import_openvino()
        self.artifact, facts = prepared(config, artifact)
        core = ov.Core()
        try:
            compiled = core.compile_model(
                core.read_model(str(self.artifact)),
                "CPU",
                {
                    "INFERENCE_NUM_THREADS": threads,
                    "NUM_STREAMS": 1,
                    "PERFORMANCE_HINT": "LATENCY",
                    "INFERENCE_PRECISION_HINT": precision,
                    "ENABLE_CPU_PINNING": False,  # the worker's own binding stands
                }
                | (
                    {"CPU_RUNTIME_CACHE_CAPACITY": RUNTIME_CACHE_SHAPES}
                    if RUNTIME_CACHE_SHAPES is not None
                    else {}
                ),
            )
        except Exception as e:
            raise ModelLoadError(f"OpenVINO cannot compile {self.artifact}: {e}") from None
        self.request = compiled.create_infer_request()
        self.inputs = {port.get_any_name() for port in compiled.inputs}
        width = compiled.outputs[0].get_partial_shape()[-1]
        super().__init__(config, facts, width=width.get_length())

    def forward(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray | None) -> np.ndarray:
        feeds = {"input_ids": ids, "attention_mask": mask}
        if types is not None and "token_type_ids" in self.inputs:
            feeds["token_type_ids"] = types
        out = self.request.infer(feeds)[0]  # the request's own buffer: copied before reuse
        return np.array(out, dtype=np.float32)
