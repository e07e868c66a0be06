"""The ONNX Runtime backend: a session on the artifact `numaserve prepare` built once for this
model and these options (onnx_build.py). Its threads inherit the worker's pinned CPUs. Where `numaserve
prepare` made the artifact's packed form, an instance bound to a NUMA node maps that node's
copy of its weights, shared with the node's other instances (node_weights.py)."""

from __future__ import annotations

import numpy as np

from numaserve.backends.artifacts import prepared
from numaserve.backends.base import Load, Model
from numaserve.backends.node_weights import is_packed, node_copy, weights_of
from numaserve.checkpoint.errors import ModelLoadError

INSTALL_HINT = (
    "model.backend onnxruntime needs the onnxruntime package, a numaserve dependency that is "
    "missing here: reinstall numaserve, or set model.backend: torch"
)


class OnnxModel(Model):
    def __init__(self, load: Load):
        """`node`: the one NUMA node this process is bound to, whose copy of a packed
        artifact's weights it maps; None: the artifact's own file."""
        config, threads, artifact, node = load.config, load.threads, load.artifact, load.node
        try:
            import onnxruntime as ort
        except ImportError:
            raise ModelLoadError(INSTALL_HINT) from None
        ort.disable_telemetry_events()  # the library's own switch, beside ORT_DISABLE_TELEMETRY
        self.artifact, facts = prepared(config, artifact)
        if is_packed(self.artifact):
            if node is not None:
                self.artifact = node_copy(self.artifact, node)
            self.weights = (weights_of(self.artifact),)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        try:
            self.session = ort.InferenceSession(
                str(self.artifact), options, providers=["CPUExecutionProvider"]
            )
        except Exception as e:
            raise ModelLoadError(f"cannot load the ONNX artifact {self.artifact}: {e}") from None
        output = self.session.get_outputs()[0]
        self.output = output.name
        super().__init__(config, facts, width=output.shape[-1])

    def forward(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray | None) -> np.ndarray:
        feeds = {"input_ids": ids, "attention_mask": mask}
        if types is not None:  # the artifact takes them where the model does (onnx_build.py)
            feeds["token_type_ids"] = types
        (out,) = self.session.run([self.output], feeds)
        return out.astype(np.float32, copy=False)
