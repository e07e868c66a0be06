"""`numaserve tune` on this machine: where its probes run, what it writes, what it refuses, and
a real short run that produces a config that plans and serves (slow). The search itself is
tests/test_tune_search.py's."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
import yaml

from numaserve.client import Client
from numaserve.config.paths import ModelPath
from numaserve.config.schema import ModelConfig, load_config
from numaserve.host.cpuset import CPUSet
from numaserve.host.ledger import LEDGER_ENV, Ledger
from numaserve.host.pinning import PINNED_BY_ENV
from numaserve.host.topology import read_topology
from numaserve.testing.server import Server
from numaserve.tune.measure import Job, MeasureError, rounds
from numaserve.tune.report import winner
from numaserve.tune.run import measured_lengths
from numaserve.tune.search import Candidate, Pool
from numaserve.tune.tuned import tuned_mapping, verification_text
from numaserve.tune.verify import Step, Verified
from tests.harness.checkpoints import save_tiny_classifier

NUMASERVE = os.path.join(os.path.dirname(sys.executable), "numaserve")


def job(cores: int, path: str = "onnxruntime none") -> Job:
    return Job(path, ModelConfig(), cores)


def test_probes_run_side_by_side_on_cores_of_their_own(sysfs):
    topo = read_topology(sysfs("xeon8260_2socket"))  # 2 x 24 cores
    placed = rounds([job(8), job(4), job(2), job(1)] * 2, topo, None)
    assert len(placed) == 1
    cpus = [cpu for _, slot in placed[0] for cpu in slot.cpus]
    assert len(cpus) == len(set(cpus)) == 30
    assert all(len(slot.cpus) == j.cores for j, slot in placed[0])  # each its own width
    assert all(slot.node is not None for _, slot in placed[0])  # memory bound to its own node


def test_each_probe_gets_a_slot_of_its_own_width_whatever_order_the_planner_places_in(sysfs):
    topo = read_topology(sysfs("epyc7402_2socket_nps4"))  # 8 nodes of 3 cores
    jobs = [job(1), job(3), job(2), job(1), job(3)]
    for placed in rounds(jobs, topo, None):
        assert all(len(slot.cpus) == j.cores for j, slot in placed)


def test_probes_that_do_not_fit_together_take_turns(sysfs):
    topo = read_topology(sysfs("epyc_kvm_2vcpu"))
    placed = rounds([job(1), job(2), job(1)], topo, None)
    assert [[j.cores for j, _ in r] for r in placed] == [[2], [1, 1]]


def test_a_probe_wider_than_the_machine_is_refused(sysfs):
    topo = read_topology(sysfs("epyc_kvm_2vcpu"))
    with pytest.raises(MeasureError, match="cannot measure onnxruntime none on 4 core"):
        rounds([job(4)], topo, None)


def test_measures_lengths_up_to_the_longest_text_padded_within_max_length():
    assert measured_lengths(40, 256) == (16, 32, 64)
    assert measured_lengths(250, 256) == (16, 32, 64, 128, 256)
    assert measured_lengths(300, 300) == (16, 32, 64, 128, 256, 300)


def test_the_tuned_config_keeps_every_other_key_and_makes_paths_absolute(tmp_path):
    model = save_tiny_classifier(tmp_path / "model")
    source = tmp_path / "given.yaml"
    source.write_text(
        "model: {path: model, task: classify, max_length: 128}\n"
        "server: {cache_entries: 5, max_batch: 4}\nplacement: {reserved_cores: 1}\n"
    )
    config = load_config(source)
    candidate = Candidate("openvino bf16", (Pool(32, 1, 3), Pool(128, 2, 1)), 16, 512)
    raw = yaml.safe_load(source.read_text())
    out = tuned_mapping(raw, config, candidate, ModelPath("openvino", "bf16"))
    assert out["model"] == {
        "path": str(model),
        "task": "classify",
        "max_length": 128,
        "backend": "openvino",
        "quantize": "bf16",
    }
    assert out["server"] == {"cache_entries": 5, "max_batch": 16, "max_batch_tokens": 512}
    assert out["placement"] == {
        "reserved_cores": 1,
        "pools": [
            {"name": "short", "max_tokens": 32, "cores_per_instance": 1, "instances": 3},
            {"name": "long", "max_tokens": 128, "cores_per_instance": 2, "instances": 1},
        ],
    }
    assert raw["model"]["path"] == "model"  # the source mapping is left as it was
    served = yaml.safe_load(verification_text(out))["server"]
    assert served["cache_entries"] == 0 and served["http"] == "" and served["metrics"] == ""


def tune(tmp_path: Path, config: str, *extra: str, env=None, **kw) -> subprocess.CompletedProcess:
    (tmp_path / "c.yaml").write_text(config)
    corpus = tmp_path / "corpus.txt"
    if not corpus.exists():
        corpus.write_text("a short text\n" * 50 + "a somewhat longer text than that one\n" * 50)
    cmd = [
        NUMASERVE,
        "tune",
        "--config",
        str(tmp_path / "c.yaml"),
        "--corpus",
        str(corpus),
        "--out",
        str(tmp_path / "tuned.yaml"),
        *extra,
    ]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})}, **kw
    )


def test_refuses_clearly_when_other_servers_hold_every_core(tmp_path, classifier_dir):
    ledger = Ledger(tmp_path / "ledger")
    (tmp_path / "ledger").mkdir()
    ledger.register("another server", CPUSet(os.sched_getaffinity(0)))
    try:
        done = tune(
            tmp_path,
            f"model: {{path: {classifier_dir}, task: classify, quantize: none}}\n",
            env={LEDGER_ENV: str(tmp_path / "ledger")},
        )
    finally:
        ledger.release()
    assert done.returncode == 75, done.stderr
    assert "no core free to measure on" in done.stderr
    assert not (tmp_path / "tuned.yaml").exists()


def test_refuses_clearly_a_model_that_does_not_load(tmp_path):
    model = save_tiny_classifier(tmp_path / "model")
    (model / "model.safetensors").write_bytes(b"not weights")
    done = tune(tmp_path, f"model: {{path: {model}, task: classify, quantize: none}}\n")
    assert done.returncode == 78, done.stderr
    assert "does not load as onnxruntime none" in done.stderr
    assert "Traceback" not in done.stderr


def test_refuses_a_config_of_several_models(tmp_path, classifier_dir):
    done = tune(tmp_path, f"models: [{{name: a, path: {classifier_dir}, task: classify}}]\n")
    assert done.returncode == 1
    assert "tune tunes a `model:` config" in done.stderr


def probes() -> list[psutil.Process]:
    return [
        p
        for p in psutil.process_iter(["cmdline"])
        if "numaserve.tune.probe" in " ".join(p.info["cmdline"] or ())
    ]


def measuring_tune(tmp_path, classifier_dir) -> subprocess.Popen:
    """`numaserve tune` on a tiny classifier, once it has begun to measure."""
    (tmp_path / "c.yaml").write_text(
        f"model: {{path: {classifier_dir}, task: classify, quantize: none}}\n"
    )
    (tmp_path / "corpus.txt").write_text("a text\n" * 20)
    proc = subprocess.Popen(
        [
            NUMASERVE,
            "tune",
            "--config",
            str(tmp_path / "c.yaml"),
            "--corpus",
            str(tmp_path / "corpus.txt"),
            "--out",
            str(tmp_path / "t.yaml"),
            "--minutes",
            "20",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    for line in proc.stderr:
        if line.startswith("measuring"):
            break
    return proc


@pytest.mark.slow
def test_a_terminated_tune_leaves_no_probe_running(tmp_path, classifier_dir):
    proc = measuring_tune(tmp_path, classifier_dir)
    deadline = time.monotonic() + 60
    while not probes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert probes(), "no probe started"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 143
    time.sleep(0.5)
    assert probes() == []
    assert not (tmp_path / "t.yaml").exists()


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("numactl"), reason="numactl is not installed")
def test_a_probe_begins_as_an_instance_does_under_numactl(tmp_path, classifier_dir):
    """So that tune measures what an instance runs: memory bound before the interpreter's
    own pages land, by numactl, as processes/begin.py does for every child."""
    proc = measuring_tune(tmp_path, classifier_dir)
    try:
        deadline, bound = time.monotonic() + 60, set()
        while not bound and time.monotonic() < deadline:
            for probe in probes():
                with contextlib.suppress(psutil.Error):  # gone meanwhile
                    bound |= {probe.environ().get(PINNED_BY_ENV)} - {None}  # None: before
            time.sleep(0.1)
        assert bound == {"numactl"}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


@pytest.mark.slow
def test_a_short_real_run_writes_a_config_that_plans_and_serves(tmp_path, classifier_dir):
    """Under quantize: auto: every path its choice holds is measured, and auto itself (its
    paths composed by band and batch size) is what it ranks and writes."""
    done = tune(
        tmp_path,
        f"model: {{path: {classifier_dir}, task: classify}}\n",
        "--minutes",
        "2",
        "--p99-ms",
        "200",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "given" in done.stdout and "tuned1" in done.stdout  # the table: both measured
    tuned = tmp_path / "tuned.yaml"
    text = tuned.read_text()
    assert text.startswith("# Written by `numaserve tune`.")
    assert load_config(str(tuned)).model.quantize == "auto"  # tuned or as given: auto serves
    assert "measured/s" in text
    plan = subprocess.run(
        [NUMASERVE, "plan", "--config", str(tuned)], capture_output=True, text=True, check=False
    )
    assert plan.returncode == 0, plan.stderr
    server = Server(tmp_path, verification_text(yaml.safe_load(text)))
    try:
        server.wait_ready()
        with Client(server.endpoint) as c:
            assert c.classify("it serves").label in ("negative", "neutral", "positive")
    finally:
        server.stop()
    assert probes() == []


def verified(label: str, *rounds: float, p99: float = 50.0) -> Verified:
    """A configuration that served `rounds[0]` texts/s at its best step, then the others."""
    best, *again = (Step(4, x, p99, 0) for x in rounds)
    return Verified(label, (Step(2, rounds[0] / 2, p99 / 2, 0), best), again=tuple(again))


def test_a_tuned_config_replaces_the_given_one_only_by_a_lead_larger_than_its_spread():
    given = verified("given", 100, 104, 98)
    clearly = verified("tuned1", 130, 128, 126)
    noisy = verified("tuned1", 140, 95, 101)  # faster in the median, by less than the spread
    assert winner([given, clearly], p99_ms=100) is clearly
    assert winner([given, noisy], p99_ms=100) is given


def test_a_config_that_misses_the_target_or_errs_in_a_later_round_does_not_win():
    given = verified("given", 100, 100, 100)
    slow_later = verified("tuned1", 150, 150, 150)
    slow_later = replace(slow_later, again=(Step(4, 150, 500, 0), Step(4, 150, 50, 0)))
    erred = replace(verified("tuned2", 150, 150, 150), again=(Step(4, 150, 50, 1),))
    assert winner([given, slow_later, erred], p99_ms=100) is given


def test_with_one_round_only_the_config_as_given_stays():
    assert winner([verified("given", 100), verified("tuned1", 200)], p99_ms=100).label == "given"
