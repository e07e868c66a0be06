"""ONNX Runtime's static int8 for benchmarks/model_paths.py, a path numaserve does not offer,
built here from the fp32 ONNX artifact so that its accuracy and speed are on record:
quantize_static, QDQ format, activations uint8 asymmetric, weights int8 per channel, MatMuls
only, calibrated (min-max) on the passages given. (OpenVINO's static int8 by NNCF is offered:
backends/openvino_build.py.)"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from numaserve.backends.base import Model, ModelFacts
from numaserve.backends.onnx_build import artifact_for
from numaserve.checkpoint.paths import resolve_model_path
from numaserve.config.schema import ModelConfig

CONFIG = ModelConfig(quantize="none", max_length=512)


def feeds(ids: list[int]) -> dict:
    x = np.array([ids], dtype=np.int64)
    return {"input_ids": x, "attention_mask": np.ones_like(x)}


class Runner(Model):
    """numaserve's own head (pooling) after a forward pass that numaserve does not offer."""

    def __init__(self, infer) -> None:
        self.infer = infer
        facts = ModelFacts.read(resolve_model_path(CONFIG.path))
        super().__init__(CONFIG, facts, width=384)  # MiniLM-L6 (its Pooling reads it)

    def forward(self, ids, mask, types):
        return np.asarray(self.infer({"input_ids": ids, "attention_mask": mask}), np.float32)


def load_static(isa, calibration: list[list[int]]) -> Runner:
    import onnxruntime as ort
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    fp32 = artifact_for(CONFIG, isa)
    work = Path(tempfile.mkdtemp(prefix="static-int8-"))

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = iter(calibration)

        def get_next(self):
            ids = next(self.left, None)
            return None if ids is None else feeds(ids)

    quantize_static(
        str(fp32),
        str(work / "qdq.onnx"),
        Reader(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul"],
    )
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(
        str(work / "qdq.onnx"), options, providers=["CPUExecutionProvider"]
    )
    return Runner(lambda f: session.run(None, f)[0])
