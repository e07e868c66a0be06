"""Real worker processes, pinned, loading real models, driven over real ZeroMQ sockets."""

import signal
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import pytest

from numaserve.backends.tokenizer import Tokenizer
from numaserve.config.paths import ModelPath
from numaserve.config.schema import ModelConfig
from numaserve.host.pinning import live_affinity, read_numa_maps
from numaserve.processes import exitcodes
from numaserve.status.report import RunningPath
from numaserve.wire import protocol
from tests.harness.processes import wait_gone
from tests.harness.router_side import ISA, RouterSide, start_worker, worker_spec
from tests.harness.seccomp import UNDER_DEFAULT_PROFILE

TEXTS = ["Return the absolute value of the argument.", "Hello world"]
# A model with nothing to prepare (torch, a named precision) is loaded by the worker itself;
# the others are refused at `numaserve prepare`, before any worker (test_missing_head.py,
# test_model_paths.py), and an instance started without prepare's record is refused below.
AS_IT_IS = dict(backend="torch", quantize="none")


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer("bundled:minilm", max_length=256)


@pytest.fixture
def router(tmp_path):
    side = RouterSide(tmp_path)
    yield side
    side.close()


@pytest.fixture(scope="module")
def embed_worker(tmp_path_factory):
    """One embedding worker on CPU 1 via numactl, shared by the tests that only talk to it."""
    directory = tmp_path_factory.mktemp("embed")
    router = RouterSide(directory)
    proc = start_worker(worker_spec(router, heartbeat_ms=100), directory / "worker.log")
    identity, ready = router.wait_for(protocol.READY)
    yield router, identity, ready, proc
    proc.terminate()
    proc.wait(30)
    router.close()


def stop(proc):
    proc.terminate()
    return proc.wait(30)


def test_worker_is_pinned_to_its_cpu_with_memory_on_its_node(embed_worker):
    _, _, ready, proc = embed_worker
    assert live_affinity(proc.pid) == (1,)
    maps = read_numa_maps(proc.pid)
    # A native library may mbind() an arena MPOL_LOCAL itself: with the CPUs pinned to the
    # node, "local" is the same node.
    assert "bind:0" in maps.policies and maps.policies <= {"bind:0", "local"}
    assert set(maps.pages_per_node) == {0}
    assert (ready["binding"], ready["threads"], ready["membind"]) == (
        {"cpus": [1], "nodes": [0]},
        1,
        "numactl",
    )


def test_worker_announces_what_it_serves(embed_worker):
    _, _, ready, proc = embed_worker
    assert ready["name"] == "main-0" and ready["pool"] == "main" and ready["pid"] == proc.pid
    assert (ready["task"], ready["dim"], ready["max_length"]) == ("embed", 384, 256)


def test_worker_answers_embed_requests_like_the_model_in_process(embed_worker, tokenizer):
    from numaserve.backends import load_model

    router, identity, _, _ = embed_worker
    inputs = [list(e.ids) for e in tokenizer.encode(TEXTS)]
    reply = router.run(identity, inputs)
    got = np.stack([protocol.embedding_from_wire(r["embedding"]) for r in reply["results"]])
    expected = np.stack(load_model(ModelConfig(backend="torch", quantize="none")).run(inputs))
    assert got.shape == (2, 384)
    assert (got * expected).sum(axis=1).min() > 0.98  # int8 in the worker, fp32 here


def test_bad_token_ids_get_an_error_and_the_worker_keeps_serving(embed_worker, tokenizer):
    router, identity, _, _ = embed_worker
    reply = router.run(identity, [[101, 10**7, 102]])
    assert reply["error"]["code"] == "bad_request"
    assert "token ids must be in 0..30521" in reply["error"]["message"]
    assert "results" in router.run(identity, [list(tokenizer.encode(["fine"])[0].ids)])


def test_malformed_frames_are_dropped_and_the_worker_keeps_serving(embed_worker, tokenizer):
    router, identity, _, _ = embed_worker
    router.sock.send_multipart([identity, b"garbage"])
    router.sock.send_multipart([identity, protocol.VERSION, b"\xc1"])
    router.send(identity, {"type": "nonsense"})
    assert "results" in router.run(identity, [list(tokenizer.encode(["still here"])[0].ids)])


def test_worker_heartbeats_and_announces_itself_again_to_a_silent_router(embed_worker):
    router, _, _, _ = embed_worker
    router.discard(0.5)  # five heartbeat intervals: anything from the earlier tests' runs
    _, beat = router.wait_for(protocol.HEARTBEAT, timeout=5)
    assert beat["busy"] == 0
    _, again = router.wait_for(protocol.READY, timeout=5)  # we sent it no heartbeats
    assert again["name"] == "main-0"


