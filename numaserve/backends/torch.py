"""The torch backend: a transformers checkpoint, int8 dynamic quantization, eager forward."""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.ao.nn.quantized.dynamic as nnqd

from numaserve.backends.base import (
    Load,
    Model,
    ModelFacts,
    full_range_int8,
    usable_positions,
)
from numaserve.backends.precision import kept_in_fp32
from numaserve.checkpoint.errors import ModelLoadError
from numaserve.checkpoint.files import read_json
from numaserve.checkpoint.paths import resolve_model_path
from numaserve.config.schema import ModelConfig
from numaserve.tasks import TASKS
from numaserve.tasks.base import Output
from numaserve.tasks.sparse import SPLADE


def configure_threads(threads: int) -> None:
    torch.set_num_threads(threads)
    # It can be set once per process, before any parallel work; a second call raises.
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)


class _FullRangeDynamicLinear(nnqd.Linear):
    """torch's dynamic int8 Linear with 8-bit activations instead of its fixed 7 (reduce_range)."""

    def forward(self, x):
        params = self._packed_params._packed_params
        return torch.ops.quantized.linear_dynamic(x, params, reduce_range=False).to(x.dtype)


def _weight_qconfig(full_range: bool):
    """Per-channel int8 weights; 7-bit ones (-64..63) where the CPU's kernels sum pairs of
    products in int16 (AVX2's vpmaddubsw): 255 * 64 * 2 < 32767 cannot saturate, and MiniLM
    loses less from a 7-bit weight per channel than from torch's 7-bit activations per tensor
    (cosine 0.992 against 0.979 to fp32 on fbgemm's AVX2 kernels, docs/accuracy.md). ONNX
    Runtime's reduce_range does the same."""
    from torch.ao.quantization import PerChannelMinMaxObserver, QConfig

    qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
    if full_range:
        return qconfig
    seven_bits = PerChannelMinMaxObserver.with_args(
        dtype=torch.qint8, qscheme=torch.per_channel_symmetric, quant_min=-64, quant_max=63
    )
    return QConfig(activation=qconfig.activation, weight=seven_bits)


def linear_layers(model: torch.nn.Module) -> list[str]:
    """The module paths of the model's Linear layers: what model.keep_fp32 names."""
    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]


def quantize_int8(
    model: torch.nn.Module, full_range: bool, keep_fp32: tuple[str, ...] = ()
) -> torch.nn.Module:
    """Dynamic int8 quantization of every Linear layer but those `keep_fp32` names
    (precision.py), with per-channel weight scales and 8-bit activations.

    Per-channel weights and 8-bit activations lift MiniLM's int8 embeddings from cosine 0.94
    to 0.99 against fp32 at the same speed (docs/accuracy.md); where the CPU lacks VNNI/AMX,
    the weights keep 7 bits instead (`_weight_qconfig`).
    torch.ao.quantization is deprecated in favour of torchao, but torchao's eager int8 measured
    39 ms against 7 ms for quantize_dynamic on this workload, so we keep the fast path and
    silence its deprecation warnings (see docs/worker.md).
    """
    mapping = {torch.nn.Linear: _FullRangeDynamicLinear}
    linears = linear_layers(model)
    kept = kept_in_fp32(linears, keep_fp32)
    qconfig = _weight_qconfig(full_range)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.ao\.quantization is deprecated")
        warnings.filterwarnings("ignore", message=r".*quantize_per_(tensor|channel).*deprecated")
        return torch.ao.quantization.quantize_dynamic(
            model,
            {name: qconfig for name in linears if name not in kept},
            dtype=torch.qint8,
            mapping=mapping,
        )


def load_transformers_model(config: ModelConfig) -> torch.nn.Module:
    """The checkpoint in fp32, in eval mode, with the head config.task reads."""
    import transformers
    from transformers import (
        AutoModel,
        AutoModelForMaskedLM,
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
    )

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    directory = resolve_model_path(config.path)
    loader = {
        Output.HIDDEN_STATE: AutoModel,
        Output.SEQUENCE_LOGITS: AutoModelForSequenceClassification,
        Output.TOKEN_LOGITS: AutoModelForTokenClassification,
        Output.VOCAB_LOGITS: AutoModelForMaskedLM,
    }[TASKS[config.task].output]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, loading = loader.from_pretrained(directory, output_loading_info=True)
    except Exception as e:  # corrupt weights, wrong architecture, no network for a hub id...
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(
            f"cannot load model {config.path} for task {config.task}: {first_line}"
        ) from None
    refuse_a_missing_head(model, loading["missing_keys"], config, directory)
    return model.eval()


