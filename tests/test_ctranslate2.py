"""The CTranslate2 backend: real conversions of saved checkpoints (every architecture its
converter reads, every task), the head run from the checkpoint's own weights, a conversion
checked against transformers before it is kept, and a real pinned worker."""

import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from numaserve.backends import load_model
from numaserve.backends.ct2_build import CONVERTED
from numaserve.checkpoint.errors import ModelLoadError
from numaserve.config.schema import ModelConfig
from tests.harness.checkpoints import save_tiny_model
from tests.harness.router_side import (
    ISA,
    pinned_worker_serves,
)
from tests.test_onnx import SENTENCES, token_ids


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("NUMASERVE_CACHE", str(root))
    return root


def test_fp32_of_a_saved_classifier_matches_torch_on_texts_and_pairs(classifier_dir, cache):
    config = ModelConfig(path=str(classifier_dir), task="classify", quantize="none")
    ct2 = load_model(replace(config, backend="ctranslate2"), ISA)
    torch_model = load_model(replace(config, backend="torch"))
    inputs = token_ids(str(classifier_dir), SENTENCES[:16])
    for ids in inputs:
        (a,), (b,) = ct2.run([ids]), torch_model.run([ids])
        assert a.label == b.label and np.allclose(a.probs, b.probs, atol=1e-4)
    pairs = [a + b[1:] for a, b in zip(inputs[:8], inputs[8:], strict=True)]
    segments = [len(a) for a in inputs[:8]]  # the second text has token type 1
    for a, b in zip(ct2.run(pairs, segments), torch_model.run(pairs, segments), strict=True):
        assert np.allclose(a.probs, b.probs, atol=1e-4)
    assert ct2.labels == torch_model.labels
    assert len(list(cache.glob("ct2/*/model"))) == 1


@pytest.mark.parametrize("architecture", CONVERTED)
@pytest.mark.parametrize("task", ["classify", "ner"])
def test_every_converted_architecture_computes_transformers_head(tmp_path, architecture, task):
    path = save_tiny_model(tmp_path / "m", architecture, task)
    config = ModelConfig(path=str(path), task=task, quantize="none", max_length=64)
    ids = token_ids(str(path), SENTENCES[:4])
    ours = load_model(replace(config, backend="ctranslate2")).run(ids)  # one padded batch
    theirs = load_model(replace(config, backend="torch")).run(ids)
    for a, b in zip(ours, theirs, strict=True):
        probs = (a.probs, b.probs) if task == "classify" else (a, b)
        np.testing.assert_allclose(*probs, atol=1e-4)


def test_int8_minilm_embeddings_stay_within_cosine_0_99_of_fp32(cache):
    int8 = load_model(ModelConfig(backend="ctranslate2", quantize="int8"), ISA)
    fp32 = load_model(ModelConfig(backend="torch", quantize="none"))
    inputs = token_ids("bundled:minilm", SENTENCES)
    cosines = [float(int8.run([ids])[0] @ fp32.run([ids])[0]) for ids in inputs]
    batch = inputs[:8]  # padded batches too, not only single texts
    cosines += [float(a @ b) for a, b in zip(int8.run(batch), fp32.run(batch), strict=True)]
    assert min(cosines) >= 0.99, sorted(cosines)[:3]


def test_padding_to_max_length_gives_the_unpadded_embedding(cache):
    config = ModelConfig(backend="ctranslate2", quantize="none", max_length=32)
    ids = token_ids("bundled:minilm", SENTENCES[:3])
    padded = load_model(replace(config, padding="max_length")).run(ids)
    for a, ids_ in zip(padded, ids, strict=True):
        (b,) = load_model(config).run([ids_])
        assert float(a @ b) > 0.9999


def test_an_architecture_ctranslate2_cannot_convert_is_refused_at_once(tmp_path, cache):
    path = save_tiny_model(tmp_path / "m", "electra")
    with pytest.raises(ModelLoadError, match="CTranslate2 converts bert, distilbert") as e:
        load_model(ModelConfig(path=str(path), backend="ctranslate2", quantize="int8"))
    assert "this is electra; use model.backend: onnxruntime or auto" in str(e.value)
    assert not cache.exists()  # no build was started


def test_keep_fp32_with_ctranslate2_is_refused_when_the_config_is_read():
    from numaserve.config.runtimes import precision_problem

    problem = precision_problem("ctranslate2", "int8", ("classifier",), "model")
    assert problem and "backend ctranslate2 quantizes every Linear layer or none" in problem


def test_a_ctranslate2_worker_never_loads_torch(classifier_dir, cache):
    code = (
        "import sys\n"
        "from numaserve.config.schema import ModelConfig\n"
        "from numaserve.backends import load_model\n"
        f"m = load_model(ModelConfig(path={str(classifier_dir)!r}, task='classify', "
        "backend='ctranslate2', quantize='int8'))\n"
        "print(m.run([[101, 7592, 102]])[0].label in m.labels, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[-1] == "True False"  # the conversion ran in a child


def test_ctranslate2_not_installed_is_a_clear_error():
    # Fakes the missing package (a sys.modules entry of None makes its import fail).
    code = (
        "import sys; sys.modules['ctranslate2'] = None\n"
        "from numaserve.backends.ct2 import import_ctranslate2\n"
        "import_ctranslate2()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "ModelLoadError: model.backend ctranslate2 needs the ctranslate2 package" in out.stderr


def test_a_pinned_ctranslate2_worker_serves_with_every_thread_on_its_cpu(
    classifier_dir, cache, tmp_path
):
    model = ModelConfig(
        path=str(classifier_dir), task="classify", backend="ctranslate2", quantize="int8"
    )
    ready = pinned_worker_serves(model, tmp_path)
    assert ready["model_path"]["path"]["backend"] == "ctranslate2"
