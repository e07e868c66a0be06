"""Load from raw DEALER clients that never retry, so that every lost request shows.

Each client keeps `depth` requests in flight (pipelined) with distinct texts, and records
for each request how it ended: `ok`, an error code, or nothing at all. The chaos suite
(tests/test_chaos.py) and the overload benchmark (benchmarks/reliability.py) both use it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import zmq

from numaserve.wire import protocol


@dataclass
class Outcomes:
    sent: int = 0
    codes: Counter = field(default_factory=Counter)  # ok, or the error code
    latency_ms: dict[str, list[float]] = field(default_factory=dict)  # by code
    unanswered: int = 0

    def add(self, other: Outcomes) -> None:
        self.sent += other.sent
        self.codes.update(other.codes)
        self.unanswered += other.unanswered
        for code, values in other.latency_ms.items():
            self.latency_ms.setdefault(code, []).extend(values)

    def summary(self) -> dict:
        return {"sent": self.sent, "unanswered": self.unanswered, **dict(self.codes)}


@dataclass(eq=False)
class _Client:
    n: int
    sock: zmq.Socket
    next_send: float
    sent: int = 0
    pending: dict[int, float] = field(default_factory=dict)


class RawLoad:
    """`clients` DEALER sockets, each with up to `depth` requests in flight, until stop().

    One thread drives every socket through one poller: threads per client would spend the
    CPU that the server under test needs on switching between themselves.
    """

    def __init__(
        self,
        endpoint: str,
        clients: int = 2,
        depth: int = 1,
        text: str = "load",
        rate: float | None = None,
        op: str = "embed",
        fields: dict | None = None,
    ):
        """`rate`: requests per second per client (an open loop, up to `depth` in flight);
        None: a new request as soon as one is answered (a closed loop). `op`: the op each
        request asks for, one the server's model serves; `fields`: more of each request's
        keys (`{"priority": "bulk"}`)."""
        self.endpoint, self.clients, self.depth, self.text, self.rate, self.op = (
            endpoint,
            clients,
            depth,
            text,
            rate,
            op,
        )
        self.fields = fields or {}
        self.running = True
        self.drain_until = float("inf")
        self.outcomes = Outcomes()
        self.ctx = zmq.Context()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        out, poller, now = self.outcomes, zmq.Poller(), time.monotonic()
        clients = {}
        for n in range(self.clients):
            sock = self.ctx.socket(zmq.DEALER)
            sock.linger = 0
            sock.connect(self.endpoint)
            poller.register(sock, zmq.POLLIN)
            clients[sock] = _Client(
                n, sock, now + (n / self.clients / self.rate if self.rate else 0)
            )
        while True:
            running = self.running  # read once: stop() may come between here and the poll
            now = time.monotonic()
            if running:
                for c in clients.values():
                    self._send_due(c, now)
            elif now >= self.drain_until or not any(c.pending for c in clients.values()):
                break
            wait = 0.1 if running and not self.rate else 0.005 if running else 0.05
            for sock, _ in poller.poll(wait * 1000):
                c = clients[sock]
                for _ in range(self.depth):
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    reply = protocol.unpack(frames)
                    started = c.pending.pop(reply.get("id"), None)
                    if started is None:
                        continue
                    code = reply["status"] if reply["status"] == "ok" else reply["error"]["code"]
                    out.codes[code] += 1
                    out.latency_ms.setdefault(code, []).append((time.monotonic() - started) * 1000)
        out.sent = sum(c.sent for c in clients.values())
        out.unanswered = sum(len(c.pending) for c in clients.values())
        for sock in clients:
            sock.close()

    def _send_due(self, c: _Client, now: float) -> None:
        while len(c.pending) < self.depth:
            if self.rate:
                if now < c.next_send:
                    return
                c.next_send += 1 / self.rate
            c.sent += 1
            body = {
                "id": c.sent,
                "op": self.op,
                "texts": [f"{self.text} {c.n}-{c.sent}: a few words"],
                **self.fields,
            }
            c.sock.send_multipart(protocol.pack(body))
            c.pending[c.sent] = time.monotonic()

    def stop_sending(self, drain_s: float = 15.0) -> None:
        """Send no more requests, and keep taking the replies still due for up to `drain_s`:
        what is in flight now stays in flight."""
        self.drain_until = time.monotonic() + drain_s
        self.running = False

    def stop(self, drain_s: float = 15.0) -> Outcomes:
        """Stop sending; wait up to `drain_s` for the replies still due."""
        if self.running:
            self.stop_sending(drain_s)
        self.thread.join(drain_s + 5)
        self.ctx.destroy(linger=0)
        return self.outcomes
