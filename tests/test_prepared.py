"""What `numaserve prepare` resolves once for every instance (processes/prepared.py): each
pool's model path and artifact, written where the server's instances read it, and loaded by
an instance exactly as told, with no hashing, judging or choosing. Real checkpoints, real
artifacts, the real CLI."""

import importlib.metadata
import json
import stat
import sys
from dataclasses import replace

import pytest

from numaserve.backends import load_model, load_prepared, prepare_model
from numaserve.backends.artifacts import write_atomically
from numaserve.backends.choice import Band
from numaserve.checkpoint.errors import ModelLoadError
from numaserve.config.paths import BandPath, BatchedPath, ModelPath, PoolPath
from numaserve.config.schema import ModelConfig, load_config
from numaserve.processes.prepared import Prepared
from numaserve.processes.specs import record_path
from tests.harness.console import numaserve
from tests.harness.router_side import ISA

NAMED = dict(task="classify", backend="onnxruntime", quantize="none")
INT8 = dict(NAMED, quantize="int8")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMASERVE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_named_precision_is_resolved_for_every_pool_with_its_built_artifact(
    classifier_dir, cache
):
    config = ModelConfig(path=str(classifier_dir), **NAMED)
    pools = (Band("short", 0, 32), Band("long", 32, 128))
    record = prepare_model(config, ISA, pools)
    assert set(record.pools) == {"short", "long"}
    short, long = record.pools["short"], record.pools["long"]
    assert str(short.path) == str(long.path) == "onnxruntime none" and short.why is None
    assert short.artifact == long.artifact and short.artifact.startswith(str(cache))
    assert record.directory == str(classifier_dir) and len(record.digest) == 64


def test_an_instance_loads_what_it_is_told_without_hashing_or_choosing(
    classifier_dir, cache, tmp_path, monkeypatch
):
    config = ModelConfig(path=str(classifier_dir), **NAMED)
    record = prepare_model(config, ISA)
    record.write(tmp_path / "record.json")

    def never(*args, **kwargs):  # in this process: the instance's load must not call them
        raise AssertionError("an instance hashed or chose")

    monkeypatch.setattr("numaserve.backends.artifacts.model_digest", never)
    monkeypatch.setattr("numaserve.backends.artifacts._sha256", never)
    monkeypatch.setattr("numaserve.backends.choice.ensure_choice", never)
    auto = ModelConfig(path=str(classifier_dir), task="classify")  # the config says auto
    model = load_prepared(auto, "default", str(tmp_path / "record.json"), ISA, 1)
    assert (model.config.backend, model.config.quantize) == ("onnxruntime", "none")
    assert str(model.artifact) == record.pools["default"].artifact
    assert model.run([[101, 7592, 102]])[0].label in model.labels


def test_an_instance_whose_record_was_prepared_again_since_its_spec_says_so_and_loads_it(
    classifier_dir, cache, tmp_path, caplog
):
    config = ModelConfig(path=str(classifier_dir), **NAMED)
    record = prepare_model(config, ISA)
    record.write(tmp_path / "record.json")
    path = str(tmp_path / "record.json")
    load_prepared(config, "default", path, ISA, 1, digest=record.pool_digest("default"))
    assert "prepared again" not in caplog.text  # the record its spec was made from
    again = replace(record, digest="0" * 64)  # its checkpoint changed, and was prepared again
    again.write(tmp_path / "record.json")
    model = load_prepared(config, "default", path, ISA, 1, digest=record.pool_digest("default"))
    assert f"{path} was prepared again since this instance's spec was made" in caplog.text
    assert str(model.artifact) == again.pools["default"].artifact


def test_a_pools_digest_changes_with_the_checkpoint_and_with_the_pools_path_only():
    pool = PoolPath(ModelPath("onnxruntime", "none"), artifact="/a/model.onnx")
    record = Prepared("m", "/m", "d1", {"short": pool, "long": pool})
    assert record.pool_digest("short") == record.pool_digest("long")
    assert record.pool_digest("short") != replace(record, digest="d2").pool_digest("short")
    other = replace(pool, path=ModelPath("onnxruntime", "int8"))
    changed = replace(record, pools={"short": other, "long": pool})
    assert changed.pool_digest("short") != record.pool_digest("short")
    assert changed.pool_digest("long") == record.pool_digest("long")


