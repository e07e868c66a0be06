"""One copy of the model in one worker: loading, int8 quantization, and the forward pass.

Importing this module imports torch, so a worker pins itself first (see pinning.py).
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.ao.nn.quantized.dynamic as nnqd

from numaserve.config import ModelConfig
from numaserve.modelpath import ModelLoadError, resolve_model_path


@dataclass(frozen=True)
class ClassifyResult:
    label: str
    probs: tuple[float, ...]


def configure_threads(threads: int) -> None:
    torch.set_num_threads(threads)
    # It can be set once per process, before any parallel work; a second call raises.
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)


# Where int8 dot products accumulate straight into int32, activations may use all 8 bits; older
# AVX2 kernels sum pairs in int16 (vpmaddubsw) and saturate unless activations keep 7 bits.
INT32_ACCUMULATING_ISA = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


def full_range_int8(isa: tuple[str, ...]) -> bool:
    """Whether int8 activations may use all 8 bits on a CPU with these ISA extensions."""
    return bool(INT32_ACCUMULATING_ISA & set(isa))


class _FullRangeDynamicLinear(nnqd.Linear):
    """torch's dynamic int8 Linear with 8-bit activations instead of its fixed 7 (reduce_range)."""

    def forward(self, x):
        params = self._packed_params._packed_params
        return torch.ops.quantized.linear_dynamic(x, params, reduce_range=False).to(x.dtype)


def quantize_int8(model: torch.nn.Module, full_range: bool) -> torch.nn.Module:
    """Dynamic int8 quantization of every Linear layer, with per-channel weight scales.

    Per-channel weights and, on VNNI/AMX CPUs, 8-bit activations lift MiniLM's int8 embeddings
    from cosine 0.94 to 0.99 against fp32 at the same speed (docs/accuracy.md).
    torch.ao.quantization is deprecated in favour of torchao, but torchao's eager int8 measured
    39 ms against 7 ms for quantize_dynamic on this workload, so we keep the fast path and
    silence its deprecation warnings (see docs/worker.md).
    """
    mapping = {torch.nn.Linear: _FullRangeDynamicLinear if full_range else nnqd.Linear}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.ao\.quantization is deprecated")
        warnings.filterwarnings("ignore", message=r".*quantize_per_(tensor|channel).*deprecated")
        return torch.ao.quantization.quantize_dynamic(
            model,
            {torch.nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig},
            dtype=torch.qint8,
            mapping=mapping,
        )


class Model:
    """A loaded model that maps batches of token ids to embeddings or class probabilities.

    The backends share everything but the forward pass: the model's shape facts, the input
    checks, padding, and the pooling or softmax after it."""

    def __init__(self, config: ModelConfig, hf_config) -> None:
        self.config = config
        self.pad_id = hf_config.pad_token_id or 0
        self.vocab_size = hf_config.vocab_size
        self.max_positions = getattr(hf_config, "max_position_embeddings", config.max_length)
        if config.max_length > self.max_positions:
            raise ModelLoadError(
                f"model.max_length is {config.max_length}, but {config.path} has only "
                f"{self.max_positions} positions"
            )
        if config.task == "classify":
            id2label = hf_config.id2label or {}
            self.labels = tuple(
                str(id2label.get(i, f"LABEL_{i}")) for i in range(hf_config.num_labels)
            )
        else:
            self.labels = ()
            self.dim = hf_config.hidden_size

    def check_ids(self, ids: list[int]) -> str | None:
        """Why these token ids cannot run, or None."""
        if not ids:
            return "empty input"
        if len(ids) > self.config.max_length:
            return f"{len(ids)} tokens exceed model.max_length {self.config.max_length}"
        if min(ids) < 0 or max(ids) >= self.vocab_size:
            return f"token ids must be in 0..{self.vocab_size - 1}"
        return None

    def _arrays(self, batch: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        if self.config.padding == "max_length":
            width = self.config.max_length
        else:  # dynamic: a batch of one runs unpadded, a batch pads to its longest
            width = max(len(ids) for ids in batch)
        ids = np.full((len(batch), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(batch), width), dtype=np.int64)
        for row, seq in enumerate(batch):
            ids[row, : len(seq)] = seq
            mask[row, : len(seq)] = 1
        return ids, mask

    def forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Logits (classify) or the last hidden state (embed), as float32."""
        raise NotImplementedError

    def run(self, batch: list[list[int]]) -> list:
        """One forward pass: a float32 unit vector per input (embed) or a ClassifyResult."""
        ids, mask = self._arrays(batch)
        out = self.forward(ids, mask)
        if self.config.task == "classify":
            exp = np.exp(out - out.max(axis=-1, keepdims=True))
            probs = exp / exp.sum(axis=-1, keepdims=True)
            return [
                ClassifyResult(self.labels[int(p.argmax())], tuple(float(x) for x in p))
                for p in probs
            ]
        weights = mask[..., None].astype(np.float32)
        pooled = (out * weights).sum(1) / np.maximum(weights.sum(1), 1e-9)
        unit = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return list(unit.astype(np.float32))


def _load_transformers_model(config: ModelConfig):
    import transformers
    from transformers import AutoModel, AutoModelForSequenceClassification

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    directory = resolve_model_path(config.path)
    loader = AutoModelForSequenceClassification if config.task == "classify" else AutoModel
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return loader.from_pretrained(directory).eval()
    except Exception as e:  # corrupt weights, wrong architecture, no network for a hub id...
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(
            f"cannot load model {config.path} for task {config.task}: {first_line}"
        ) from None


class TorchModel(Model):
    def __init__(self, config: ModelConfig, isa: tuple[str, ...] = ()):
        model = _load_transformers_model(config)
        super().__init__(config, model.config)
        if config.quantize == "int8":
            model = quantize_int8(model, full_range=full_range_int8(isa))
        self.module = model

    def forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            out = self.module(
                input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)
            )
            result = out.logits if self.config.task == "classify" else out.last_hidden_state
            return result.float().numpy()


class OnnxModel(Model):
    """ONNX Runtime on the artifact built once for this model and these options
    (onnx_artifacts.py). Its threads inherit the worker's pinned CPUs."""

    def __init__(self, config: ModelConfig, isa: tuple[str, ...] = (), threads: int = 1):
        try:
            import onnxruntime as ort
        except ImportError:
            from numaserve.onnx_artifacts import INSTALL_HINT

            raise ModelLoadError(INSTALL_HINT) from None
        from transformers import AutoConfig

        from numaserve.onnx_artifacts import ensure_artifact

        directory = Path(resolve_model_path(config.path))
        try:
            hf_config = AutoConfig.from_pretrained(directory)
        except Exception as e:
            raise ModelLoadError(f"cannot load model {config.path}: {e}") from None
        super().__init__(config, hf_config)
        self.artifact = ensure_artifact(
            directory, config, full_range_int8(isa), lambda: _load_transformers_model(config)
        )
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
        self.output = self.session.get_outputs()[0].name

    def forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        (out,) = self.session.run([self.output], {"input_ids": ids, "attention_mask": mask})
        return out.astype(np.float32, copy=False)


def load_model(config: ModelConfig, isa: tuple[str, ...] = (), threads: int = 1) -> Model:
    if config.backend == "onnxruntime":
        return OnnxModel(config, isa, threads)
    return TorchModel(config, isa)
