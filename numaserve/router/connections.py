"""What the router hears of its client connections: those that closed and those the CurveZMQ
handshake refused, from libzmq's socket monitor, each counted and logged at most once per
SUMMARY_LOG_S, beside the messages that failed in the router."""

from __future__ import annotations

import logging
import time

import zmq
from zmq.utils.monitor import parse_monitor_message

from numaserve.logs import Summary

log = logging.getLogger("numaserve.router")
# A client the CurveZMQ handshake refused; its socket's disconnect follows.
HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
SUMMARY_LOG_S = 10.0  # at most one log line per this long for a repeated event


class Connections:
    def __init__(self, clients: zmq.Socket, max_message_bytes: int):
        self.monitor = clients.get_monitor_socket(zmq.EVENT_DISCONNECTED | HANDSHAKE_FAILED)
        self.disconnects = Summary(
            log,
            "client connection(s) closed: they left, or sent a message over "
            f"server.max_message_bytes={max_message_bytes} and were dropped",
            SUMMARY_LOG_S,
        )
        self.refused = Summary(
            log,
            "client connection(s) refused in the CurveZMQ handshake: a key not in "
            "server.curve.authorized_keys_dir, a wrong server key, or plaintext",
            SUMMARY_LOG_S,
            logging.WARNING,
        )
        self.failures = Summary(
            log, "message(s) failed in the router and were dropped", SUMMARY_LOG_S, logging.ERROR
        )
        self.failed_handshakes: set[int] = set()  # their sockets' disconnects are not a leaving

    def on_events(self) -> None:
        """Count what the monitor socket has to say now."""
        closed = refused = 0
        while self.monitor.poll(0):
            event = parse_monitor_message(self.monitor.recv_multipart())
            fd = event["value"]
            if event["event"] & HANDSHAKE_FAILED:
                self.failed_handshakes.add(fd)
                refused += 1
            elif fd in self.failed_handshakes:
                self.failed_handshakes.discard(fd)
            else:
                closed += 1
        now = time.monotonic()
        self.disconnects.add(closed, now)
        self.refused.add(refused, now)

    def flush(self, now: float) -> None:
        self.disconnects.flush(now)
        self.refused.flush(now)
        self.failures.flush(now)

    def counts(self) -> dict[str, int]:
        return {
            "client_disconnects": self.disconnects.total,
            "refused_handshakes": self.refused.total,
            "internal_errors": self.failures.total,
        }

    def close(self, clients: zmq.Socket) -> None:
        clients.disable_monitor()
        self.monitor.close(linger=0)