def test_a_pool_runs_its_shorter_texts_on_the_path_chosen_for_them(classifier_dir, tmp_path):
    int8 = ModelConfig(
        path=str(classifier_dir), task="classify", backend="onnxruntime", quantize="int8"
    )
    fp32 = replace(int8, quantize="none")
    long_path, short_path = (prepare_model(c, ISA).pools["default"] for c in (int8, fp32))
    Prepared(
        "m",
        str(classifier_dir),
        "0" * 64,
        {
            "default": PoolPath(
                long_path.path,
                "texts of 9-256 tokens: the fastest",
                (
                    BandPath(
                        8, short_path.path, "texts of 1-8 tokens", artifact=short_path.artifact
                    ),
                ),
                artifact=long_path.artifact,
            )
        },
    ).write(tmp_path / "record.json")
    auto = ModelConfig(path=str(classifier_dir), task="classify")
    model = load_prepared(auto, "default", str(tmp_path / "record.json"), ISA, 1)
    short, long = [101, *[7592] * 5, 102], [101, *[7592] * 20, 102]
    alone = {
        "fp32": load_model(fp32, ISA, 1, short_path.artifact),
        "int8": load_model(int8, ISA, 1, long_path.artifact),
    }
    assert model.run([short, long]) == [alone["fp32"].run([short])[0], alone["int8"].run([long])[0]]
    assert model.run([long, short]) == [alone["int8"].run([long])[0], alone["fp32"].run([short])[0]]
    assert [(s.last, str(s.path)) for s in model.prepared.shorter] == [(8, "onnxruntime none")]
    assert model.labels == alone["int8"].labels


def test_a_pool_runs_its_micro_batches_from_the_crossover_on_its_throughput_path(
    classifier_dir, tmp_path
):
    int8 = ModelConfig(
        path=str(classifier_dir), task="classify", backend="onnxruntime", quantize="int8"
    )
    fp32 = replace(int8, quantize="none")
    alone_path, batch_path = (prepare_model(c, ISA).pools["default"] for c in (int8, fp32))
    batched = BatchedPath(
        4, batch_path.path, "4 at a time: the fastest", artifact=batch_path.artifact
    )
    record = Prepared(
        "m",
        str(classifier_dir),
        "0" * 64,
        {
            "default": PoolPath(
                alone_path.path, "one at a time", batched=batched, artifact=alone_path.artifact
            )
        },
    )
    record.write(tmp_path / "record.json")
    assert Prepared.read(tmp_path / "record.json") == record  # written and read back whole
    auto = ModelConfig(path=str(classifier_dir), task="classify")
    model = load_prepared(auto, "default", str(tmp_path / "record.json"), ISA, 1)
    texts = [[101, *[7592 + i] * (3 + i), 102] for i in range(4)]
    alone = {
        "int8": load_model(int8, ISA, 1, alone_path.artifact),
        "fp32": load_model(fp32, ISA, 1, batch_path.artifact),
    }
    assert model.run(texts[:3]) == alone["int8"].run(texts[:3])  # 3 texts: below the crossover
    assert model.run(texts) == alone["fp32"].run(texts)  # 4: from the crossover on
    assert model.ran == {"onnxruntime int8": 1, "onnxruntime none": 1}
    assert record.pools["default"].paths == (
        (alone_path.path, alone_path.artifact),
        (batch_path.path, batch_path.artifact),
    )


def test_a_named_int8_is_served_and_says_what_it_costs_on_this_cpu(
    classifier_dir, choice_cache, caplog
):
    caplog.set_level("INFO", logger="numaserve.backends")
    config = ModelConfig(
        path=str(classifier_dir), task="classify", backend="onnxruntime", quantize="int8"
    )
    pools = (Band("short", 0, 16), Band("long", 16, 128))
    record = prepare_model(config, ISA, pools)
    short, long = record.pools["short"].accuracy, record.pools["long"].accuracy
    assert short.startswith("served as asked; on this CPU ")
    assert "1-8 tokens: the same as fp32 for " in short and "; 9-16 tokens: " in short
    assert "17-64 tokens: " in long and "; 65-" in long and "1-8" not in long
    assert str(record.pools["long"].path) == "onnxruntime int8"  # served all the same
    assert "judging it against fp32 on this CPU" in caplog.text
    caplog.clear()
    assert prepare_model(config, ISA, pools).pools["short"].accuracy == short  # judged once: kept
    assert "judging it against fp32" not in caplog.text
    assert prepare_model(replace(config, quantize="none"), ISA).pools["default"].accuracy is None


def as_installed_without_torch(monkeypatch):
    """This process as the container image's runtime: no torch to import, and neither torch
    nor openvino installed. Faked in this process (sys.modules and the packages' metadata);
    the image itself is tests/test_container.py's."""
    real = importlib.metadata.version

    def version(package):
        if package in ("torch", "openvino"):
            raise importlib.metadata.PackageNotFoundError(package)
        return real(package)

    monkeypatch.setattr(importlib.metadata, "version", version)
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.delitem(sys.modules, "numaserve.backends.torch", raising=False)


