"""The supervisor's line to the router, over the router's private worker socket.

The supervisor sends its slot table (`numaserve status` shows it); the router answers with
its status, whose `routed_pids` say which workers it hears from: that is how the supervisor
knows an instance is READY, or has gone silent.
"""

from __future__ import annotations

import contextlib

import zmq

from numaserve import protocol


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
