"""Every encoder architecture numaserve serves, on each backend and precision, against
transformers on the same directory: small random models made here with save_pretrained.
The torch fp32 column runs in the fast suite; the ONNX and int8 columns (an ONNX build each)
are slow. docs/models.md holds the table this checks."""

from dataclasses import replace

import numpy as np
import pytest

from numaserve.backends import load_model
from numaserve.checkpoint.errors import ModelLoadError
from numaserve.config.schema import ModelConfig
from tests.harness.checkpoints import architectures, save_tiny_model

# Outputs judged against reference libraries, nothing timed: CI runs the slow ones on two
# workers (.ci/run).
pytestmark = pytest.mark.outputs_only
ARCHITECTURES = list(architectures())
# Lengths differ, so a batch is padded and the mask matters.
TEXTS = ["a short one", "a somewhat longer text to embed, with punctuation!", "x"]
# Cosine to fp32 transformers. int8 on random weights is no accuracy figure (docs/accuracy.md
# has those); it shows the quantised graph computes the same function.
AT_LEAST = {"none": 0.9999, "int8": 0.99}


def token_ids(path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    return [tokenizer(t)["input_ids"] for t in TEXTS]


def reference(path, task: str) -> np.ndarray:
    """transformers' answer, text by text (no padding): mean-pooled unit vectors (embed) or
    softmax probabilities (classify)."""
    import torch
    from transformers import AutoModel, AutoModelForSequenceClassification

    loader = AutoModelForSequenceClassification if task == "classify" else AutoModel
    model = loader.from_pretrained(str(path)).eval()
    rows = []
    with torch.inference_mode():
        for ids in token_ids(path):
            out = model(
                input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)).long()
            )
            if task == "classify":
                rows.append(torch.softmax(out.logits[0], -1).numpy())
            else:
                mean = out.last_hidden_state[0].mean(0).numpy()
                rows.append(mean / np.linalg.norm(mean))
    return np.stack(rows)


def served(path, task: str, backend: str, quantize: str) -> np.ndarray:
    config = ModelConfig(
        path=str(path), task=task, backend=backend, quantize=quantize, max_length=128
    )
    results = load_model(config).run(token_ids(path))  # one padded batch
    return np.stack([r.probs if task == "classify" else r for r in results])


def check(path, task: str, backend: str, quantize: str) -> None:
    ours, theirs = served(path, task, backend, quantize), reference(path, task)
    if task == "classify":
        np.testing.assert_allclose(ours, theirs, atol=1e-4 if quantize == "none" else 2e-2)
    else:
        assert (ours * theirs).sum(1).min() >= AT_LEAST[quantize]


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_torch_fp32_embeddings_match_transformers(tmp_path, architecture):
    check(save_tiny_model(tmp_path / "m", architecture), "embed", "torch", "none")


@pytest.mark.slow
@pytest.mark.parametrize("quantize", ["none", "int8"])
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_onnx_embeddings_match_transformers(tmp_path, architecture, quantize):
    check(save_tiny_model(tmp_path / "m", architecture), "embed", "onnxruntime", quantize)


@pytest.mark.slow
@pytest.mark.parametrize("quantize", ["none", "int8"])
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_torch_int8_embeddings_stay_close_to_transformers(tmp_path, architecture, quantize):
    check(save_tiny_model(tmp_path / "m", architecture), "embed", "torch", quantize)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_classifier_probabilities_match_transformers(tmp_path, architecture, backend):
    check(save_tiny_model(tmp_path / "m", architecture, "classify"), "classify", backend, "none")


def test_a_roberta_style_model_takes_two_tokens_fewer_than_its_position_table(tmp_path):
    # 514 position embeddings, ids starting after pad_token_id 1: 512 tokens fit, 513 crash.
    path = save_tiny_model(tmp_path / "m", "roberta")
    config = ModelConfig(path=str(path), task="embed", backend="torch", quantize="none")
    with pytest.raises(ModelLoadError, match=r"max_length is 513, but .* has only 512 positions"):
        load_model(replace(config, max_length=513))
    model = load_model(replace(config, max_length=512))
    assert len(model.run([[0] + [5] * 510 + [2]])) == 1


def test_a_model_onnx_cannot_express_is_refused_naming_the_torch_backend(tmp_path):
    """FNet mixes tokens with a Fourier transform, which the ONNX exporter cannot write."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.FNetConfig(hidden_size=64, num_hidden_layers=2, intermediate_size=128)
    path = tmp_path / "fnet"
    transformers.AutoModel.from_config(config).save_pretrained(path)
    save_tiny_model(tmp_path / "bert", "bert")  # for its tokenizer
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (path / name).write_bytes((tmp_path / "bert" / name).read_bytes())
    model = ModelConfig(path=str(path), task="embed", quantize="none", max_length=64)
    with pytest.raises(ModelLoadError) as e:
        load_model(replace(model, backend="onnxruntime"))
    assert str(e.value) == (
        f"cannot export {path} to ONNX (UnsupportedOperatorError: Exporting the operator "
        "'aten::fft_fftn' to ONNX opset version 17 is not supported); serve it with "
        "model.backend: torch"
    )
    assert len(load_model(replace(model, backend="torch")).run([[101, 2054, 102]])) == 1
