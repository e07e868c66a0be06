"""The real router, run in a thread of the test, with stand-in workers.

The stand-ins speak the documented worker protocol (docs/protocol.md) over real ZeroMQ
sockets and answer every `run` after a set delay with a fixed 4-float embedding: they stand in
for the model, so that a test sees the router's own behaviour (deadlines, shedding, memory)
in a fraction of a second. Nothing of the router is faked.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import zmq

from numaserve.backends.tokenizer import Tokenizer
from numaserve.config.schema import PoolConfig, ServerConfig
from numaserve.processes.specs import RouterSpec
from numaserve.router.loop import Router
from numaserve.testing.ports import free_port
from numaserve.wire import protocol

VECTOR = protocol.embedding_to_wire([0.5, 0.5, 0.5, 0.5])


class StandInWorker(threading.Thread):
    """One instance: READY, then a result `delay` seconds after each run, heartbeats between.
    `ready`: more of its READY (a `model_key`, as a real worker's); `vector`: its embedding."""

    def __init__(
        self,
        ctx: zmq.Context,
        endpoint: str,
        name: str,
        pool: str,
        delay: float,
        ready: dict | None = None,
        vector: bytes = VECTOR,
    ):
        super().__init__(name=f"stand-in-{name}", daemon=True)
        self.ctx, self.endpoint, self.name, self.pool, self.delay = (
            ctx,
            endpoint,
            name,
            pool,
            delay,
        )
        self.ready, self.vector = ready or {}, vector
        self.running = True
        self.runs = 0
        self.inputs = 0  # texts run, over every batch

    def run(self) -> None:
        sock = self.ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(self.endpoint)
        ready = {"type": protocol.READY, "name": self.name, "pool": self.pool, "pid": 0}
        ready |= self.ready
        sock.send_multipart(protocol.pack(ready))
        next_beat = time.monotonic()
        due: list[tuple[float, dict]] = []  # jobs being "run": heartbeats go on meanwhile
        while self.running:
            now = time.monotonic()
            wait = min([next_beat, *(when for when, _ in due[:1])]) - now
            if sock.poll(max(0, min(wait, 0.02)) * 1000):
                body = protocol.unpack(sock.recv_multipart())
                if body.get("type") == protocol.RUN:
                    due.append((time.monotonic() + self.delay, body))
            while due and due[0][0] <= time.monotonic():
                _, body = due.pop(0)
                self.runs += 1
                self.inputs += len(body["inputs"])
                results = [{"embedding": self.vector} for _ in body["inputs"]]
                reply = {"type": protocol.RESULT, "job": body["job"], "results": results}
                sock.send_multipart(protocol.pack(reply))
            if time.monotonic() >= next_beat:
                sock.send_multipart(protocol.pack({"type": protocol.HEARTBEAT}))
                next_beat = time.monotonic() + 0.1
        sock.close()


class InProcessRouter:
    """A Router serving in a thread, with `instances` stand-in workers in one pool."""

    def __init__(
        self,
        directory: Path,
        instances: int = 1,
        delay: float = 0.0,
        start_workers: bool = True,
        frontend: str | None = None,
        endpoint: str | None = None,
        local: str | None = None,
        **server_settings,
    ):
        """`frontend`: an address the router connects to as a shard does to its frontend,
        instead of binding its own endpoint; `endpoint`: its own (default: a free port);
        `local`: the private socket an HTTP front connects to, as a shard's."""
        self.endpoint = endpoint or f"tcp://127.0.0.1:{free_port()}"
        server = ServerConfig(endpoint=self.endpoint, heartbeat_ms=500, **server_settings)
        spec = RouterSpec(
            workers_endpoint=f"ipc://{directory}/workers.sock",
            pools=(PoolConfig(name="main", max_tokens=256),),
            server=server,
            frontend=frontend,
            local=local,
        )
        self.spec = spec
        self.ctx = zmq.Context()
        tokenizer = Tokenizer(spec.model.path, spec.model.max_length, memo_bytes=1 << 20)
        self.router = Router(spec, tokenizer, self.ctx)
        self.router.bind()
        self.wake_r, self.wake_w = os.pipe()
        self.thread = threading.Thread(target=self.router.serve, args=(self.wake_r,))
        self.thread.start()
        self.workers = [
            StandInWorker(self.ctx, spec.workers_endpoint, f"main-{i}", "main", delay)
            for i in range(instances)
        ]
        if start_workers:
            self.start_workers()

    def start_workers(self) -> None:
        for worker in self.workers:
            worker.start()
        deadline = time.monotonic() + 10
        while len(self.router.dispatch.workers) < len(self.workers):
            assert time.monotonic() < deadline, "the stand-in workers never became ready"
            time.sleep(0.01)

    def add_worker(self, name: str, **kw) -> StandInWorker:
        """Another instance, started and announced (kw: StandInWorker's `ready`, `vector`)."""
        worker = StandInWorker(self.ctx, self.spec.workers_endpoint, name, "main", 0.0, **kw)
        self.workers.append(worker)
        worker.start()
        deadline = time.monotonic() + 10
        while worker.name not in {w.name for w in self.router.dispatch.workers.values()}:
            assert time.monotonic() < deadline, f"{name} never became ready"
            time.sleep(0.01)
        return worker

    def client_socket(self) -> zmq.Socket:
        sock = self.ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(self.endpoint)
        return sock

    def close(self) -> None:
        os.write(self.wake_w, b"s")  # SIGTERM's path: drain, then the loop ends
        self.thread.join(30)
        for worker in self.workers:
            worker.running = False
            if worker.ident is not None:  # started
                worker.join(5)
        self.router.close()
        self.ctx.destroy(linger=0)  # the tests' client sockets too
        os.close(self.wake_r)
        os.close(self.wake_w)
