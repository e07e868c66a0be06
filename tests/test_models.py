"""The torch backend and what every backend shares (the forward pass, its switches, load
errors), in this process with real weights. The ONNX backend: test_onnx.py."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from numaserve.backends import load_model
from numaserve.backends.tokenizer import Tokenizer
from numaserve.checkpoint.errors import ModelLoadError
from numaserve.checkpoint.paths import resolve_model_path
from numaserve.config.schema import ModelConfig
from numaserve.corpus import stdlib_sentences
from numaserve.host.topology import read_topology
from tests.harness.checkpoints import LABELS, save_tiny_classifier

SENTENCES = stdlib_sentences(64)


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer("bundled:minilm", max_length=256)


@pytest.fixture(scope="module")
def fp32():
    return load_model(ModelConfig(backend="torch", quantize="none"))


def ids(tokenizer, texts):
    return [list(e.ids) for e in tokenizer.encode(texts)]


def embed_each(model, batch):
    return np.stack([model.run([x])[0] for x in batch])


def test_bundled_minilm_matches_sentence_transformers(tokenizer, fp32):
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(resolve_model_path("bundled:minilm"), device="cpu")
    expected = reference.encode(SENTENCES, normalize_embeddings=True)
    ours = embed_each(fp32, ids(tokenizer, SENTENCES))
    cosine_distance = 1 - (ours * expected).sum(axis=1)
    assert cosine_distance.max() < 1e-4


def test_embeddings_are_unit_length(tokenizer, fp32):
    vectors = embed_each(fp32, ids(tokenizer, SENTENCES[:5]))
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)


def test_a_dynamically_padded_batch_equals_unpadded_singles(tokenizer, fp32):
    batch = ids(tokenizer, SENTENCES[:8])
    assert len({len(x) for x in batch}) > 1  # really of mixed lengths
    batched = np.stack(fp32.run(batch))
    assert np.allclose(batched, embed_each(fp32, batch), atol=1e-5)


def test_padding_to_max_length_gives_the_same_embeddings(tokenizer, fp32):
    padded = load_model(
        ModelConfig(backend="torch", quantize="none", padding="max_length", max_length=64)
    )
    batch = ids(tokenizer, SENTENCES[:4])
    assert np.allclose(embed_each(padded, batch), embed_each(fp32, batch), atol=1e-5)


def int8_cosines(isa: tuple[str, ...]) -> np.ndarray:
    """Each SENTENCES embedding's cosine between torch int8 (quantized for `isa`) and fp32."""
    tokenizer = Tokenizer("bundled:minilm", max_length=256)
    batch = ids(tokenizer, SENTENCES)
    fp32 = load_model(ModelConfig(backend="torch", quantize="none"))
    int8 = load_model(ModelConfig(backend="torch", quantize="int8"), isa=isa)
    return (embed_each(int8, batch) * embed_each(fp32, batch)).sum(axis=1)


def test_int8_embeddings_stay_close_to_fp32():
    cosine = int8_cosines(read_topology().isa)
    assert cosine.mean() >= 0.99, (cosine.mean(), cosine.min())


def test_int8_embeddings_stay_close_to_fp32_on_an_avx2_only_cpu():
    """fbgemm's AVX2 kernels, forced on any x86 CPU by FBGEMM_ENABLE_INSTRUCTIONS, sum pairs
    of products in int16: what Haswell to Zen 2 servers run (in a child: fbgemm reads it once)."""
    script = (
        "from tests.test_models import int8_cosines; c = int8_cosines(('avx2', 'fma')); "
        "print(c.mean(), c.min())"
    )
    env = {**os.environ, "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"}
    run = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    mean, lowest = map(float, run.stdout.split()[-2:])
    assert mean >= 0.99, (mean, lowest)


def test_int8_replaces_every_linear_layer():
    import torch

    int8 = load_model(ModelConfig(backend="torch", quantize="int8"))
    assert not any(type(m) is torch.nn.Linear for m in int8.module.modules())


