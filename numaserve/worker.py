"""A numaserve instance: one process, pinned to its slot, running one copy of the model.

Start-up order matters: pin CPUs and memory first, then import torch (its thread pool inherits
the binding), load and warm the model, and only then announce READY to the router.

Two threads, each with its own connection to the router: the main (model) thread receives
runs, computes and sends results on the job connection, with no hand-off between threads; the
control thread sends and hears heartbeats on the control connection, so they keep flowing
while a long forward pass runs. They talk over an inproc PAIR socket.
Run as `python -m numaserve.worker --spec JSON` (a WorkerSpec, processes/specs.py).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

from numaserve.checkpoint.errors import ModelLoadError
from numaserve.config.paths import ModelPath, PoolPath
from numaserve.config.runtimes import needs_prepare
from numaserve.host.pinning import (
    PinReport,
    thread_settings,
)
from numaserve.processes import exitcodes
from numaserve.processes.begin import begin
from numaserve.processes.specs import WorkerSpec, model_key
from numaserve.processes.tracing import span_context
from numaserve.processes.tracing import start as start_tracing
from numaserve.status.report import Ready, RunningPath
from numaserve.wire import protocol
from numaserve.wire.run import BadRun, Run

log = logging.getLogger("numaserve.worker")
CONTROL = "inproc://control"
# The control thread's commands to the model thread, and the model thread's last word.
STOP, ANNOUNCE, LEAVE, DONE = b"stop", b"announce", b"leave", b"done"


class Engine:
    """The model, warmed up, and the translation of its outputs to wire results."""

    def __init__(self, spec: WorkerSpec, report: PinReport):
        from numaserve.backends import load_model, load_prepared  # the backend: after pinning

        if spec.prepared:
            self.model = load_prepared(
                spec.model,
                spec.slot.pool,
                spec.prepared,
                spec.isa,
                report.threads,
                # the node whose copy of shared weights it maps: where its memory is bound
                report.binding.node,
                spec.prepared_digest,
            )
        elif needs_prepare(spec.model.backend, spec.model.quantize):
            raise ModelLoadError(
                f"this instance was started without what `numaserve prepare` resolved for "
                f"{spec.model.path} (its spec names no record): an instance loads its pool's "
                "model path and artifact as prepare resolved them, and never chooses or builds "
                "them itself; start it with `numaserve start`, which prepares first"
            )
        else:  # torch, with a named precision: the checkpoint as it is
            self.model = load_model(spec.model, spec.isa, report.threads)
        self.task = self.model.task
        self.warm_up(
            min(spec.max_tokens, spec.model.max_length), spec.max_batch, spec.max_batch_tokens
        )
        # Where tracing is on: this process's, with what holds for each of its forward passes
        # on its resource (sent once a batch of spans, not on every span).
        self.tracing = start_tracing(
            "worker",
            attributes={
                "numaserve.instance": spec.slot.name,
                "numaserve.pool": spec.slot.pool,
                "numaserve.cpus": str(report.binding.cpus),
                "numaserve.numa_nodes": str(report.binding.nodes),
                "numaserve.model.path": spec.model.path,
                "numaserve.model.backend": self.model.config.backend,
                "numaserve.model.precision": self.model.config.quantize,
            },
        )

    def warm_up(self, longest: int, max_batch: int = 1, max_batch_tokens: int = 1) -> None:
        """Run every shape family once on every path it holds, one text at a time and in the
        micro-batches the router sends (a band's throughput path runs those), so the first
        real request pays no one-off costs (a runtime's first pass at a shape)."""
        lengths = sorted({n for n in (2, 8, 16, 32, 64, 128, 256, 512) if n < longest} | {longest})
        for n in lengths:
            self.model.run([self._ids(n)])
        sizes = {s for s in (2, 4, 8, 16, 32, 64, 128, 256) if s < max_batch} | {max_batch, 4}
        for size in sorted(sizes - {1}):
            for n in lengths:
                if size * n > max(max_batch_tokens, 64):
                    break
                self.model.run([self._ids(n)] * size)
        if (ran := getattr(self.model, "ran", None)) is not None:
            ran.update(dict.fromkeys(ran, 0))  # what it serves counts, not its warm-up

    def _ids(self, n: int) -> list[int]:
        return [(7 * i + 1000) % self.model.vocab_size for i in range(n)]

    def run(self, body: dict) -> dict:
        try:
            run = Run.from_wire(body, hidden_state=not self.task.output.logits)
        except BadRun as e:
            return _job_error(body.get("job"), protocol.ErrorCode.BAD_REQUEST, str(e))
        job, inputs = run.job, run.inputs
        for i, ids in enumerate(inputs):
            if reason := self.model.check_ids(ids):
                return _job_error(job, protocol.ErrorCode.BAD_REQUEST, f"input {i}: {reason}")
        try:
            started = time.perf_counter()
            outputs = self.model.run(inputs, run.segments, list(run.token_vectors))
            pass_s = time.perf_counter() - started
        except Exception as e:
            read = map(span_context, run.trace)  # as the pass's span reads them
            traces = sorted({f"{c.trace_id:032x}" for c in read if c is not None})
            log.exception(  # a log line that leads to the traces of the requests it failed
                "forward pass failed (job %s%s)",
                job,
                f", trace_ids {','.join(traces)}" if traces else "",
                extra={"trace_ids": traces} if traces else {},
            )
            return _job_error(job, protocol.ErrorCode.INTERNAL, f"forward pass failed: {e}")
        results = [self.task.to_wire(output) for output in outputs]
        if self.tracing is not None and run.trace:
            attributes = {
                "numaserve.batch.texts": len(inputs),
                "numaserve.batch.tokens": sum(map(len, inputs)),
                "numaserve.head_ms": round(self.model.head_s * 1000, 3),  # within the pass
            }
            self.tracing.batch(list(run.trace), "forward pass", pass_s, attributes)
        return {"type": protocol.RESULT, "job": job, "results": results, "pass_s": pass_s}

    def describe(self) -> dict:
        config = self.model.config
        # What runs: the prepared record's entry (an instance of a server), else what
        # load_model's `auto` chose, else the config's own path; `auto` chose it where it
        # says why.
        runs = (
            self.model.prepared
            or self.model.choice
            or PoolPath(
                ModelPath(config.backend, config.quantize, config.keep_fp32),
                accuracy=self.model.accuracy,
            )
        )
        info = {
            "task": self.task.name,
            "max_length": config.max_length,
            "model_path": RunningPath(runs, "auto" if runs.why else "config"),
            "weights": [w.to_wire() for w in self.model.weights],
        }
        return info | self.model.head.describe()


def _job_error(job, code: protocol.ErrorCode, message: str) -> dict:
    return {"type": protocol.RESULT, "job": job, "error": protocol.error_body(code, message)}


class Control(threading.Thread):
    """The control connection: heartbeats both ways, on a DEALER of its own, so they keep
    flowing through a long forward pass. It turns SIGTERM (through the wakeup fd) and a lost
    parent into STOP for the model thread, a silent router into ANNOUNCE (the router may have
    restarted and forgotten us), and a router gone while stopping into LEAVE."""

    def __init__(
        self, ctx: zmq.Context, spec: WorkerSpec, instance: bytes, wake_fd: int, tracing=None
    ):
        """`tracing`: the process's, where it traces: its heartbeats say how many spans it
        could not deliver, for the shard's /metrics."""
        super().__init__(name="numaserve-control", daemon=True)
        self.ctx, self.spec, self.instance, self.wake_fd = ctx, spec, instance, wake_fd
        self.tracing = tracing
        self.passes: dict[str, int] | None = None  # the model's, by path, where it has several
        self.parent = os.getppid()
        self.busy = self.served = 0  # the model thread's, read for heartbeats
        self.stopping = False
        # None until the first connection: not yet connected is not "the router is gone" (a
        # SIGTERM just after start once made a worker leave with a run on its way to it).
        self.connected: bool | None = None

    def run(self) -> None:
        try:
            self.loop()
        except BaseException:  # without this thread the worker is deaf: die, to be restarted
            log.exception("control thread failed")
            os._exit(exitcodes.CRASH)

    def heartbeat(self) -> dict:
        beat = {"type": protocol.HEARTBEAT, "instance": self.instance, "busy": self.busy}
        beat["served"] = self.served
        if self.tracing is not None:
            beat["spans_dropped"] = self.tracing.dropped()
        if self.passes is not None:  # its keys are fixed at load: a copy is safe to take
            beat["passes"] = dict(self.passes)
        return beat

    def loop(self) -> None:
        sock = self.ctx.socket(zmq.DEALER)
        sock.linger = 0
        monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        sock.connect(self.spec.router)
        self.model = self.ctx.socket(zmq.PAIR)
        self.model.connect(CONTROL)
        poller = zmq.Poller()
        for item in (sock, monitor, self.model, self.wake_fd):
            poller.register(item, zmq.POLLIN)

        interval = self.spec.heartbeat_ms / 1000
        last_heard = time.monotonic()
        next_beat = last_heard
        while True:
            events = dict(poller.poll(max(0.0, next_beat - time.monotonic()) * 1000))
            while monitor in events and monitor.poll(0):  # first: stop() reads `connected`
                self.on_connection(recv_monitor_message(monitor)["event"])
            if self.wake_fd in events:
                os.read(self.wake_fd, 64)
                self.stop("asked to stop")
            if sock in events:
                while sock.poll(0):
                    sock.recv_multipart()  # heartbeats: hearing anything is what counts
                last_heard = time.monotonic()
            if self.model in events and self.model.recv() == DONE:
                break
            now = time.monotonic()
            if now >= next_beat:
                sock.send_multipart(protocol.pack(self.heartbeat()))
                next_beat = now + interval
                if now - last_heard > self.spec.liveness * interval and not self.stopping:
                    self.model.send(ANNOUNCE)
                    last_heard = now
                if os.getppid() != self.parent:
                    self.stop("parent process is gone")
        sock.disable_monitor()
        for s in (monitor, sock, self.model):
            s.close()

    def on_connection(self, event: int) -> None:
        self.connected = event == zmq.EVENT_CONNECTED
        if self.stopping and self.connected is False:
            self.model.send(LEAVE)

    def stop(self, why: str) -> None:
        if not self.stopping:
            self.stopping = True
            log.info("%s: finishing the job in hand, if any, then exiting", why)
            self.model.send(STOP)
            if self.connected is False:  # the router is gone: no answer to BYE will come
                self.model.send(LEAVE)


def serve(spec: WorkerSpec, engine: Engine, report: PinReport, load_seconds: float) -> int:
    """The model thread owns the job connection: a run goes from the socket to the model and
    its result back with no hand-off between threads (that cost 140 us a request)."""
    ctx = zmq.Context()
    control_pair = ctx.socket(zmq.PAIR)
    control_pair.bind(CONTROL)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)

    # The kernel may hand SIGTERM to any thread, a runtime's worker thread included, while the
    # main thread sits in a C call that Python's handler must wait for. The wakeup fd is
    # written by the C-level handler at once, whichever thread took the signal; the control
    # thread polls it and does the work. The Python-level handler has nothing left to do.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    ready = Ready(
        name=spec.slot.name,
        pool=spec.slot.pool,
        pid=os.getpid(),
        binding=report.binding,
        membind=report.membind,
        threads=report.threads,
        max_tokens=spec.max_tokens,
        model_key=model_key(spec.model),
        load_seconds=round(load_seconds, 3),
        **engine.describe(),
    )
    instance = f"{spec.slot.name}/{os.getpid()}".encode()
    jobs = ctx.socket(zmq.DEALER)
    jobs.linger = 1000
    jobs.setsockopt(zmq.ROUTING_ID, instance)
    jobs.connect(spec.router)
    control = Control(ctx, spec, instance, wake_r, engine.tracing)
    control.passes = getattr(engine.model, "ran", None)  # a Banded model counts its paths'
    control.start()
    log.info(
        "ready in %.1f s: CPUs %s, memory on node(s) %s (bound by %s), %d thread(s)",
        load_seconds,
        report.binding.cpus,
        report.binding.nodes,
        report.membind,
        report.threads,
    )
    jobs.send_multipart(protocol.pack(ready.to_wire()))
    run_jobs(jobs, control_pair, engine, control, spec.liveness * spec.heartbeat_ms / 1000, ready)
    control_pair.send(DONE)
    control.join()
    jobs.close()
    control_pair.close()
    ctx.term()
    log.info("stopped after serving %d job(s)", control.served)
    return exitcodes.OK


