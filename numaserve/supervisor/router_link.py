"""The supervisor's line to each router shard, over the shard's private worker socket.

The supervisor sends its slot table (`numaserve status` shows it); a shard answers with its
status, whose `routed_pids` say which workers it hears from: that is how the supervisor knows an
instance is READY, or has gone silent.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import zmq

from numaserve import protocol
from numaserve.supervisor.children import Child


class RouterLink:
    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.connect(endpoint)

    def send(self, message: dict) -> None:
        """Never blocks: with the router down, the message is dropped (a newer one follows)."""
        with contextlib.suppress(zmq.Again):
            self.sock.send_multipart(protocol.pack(message), zmq.NOBLOCK)

    def receive(self) -> list[dict]:
        """The router's answers waiting now; unparseable ones are skipped."""
        answers = []
        while self.sock.poll(0):
            with contextlib.suppress(protocol.ProtocolError):
                answers.append(protocol.unpack(self.sock.recv_multipart()))
        return answers

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


@dataclass(eq=False)
class ShardView:
    """What the supervisor knows of one router shard."""

    child: Child
    link: RouterLink
    status: dict | None = None  # its latest answer
    heard_at: float = 0.0
    acked: int = 0  # the latest slot table it has answered
    seq_floor: int = 0  # answers to tables sent before its (re)start are stale

    def routed_pids(self, now: float, fresh_s: float) -> set[int] | None:
        """The workers it hears from; None with no fresh word from it (judge nobody)."""
        if self.status is None or now - self.heard_at > fresh_s:
            return None
        return set(self.status.get("routed_pids", ()))
