"""Whether a set-aside server answers again: for each, a socket of its own sends `ping` and is
read without waiting whenever the client chooses where to send, so that no request waits on a
server that may still be down (the zguide's Paranoid Pirate, with pings for heartbeats).

A ping unanswered for `timeout` seconds is sent again on a fresh socket (Lazy Pirate): libzmq
keeps reconnecting meanwhile, so a server that comes back answers the first ping it gets.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from numaserve.wire import protocol


@dataclass
class Probe:
    sock: zmq.Socket
    request_id: str
    sent: float


class Probes:
    """The probe sockets, by endpoint. `configure`: what each client socket gets (CURVE keys)
    before it connects; sockets are plain (non-asyncio) ones on the client's libzmq context,
    never blocking, so that both clients use them alike."""

    def __init__(
        self, context: zmq.Context, configure: Callable[[zmq.Socket, str], None], timeout: float
    ):
        self.ctx = zmq.Context.shadow(context.underlying)
        self.configure, self.timeout = configure, timeout
        self.probes: dict[str, Probe] = {}
        self._ids = itertools.count(1)
        self._prefix = f"{os.getpid()}-probe-{id(self):x}-"

    def start(self, endpoint: str) -> None:
        self.stop(endpoint)
        sock = self.ctx.socket(zmq.DEALER)
        sock.linger = 0
        self.configure(sock, endpoint)
        sock.connect(endpoint)
        request_id = f"{self._prefix}{next(self._ids)}"
        # Queued until the connection is made (a DEALER connecting, without ZMQ_IMMEDIATE).
        sock.send_multipart(protocol.pack({"id": request_id, "op": "ping"}), zmq.NOBLOCK)
        self.probes[endpoint] = Probe(sock, request_id, time.monotonic())

    def answered(self) -> list[str]:
        """The endpoints whose ping came back since the last look; their probes end."""
        back = [endpoint for endpoint, probe in self.probes.items() if _pong(probe)]
        for endpoint in back:
            self.stop(endpoint)
        for endpoint, probe in list(self.probes.items()):
            if time.monotonic() - probe.sent >= self.timeout:
                self.start(endpoint)
        return back

    def stop(self, endpoint: str) -> None:
        probe = self.probes.pop(endpoint, None)
        if probe is not None:
            probe.sock.close(linger=0)

    def close(self) -> None:
        for endpoint in list(self.probes):
            self.stop(endpoint)


def _pong(probe: Probe) -> bool:
    """Whether the probe's ping came back (other messages are read and dropped)."""
    while probe.sock.poll(0):
        try:
            body = protocol.unpack(probe.sock.recv_multipart(zmq.NOBLOCK))
        except (protocol.ProtocolError, zmq.Again):
            continue
        if body.get("id") == probe.request_id and body.get("status") == "ok":
            return True
    return False