def test_a_named_precision_judged_where_it_was_built_is_found_without_torch(
    classifier_dir, choice_cache, monkeypatch, caplog
):
    config = ModelConfig(path=str(classifier_dir), **INT8)
    judged = prepare_model(config, ISA).pools["default"].accuracy
    as_installed_without_torch(monkeypatch)
    caplog.set_level("INFO", logger="numaserve.backends")
    assert prepare_model(config, ISA).pools["default"].accuracy == judged
    assert "judging it against fp32" not in caplog.text


def test_a_named_precision_not_judged_on_this_cpu_is_served_unjudged_without_torch(
    classifier_dir, choice_cache, monkeypatch, caplog
):
    config = ModelConfig(path=str(classifier_dir), **INT8)
    prepare_model(config, ISA)  # its artifact built, as the image's build stage does
    for judgement in (choice_cache / "choice").glob("named-*.json"):
        judgement.unlink()  # as on a CPU the build stage did not run on
    as_installed_without_torch(monkeypatch)
    record = prepare_model(config, ISA)
    assert str(record.pools["default"].path) == "onnxruntime int8"
    assert record.pools["default"].accuracy == (
        "served as asked; not judged on this CPU (its fp32 reference needs torch)"
    )
    assert "not judged on this CPU, served as asked" in caplog.text
    assert "No module named 'torch'" in caplog.text or "import of torch halted" in caplog.text


def test_a_backend_not_installed_is_a_clear_error(classifier_dir, cache, monkeypatch):
    as_installed_without_torch(monkeypatch)
    with pytest.raises(ModelLoadError, match=r"model\.backend torch cannot run here"):
        load_model(ModelConfig(path=str(classifier_dir), task="classify", backend="torch"))


def test_a_missing_artifact_is_a_clear_error_naming_it(classifier_dir, cache, tmp_path):
    record = prepare_model(ModelConfig(path=str(classifier_dir), **NAMED), ISA)
    record.write(tmp_path / "record.json")
    artifact = record.pools["default"].artifact
    (cache / "gone").mkdir(parents=True)
    (cache / "onnx").rename(cache / "gone" / "onnx")
    with pytest.raises(ModelLoadError, match=f"the prepared artifact {artifact} is missing"):
        load_prepared(
            ModelConfig(path=str(classifier_dir), **NAMED),
            "default",
            str(tmp_path / "record.json"),
            ISA,
            1,
        )


def test_a_missing_record_or_pool_is_a_clear_error(classifier_dir, tmp_path):
    config = ModelConfig(path=str(classifier_dir), **NAMED)
    with pytest.raises(ModelLoadError, match="cannot read what `numaserve prepare` resolved"):
        load_prepared(config, "default", str(tmp_path / "none.json"), ISA, 1)
    Prepared("m", "/d", "0" * 64, {}).write(tmp_path / "empty.json")
    with pytest.raises(ModelLoadError, match="resolved pools  of m, not default"):
        load_prepared(config, "default", str(tmp_path / "empty.json"), ISA, 1)


def test_prepare_writes_each_models_record_where_its_instances_read_it(
    classifier_dir, cache, tmp_path
):
    config_file = tmp_path / "server.yaml"
    config_file.write_text(
        f"model: {{path: {classifier_dir}, task: classify, backend: ctranslate2, quantize: int8}}\n"
        "placement: {pools: [{name: short, max_tokens: 32, instances: 1},"
        " {name: long, max_tokens: 256, instances: 1}]}\n"
    )
    out = numaserve("prepare", "--config", config_file, "--record-dir", tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    (served,) = load_config(config_file).models
    data = json.loads(record_path(tmp_path, served).read_text())
    assert {p: data["pools"][p]["path"]["backend"] for p in data["pools"]} == {
        "short": "ctranslate2",
        "long": "ctranslate2",
    }
    assert "prepared" in out.stderr and "pool short: ctranslate2 int8" in out.stderr


def test_what_prepare_writes_is_readable_by_the_user_the_service_runs_as(tmp_path):
    """Prepared as root (an image's build, an operator), served by the numaserve user: an
    artifact's digest, a kept choice and a record must be readable by others, or the service
    takes a sound artifact for a damaged one and cannot rebuild it in a read-only cache."""
    path = tmp_path / "model.onnx.sha256"
    write_atomically(path, "0" * 64)
    assert stat.S_IMODE(path.stat().st_mode) & 0o044 == 0o044
