"""The ONNX Runtime backend: real exports, optimisations and quantisations of saved
checkpoints, real artifact files shared between real processes, a real pinned worker."""

import importlib.metadata
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import psutil
import pytest

from numaserve.backends import load_model
from numaserve.backends.base import full_range_int8
from numaserve.backends.onnx import INSTALL_HINT
from numaserve.backends.onnx_build import artifact_key, ensure_artifact
from numaserve.backends.tokenizer import Tokenizer
from numaserve.checkpoint.errors import ModelLoadError
from numaserve.config.schema import ModelConfig
from numaserve.corpus import stdlib_sentences
from numaserve.wire import protocol
from tests.harness.console import numaserve
from tests.harness.processes import wait_gone
from tests.harness.router_side import (
    ISA,
    RouterSide,
    pinned_worker_serves,
    start_worker,
    worker_spec,
)

SENTENCES = stdlib_sentences(64)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("NUMASERVE_CACHE", str(root))
    return root


def token_ids(path: str, texts: list[str]) -> list[list[int]]:
    return [list(e.ids) for e in Tokenizer(path, 256).encode(texts)]


def artifacts(root: Path) -> list[Path]:
    return sorted(root.glob("onnx/*/model.onnx"))


def test_fp32_export_of_a_saved_classifier_matches_torch(classifier_dir, cache):
    config = ModelConfig(path=str(classifier_dir), task="classify", quantize="none")
    onnx_model = load_model(replace(config, backend="onnxruntime"))
    torch_model = load_model(replace(config, backend="torch"))
    inputs = token_ids(str(classifier_dir), SENTENCES)
    for ids in inputs:
        (a,), (b,) = onnx_model.run([ids]), torch_model.run([ids])
        assert a.label == b.label and np.allclose(a.probs, b.probs, atol=1e-4)
    assert onnx_model.labels == torch_model.labels
    assert [p.parent for p in artifacts(cache)] == [onnx_model.artifact.parent]


def test_int8_artifact_of_minilm_keeps_embeddings_within_cosine_0_99(cache):
    int8 = load_model(ModelConfig(backend="onnxruntime", quantize="int8"), isa=ISA)
    fp32 = load_model(ModelConfig(backend="torch", quantize="none"))
    inputs = token_ids("bundled:minilm", SENTENCES)
    batch = inputs[:8]  # padded batches too, not only single texts
    cosines = [float(a @ b) for a, b in zip(int8.run(batch), fp32.run(batch), strict=True)]
    cosines += [float(int8.run([ids])[0] @ fp32.run([ids])[0]) for ids in inputs]
    assert np.mean(cosines) >= 0.99, (np.mean(cosines), min(cosines))


