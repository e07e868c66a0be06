"""What libzmq's socket monitor says of a client socket's way to its endpoint, until the ZMTP
handshake passes: whether anything accepted the connection, and whether the handshake failed.

It lets a client say "nothing is answering at ENDPOINT" within a second or two, instead of
after every retry, and name a refused handshake as one, rather than guess at both after a
timeout. Once the handshake has passed the watch is closed, so requests pay nothing for it.
"""

from __future__ import annotations

import itertools
import os

import zmq
from zmq.utils.monitor import parse_monitor_message

HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
WATCHED = zmq.EVENT_CONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | HANDSHAKE_FAILED
_names = itertools.count()


class LinkWatch:
    """The monitor of one client socket. Create it before the socket connects."""

    def __init__(self, sock: zmq.Socket):
        self.sock = sock
        address = f"inproc://numaserve-linkwatch-{os.getpid()}-{next(_names)}"
        sock.monitor(address, WATCHED)
        # A plain socket on the same libzmq context, so that an asyncio client reads it too.
        self.monitor = zmq.Context.shadow(sock.context.underlying).socket(zmq.PAIR)
        self.monitor.linger = 0
        self.monitor.connect(address)
        self.connected = False  # something accepted the connection
        self.passed = False  # the ZMTP handshake (and CURVE's, where used) succeeded
        # The HANDSHAKE_FAILED_* event where a peer refused the handshake (AUTH, PROTOCOL)
        self.failed: int | None = None
        # Connections closed before the handshake ended: a proxy or port forward with nothing
        # behind it, or a server stopping. libzmq connects again by itself.
        self.dropped = 0

    def read(self) -> None:
        """Take in the events the monitor has now."""
        while self.monitor.poll(0):
            event = parse_monitor_message(self.monitor.recv_multipart())["event"]
            if event == zmq.EVENT_CONNECTED:
                self.connected = True
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.connected = self.passed = True
            elif event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                self.dropped += 1
            elif event & HANDSHAKE_FAILED:
                self.connected, self.failed = True, event

    def close(self) -> None:
        """Stop watching; call it before the socket closes."""
        self.sock.disable_monitor()
        self.monitor.close(linger=0)
