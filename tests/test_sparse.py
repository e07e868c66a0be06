"""sparse: a SPLADE model's sparse embeddings, held against sentence-transformers'
SparseEncoder on a small random-weight checkpoint of the real layout."""

from __future__ import annotations

import json

import numpy as np
import pytest

from numaserve.backends import load_model
from numaserve.backends.tokenizer import Tokenizer
from numaserve.checkpoint.errors import ModelLoadError
from numaserve.config.schema import ModelConfig
from tests.harness.checkpoints import save_tiny_splade, sparse_encoder_weights

TEXTS = ["What is the capital of France?", "Paris is the capital of France.", "a fox"]


def served(path, backend="torch", quantize="none", texts=TEXTS) -> list:
    config = ModelConfig(
        path=str(path), task="sparse", backend=backend, quantize=quantize, max_length=64
    )
    encoded = Tokenizer(config.path, config.max_length).encode(list(texts))
    return load_model(config).run([list(e.ids) for e in encoded])


def dense(results, size: int) -> np.ndarray:
    out = np.zeros((len(results), size), dtype=np.float32)
    for row, (indices, values) in zip(out, results, strict=True):
        row[indices] = values
    return out


@pytest.mark.parametrize(
    ("strategy", "activation"), [("max", "relu"), ("sum", "relu"), ("max", "log1p_relu")]
)
def test_the_weights_are_the_sparse_encoders(tmp_path, strategy, activation):
    path = save_tiny_splade(tmp_path / "splade", strategy, activation)
    theirs = sparse_encoder_weights(path, TEXTS)
    assert (theirs > 0).sum(axis=1).min() > 10  # weights to compare, not zeros
    ours = served(path)
    np.testing.assert_allclose(dense(ours, theirs.shape[1]), theirs, atol=1e-4)
    for indices, values in ours:  # only the non-zero weights, by index
        assert (np.diff(indices.astype(np.int64)) > 0).all() and (values > 0).all()


@pytest.mark.parametrize("v6_modules", [False, True])
def test_onnx_runtime_gives_the_same_weights(tmp_path, v6_modules):
    path = save_tiny_splade(tmp_path / "splade", v6_modules=v6_modules)
    theirs = sparse_encoder_weights(path, TEXTS)
    np.testing.assert_allclose(
        dense(served(path, "onnxruntime"), theirs.shape[1]), theirs, atol=1e-4
    )


def test_a_checkpoint_that_is_not_a_sparse_encoder_is_refused_by_name(tmp_path):
    path = save_tiny_splade(tmp_path / "splade")
    (path / "modules.json").write_text(
        json.dumps([{"idx": 0, "name": "0", "path": "", "type": "x.MLMTransformer"}])
    )
    with pytest.raises(ModelLoadError, match="its modules are MLMTransformer; numaserve serves"):
        served(path)


def test_ctranslate2_is_refused_before_any_conversion(tmp_path):
    path = save_tiny_splade(tmp_path / "splade")
    with pytest.raises(ModelLoadError, match="numaserve converts no masked-LM head"):
        served(path, "ctranslate2", "int8")


def test_the_accuracy_gate_holds_sparse_weights_to_fp32s_by_cosine():
    from numaserve.tasks.sparse import SPARSE

    reference = [(np.array([3, 9], np.uint32), np.array([1.0, 2.0], np.float32))] * 4
    close = [(np.array([3, 9], np.uint32), np.array([1.0, 2.001], np.float32))] * 4
    moved = [(np.array([4, 9], np.uint32), np.array([1.0, 2.0], np.float32))] * 4
    expected = SPARSE.gate_answers(reference, None, None, None, None)
    judge = lambda results: SPARSE.gate_verdict(  # noqa: E731
        SPARSE.gate_answers(results, None, None, None, None), expected
    )
    assert judge(close).passed and not judge(moved).passed