HEADS = {
    Output.SEQUENCE_LOGITS: ("a sequence classification head", "ForSequenceClassification"),
    Output.TOKEN_LOGITS: ("a token classification head", "ForTokenClassification"),
    Output.VOCAB_LOGITS: ("a masked-LM head", "ForMaskedLM"),
}


def refuse_a_missing_head(model, missing, config: ModelConfig, directory: str) -> None:
    """transformers initialises a head the checkpoint lacks at random, and serves noise with
    it (the same label for every text, or another one on each load), and loads one task's
    head as another's where their weights share names (`classifier`): both refused here,
    where every model path loads the checkpoint (the torch backend, an export, the fp32
    reference `quantize: auto` judges against), before any minutes of work."""
    output = TASKS[config.task].output
    if output not in HEADS:
        return
    prefix = model.base_model_prefix + "."
    absent = sorted(name for name in missing if not name.startswith(prefix))
    architecture = _architecture(directory)
    another = next((o for o, (_, s) in HEADS.items() if architecture.endswith(s)), output)
    if not absent and another is output:
        return
    head, _ = HEADS[output]
    lacking = f" ({', '.join(absent)})" if absent else ""
    raise ModelLoadError(
        f"task: {config.task} needs {head}{lacking}, which {config.path} does not hold: "
        f"it is {checkpoint_kind(directory, architecture)}"
    )


def _architecture(directory: str) -> str:
    return (read_json(Path(directory) / "config.json").get("architectures") or ["?"])[0]


def checkpoint_kind(directory: str, architecture: str) -> str:
    """What a checkpoint is, said with the task that serves it."""
    modules = Path(directory) / "modules.json"
    if modules.is_file():
        if SPLADE in modules.read_text(errors="replace"):
            return "a SPLADE sparse encoder: use task: sparse"
        return "a sentence-embedding model: use task: embed"
    for suffix, kind in (
        ("ForSequenceClassification", "a sequence classifier ({}): use task: classify"),
        ("ForTokenClassification", "a token classifier ({}): use task: ner"),
        ("ForMaskedLM", "a masked language model ({}): use task: sparse, as a SparseEncoder"),
        ("Model", "an encoder without a task head ({}): use task: embed"),
    ):
        if architecture.endswith(suffix):
            return kind.format(architecture)
    return f"a {architecture} checkpoint, not fine-tuned for this task: fine-tune it first"


class TorchModel(Model):
    def __init__(self, load: Load):
        """The checkpoint itself, quantized here where asked: torch has no artifact."""
        config, threads = load.config, load.threads
        configure_threads(threads)
        model = load_transformers_model(config)
        hf = model.config
        pad_id = hf.pad_token_id or 0
        super().__init__(
            config,
            ModelFacts(
                vocab_size=hf.vocab_size,
                max_positions=usable_positions(
                    hf.model_type,
                    getattr(hf, "max_position_embeddings", None),
                    pad_id,
                ),
                pad_id=pad_id,
                id2label=hf.id2label or {},
                problem_type=hf.problem_type,
                type_vocab_size=getattr(hf, "type_vocab_size", 0) or 0,
            ),
            width=TASKS[config.task].output.width(hf),
        )
        if config.quantize == "int8":
            model = quantize_int8(model, full_range_int8(load.isa), config.keep_fp32)
        self.module = model

    def forward(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray | None) -> np.ndarray:
        inputs = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
        if types is not None:
            inputs["token_type_ids"] = torch.from_numpy(types)
        with torch.inference_mode():
            out = self.module(**inputs)
            result = out.logits if self.task.output.logits else out.last_hidden_state
            return result.float().numpy()
