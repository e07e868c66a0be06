"""The OpenVINO backend: real compilations of the shared fp32 ONNX artifact, a real pinned
worker, and its usage statistics kept off."""

import dataclasses
import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from numaserve.backends import load_model, prepare_model
from numaserve.backends.base import full_range_int8
from numaserve.backends.openvino import BF16_ISA
from numaserve.backends.tokenizer import Tokenizer
from numaserve.checkpoint.errors import ModelLoadError
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


def test_bf16_on_a_cpu_without_bfloat16_is_refused_before_anything_is_built(
    cache, caplog, monkeypatch
):
    # The ISA is an argument: the refusal is checked on any CPU.
    config = ModelConfig(backend="openvino", quantize="bf16")
    with pytest.raises(ModelLoadError, match="bf16 needs a CPU with bfloat16 arithmetic"):
        load_model(config, ("avx2", "avx512f", "avx512_vnni"))

    def judged(*args, **kwargs):  # the fp32 reference: a minute of torch on a slow CPU
        raise AssertionError("prepare judged the precision before refusing it")

    monkeypatch.setattr("numaserve.backends.choice.reference_gate", judged)
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
    assert ready["model_path"]["path"]["backend"] == "openvino"


def passages(count: int) -> list[str]:
    """Passages the gate judges on (and int8's calibration leaves out), 20 words and up."""
    from numaserve.backends.gate import gate_texts
    from numaserve.corpus import stdlib_passages

    return [p for p in gate_texts(stdlib_passages()) if len(p.split()) >= 20][:count]


@pytest.mark.parametrize(
    "isa, lowest",
    [
        pytest.param(  # 8-bit weights, whose products only int32 sums (VNNI, AMX) hold
            ISA,
            0.99,
            marks=pytest.mark.skipif(
                not full_range_int8(ISA), reason="this CPU's int8 sums pairs into int16"
            ),
        ),
        # 7-bit weights, as on an AVX2-only CPU; they cannot saturate, so any CPU computes
        # what that one does (0.9887 lowest here)
        (("avx2", "avx512f"), 0.98),
    ],
)
def test_int8_minilm_embeddings_of_passages_stay_near_fp32_on_either_int8_range(cache, isa, lowest):
    int8 = load_model(ModelConfig(backend="openvino", quantize="int8"), isa)
    fp32 = load_model(ModelConfig(backend="torch", quantize="none"))
    for ids in token_ids("bundled:minilm", passages(40)):
        (a,), (b,) = int8.run([ids]), fp32.run([ids])
        assert float(np.dot(a, b)) >= lowest  # both unit length


def test_int8_is_quantized_by_nncf_once_into_a_kept_model_of_int8_weights(classifier_dir, cache):
    from numaserve.backends.openvino_runtime import import_openvino

    config = ModelConfig(
        path=str(classifier_dir), task="classify", backend="openvino", quantize="int8"
    )
    first = load_model(config, ISA)
    built = first.artifact.stat().st_mtime_ns
    assert load_model(config, ISA).artifact == first.artifact
    assert first.artifact.stat().st_mtime_ns == built
    assert list(cache.glob("openvino/*/model/model.xml")) == [first.artifact]
    ov = import_openvino()
    weights = {
        op.get_output_element_type(0)
        for op in ov.Core().read_model(str(first.artifact)).get_ordered_ops()
        if op.get_type_name() == "Constant"
        and op.get_output_partial_shape(0).rank.get_length() == 2
    }
    assert ov.Type.i8 in weights  # the Linear layers' weights
    fp32 = load_model(replace(config, backend="torch", quantize="none"))
    for ids in token_ids(str(classifier_dir), SENTENCES[:16]):
        (a,), (b,) = first.run([ids]), fp32.run([ids])
        assert np.allclose(a.probs, b.probs, atol=0.02)


def test_nncf_sends_no_usage_statistics():
    # NNCF sends them through openvino_telemetry where it can import it; numaserve imports
    # openvino first (import_openvino), which leaves that package unloadable.
    code = (
        "from numaserve.backends.openvino_runtime import import_openvino\n"
        "import_openvino()\n"
        "from nncf.telemetry import wrapper\n"
        "print(isinstance(wrapper.telemetry, wrapper.NNCFTelemetry))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"  # NNCF's stub, which sends nothing


def test_int8_without_nncf_is_a_clear_error(classifier_dir, tmp_path):
    # Fakes the missing package (a sys.modules entry of None makes its import fail).
    config = ModelConfig(path=str(classifier_dir), task="classify", quantize="int8")
    code = (
        "import sys, json; sys.modules['nncf'] = None\n"
        "from numaserve.backends.openvino_build import main\n"
        f"sys.exit(main([{json.dumps(dataclasses.asdict(config))!r}, {str(tmp_path / 'm')!r}]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 3  # refused, in one line
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .startswith("model.backend openvino with quantize: int8 needs the nncf package")
    )


def test_int8_of_a_cross_encoder_scores_pairs_near_torch(cache, tmp_path):
    from tests.harness.checkpoints import save_tiny_cross_encoder

    path = save_tiny_cross_encoder(tmp_path / "ranker")
    config = ModelConfig(path=str(path), task="rerank", backend="openvino", quantize="int8")
    int8 = load_model(config, ISA)
    fp32 = load_model(replace(config, backend="torch", quantize="none"))
    assert "token_type_ids" in int8.inputs  # a pair's second text has type 1
    tokenizer = Tokenizer(str(path), 128)
    pairs = tokenizer.encode([(s, SENTENCES[i + 1]) for i, s in enumerate(SENTENCES[:8])])
    for e in pairs:
        (a,), (b,) = int8.run([list(e.ids)], [e.second]), fp32.run([list(e.ids)], [e.second])
        assert abs(a.score - b.score) <= 0.05, (a, b)