def test_classifier_returns_its_labels_and_probabilities(classifier_dir, tokenizer):
    model = load_model(
        ModelConfig(backend="torch", path=str(classifier_dir), task="classify", quantize="none")
    )
    results = model.run(ids(tokenizer, ["It works.", "A longer sentence about nothing much."]))
    assert model.labels == ("negative", "neutral", "positive")
    for r in results:
        assert r.label in model.labels
        assert abs(sum(r.probs) - 1) < 1e-5
        assert r.label == model.labels[int(np.argmax(r.probs))]


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_a_multi_label_classifier_scores_each_label_as_transformers_does(
    tmp_path, tokenizer, backend
):
    import torch
    from transformers import AutoModelForSequenceClassification

    path = save_tiny_classifier(tmp_path / "model", problem_type="multi_label_classification")
    texts = ["It works.", "A longer sentence about nothing much."]
    config = ModelConfig(backend=backend, path=str(path), task="classify", quantize="none")
    results = load_model(config).run(ids(tokenizer, texts))
    reference = AutoModelForSequenceClassification.from_pretrained(path).eval()
    for text, result in zip(texts, results, strict=True):
        with torch.inference_mode():
            logits = reference(**reference_inputs(path, text)).logits[0]
        expected = torch.sigmoid(logits).numpy()
        np.testing.assert_allclose(result.probs, expected, atol=1e-4)
        assert result.label == LABELS[int(expected.argmax())]


def reference_inputs(path, text):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)(text, return_tensors="pt")


def test_ids_outside_the_vocabulary_are_refused(fp32):
    assert fp32.check_ids([101, 999999]) == "token ids must be in 0..30521"
    assert fp32.check_ids([]) == "empty input"
    assert fp32.check_ids([101] * 300) == "300 tokens exceed model.max_length 256"


def test_missing_model_directory_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="no such directory"):
        load_model(ModelConfig(backend="torch", path=str(tmp_path / "nope")))


def test_directory_without_config_is_not_a_model(tmp_path):
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        load_model(ModelConfig(backend="torch", path=str(tmp_path)))


def test_corrupt_weights_are_a_clear_error(classifier_dir, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(classifier_dir, broken)
    (broken / "model.safetensors").write_bytes(b"\x00not a safetensors file")
    with pytest.raises(ModelLoadError, match=r"cannot load model .* for task classify"):
        load_model(ModelConfig(backend="torch", path=str(broken), task="classify"))


def test_weights_the_server_cannot_read_are_a_clear_error(classifier_dir, tmp_path):
    """As the unit's numaserve user meets a checkpoint saved as root: save_pretrained writes
    model.safetensors 0600. Root reads everything, so the check runs in a child whose
    capabilities cannot override file permissions (setpriv), on weights owned by nobody."""
    model = tmp_path / "model"
    shutil.copytree(classifier_dir, model)
    weights = model / "model.safetensors"
    os.chown(weights, 65534, 65534)
    weights.chmod(0o600)
    check = f"from numaserve.checkpoint.paths import resolve_model_path; resolve_model_path({str(model)!r})"
    no_override = "--bounding-set=-dac_override,-dac_read_search"
    out = subprocess.run(
        ["setpriv", no_override, sys.executable, "-c", check], capture_output=True, text=True
    )
    assert out.returncode != 0
    assert f"model.path: {model}: model.safetensors cannot be read by user root" in out.stderr
    assert f"chmod -R a+rX {model}" in out.stderr


def test_unknown_bundled_model_lists_the_bundled_ones():
    with pytest.raises(
        ModelLoadError, match=r"unknown bundled model 'bundled:gpt'.*bundled:minilm"
    ):
        resolve_model_path("bundled:gpt")


def test_max_length_beyond_the_models_positions_is_refused(classifier_dir):
    with pytest.raises(ModelLoadError, match="has only 512 positions"):
        load_model(
            ModelConfig(backend="torch", path=str(classifier_dir), task="classify", max_length=1024)
        )
