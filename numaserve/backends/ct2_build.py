"""CTranslate2 models: the checkpoint's encoder converted once into CTranslate2's format, with
the task's head beside it, kept on disk (artifacts.py) for every worker that serves it (ct2.py
runs what was kept: its `Converted`).

CTranslate2 runs an encoder and gives its hidden states; the head a classifier, reranker or
tagger puts on them (BERT's pooler and classifier, RoBERTa's classification head,
DistilBERT's pre-classifier) is the checkpoint's own weights, kept here as arrays and run in
float32 by the worker (ct2.py). Before a conversion is kept, it is run against the
checkpoint in transformers on a few inputs: a model that converts but answers differently
(an option of the architecture the converter ignores) is refused, not served.

One float32 conversion serves every precision: CTranslate2 quantizes its weights as it loads
them (`compute_type`), in milliseconds.
"""

from __future__ import annotations

import importlib.metadata
import json
import types
from pathlib import Path

import numpy as np

from numaserve.backends.artifacts import Build, build_main, cache_root, ensure, key_of
from numaserve.backends.base import ModelFacts
from numaserve.backends.ct2 import Converted
from numaserve.checkpoint.errors import ModelLoadError
from numaserve.checkpoint.paths import resolve_model_path
from numaserve.config.schema import ModelConfig
from numaserve.tasks import TASKS
from numaserve.tasks.base import Output

FORMAT = 1  # bump when the conversion or the head changes, so old ones are not reused
CONVERTED = ("bert", "distilbert", "roberta", "xlm-roberta", "camembert")
ROBERTA_LIKE = ("roberta", "xlm-roberta", "camembert")


def model_type(model_dir: Path) -> str | None:
    from numaserve.checkpoint.files import read_json

    return read_json(model_dir / "config.json").get("model_type")


def refuse_unconverted(model_dir: Path, path: str) -> None:
    """Before a build: an architecture CTranslate2 cannot convert is said at once."""
    kind = model_type(model_dir)
    if kind not in CONVERTED:
        raise ModelLoadError(
            f"model.backend ctranslate2 cannot run {path}: CTranslate2 converts "
            f"{', '.join(CONVERTED)} encoders, and this is {kind or 'an unnamed architecture'}; "
            "use model.backend: onnxruntime or auto"
        )


def artifact_for(config: ModelConfig, isa: tuple[str, ...] = (), digest: str | None = None) -> Path:
    """The converted model, converted now if it is missing (prepare, and `auto` judging it).
    `digest`: the checkpoint's, where the caller has it."""
    directory = Path(resolve_model_path(config.path))
    ModelFacts.read(directory).check(config)
    refuse_unconverted(directory, config.path)
    if TASKS[config.task].output is Output.VOCAB_LOGITS:
        raise ModelLoadError(
            f"model.backend ctranslate2 cannot run {config.path} for task {config.task}: "
            "numaserve converts no masked-LM head; use model.backend: onnxruntime or auto"
        )
    TASKS[config.task].check_checkpoint(directory, config.path)
    return ensure_converted(directory, config, digest=digest)


def ensure_converted(
    model_dir: Path, config: ModelConfig, root: Path | None = None, digest: str | None = None
) -> Path:
    """The converted model's directory, converted first if it is missing or damaged.
    `digest`: the checkpoint's, where the caller has it (artifacts.model_digest)."""
    options = {
        "format": FORMAT,
        "task": config.task,
        "ctranslate2": importlib.metadata.version("ctranslate2"),
    }
    directory = (root or cache_root()) / "ct2" / key_of(model_dir, options, digest)
    build = Build("the CTranslate2 model", "numaserve.backends.ct2_build", config)
    return ensure(directory, "model", build)


# -- the build child (python -m numaserve.backends.ct2_build) -------------------------------


def head_layers(model, output: Output) -> list[tuple[object, str]]:
    """The Linear layers of the task's head, in order, each with the activation after it."""
    if output is Output.HIDDEN_STATE:
        return []
    if output is Output.TOKEN_LOGITS:
        return [(model.classifier, "none")]
    kind = model.config.model_type
    if kind == "bert":
        return [(model.bert.pooler.dense, "tanh"), (model.classifier, "none")]
    if kind == "distilbert":
        return [(model.pre_classifier, "relu"), (model.classifier, "none")]
    return [(model.classifier.dense, "tanh"), (model.classifier.out_proj, "none")]


