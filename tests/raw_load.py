"""Load from raw DEALER clients that never retry, so that every lost request shows.

Each client keeps `depth` requests in flight (pipelined) with distinct texts, and records
for each request how it ended: `ok`, an error code, or nothing at all. The chaos suite
(tests/test_chaos.py) and the overload benchmark (benchmarks/overload.py) both use it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import zmq

from numaserve import protocol


@dataclass
class Outcomes:
    sent: int = 0
    codes: Counter = field(default_factory=Counter)  # ok, or the error code
    latency_ms: dict[str, list[float]] = field(default_factory=dict)  # by code
    unanswered: int = 0

    @property
    def answered(self) -> int:
        return sum(self.codes.values())

    def add(self, other: Outcomes) -> None:
        self.sent += other.sent
        self.codes.update(other.codes)
        self.unanswered += other.unanswered
        for code, values in other.latency_ms.items():
            self.latency_ms.setdefault(code, []).extend(values)

    def summary(self) -> dict:
        return {"sent": self.sent, "unanswered": self.unanswered, **dict(self.codes)}


class RawLoad:
    """`clients` threads, each a DEALER with `depth` requests in flight, until stop()."""

    def __init__(self, endpoint: str, clients: int = 2, depth: int = 1, text: str = "load"):
        self.endpoint, self.depth, self.text = endpoint, depth, text
        self.running = True
        self.results = [Outcomes() for _ in range(clients)]
        self.ctx = zmq.Context()
        self.threads = [
            threading.Thread(target=self._client, args=(n,), daemon=True) for n in range(clients)
        ]
        for t in self.threads:
            t.start()

    def _client(self, n: int) -> None:
        out = self.results[n]
        sock = self.ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(self.endpoint)
        pending: dict[int, float] = {}
        i = 0
        while self.running or pending:
            while self.running and len(pending) < self.depth:
                i += 1
                body = {"id": i, "op": "embed", "texts": [f"{self.text} {n}-{i}: a few words"]}
                sock.send_multipart(protocol.pack(body))
                pending[i] = time.monotonic()
                out.sent += 1
            if not sock.poll(100 if self.running else self.drain_left()):
                if not self.running:
                    break  # the rest never came
                continue
            reply = protocol.unpack(sock.recv_multipart())
            started = pending.pop(reply.get("id"), None)
            if started is None:
                continue
            code = reply["status"] if reply["status"] == "ok" else reply["error"]["code"]
            out.codes[code] += 1
            out.latency_ms.setdefault(code, []).append((time.monotonic() - started) * 1000)
        out.unanswered = len(pending)
        sock.close()

    def drain_left(self) -> int:
        return max(0, int((self.drain_until - time.monotonic()) * 1000))

    def stop(self, drain_s: float = 15.0) -> Outcomes:
        """Stop sending; wait up to `drain_s` for the replies still due."""
        self.drain_until = time.monotonic() + drain_s
        self.running = False
        for t in self.threads:
            t.join(drain_s + 5)
        self.ctx.destroy(linger=0)
        total = Outcomes()
        for out in self.results:
            total.add(out)
        return total
