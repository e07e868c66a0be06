"""One copy of an ONNX Runtime model's weights per NUMA node: `numaserve prepare`'s packed
form, each node's copy made by its first instance, and real pinned workers mapping that copy
and sharing its pages, read from their own /proc/PID/smaps. The 2-node kernel's placement of
each node's pages is tests/test_numa_vm.py's."""

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest

from numaserve.backends import load_model, load_prepared
from numaserve.backends.node_weights import DATA, is_packed, node_copy
from numaserve.config.schema import ModelConfig
from numaserve.host.pinning import read_numa_maps
from numaserve.processes.prepared import Prepared
from numaserve.wire import protocol
from tests.harness.checkpoints import save_tiny_splade
from tests.harness.processes import still_running, wait_gone
from tests.harness.router_side import (
    ISA,
    NAMED,
    RouterSide,
    prepared_record,
    start_worker,
    worker_spec,
)
from tests.harness.waiting import eventually

TEXTS = [[101, 7592, 2088, 102], [101, 1037, 2936, 6251, 2008, 2003, 2936, 102]]


@pytest.fixture(scope="module")
def record(tmp_path_factory) -> str:
    """MiniLM int8 prepared once, in the run's cache (tests/conftest.py)."""
    return prepared_record(NAMED, tmp_path_factory.mktemp("record"))


def record_artifact(record: str) -> Path:
    return Path(Prepared.read(record).pools["main"].artifact)


def mapped(pid: int, file: str) -> dict[str, int]:
    """The kB of `file`'s mappings in the process, by smaps field, over every mapping of it."""
    totals: dict[str, int] = {}
    inside = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
            inside = fields[-1] == file
        elif inside and fields[0].endswith(":") and len(fields) == 3:
            totals[fields[0][:-1]] = totals.get(fields[0][:-1], 0) + int(fields[1])
    return totals


def test_prepare_records_the_artifacts_packed_form_with_its_weights_in_a_file_beside_it(
    record,
):
    artifact = record_artifact(record)
    assert artifact.parent.name.startswith("packed-") and artifact.name == "model.onnx"
    assert (artifact.parent / DATA).stat().st_size > artifact.stat().st_size
    assert (artifact.parent.parent / "model.onnx").exists()  # what it was made of


def test_the_node_copy_answers_exactly_as_the_artifact_it_was_made_of(record):
    whole = load_model(NAMED, ISA)
    shared = load_prepared(NAMED, "main", record, ISA, threads=1, node=0)
    assert shared.artifact.parent.name == "node0" and whole.artifact.name == "model.onnx"
    for a, b in zip(whole.run(TEXTS), shared.run(TEXTS), strict=True):
        assert np.array_equal(a, b)
    (weights,) = shared.weights
    assert weights.node == 0 and weights.file == str(shared.artifact.parent / DATA)


def test_an_instance_bound_to_no_one_node_maps_the_packed_form_itself(record):
    model = load_prepared(NAMED, "main", record, ISA, threads=1, node=None)
    assert model.artifact == record_artifact(record)
    assert model.weights[0].node is None


def test_what_prepare_records_runs_and_answers_as_the_artifact_where_a_packed_form_would_not(
    tmp_path,
):
    """ONNX Runtime 1.31 saved a packed form of a SPLADE model's graph (a masked-LM head tied
    to the embeddings) that it then crashed running (SIGSEGV): prepare keeps a form only where
    it runs and answers as the artifact does. Run in a child: a crash fails this test alone."""
    model = ModelConfig(
        path=str(save_tiny_splade(tmp_path / "splade")),
        task="sparse",
        backend="onnxruntime",
        quantize="none",
        max_length=64,
    )
    recorded = record_artifact(prepared_record(model, tmp_path))
    whole = recorded.parent.parent / "model.onnx" if is_packed(recorded) else recorded
    code = (
        "import sys; from pathlib import Path; import numpy as np\n"
        "from numaserve.backends.node_weights import _answers\n"
        "print(np.abs(_answers(Path(sys.argv[1])) - _answers(Path(sys.argv[2]))).max())"
    )
    child = subprocess.run(
        [sys.executable, "-c", code, str(recorded), str(whole)], capture_output=True, text=True
    )
    assert child.returncode == 0, child.stderr[-2000:]
    assert float(child.stdout) < 1e-4


def test_a_node_copy_cut_short_is_copied_again(record):
    packed = record_artifact(record)
    copy = node_copy(packed, 0)
    data = copy.parent / DATA
    whole = data.read_bytes()
    data.write_bytes(whole[: len(whole) // 2])  # a copy a full disk cut short
    assert node_copy(packed, 0) == copy and data.read_bytes() == whole


def test_two_instances_of_one_node_map_one_copy_and_share_its_pages(record, tmp_path):
    shutil.rmtree(Path(record_artifact(record)).parent / "node0", ignore_errors=True)
    router = RouterSide(tmp_path)
    procs = [
        start_worker(worker_spec(router, cpus=(cpu,), prepared=record), tmp_path / f"w{cpu}.log")
        for cpu in (0, 1)
    ]
    try:
        readies = [router.wait_for(protocol.READY, timeout=120) for _ in procs]
        for identity, _ in readies:
            router.run(identity, TEXTS)  # each has run: its weights are faulted in
        (file,) = {w["file"] for _, ready in readies for w in ready["weights"]}
        assert Path(file).parent.name == "node0"
        assert [ready["weights"][0]["node"] for _, ready in readies] == [0, 0]
        size_kb = Path(file).stat().st_size // 1024
        for proc in procs:
            pages = mapped(proc.pid, file)
            # A third of the file is in use (the unpacked weights it also holds are not), and
            # its pages are the other instance's too (dirty: a copy just written, not yet on
            # disk), so each counts about half of them. None is a copy of its own; the kernel's
            # fault-around may map a few neighbouring pages into one of the two alone (seen:
            # 60 KB of 11.8 MB), which count as private.
            assert pages["Rss"] > size_kb // 3, pages
            assert pages["Anonymous"] == 0, pages
            assert pages["Private_Clean"] + pages["Private_Dirty"] <= pages["Rss"] * 0.02, pages
            assert pages["Pss"] <= pages["Rss"] * 0.55, pages
            # numa_maps finds the file's pages (on the 2-node VM: on its node alone)
            assert set(read_numa_maps(proc.pid, file).pages_per_node) == {0}
        logs = "".join((tmp_path / f"w{cpu}.log").read_text() for cpu in (0, 1))
        assert logs.count("copied the model's weights for NUMA node 0") == 1, logs[-3000:]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        router.close()


def test_the_packing_child_dies_with_the_process_that_started_it(tmp_path):
    """A prepare killed midway (a start timeout, a stop) leaves no packing child running. The
    artifact is a FIFO no one writes, so the child blocks reading it until it is killed."""
    artifact = tmp_path / "model.onnx"
    os.mkfifo(artifact)
    (tmp_path / "packed").mkdir()
    caller = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from numaserve.backends import node_weights;"
            "node_weights._pack(Path(sys.argv[1]), Path(sys.argv[2]))",
            str(artifact),
            str(tmp_path / "packed"),
        ]
    )
    child = eventually(lambda: psutil.Process(caller.pid).children(), every=0.05)[0].pid
    try:
        caller.kill()
        caller.wait()
        assert wait_gone([child], timeout=10) == [], "the packing child outlived its caller"
    finally:
        if still_running(child):
            os.kill(child, signal.SIGKILL)