def _encoder_for_converter(model):
    """What CTranslate2's loader for this architecture reads: the base encoder (its XLM-R
    loader reads it as `.roberta`, its BERT one needs a pooler even where none is used)."""
    import torch

    base = model.base_model
    kind = model.config.model_type
    if not hasattr(base.config, "position_embedding_type"):  # transformers 5: absolute alone
        base.config.position_embedding_type = "absolute"
    if kind == "xlm-roberta":
        return types.SimpleNamespace(roberta=base, config=base.config)
    if kind == "bert" and base.pooler is None:  # a tagger's BERT has none; its output is unused
        size = base.config.hidden_size
        pooler = types.SimpleNamespace(dense=torch.nn.Linear(size, size))
        return types.SimpleNamespace(
            embeddings=base.embeddings, encoder=base.encoder, pooler=pooler, config=base.config
        )
    return base


def build(model, config: ModelConfig, destination: Path, full_range: bool) -> None:
    """Convert the encoder (float32), keep the head's weights, and check the result against
    transformers before it is kept. `full_range` is the ONNX build's: CTranslate2 quantizes
    activations per row at run time, and picks its kernels by the CPU."""
    import torch
    import transformers
    from ctranslate2.converters.transformers import _MODEL_LOADERS

    from numaserve.checkpoint.paths import resolve_model_path

    refuse_unconverted(Path(resolve_model_path(config.path)), config.path)
    loader = _MODEL_LOADERS[type(model.config).__name__]
    tokenizer = transformers.AutoTokenizer.from_pretrained(resolve_model_path(config.path))
    with torch.no_grad():
        spec = loader(_encoder_for_converter(model), tokenizer)
    spec.validate()
    spec.optimize(quantization=None)
    destination.mkdir()
    spec.save(str(destination))
    layers = head_layers(model, TASKS[config.task].output)
    arrays = {}
    for i, (linear, _) in enumerate(layers):
        arrays[f"weight_{i}"] = linear.weight.detach().numpy().astype(np.float32)
        arrays[f"bias_{i}"] = linear.bias.detach().numpy().astype(np.float32)
    np.savez(destination / "head.npz", **arrays)
    head = {
        "activations": [a for _, a in layers],
        "reads": "first" if TASKS[config.task].output is Output.SEQUENCE_LOGITS else "every",
        "hidden_size": model.config.hidden_size,
    }
    (destination / "head.json").write_text(json.dumps(head))
    _check_against_transformers(model, config, destination)


def _check_against_transformers(model, config: ModelConfig, destination: Path) -> None:
    """The converted model in float32 and the checkpoint in transformers, on a batch of
    inputs of several lengths: they must agree, or the conversion is not kept."""
    import torch

    output = TASKS[config.task].output
    vocab = model.config.vocab_size
    rows = [[(7 * i + 1000 + 13 * n) % vocab for i in range(n)] for n in (3, 9, 17)]
    width = max(map(len, rows))
    ids = np.zeros((len(rows), width), dtype=np.int64)
    mask = np.zeros_like(ids)
    for r, row in enumerate(rows):
        ids[r, : len(row)], mask[r, : len(row)] = row, 1
    ours = Converted(destination, "float32", 1).forward(ids, mask, None)
    with torch.inference_mode():
        out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    theirs = (out.logits if output.logits else out.last_hidden_state).float().numpy()
    first = output is Output.SEQUENCE_LOGITS
    gap = max(
        float(
            np.abs(ours[r] - theirs[r]).max()
            if first
            else np.abs(ours[r, :n] - theirs[r, :n]).max()
        )
        for r, n in enumerate(mask.sum(1))
    )
    scale = float(np.abs(theirs).max()) or 1.0
    if gap > 1e-3 * max(scale, 1.0):
        raise ModelLoadError(
            f"CTranslate2's conversion of {config.path} does not answer as transformers does "
            f"(largest difference {gap:.2g}, on outputs up to {scale:.2g}); use model.backend: "
            "onnxruntime"
        )


def main(argv: list[str] | None = None) -> int:
    """The build child: ensure_converted runs it and reads its last stderr line on failure."""
    failure = "cannot convert {path} for CTranslate2 ({cause}); use model.backend: onnxruntime"
    return build_main(argv, "numaserve.backends.ct2_build", build, failure)


if __name__ == "__main__":
    import sys

    sys.exit(main())
