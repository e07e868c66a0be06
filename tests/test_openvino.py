"""The OpenVINO backend: real compilations of the shared fp32 ONNX artifact, a real pinned
worker, and its usage statistics kept off."""

import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from numaserve.backends import load_model, prepare_model
from numaserve.backends.openvino import BF16_ISA
from numaserve.config.model_paths import ModelLoadError
from numaserve.config.schema import ModelConfig
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


def test_fp32_of_a_saved_classifier_matches_torch_and_shares_onnxruntimes_artifact(
    classifier_dir, cache
):
    config = ModelConfig(path=str(classifier_dir), task="classify", quantize="none")
    openvino = load_model(replace(config, backend="openvino"), ISA)
    onnxruntime = load_model(replace(config, backend="onnxruntime"), ISA)
    torch_model = load_model(replace(config, backend="torch"))
    for ids in token_ids(str(classifier_dir), SENTENCES):
        (a,), (b,) = openvino.run([ids]), torch_model.run([ids])
        assert a.label == b.label and np.allclose(a.probs, b.probs, atol=1e-4)
    assert openvino.artifact == onnxruntime.artifact
    assert len(list(cache.glob("onnx/*/model.onnx"))) == 1


@pytest.mark.skipif(not BF16_ISA & set(ISA), reason="this CPU has no bfloat16 arithmetic")
def test_bf16_minilm_embeddings_stay_within_cosine_0_995_of_fp32(cache):
    bf16 = load_model(ModelConfig(backend="openvino", quantize="bf16"), ISA)
    fp32 = load_model(ModelConfig(backend="torch", quantize="none"))
    for ids in token_ids("bundled:minilm", SENTENCES):
        (a,), (b,) = bf16.run([ids]), fp32.run([ids])
        assert float(np.dot(a, b)) >= 0.995  # both unit length


def test_bf16_on_a_cpu_without_bfloat16_is_refused_before_anything_is_built(cache, caplog):
    # The ISA is an argument: the refusal is checked on any CPU.
    config = ModelConfig(backend="openvino", quantize="bf16")
    with pytest.raises(ModelLoadError, match="bf16 needs a CPU with bfloat16 arithmetic"):
        load_model(config, ("avx2", "avx512f", "avx512_vnni"))
    assert not prepare_model(config, ("avx2",))
    assert "bf16 needs a CPU with bfloat16" in caplog.text and not cache.exists()


def test_openvino_runs_with_its_usage_statistics_unloaded(classifier_dir, cache):
    # openvino_telemetry, whose senders post to Google Analytics, is imported by openvino
    # itself when nothing stops it.
    code = (
        "import sys\n"
        "from numaserve.config.schema import ModelConfig\n"
        "from numaserve.backends import load_model\n"
        f"load_model(ModelConfig(path={str(classifier_dir)!r}, task='classify', "
        "backend='openvino', quantize='none'))\n"
        "print(sorted(m for m, v in sys.modules.items() if m.startswith('openvino_telem') and v))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_openvino_not_installed_is_a_clear_error():
    # Fakes the missing package (a sys.modules entry of None makes its import fail).
    code = (
        "import sys; sys.modules['openvino'] = None\n"
        "from numaserve.config.schema import ModelConfig\n"
        "from numaserve.backends import load_model\n"
        "load_model(ModelConfig(backend='openvino', quantize='none'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "ModelLoadError: model.backend openvino needs the openvino package" in out.stderr


def test_a_pinned_openvino_worker_serves_with_every_thread_on_its_cpu(
    classifier_dir, cache, tmp_path
):
    model = ModelConfig(
        path=str(classifier_dir), task="classify", backend="openvino", quantize="none"
    )
    ready = pinned_worker_serves(model, tmp_path)
    assert ready["model_path"]["backend"] == "openvino"
