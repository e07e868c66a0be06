"""One copy of the model in one worker: loading, int8 quantization, and the forward pass.

Importing this module imports torch, so a worker pins itself first (see pinning.py).
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass

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
    """A loaded model that maps batches of token ids to embeddings or class probabilities."""

    def __init__(self, config: ModelConfig, isa: tuple[str, ...] = ()):
        import transformers
        from transformers import AutoModel, AutoModelForSequenceClassification

        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()

        self.config = config
        directory = resolve_model_path(config.path)
        loader = AutoModelForSequenceClassification if config.task == "classify" else AutoModel
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = loader.from_pretrained(directory)
        except Exception as e:  # corrupt weights, wrong architecture, no network for a hub id...
            first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ModelLoadError(
                f"cannot load model {config.path} for task {config.task}: {first_line}"
            ) from None
        model.eval()
        hf_config = model.config
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
        if config.quantize == "int8":
            model = quantize_int8(model, full_range=bool(INT32_ACCUMULATING_ISA & set(isa)))
        self.module = model

    def check_ids(self, ids: list[int]) -> str | None:
        """Why these token ids cannot run, or None."""
        if not ids:
            return "empty input"
        if len(ids) > self.config.max_length:
            return f"{len(ids)} tokens exceed model.max_length {self.config.max_length}"
        if min(ids) < 0 or max(ids) >= self.vocab_size:
            return f"token ids must be in 0..{self.vocab_size - 1}"
        return None

    def _tensors(self, batch: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        if self.config.padding == "max_length":
            width = self.config.max_length
        else:  # dynamic: a batch of one runs unpadded, a batch pads to its longest
            width = max(len(ids) for ids in batch)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, seq in enumerate(batch):
            ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[row, : len(seq)] = 1
        return ids, mask

    def run(self, batch: list[list[int]]) -> list:
        """One forward pass: a float32 unit vector per input (embed) or a ClassifyResult."""
        ids, mask = self._tensors(batch)
        with torch.inference_mode():
            out = self.module(input_ids=ids, attention_mask=mask)
            if self.config.task == "classify":
                probs = torch.softmax(out.logits.float(), dim=-1).numpy()
                return [
                    ClassifyResult(self.labels[int(p.argmax())], tuple(float(x) for x in p))
                    for p in probs
                ]
            hidden = out.last_hidden_state
            weights = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
            unit = torch.nn.functional.normalize(pooled, p=2, dim=1)
            return list(unit.numpy().astype(np.float32))
