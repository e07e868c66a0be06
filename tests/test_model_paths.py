"""Where `model.path` points, as a user writes it: a path relative to the config file, a
directory that is not there, a hub id served offline from the local Hugging Face cache. Real
checkpoints (save_pretrained), a real cache layout (huggingface_hub's), the real CLI."""

import glob
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from numaserve.checkpoint.errors import ModelLoadError
from numaserve.checkpoint.paths import resolve_model_path
from numaserve.client import Client, NumaserveError
from numaserve.config.schema import load_config
from numaserve.testing.ports import free_port
from tests.harness.checkpoints import save_tiny_classifier
from tests.harness.console import numaserve


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return save_tiny_classifier(tmp_path_factory.mktemp("tiny") / "tiny-clf")


def write_config(directory: Path, path: str) -> Path:
    config = directory / "server.yaml"
    config.write_text(f"model: {{path: {path}, task: classify, max_length: 64}}\n")
    return config


def test_a_relative_model_path_is_read_against_the_config_files_directory(tiny, tmp_path):
    shutil.copytree(tiny, tmp_path / "deploy/models/tiny-clf")
    config = load_config(write_config(tmp_path / "deploy", "models/tiny-clf"))
    assert Path(config.model.path) == tmp_path / "deploy/models/tiny-clf"
    assert resolve_model_path(config.model.path) == str(tmp_path / "deploy/models/tiny-clf")


def test_a_dot_relative_path_that_is_not_there_says_no_such_directory(tmp_path):
    (tmp_path / "deploy").mkdir()
    config = load_config(write_config(tmp_path / "deploy", "./models/tiny-clf"))
    with pytest.raises(ModelLoadError, match="no such directory") as e:
        resolve_model_path(config.model.path)
    assert str(tmp_path / "deploy/models/tiny-clf") in str(e.value)


def test_a_missing_directory_that_could_be_a_hub_id_says_both_where_it_looked(tmp_path):
    (tmp_path / "deploy").mkdir()
    config = load_config(write_config(tmp_path / "deploy", "models/tiny-clf"))
    with pytest.raises(ModelLoadError) as e:
        resolve_model_path(config.model.path)
    message = str(e.value)
    assert "models/tiny-clf: no such directory next to the config file" in message
    assert "Hugging Face cache" in message and "never downloads" in message


def hub_cache(root: Path, repo_id: str, checkpoint: Path) -> Path:
    """The layout huggingface_hub writes: models--ORG--NAME/{refs/main, snapshots/COMMIT}."""
    repo = root / "hub" / ("models--" + repo_id.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(checkpoint, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs/main").write_text(commit)
    return repo / "snapshots" / commit


def test_a_hub_id_is_served_offline_from_the_local_hugging_face_cache(tiny, tmp_path):
    snapshot = hub_cache(tmp_path / "hf", "acme/tiny-clf", tiny)
    script = (
        "from numaserve.checkpoint.paths import resolve_model_path as r; print(r('acme/tiny-clf'))"
    )
    env = {"HF_HOME": str(tmp_path / "hf"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    )
    assert Path(out.stdout.strip()) == snapshot


def test_plan_checks_the_model_path_and_exits_2_naming_it(tmp_path):
    (tmp_path / "deploy").mkdir()
    out = numaserve("plan", "--config", write_config(tmp_path / "deploy", "./models/nope"))
    assert out.returncode == 2
    assert "model.path" in out.stderr and "no such directory" in out.stderr


def test_start_with_a_missing_model_exits_78_at_once_naming_it(tmp_path):
    (tmp_path / "deploy").mkdir()
    out = numaserve("start", "--config", write_config(tmp_path / "deploy", "./models/nope"))
    assert out.returncode == 78  # EX_CONFIG: systemd does not restart into it
    assert "no such directory" in out.stderr and "spawn" not in out.stderr


def test_start_needs_a_config_or_a_model():
    out = numaserve("start")
    assert out.returncode == 2 and "--config FILE, or --model PATH" in out.stderr


@pytest.mark.slow
def test_start_model_serves_a_model_with_no_config_file(tiny, tmp_path):
    """As `text-embeddings-router --model-id` users start a server: one flag, no YAML."""
    http, zmq_port = free_port(), free_port()
    before = set(glob.glob("/tmp/numaserve-model-*.yaml"))
    exe = os.path.join(os.path.dirname(sys.executable), "numaserve")
    command = [exe, "start", "--model", tiny, "--task", "classify", "--port", str(http)]
    server = subprocess.Popen(
        [*command, "--zmq-port", str(zmq_port)], stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        with Client(f"tcp://127.0.0.1:{zmq_port}", timeout=5, retries=0) as client:
            while True:
                try:
                    result = client.classify("no config file needed")
                    break
                except NumaserveError:  # still starting
                    assert time.monotonic() < deadline and server.poll() is None
                    time.sleep(0.5)
        assert result.label in ("negative", "neutral", "positive")
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/info", timeout=10) as reply:
            assert reply.status == 200
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0, server.stderr.read()
    assert set(glob.glob("/tmp/numaserve-model-*.yaml")) == before  # its config is gone


def test_start_models_flags_set_the_config_it_writes(tmp_path):
    from numaserve.cli.serving import _model_config
    from numaserve.config.schema import load_config

    written = _model_config("bundled:minilm", "embed", (8080, 5555), "int8", 128, 100)
    config = load_config(written)
    assert (config.model.quantize, config.model.max_length) == ("int8", 128)
    assert config.server.max_texts == 100
    plain = load_config(_model_config("bundled:minilm", "embed", (8080, 5555)))
    assert plain.model.quantize == "auto" and plain.server.max_texts == 2048


def test_start_models_flags_are_refused_with_a_config_file(tmp_path):
    (tmp_path / "deploy").mkdir()
    config = write_config(tmp_path / "deploy", "bundled:minilm")
    out = numaserve("start", "--config", config, "--quantize", "int8", "--max-texts", "9")
    assert out.returncode == 2
    assert "--quantize, --max-texts: for --model; with --config FILE, set them in the file" in (
        out.stderr
    )


def test_start_model_with_a_missing_model_names_the_command_not_a_file(tmp_path):
    out = numaserve("start", "--model", "./nope", cwd=tmp_path)
    assert out.returncode == 78
    assert f"numaserve start --model ./nope: model.path: {tmp_path}/nope: no such directory" in (
        out.stderr
    )
    assert "numaserve-model-" not in out.stderr  # the file it wrote is gone: never named
