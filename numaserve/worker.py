"""A numaserve instance: one process, pinned to its slot, running one copy of the model.

Start-up order matters: pin CPUs and memory first, then import torch (its thread pool inherits
the binding), load and warm the model, and only then announce READY to the router.

Two threads: the main thread runs forward passes; the I/O thread owns the ZeroMQ socket, so
heartbeats keep flowing while a long forward pass runs. They talk over an inproc PAIR socket.
Run as `python -m numaserve.worker --spec JSON` (a WorkerSpec, specs.py).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import threading
import time

import zmq

from numaserve import exitcodes, protocol
from numaserve.backends.modelpath import ModelLoadError
from numaserve.host.cpulist import format_cpulist
from numaserve.host.pinning import (
    PINNED_BY_ENV,
    PinningError,
    PinReport,
    numactl_argv,
    pin_current_process,
    thread_settings,
)
from numaserve.lifecycle import die_with_parent, read_spec
from numaserve.specs import WorkerSpec

log = logging.getLogger("numaserve.worker")
JOBS = "inproc://jobs"
STOP = [b"stop"]


class Engine:
    """The model, warmed up, and the translation of its outputs to wire results."""

    def __init__(self, spec: WorkerSpec, report: PinReport):
        from numaserve.backends import load_model  # imports the backend: after pinning

        self.model = load_model(spec.model, spec.isa, report.threads)
        self.task = spec.model.task
        self.warm_up(min(spec.max_tokens, spec.model.max_length))

    def warm_up(self, longest: int) -> None:
        """Run every shape family once, so the first real request pays no one-off costs."""
        lengths = sorted({n for n in (2, 8, 16, 32, 64, 128, 256, 512) if n < longest} | {longest})
        for n in lengths:
            self.model.run([self._ids(n)])
        self.model.run([self._ids(min(16, longest))] * 4)

    def _ids(self, n: int) -> list[int]:
        return [(7 * i + 1000) % self.model.vocab_size for i in range(n)]

    def run(self, body: dict) -> dict:
        job = body.get("job")
        inputs = body.get("inputs")
        if not isinstance(inputs, list) or not inputs:
            return _job_error(
                job, protocol.ErrorCode.BAD_REQUEST, "inputs must be a non-empty list"
            )
        for i, ids in enumerate(inputs):
            if not isinstance(ids, list) or not all(type(t) is int for t in ids):
                return _job_error(
                    job, protocol.ErrorCode.BAD_REQUEST, f"input {i}: not a list of token ids"
                )
            reason = self.model.check_ids(ids)
            if reason:
                return _job_error(job, protocol.ErrorCode.BAD_REQUEST, f"input {i}: {reason}")
        try:
            outputs = self.model.run(inputs)
        except Exception as e:
            log.exception("forward pass failed")
            return _job_error(job, protocol.ErrorCode.INTERNAL, f"forward pass failed: {e}")
        if self.task == "classify":
            results = [{"label": r.label, "probs": list(r.probs)} for r in outputs]
        else:
            results = [{"embedding": protocol.embedding_to_wire(v)} for v in outputs]
        return {"type": protocol.RESULT, "job": job, "results": results}

    def describe(self) -> dict:
        info: dict = {"task": self.task, "max_length": self.model.config.max_length}
        if self.task == "classify":
            info["labels"] = list(self.model.labels)
        else:
            info["dim"] = self.model.dim
        return info


def _job_error(job, code: protocol.ErrorCode, message: str) -> dict:
    return {"type": protocol.RESULT, "job": job, "error": protocol.error_body(code, message)}


class IOThread(threading.Thread):
    """Owns the DEALER socket: READY, heartbeats both ways, and jobs to and from the main thread."""

    def __init__(self, ctx: zmq.Context, spec: WorkerSpec, ready: dict, wake_fd: int):
        super().__init__(name="numaserve-io", daemon=True)
        self.ctx, self.spec, self.ready, self.wake_fd = ctx, spec, ready, wake_fd
        self.parent = os.getppid()
        self.served = 0
        self.in_flight = 0  # a count: job ids are the router's, and need not be unique
        self.stopping = False

    def run(self) -> None:
        try:
            self.loop()
        except BaseException:  # without this thread the worker is deaf: die, to be restarted
            log.exception("I/O thread failed")
            os._exit(exitcodes.CRASH)

    def loop(self) -> None:
        self.dealer = self.ctx.socket(zmq.DEALER)
        self.dealer.linger = 1000
        self.dealer.connect(self.spec.router)
        self.jobs = self.ctx.socket(zmq.PAIR)
        self.jobs.connect(JOBS)
        poller = zmq.Poller()
        poller.register(self.dealer, zmq.POLLIN)
        poller.register(self.jobs, zmq.POLLIN)
        poller.register(self.wake_fd, zmq.POLLIN)

        interval = self.spec.heartbeat_ms / 1000
        self.send(self.ready)
        last_heard = time.monotonic()
        next_beat = last_heard + interval
        while not (self.stopping and not self.in_flight):
            for sock, _ in poller.poll(max(0.0, next_beat - time.monotonic()) * 1000):
                if sock == self.wake_fd:
                    os.read(self.wake_fd, 64)
                    self.begin_stop("asked to stop")
                elif sock is self.dealer:
                    last_heard = time.monotonic()
                    self.from_router(self.dealer.recv_multipart())
                else:
                    self.dealer.send_multipart(self.jobs.recv_multipart())
                    self.in_flight -= 1
                    self.served += 1
            now = time.monotonic()
            if now >= next_beat:
                self.send(
                    {"type": protocol.HEARTBEAT, "busy": self.in_flight, "served": self.served}
                )
                next_beat = now + interval
                if now - last_heard > self.spec.liveness * interval and not self.stopping:
                    self.send(self.ready)  # the router may have restarted and forgotten us
                    last_heard = now
                if os.getppid() != self.parent:
                    self.begin_stop("parent process is gone")
        self.jobs.send_multipart(STOP)
        self.dealer.close()
        self.jobs.close()

    def send(self, body: dict) -> None:
        self.dealer.send_multipart(protocol.pack(body))

    def begin_stop(self, why: str) -> None:
        if not self.stopping:
            self.stopping = True
            log.info("%s: finishing %d job(s) in flight, then exiting", why, self.in_flight)
            self.send({"type": protocol.BYE})

    def from_router(self, frames: list[bytes]) -> None:
        try:
            body = protocol.unpack(frames)
        except protocol.ProtocolError as e:
            log.warning("dropped a message from the router: %s", e)
            return
        kind = body.get("type")
        if kind == protocol.RUN:
            if self.stopping:  # the router re-routes this at once rather than wait for a timeout
                self.send(
                    _job_error(
                        body.get("job"), protocol.ErrorCode.NO_INSTANCE, "worker is stopping"
                    )
                )
                return
            self.in_flight += 1
            self.jobs.send_multipart(frames)
        elif kind != protocol.HEARTBEAT:
            log.warning("ignored a message of unknown type %r from the router", kind)


def serve(spec: WorkerSpec, engine: Engine, report: PinReport, load_seconds: float) -> int:
    ctx = zmq.Context()
    jobs = ctx.socket(zmq.PAIR)
    jobs.bind(JOBS)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)

    # The kernel may hand SIGTERM to any thread, a runtime's worker thread included, while the
    # main thread sits in a C call that Python's handler must wait for. The wakeup fd is
    # written by the C-level handler at once, whichever thread took the signal; the I/O
    # thread polls it and does the work. The Python-level handler has nothing left to do.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    ready = {
        "type": protocol.READY,
        "name": spec.name,
        "pool": spec.pool,
        "pid": os.getpid(),
        "max_tokens": spec.max_tokens,
        "load_seconds": round(load_seconds, 3),
        **report.to_json(),
        **engine.describe(),
    }
    io = IOThread(ctx, spec, ready, wake_r)
    io.start()
    log.info(
        "ready in %.1f s: CPUs %s, memory on node(s) %s (bound by %s), %d thread(s)",
        load_seconds,
        format_cpulist(report.cpus),
        format_cpulist(report.nodes),
        report.membind,
        report.threads,
    )
    while True:
        frames = jobs.recv_multipart()
        if frames == STOP:
            break
        jobs.send_multipart(protocol.pack(engine.run(protocol.unpack(frames))))
    io.join()
    jobs.close()
    ctx.term()
    log.info("stopped after serving %d job(s)", io.served)
    return exitcodes.OK


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    spec = read_spec(WorkerSpec, "numaserve.worker", argv, log)
    if spec is None:
        return exitcodes.MODEL
    log.name = f"numaserve.worker.{spec.name}"
    die_with_parent()
    try:
        method, cpus, nodes = pin_current_process(spec.cpus, spec.nodes)
    except PinningError as e:
        where = f"CPUs {format_cpulist(spec.cpus)}, node(s) {format_cpulist(spec.nodes)}"
        log.error("cannot pin to %s: %s", where, e)
        return exitcodes.PINNING
    numactl = shutil.which("numactl") if spec.use_numactl else None
    if numactl and method != "numactl":
        # Bound and checked in-process above (so a bad slot exits PINNING, not numactl's 1);
        # now start over under numactl, so even the interpreter's own memory is node-local.
        under_numactl = numactl_argv(numactl, cpus, nodes, spec.argv())
        try:
            os.execve(numactl, under_numactl, {**os.environ, PINNED_BY_ENV: "numactl"})
        except OSError as e:
            log.warning("cannot run %s (%s); keeping the in-process binding", numactl, e.strerror)
    threads, warnings = thread_settings(spec.threads, os.environ)
    for warning in warnings:
        log.warning("%s", warning)
    report = PinReport(cpus, nodes, method, threads)
    try:
        engine = Engine(spec, report)
    except ModelLoadError as e:
        log.error("%s", e)
        return exitcodes.MODEL
    return serve(spec, engine, report, time.monotonic() - started)


if __name__ == "__main__":
    sys.exit(main())