BUILD = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from numaserve.config.schema import ModelConfig
from numaserve.backends import load_model
model = load_model(ModelConfig(path=sys.argv[1], task="classify", backend="onnxruntime", quantize="int8"))
print(model.artifact, model.run([[101, 7592, 102]])[0].label)
"""


def test_two_workers_starting_at_once_share_one_artifact(classifier_dir, cache):
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", BUILD, str(classifier_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=os.environ,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=170) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outputs]
    paths = {out.split()[0] for out, _ in outputs}
    assert len(paths) == 1 and artifacts(cache) == [Path(paths.pop())]
    logs = "".join(err for _, err in outputs)
    assert logs.count("building the ONNX artifact") == 1, logs[-3000:]
    leftovers = [p.name for p in artifacts(cache)[0].parent.iterdir()]
    assert sorted(leftovers) == [".lock", "model.onnx", "model.onnx.sha256"]


def test_a_corrupt_artifact_is_detected_and_rebuilt(classifier_dir, cache, caplog):
    config = ModelConfig(
        path=str(classifier_dir), task="classify", backend="onnxruntime", quantize="int8"
    )
    artifact = load_model(config).artifact
    good = artifact.read_bytes()
    artifact.write_bytes(good[: len(good) // 2])  # a copy cut short
    rebuilt = load_model(config)
    assert "does not match its digest: rebuilding it" in caplog.text
    assert rebuilt.artifact == artifact and rebuilt.run([[101, 102]])[0].label
    assert len(artifact.read_bytes()) == len(good)


def test_leftovers_of_a_killed_build_are_removed_by_the_next_one(classifier_dir, cache):
    config = ModelConfig(
        path=str(classifier_dir), task="classify", backend="onnxruntime", quantize="int8"
    )
    directory = cache / "onnx" / artifact_key(classifier_dir, config, full_range_int8(ISA))
    (directory / "build-abc123").mkdir(parents=True)
    (directory / "build-abc123" / "export.onnx").write_bytes(b"half an export")
    (directory / "model.onnx.4242.tmp").write_bytes(b"half a model")
    load_model(config, isa=ISA)
    assert sorted(p.name for p in directory.iterdir()) == [
        ".lock",
        "model.onnx",
        "model.onnx.sha256",
    ]


def test_a_failed_build_is_a_clear_error_and_leaves_no_artifact(classifier_dir, cache, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(classifier_dir, broken)
    (broken / "model.safetensors").write_bytes(b"\x00not a safetensors file")
    config = ModelConfig(path=str(broken), task="classify", backend="onnxruntime", quantize="int8")
    with pytest.raises(ModelLoadError, match=r"^cannot load model .* for task classify"):
        load_model(config)
    assert artifacts(cache) == [] and not list(cache.glob("onnx/*/*.tmp"))


def test_an_onnx_worker_never_loads_torch(classifier_dir, cache):
    code = BUILD + "print('torch' in sys.modules, 'libtorch' in open('/proc/self/maps').read())\n"
    out = subprocess.run(
        [sys.executable, "-c", code, str(classifier_dir)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[-1] == "False False"  # the build ran in a child process


def building(proc: psutil.Process) -> bool:
    return "libtorch" in Path(f"/proc/{proc.pid}/maps").read_text()


def test_a_build_dies_with_the_worker_that_started_it(cache):
    # MiniLM: its build takes about 8 s, so a build that outlived its worker would be seen.
    code = "from numaserve.config.schema import ModelConfig\n" + (
        "from numaserve.backends import load_model\nload_model(ModelConfig(backend='onnxruntime', quantize='int8'))"
    )
    worker = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 60
        while not (builders := psutil.Process(worker.pid).children()):
            assert time.monotonic() < deadline and worker.poll() is None, "no build started"
            time.sleep(0.05)
        while not building(builders[0]):  # past its start, where it checks its parent once
            assert time.monotonic() < deadline and worker.poll() is None, "the build never ran"
            time.sleep(0.05)
        worker.send_signal(signal.SIGKILL)
        assert wait_gone([b.pid for b in builders], timeout=2) == [], "build outlived its worker"
    finally:
        worker.kill()
        worker.wait()


def test_onnxruntime_not_installed_is_a_clear_error(tmp_path):
    # Fakes the missing package (sys.modules entry None makes its import fail): installing and
    # uninstalling onnxruntime inside a test is not an option.
    code = (
        "import sys; sys.modules['onnxruntime'] = None\n"
        "from numaserve.config.schema import ModelConfig\n"
        "from numaserve.backends import load_model\n"
        "load_model(ModelConfig(backend='onnxruntime', quantize='int8'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0 and f"ModelLoadError: {INSTALL_HINT}" in out.stderr


def test_a_pinned_onnx_worker_serves_with_every_thread_on_its_cpu(classifier_dir, cache, tmp_path):
    model = ModelConfig(
        path=str(classifier_dir), task="classify", backend="onnxruntime", quantize="int8"
    )
    ready = pinned_worker_serves(model, tmp_path)
    assert ready["model_path"]["path"]["backend"] == "onnxruntime"
    assert len(artifacts(cache)) == 1


@pytest.fixture
def read_only(tmp_path):
    """A read-only bind mount of a directory, as a container's read-only root or a VM guest
    sees its cache (root would write through mere permissions)."""
    mounts = []

    def mount(source: Path) -> Path:
        target = tmp_path / f"ro-{len(mounts)}"
        target.mkdir()
        for args in (["--bind", source, target], ["-o", "remount,ro,bind", target]):
            done = subprocess.run(["mount", *map(str, args)], capture_output=True, text=True)
            if done.returncode:
                pytest.skip(f"cannot make a read-only bind mount here: {done.stderr.strip()}")
            mounts.append(target)
        return target

    yield mount
    for target in dict.fromkeys(reversed(mounts)):
        subprocess.run(["umount", str(target)], check=False)


def test_prepare_builds_the_artifact_and_a_worker_serves_from_a_read_only_cache(
    classifier_dir, cache, tmp_path, read_only, monkeypatch
):
    config = tmp_path / "numaserve.yaml"
    config.write_text(
        f"model: {{path: {classifier_dir}, task: classify, backend: onnxruntime, quantize: int8}}\n"
    )
    prepared = numaserve("prepare", "--config", config, timeout=300)
    assert prepared.returncode == 0, prepared.stderr
    assert "ONNX artifact ready in" in prepared.stderr and len(artifacts(cache)) == 1
    monkeypatch.setenv("NUMASERVE_CACHE", str(read_only(cache)))
    router = RouterSide(tmp_path)
    proc = start_worker(
        worker_spec(
            router, model=ModelConfig(path=str(classifier_dir), task="classify", quantize="int8")
        ),
        tmp_path / "worker.log",
    )
    try:
        identity, ready = router.wait_for(protocol.READY, timeout=120)
        assert router.run(identity, [[101, 7592, 102]])["results"][0]["label"]
        # No node copy can be written there: it maps the packed form prepare made, and says so
        assert (
            "this node's instances map one copy for the whole host"
            in (tmp_path / "worker.log").read_text()
        )
        assert [w["node"] for w in ready["weights"]] == [None]
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_missing_artifact_in_a_read_only_cache_is_a_clear_error(classifier_dir, cache, read_only):
    cache.mkdir()
    with pytest.raises(ModelLoadError, match=r"cannot be built there.*numaserve prepare"):
        ensure_artifact(
            classifier_dir, ModelConfig(task="classify", quantize="int8"), False, read_only(cache)
        )


def test_a_runtime_without_torch_finds_the_artifact_a_build_with_torch_made(
    classifier_dir, monkeypatch
):
    """The container image serves with ONNX Runtime alone: its build stage exports with torch,
    and the runtime, without torch, must compute the same artifact key."""
    config = ModelConfig(
        path=str(classifier_dir), task="classify", backend="onnxruntime", quantize="int8"
    )
    with_torch = artifact_key(classifier_dir, config, False)
    installed = importlib.metadata.version

    def version(name: str) -> str:
        if name == "torch":
            raise importlib.metadata.PackageNotFoundError(name)
        return installed(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert artifact_key(classifier_dir, config, False) == with_torch
