"""model.keep_fp32: the Linear layers left in fp32 when the rest is quantized to int8, on both
backends, checked in the real quantized torch module and the real ONNX graph."""

import numpy as np
import onnx
import pytest
import torch

from numaserve.backends import load_model
from numaserve.backends.precision import kept_in_fp32, onnx_module_path
from numaserve.backends.tokenizer import Tokenizer
from numaserve.checkpoint.errors import ModelLoadError
from numaserve.config.schema import ConfigError, ModelConfig, parse_config
from numaserve.corpus import stdlib_sentences
from tests.harness.router_side import ISA

LINEARS = [
    "bert.encoder.layer.0.attention.self.query",
    "bert.encoder.layer.0.output.dense",
    "bert.encoder.layer.1.output.dense",
    "bert.pooler.dense",
    "classifier",
]


def test_globs_pick_the_layers_they_name():
    assert kept_in_fp32(LINEARS, ["classifier"]) == {"classifier"}
    assert kept_in_fp32(LINEARS, ["*.layer.?.output.dense"]) == {
        "bert.encoder.layer.0.output.dense",
        "bert.encoder.layer.1.output.dense",
    }
    assert kept_in_fp32(LINEARS, []) == set()


def test_a_glob_that_matches_no_layer_is_an_error_that_shows_real_names():
    with pytest.raises(ModelLoadError, match=r"'clasifier' matches none of the model's 5"):
        kept_in_fp32(LINEARS, ["clasifier"])
    with pytest.raises(ModelLoadError, match=r"bert\.encoder\.layer\.0\.attention\.self\.query"):
        kept_in_fp32(LINEARS, ["clasifier"])


def test_an_onnx_node_name_gives_its_module_path():
    assert onnx_module_path("/model/bert/encoder/layer.0/output/dense/MatMul") == (
        "bert.encoder.layer.0.output.dense"
    )
    assert onnx_module_path("/model/classifier/Gemm") == "classifier"
    assert onnx_module_path("Attention_0") is None


def test_keep_fp32_is_read_from_the_config_as_a_list():
    config = parse_config(
        'model: {task: classify, quantize: int8, keep_fp32: ["classifier", "*.layer.5.*"]}'
    )
    assert config.model.keep_fp32 == ("classifier", "*.layer.5.*")


def test_keep_fp32_without_int8_is_a_config_error():
    with pytest.raises(ConfigError, match=r"model\.keep_fp32: names layers to leave out of int8"):
        parse_config("model: {quantize: none, keep_fp32: [classifier]}")


def config_for(directory, **kw) -> ModelConfig:
    return ModelConfig(**{"path": str(directory), "task": "classify", "quantize": "int8", **kw})


def test_torch_leaves_the_named_layers_in_fp32_and_quantizes_the_rest(classifier_dir):
    model = load_model(config_for(classifier_dir, backend="torch", keep_fp32=("classifier",)), ISA)
    modules = dict(model.module.named_modules())
    assert type(modules["classifier"]) is torch.nn.Linear
    others = [m for n, m in modules.items() if n.endswith("output.dense")]
    assert others and all(type(m) is not torch.nn.Linear for m in others)


def test_onnx_leaves_the_named_layers_in_fp32_and_quantizes_the_rest(classifier_dir):
    config = config_for(classifier_dir, keep_fp32=("*.layer.0.output.dense",))
    graph = onnx.load(str(load_model(config, ISA).artifact))
    ops: dict[str | None, set[str]] = {}
    for node in graph.graph.node:
        ops.setdefault(onnx_module_path(node.name), set()).add(node.op_type)
    assert "MatMul" in ops["bert.encoder.layer.0.output.dense"]
    assert "MatMulInteger" not in ops["bert.encoder.layer.0.output.dense"]
    assert "MatMulInteger" in ops["bert.encoder.layer.1.output.dense"]


def test_keeping_every_layer_gives_fp32_answers_in_torch(classifier_dir):
    texts = stdlib_sentences(16)
    inputs = [list(e.ids) for e in Tokenizer(str(classifier_dir), 256).encode(texts)]
    fp32 = load_model(config_for(classifier_dir, backend="torch", quantize="none"), ISA)
    kept = load_model(config_for(classifier_dir, backend="torch", keep_fp32=("*",)), ISA)
    for ids in inputs:
        (a,), (b,) = kept.run([ids]), fp32.run([ids])
        assert np.allclose(a.probs, b.probs, atol=1e-6)


def test_keeping_every_layer_leaves_no_integer_matmul_in_the_onnx_graph(classifier_dir):
    kept = load_model(config_for(classifier_dir, keep_fp32=("*",)), ISA)
    assert "MatMulInteger" not in {n.op_type for n in onnx.load(str(kept.artifact)).graph.node}


def test_a_misspelt_layer_stops_the_onnx_build_with_the_message(classifier_dir, caplog):
    """A build that refuses (its one line says why) is no build error: `quantize: auto` skips
    such a candidate for an architecture whose layers are named otherwise, and must not log
    an ERROR with the child's output for it."""
    with pytest.raises(ModelLoadError, match="matches none of the model's"):
        load_model(config_for(classifier_dir, keep_fp32=("clasifier",)), ISA)
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
