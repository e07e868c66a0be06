"""The CTranslate2 backend: the encoder converted once (ct2_build.py), run by CTranslate2's
own kernels at the precision asked for, with the task's head on its hidden states in float32.

`quantize: int8` is CTranslate2's int8_float32: int8 weights, activations quantized per row at
run time, everything but the matrix products in float32. On MiniLM it is both faster than
ONNX Runtime's dynamic int8 and closer to fp32 (docs/accuracy.md, docs/benchmarks.md). Its
threads (OpenMP, `threads` of them) inherit the worker's pinned CPUs and memory policy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from numaserve.backends.artifacts import prepared_artifact
from numaserve.backends.base import Model, ModelFacts
from numaserve.backends.ct2_build import Converted, ensure_converted, refuse_unconverted
from numaserve.checkpoint.errors import ModelLoadError
from numaserve.checkpoint.paths import resolve_model_path
from numaserve.config.schema import ModelConfig
from numaserve.tasks import TASKS
from numaserve.tasks.base import Output

# model.quantize -> CTranslate2's compute_type on a CPU.
COMPUTE_TYPES = {"int8": "int8_float32", "int16": "int16", "none": "float32"}


def prepare_converted(
    config: ModelConfig, digest: str | None = None, artifact: str | None = None
) -> tuple[Path, ModelFacts]:
    """The converted model and the checkpoint's facts: the one `numaserve prepare` converted
    (`artifact`, as an instance is told it), else converted now if missing (prepare itself,
    tune's probes). `digest`: the checkpoint's, where the caller has it."""
    directory = Path(resolve_model_path(config.path))
    facts = ModelFacts.read(directory)
    facts.check(config)
    if artifact is not None:
        return prepared_artifact(artifact), facts
    refuse_unconverted(directory, config.path)
    if TASKS[config.task].output is Output.VOCAB_LOGITS:
        raise ModelLoadError(
            f"model.backend ctranslate2 cannot run {config.path} for task {config.task}: "
            "numaserve converts no masked-LM head; use model.backend: onnxruntime or auto"
        )
    TASKS[config.task].check_checkpoint(directory, config.path)
    return ensure_converted(directory, config, digest=digest), facts


class Ct2Model(Model):
    def __init__(
        self,
        config: ModelConfig,
        isa: tuple[str, ...] = (),
        threads: int = 1,
        artifact: str | None = None,
    ):
        self.artifact, facts = prepare_converted(config, artifact=artifact)
        self.converted = Converted(self.artifact, COMPUTE_TYPES[config.quantize], threads)
        super().__init__(config, facts, width=self.converted.width)

    def forward(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray | None) -> np.ndarray:
        return self.converted.forward(ids, mask, types)
