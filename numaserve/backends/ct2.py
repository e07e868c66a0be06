"""The CTranslate2 backend: the encoder converted once (ct2_build.py), run by CTranslate2's
own kernels at the precision asked for, with the task's head on its hidden states in float32.

`quantize: int8` is CTranslate2's int8_float32: int8 weights, activations quantized per row at
run time, everything but the matrix products in float32. On MiniLM it is both faster than
ONNX Runtime's dynamic int8 and closer to fp32 (docs/accuracy.md, docs/benchmarks.md). Its
threads (OpenMP, `threads` of them) inherit the worker's pinned CPUs and memory policy.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from numaserve.backends.artifacts import prepared
from numaserve.backends.base import Load, Model
from numaserve.checkpoint.errors import ModelLoadError

# The first layer of a sequence head reads the first token's state; a token head, each one's.
ACTIVATIONS = {"tanh": np.tanh, "relu": lambda x: np.maximum(x, 0), "none": lambda x: x}
INSTALL_HINT = (
    "model.backend ctranslate2 needs the ctranslate2 package, a numaserve dependency that is "
    "missing here: reinstall numaserve, or set model.backend: onnxruntime"
)


def import_ctranslate2():
    try:
        import ctranslate2
    except ImportError:
        raise ModelLoadError(INSTALL_HINT) from None
    return ctranslate2


# model.quantize -> CTranslate2's compute_type on a CPU.
COMPUTE_TYPES = {"int8": "int8_float32", "int16": "int16", "none": "float32"}


class Ct2Model(Model):
    def __init__(self, load: Load):
        config, threads, artifact = load.config, load.threads, load.artifact
        self.artifact, facts = prepared(config, artifact)
        self.converted = Converted(self.artifact, COMPUTE_TYPES[config.quantize], threads)
        super().__init__(config, facts, width=self.converted.width)
        if self.head.hides_tokens:
            raise ModelLoadError(
                f"{config.path}: its queries' expansion tokens are read but not attended to "
                "(query_expansion attend: false), and CTranslate2 attends to every token of an "
                "input up to its length: serve it with onnxruntime, openvino or torch"
            )

    def forward(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray | None) -> np.ndarray:
        return self.converted.forward(ids, mask, types)


class Converted:
    """A converted model's encoder and its head: padded token ids to the task's output."""

    def __init__(self, directory: Path, compute_type: str, threads: int):
        self.ct2 = import_ctranslate2()
        try:
            self.encoder = self.ct2.Encoder(
                str(directory),
                device="cpu",
                compute_type=compute_type,
                inter_threads=1,
                intra_threads=threads,
            )
        except Exception as e:  # a damaged file, an incompatible CTranslate2
            raise ModelLoadError(f"CTranslate2 cannot load {directory}: {e}") from None
        head = json.loads((directory / "head.json").read_text())
        weights = np.load(directory / "head.npz")
        self.layers = [
            (np.ascontiguousarray(weights[f"weight_{i}"].T), weights[f"bias_{i}"], ACTIVATIONS[a])
            for i, a in enumerate(head["activations"])
        ]
        self.first_token = head["reads"] == "first"
        self.width = self.layers[-1][0].shape[1] if self.layers else head["hidden_size"]

    def forward(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray | None) -> np.ndarray:
        lengths = mask.sum(axis=1, dtype=np.int32)
        out = self.encoder.forward_batch(
            self.ct2.StorageView.from_array(np.ascontiguousarray(ids, dtype=np.int32)),
            self.ct2.StorageView.from_array(lengths),
            token_type_ids=None if types is None else types.tolist(),
        )
        x = np.array(out.last_hidden_state, dtype=np.float32)  # CTranslate2's buffer: copied
        if self.first_token:
            x = x[:, 0]
        elif x.shape[1] < ids.shape[1]:  # padded past the longest text (padding: max_length)
            x = np.pad(x, ((0, 0), (0, ids.shape[1] - x.shape[1]), (0, 0)))
        for weight, bias, activation in self.layers:
            x = activation(x @ weight + bias)
        return x