def test_worker_binds_memory_itself_where_numactl_is_not_used(router, tmp_path):
    proc = start_worker(worker_spec(router, use_numactl=False, cpus=(0,)), tmp_path / "w.log")
    _, ready = router.wait_for(protocol.READY)
    assert ready["membind"] == "set_mempolicy"
    assert live_affinity(proc.pid) == (0,)
    assert "bind:0" in read_numa_maps(proc.pid).policies
    assert stop(proc) == exitcodes.OK


def test_under_a_profile_refusing_memory_policy_the_cpuset_binds_it_and_the_worker_says_so(
    router, tmp_path
):
    """As a container without CAP_SYS_NICE runs under its runtime's default seccomp profile,
    on a host whose cpuset.mems is the slot's one node. numactl, which the worker would start
    itself over under, is refused too: it stays as it is."""
    log = tmp_path / "w.log"
    proc = start_worker(worker_spec(router, cpus=(0,)), log, prefix=UNDER_DEFAULT_PROFILE)
    _, ready = router.wait_for(protocol.READY)
    assert ready["membind"] == "cpuset"
    assert live_affinity(proc.pid) == (0,)
    assert "memory bound by cgroup cpuset.mems" in log.read_text()
    assert stop(proc) == exitcodes.OK


def test_worker_classifies_with_a_saved_checkpoint(router, tmp_path, classifier_dir, tokenizer):
    model = ModelConfig(path=str(classifier_dir), task="classify", **AS_IT_IS)
    proc = start_worker(worker_spec(router, model=model), tmp_path / "w.log")
    identity, ready = router.wait_for(protocol.READY)
    assert ready["labels"] == ["negative", "neutral", "positive"]
    reply = router.run(identity, [list(e.ids) for e in tokenizer.encode(TEXTS)])
    for r in reply["results"]:
        assert r["label"] in ready["labels"] and abs(sum(r["probs"]) - 1) < 1e-4
    assert stop(proc) == exitcodes.OK


def test_heartbeats_flow_during_a_long_forward_pass_and_sigterm_finishes_it(router, tmp_path):
    proc = start_worker(worker_spec(router, heartbeat_ms=50, max_tokens=256), tmp_path / "w.log")
    identity, _ = router.wait_for(protocol.READY)
    long_batch = [[101] + [2000 + i for i in range(254)] + [102]] * 48
    for _ in range(2):  # job ids belong to the router and may repeat: both must be answered
        router.send(identity, {"type": protocol.RUN, "job": 7, "inputs": long_batch})
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    seen = []
    while sum(b["type"] == protocol.RESULT for b in seen) < 2:
        seen.append(router.recv()[1])
    busy_beats = [b for b in seen if b["type"] == protocol.HEARTBEAT and b["busy"] >= 1]
    assert len(busy_beats) >= 3, [b["type"] for b in seen]
    assert {"type": protocol.BYE} in seen
    assert all(len(b["results"]) == 48 for b in seen if b["type"] == protocol.RESULT)
    assert proc.wait(30) == exitcodes.OK


def test_a_stopping_worker_runs_what_still_reaches_it_and_leaves_when_the_router_answers_bye(
    router, tmp_path, tokenizer
):
    # Heartbeats 10 s apart: waiting out the router's answer would take 30 s.
    proc = start_worker(worker_spec(router, heartbeat_ms=10_000), tmp_path / "w.log")
    identity, _ = router.wait_for(protocol.READY)
    proc.send_signal(signal.SIGTERM)
    bye_from, _ = router.wait_for(protocol.BYE)
    assert bye_from == identity  # on the job connection: after it, no run is in flight
    assert "results" in router.run(identity, [list(tokenizer.encode(["sent before bye"])[0].ids)])
    router.send(identity, {"type": protocol.BYE})
    assert proc.wait(10) == exitcodes.OK


def test_a_stopping_worker_leaves_at_once_when_the_router_is_gone(router, tmp_path):
    proc = start_worker(worker_spec(router, heartbeat_ms=10_000), tmp_path / "w.log")
    router.wait_for(protocol.READY)
    router.close()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == exitcodes.OK


def test_worker_exits_when_its_parent_dies(router, tmp_path):
    spec = worker_spec(router)
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; "
            f"p = subprocess.Popen({spec.argv()!r}); print(p.pid, flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    worker_pid = int(parent.stdout.readline())
    router.wait_for(protocol.READY)
    parent.kill()
    parent.wait()
    assert wait_gone([worker_pid], timeout=30) == []


def exit_of(spec, tmp_path):
    log = tmp_path / "w.log"
    code = start_worker(spec, log).wait(60)
    return code, log.read_text()


def test_missing_model_exits_with_the_model_code(router, tmp_path):
    spec = worker_spec(router, model=ModelConfig(path=str(tmp_path / "nope"), **AS_IT_IS))
    code, log = exit_of(spec, tmp_path)
    assert code == exitcodes.MODEL
    assert "no such directory" in log and "Traceback" not in log


