"""A task whose head the checkpoint does not hold (a classifier asked of a sentence-embedding
model, say) is refused at load, naming the task, the checkpoint and what it does hold: never
served with a head transformers initialised at random, and never after minutes of judging
model paths. Real checkpoints saved with save_pretrained, real loads, the real CLI."""

import time

import pytest

from numaserve.backends import load_model
from numaserve.checkpoint.errors import ModelLoadError
from numaserve.config.schema import ModelConfig
from tests.harness.checkpoints import save_tiny_embedder
from tests.harness.console import numaserve

# Every named precision of every backend: the check is the checkpoint's, not a path's.
PATHS = [
    ("torch", "none"),
    ("torch", "int8"),
    ("onnxruntime", "int8"),
    ("openvino", "none"),
    ("ctranslate2", "int8"),
]


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    return save_tiny_embedder(tmp_path_factory.mktemp("embedder") / "st", "mean")


@pytest.mark.parametrize(("backend", "quantize"), PATHS)
def test_classify_on_a_sentence_embedding_model_is_refused_on_every_path(
    embedder, backend, quantize
):
    config = ModelConfig(path=str(embedder), task="classify", backend=backend, quantize=quantize)
    with pytest.raises(ModelLoadError) as refused:
        load_model(config)
    message = str(refused.value)
    assert "task: classify needs a sequence classification head" in message
    assert str(embedder) in message
    assert "a sentence-embedding model: use task: embed" in message


def test_rerank_on_a_sentence_embedding_model_is_refused(embedder):
    config = ModelConfig(path=str(embedder), task="rerank", backend="torch", quantize="none")
    with pytest.raises(ModelLoadError, match="task: rerank needs a sequence classification head"):
        load_model(config)


def test_ner_on_a_sequence_classifier_is_refused_naming_what_it_is(classifier_dir):
    config = ModelConfig(path=str(classifier_dir), task="ner", backend="torch", quantize="none")
    with pytest.raises(ModelLoadError) as refused:
        load_model(config)
    message = str(refused.value)
    assert "task: ner needs a token classification head" in message
    assert "a sequence classifier (BertForSequenceClassification): use task: classify" in message


def test_a_checkpoint_that_holds_its_head_loads(classifier_dir):
    config = ModelConfig(
        path=str(classifier_dir), task="classify", backend="torch", quantize="none"
    )
    assert load_model(config).labels == ("negative", "neutral", "positive")


def test_start_refuses_a_missing_head_at_once_without_judging_model_paths():
    started = time.monotonic()
    out = numaserve("start", "--model", "bundled:minilm", "--task", "classify", timeout=120)
    elapsed = time.monotonic() - started
    assert out.returncode == 78, out.stderr[-2000:]
    assert "task: classify needs a sequence classification head" in out.stderr
    assert "use task: embed" in out.stderr
    assert "judging" not in out.stderr and "the gate" not in out.stderr
    assert elapsed < 60, elapsed
