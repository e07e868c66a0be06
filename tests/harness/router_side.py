"""The router's end of the worker protocol, held by a test: a real ROUTER socket on ipc.

Until numaserve's router exists to drive workers, tests speak its side of the protocol
themselves; nothing about the worker is faked.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import replace
from pathlib import Path

import zmq

from numaserve.config.runtimes import needs_prepare
from numaserve.config.schema import ModelConfig
from numaserve.host.cpuset import Binding
from numaserve.host.placement import Slot
from numaserve.host.topology import read_topology
from numaserve.processes.specs import WorkerSpec
from numaserve.wire import protocol

ISA = read_topology().isa
# The worker's own model path unless a test names another: `quantize: auto` would first race
# the candidates (tests/test_choice.py), and no test here is about that.
NAMED = ModelConfig(backend="onnxruntime", quantize="int8")


class RouterSide:
    def __init__(self, directory: Path):
        self.directory = directory
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.linger = 0
        self.endpoint = f"ipc://{directory}/workers.sock"
        self.sock.bind(self.endpoint)
        self.job = 0

    def recv(self, timeout: float = 30.0) -> tuple[bytes, dict]:
        if not self.sock.poll(timeout * 1000):
            raise TimeoutError(f"nothing from a worker in {timeout} s")
        identity, *frames = self.sock.recv_multipart()
        return identity, protocol.unpack(frames)

    def discard(self, seconds: float) -> None:
        """Drop what arrives for `seconds`: messages about earlier work (a heartbeat the control
        connection sent during a run can arrive after that run's result: two connections,
        no order between them)."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self.sock.poll(left * 1000):
                self.sock.recv_multipart()

    def wait_for(self, kind: str, timeout: float = 60.0) -> tuple[bytes, dict]:
        deadline = time.monotonic() + timeout
        while True:
            identity, body = self.recv(max(0.01, deadline - time.monotonic()))
            if body.get("type") == kind:
                return identity, body

    def send(self, identity: bytes, body: dict) -> None:
        self.sock.send_multipart([identity, *protocol.pack(body)])

    def run(self, identity: bytes, inputs: list[list[int]], timeout: float = 30.0) -> dict:
        self.job += 1
        self.send(identity, {"type": protocol.RUN, "job": self.job, "inputs": inputs})
        _, body = self.wait_for(protocol.RESULT, timeout)
        assert body["job"] == self.job
        return body

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


def worker_spec(router: RouterSide, cpus: tuple[int, ...] = (1,), **overrides) -> WorkerSpec:
    """A worker of pool `main` (bundled:minilm on NAMED unless `model` is given), told what
    `numaserve prepare` resolved for its model, as a server's supervisor tells it (prepared
    first, here in the test's process, where needed)."""
    spec = WorkerSpec(
        slot=Slot("main-0", "main", Binding.of(cpus, [0]), threads=len(cpus)),
        router=router.endpoint,
        max_tokens=64,
        isa=ISA,
        model=NAMED,
    )
    spec = replace(spec, **overrides)
    if "prepared" in overrides or not needs_prepare(spec.model.backend, spec.model.quantize):
        return spec
    return replace(spec, prepared=prepared_record(spec.model, router.directory))


def prepared_record(model: ModelConfig, directory: Path) -> str:
    """The record `numaserve prepare` writes for a model of one pool, `main`, over every
    length, written in `directory` (the artifacts and the choice go to the run's cache)."""
    from numaserve.backends import prepare_model
    from numaserve.backends.choice import Band

    record = prepare_model(model, ISA, (Band("main", 0, model.max_length),))
    assert record is not None, f"{model.path} could not be prepared (the log says why)"
    path = directory / "prepared-main.json"
    record.write(path)
    return str(path)


def start_worker(spec: WorkerSpec, log: Path, prefix: tuple[str, ...] = ()) -> subprocess.Popen:
    """`prefix`: what to run it under (tests/harness/seccomp.py)."""
    argv = [*prefix, *spec.argv()]
    return subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT)


def pinned_worker_serves(model: ModelConfig, directory: Path) -> dict:
    """A worker of `model` (a classifier) pinned to CPU 1 answers a text with one of its
    labels, and every one of its threads (the runtime's too) runs on CPU 1. Its READY."""
    from numaserve.host.pinning import live_affinity

    router = RouterSide(directory)
    proc = start_worker(worker_spec(router, model=model), directory / "worker.log")
    try:
        identity, ready = router.wait_for(protocol.READY, timeout=120)
        reply = router.run(identity, [[101, 7592, 102]])
        assert reply["results"][0]["label"] in ready["labels"]
        tasks = list(Path(f"/proc/{proc.pid}/task").iterdir())
        assert all(live_affinity(f"{proc.pid}/task/{t.name}") == (1,) for t in tasks)
        return ready
    finally:
        proc.terminate()
        proc.wait(30)
        router.close()