def test_corrupt_checkpoint_exits_with_the_model_code(router, tmp_path, classifier_dir):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(classifier_dir, broken)
    (broken / "model.safetensors").write_bytes(b"garbage")
    spec = worker_spec(router, model=ModelConfig(path=str(broken), task="classify", **AS_IT_IS))
    code, log = exit_of(spec, tmp_path)
    assert code == exitcodes.MODEL
    assert "cannot load model" in log


def test_an_instance_without_prepares_record_is_refused_and_never_chooses(router, tmp_path):
    spec = worker_spec(router, model=ModelConfig(), prepared="")  # quantize: auto
    code, log = exit_of(spec, tmp_path)
    assert code == exitcodes.MODEL
    assert "started without what `numaserve prepare` resolved for bundled:minilm" in log
    assert "judging" not in log and "Traceback" not in log


def test_unknown_task_exits_with_the_model_code(router, tmp_path):
    spec = worker_spec(router).to_json().replace('"task": "embed"', '"task": "summarize"')
    log = tmp_path / "w.log"
    code = subprocess.run(
        [sys.executable, "-m", "numaserve.worker", "--spec", spec],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        timeout=60,
    ).returncode
    assert code == exitcodes.MODEL
    assert (
        "model.task: must be one of embed, classify, rerank, ner, sparse, multivector; got "
        "'summarize'" in log.read_text()
    )


def test_unpinnable_slot_exits_with_the_pinning_code(router, tmp_path):
    code, log = exit_of(worker_spec(router, cpus=(4095,)), tmp_path)
    assert code == exitcodes.PINNING
    assert "cannot pin to CPUs 4095" in log


def test_a_failed_forward_pass_is_logged_with_the_trace_ids_of_the_requests_it_served(caplog):
    from numaserve.backends import load_model
    from numaserve.worker import Engine

    engine = object.__new__(Engine)  # its parts set here, not loaded from a spec
    engine.model = load_model(ModelConfig(backend="torch", quantize="none"))
    engine.task, engine.tracing = engine.model.task, None

    def fail(*args):
        raise RuntimeError("cannot allocate memory")

    engine.model.run = fail
    traced = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    reply = engine.run({"job": 7, "inputs": [[101, 102]], "trace": [traced, 5]})
    assert reply["error"]["message"] == "forward pass failed: cannot allocate memory"
    (record,) = [r for r in caplog.records if "forward pass failed" in r.getMessage()]
    assert record.getMessage() == (
        "forward pass failed (job 7, trace_ids 4bf92f3577b34da6a3ce929d0e0e4736)"
    )
    assert record.trace_ids == ["4bf92f3577b34da6a3ce929d0e0e4736"]


def test_a_worker_holding_a_throughput_path_says_so_runs_its_batches_there_and_counts_them(
    router, tmp_path
):
    from numaserve.backends import prepare_model
    from numaserve.backends.choice import Band
    from numaserve.config.paths import BatchedPath

    int8 = ModelConfig(backend="onnxruntime", quantize="int8")
    fp32 = ModelConfig(backend="onnxruntime", quantize="none")
    alone, batch = (prepare_model(c, ISA, (Band("main", 0, 256),)) for c in (int8, fp32))
    path = batch.pools["main"]
    batched = BatchedPath(4, path.path, "4 at a time: the fastest", artifact=path.artifact)
    pool = replace(alone.pools["main"], why="one at a time: the fastest", batched=batched)
    record = replace(alone, pools={"main": pool})
    record.write(tmp_path / "prepared.json")
    auto = ModelConfig()  # quantize: auto; the record says what runs
    spec = worker_spec(
        router,
        model=auto,
        prepared=str(tmp_path / "prepared.json"),
        heartbeat_ms=100,
        max_batch=8,
        max_batch_tokens=128,
    )
    proc = start_worker(spec, tmp_path / "worker.log")
    try:
        identity, ready = router.wait_for(protocol.READY, timeout=120)
        said = RunningPath.from_wire(ready["model_path"]).runs
        assert said.path == ModelPath("onnxruntime", "int8")
        assert said.batched.from_batch == 4 and said.batched.path.quantize == "none"
        router.run(identity, [[101, 7592, 102]] * 3)  # below the crossover: int8
        router.run(identity, [[101, 7592, 102]] * 4)  # from it: fp32
        router.run(identity, [[101, 7592, 102]] * 8)
        router.discard(0.3)  # heartbeats sent before the runs
        _, beat = router.wait_for(protocol.HEARTBEAT, timeout=5)
        assert beat["passes"] == {"onnxruntime int8": 1, "onnxruntime none": 2}  # not warm-up's
    finally:
        stop(proc)