def run_jobs(
    jobs: zmq.Socket,
    control_pair: zmq.Socket,
    engine: Engine,
    control: Control,
    ack_timeout: float,
    ready: Ready,
) -> None:
    """Serve runs until stopped. On STOP: say BYE, go on running what still arrives, and
    leave once the router answers bye (nothing follows it on this connection), the router is
    gone, or `ack_timeout` passes without its answer."""
    poller = zmq.Poller()
    poller.register(jobs, zmq.POLLIN)
    poller.register(control_pair, zmq.POLLIN)
    leave_by = None
    while True:
        timeout = None if leave_by is None else max(0.0, leave_by - time.monotonic()) * 1000
        events = dict(poller.poll(timeout))
        while control_pair in events and control_pair.poll(0):  # first: BYE before a run
            command = control_pair.recv()
            if command == ANNOUNCE:
                jobs.send_multipart(protocol.pack(ready.to_wire()))
            elif command == STOP:
                jobs.send_multipart(protocol.pack({"type": protocol.BYE}))
                leave_by = time.monotonic() + ack_timeout
            elif command == LEAVE:
                return
        if jobs in events:
            try:
                body = protocol.unpack(jobs.recv_multipart())
            except protocol.ProtocolError as e:
                log.warning("dropped a message from the router: %s", e)
                continue
            kind = body.get("type")
            if kind == protocol.RUN:
                control.busy = 1
                jobs.send_multipart(protocol.pack(engine.run(body)))
                control.busy = 0
                control.served += 1
            elif kind == protocol.BYE and leave_by is not None:
                return
            elif kind not in (protocol.HEARTBEAT, protocol.BYE):
                log.warning("ignored a message of unknown type %r from the router", kind)
        if leave_by is not None and time.monotonic() >= leave_by:
            log.warning("the router did not answer bye in %.1f s; exiting", ack_timeout)
            return


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    began = begin(WorkerSpec, argv, log)
    if isinstance(began, int):
        return began
    spec, method = began.spec, began.method
    log.name = f"numaserve.worker.{spec.slot.name}"
    threads, warnings = thread_settings(spec.slot.threads, os.environ)
    for warning in warnings:
        log.warning("%s", warning)
    report = PinReport(began.binding, method, threads)
    try:
        engine = Engine(spec, report)
    except ModelLoadError as e:
        log.error("%s", e)
        return exitcodes.MODEL
    return serve(spec, engine, report, time.monotonic() - started)


if __name__ == "__main__":
    sys.exit(main())
