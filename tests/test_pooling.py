"""Embeddings pooled as the model's sentence-transformers modules say, checked against
sentence-transformers' own `encode` on the same directory (tiny random models made here)."""

import json

import numpy as np
import pytest

from numaserve.backends import load_model
from numaserve.backends.tokenizer import Tokenizer
from numaserve.checkpoint.errors import ModelLoadError
from numaserve.config.schema import (
    ConfigError,
    ModelConfig,
    parse_config,
    with_checkpoint_lengths,
)
from numaserve.tasks.pooling import MODES, Pooling
from tests.harness.checkpoints import save_tiny_cross_encoder, save_tiny_embedder
from tests.test_architectures import TEXTS
from tests.test_architectures import served as served_as


def reference(path) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device="cpu").encode(TEXTS)


def served(path, backend: str = "torch") -> np.ndarray:
    return served_as(path, "embed", backend, "none")


def assert_same_vectors(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.shape == theirs.shape
    cosine = (ours * theirs).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
    assert cosine.min() >= 0.9999, cosine
    np.testing.assert_allclose(ours, theirs, rtol=1e-3, atol=1e-4)  # lengths too, unnormalised


@pytest.mark.parametrize("normalize", [True, False], ids=["normalize", "raw"])
@pytest.mark.parametrize("mode", [*MODES, ("cls", "mean")], ids=str)
def test_embeddings_match_sentence_transformers_for_every_pooling_mode(tmp_path, mode, normalize):
    path = save_tiny_embedder(tmp_path / "model", mode, normalize)
    assert_same_vectors(served(path), reference(path))


def test_the_onnx_backend_pools_the_same_way(tmp_path):
    path = save_tiny_embedder(tmp_path / "model", "cls", normalize=True)
    assert_same_vectors(served(path, "onnxruntime"), reference(path))


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_a_dense_module_after_pooling_matches_sentence_transformers(tmp_path, backend):
    path = save_tiny_embedder(tmp_path / "model", "mean", dense=((32, "Tanh", True),))
    assert_same_vectors(served(path, backend), reference(path))


def test_two_dense_projections_without_bias_as_embeddinggemma_has(tmp_path):
    dense = ((256, "Identity", False), (48, "Identity", False))
    path = save_tiny_embedder(tmp_path / "model", "mean", dense=dense)
    ours = served(path)
    assert ours.shape[1] == 48
    assert_same_vectors(ours, reference(path))


@pytest.mark.parametrize("activation", ["ReLU", "Sigmoid"])
def test_a_dense_modules_activation_is_applied(tmp_path, activation):
    dense = ((32, activation, True),)
    path = save_tiny_embedder(tmp_path / "model", "cls", normalize=False, dense=dense)
    assert_same_vectors(served(path), reference(path))


def test_a_dense_activation_numaserve_cannot_compute_is_refused_by_name(tmp_path):
    path = save_tiny_embedder(tmp_path / "model", "mean", dense=((32, "GELU", True),))
    with pytest.raises(ModelLoadError, match=r"'2_Dense' applies torch.nn.*GELU, which numaserve"):
        load_model(ModelConfig(path=str(path), task="embed", backend="torch", quantize="none"))


def test_a_module_numaserve_cannot_run_is_refused_by_name(tmp_path):
    path = save_tiny_embedder(tmp_path / "model", "mean")
    modules = json.loads((path / "modules.json").read_text())
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_LayerNorm", "type": "x.LayerNorm"})
    (path / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ModelLoadError, match=r"module '2_LayerNorm' is a x.LayerNorm, which numa"):
        load_model(ModelConfig(path=str(path), task="embed", backend="torch", quantize="none"))


def test_a_model_without_modules_json_is_mean_pooled_and_unit_length(tmp_path):
    assert Pooling.read(tmp_path) == Pooling(modes=("mean",), normalize=True)


def test_the_older_boolean_pooling_config_is_read(tmp_path):
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(
        json.dumps({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False})
    )
    modules = [
        {"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    assert Pooling.read(tmp_path) == Pooling(modes=("cls",), normalize=False)


def test_the_bundled_default_is_mean_pooled_and_normalised():
    from numaserve.checkpoint.paths import resolve_model_path

    assert Pooling.read(resolve_model_path("bundled:minilm")) == Pooling(("mean",), True)


def loaded(text: str, source: str = "<string>"):
    """A config as loaded to run: checked, and its unset max_length read from the checkpoint."""
    return with_checkpoint_lengths(parse_config(text, source=source))


def with_max_seq_length(path, value):
    config = path / "sentence_bert_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "max_seq_length": value}))
    return path


def test_the_default_max_length_is_the_checkpoints_max_seq_length(tmp_path):
    path = with_max_seq_length(save_tiny_embedder(tmp_path / "m", "mean"), 24)
    assert loaded(f"model: {{path: {path}}}").model.max_length == 24
    assert loaded(f"model: {{path: {path}, max_length: 64}}").model.max_length == 64


def test_a_long_text_is_cut_where_sentence_transformers_cuts_it(tmp_path):
    from sentence_transformers import SentenceTransformer

    path = with_max_seq_length(save_tiny_embedder(tmp_path / "m", "mean"), 24)
    config = loaded(f"model: {{path: {path}, backend: torch, quantize: none}}").model
    long_text = "a text far longer than the model's twenty-four tokens " * 5
    (encoded,) = Tokenizer(config.path, config.max_length).encode([long_text])
    (ours,) = load_model(config).run([list(encoded.ids)])
    theirs = SentenceTransformer(str(path), device="cpu").encode([long_text])
    assert encoded.truncated and len(encoded.ids) == 24
    assert_same_vectors(ours[None], theirs)


def test_a_checkpoint_without_sentence_transformers_config_keeps_256(classifier_dir):
    assert loaded(f"model: {{path: {classifier_dir}}}").model.max_length == 256


def test_a_reranker_reads_as_far_as_its_tokenizer_as_cross_encoder_does(tmp_path):
    path = save_tiny_cross_encoder(tmp_path / "ce")  # sentence_bert_config.json: no length
    config = json.loads((path / "tokenizer_config.json").read_text())
    assert config["model_max_length"] == 512
    assert loaded(f"model: {{path: {path}, task: rerank}}").model.max_length == 512
    assert loaded(f"model: {{path: {path}, task: classify}}").model.max_length == 256
    (path / "tokenizer_config.json").write_text(json.dumps(config | {"model_max_length": 10**30}))
    assert loaded(f"model: {{path: {path}, task: rerank}}").model.max_length == 256


def test_a_max_seq_length_beyond_every_pool_says_what_to_set(tmp_path):
    path = with_max_seq_length(save_tiny_embedder(tmp_path / "m", "cls"), 1024)
    with pytest.raises(ConfigError) as e:
        loaded(f"model: {{path: {path}}}", source="my.yaml")
    assert str(e.value) == (
        f"my.yaml: model.max_length is not set, so it is {path}'s max_seq_length, 1024 "
        "(sentence_bert_config.json), but the largest pool's max_tokens is 512; set "
        "model.max_length (at most 512), or raise a pool's max_tokens"
    )


def test_a_malformed_sentence_transformers_config_is_a_config_error(tmp_path):
    path = save_tiny_embedder(tmp_path / "m", "mean")
    (path / "sentence_bert_config.json").write_text("{broken")
    with pytest.raises(ConfigError, match=r"model.max_length is not set, and cannot read .*"):
        loaded(f"model: {{path: {path}}}")
