"""What the router hears of its client connections, from libzmq's socket monitor: those that
closed, and those the handshake refused, by what went wrong (a key not let in, plaintext
against CURVE or the reverse, a wrong server key, not ZeroMQ), each counted and logged at most
once per SUMMARY_LOG_S, beside the messages that failed in the router. A connection closed
before its handshake ended (a port check) is a closed one, not a refusal."""

from __future__ import annotations

import logging
import time

import zmq
from zmq.utils.monitor import parse_monitor_message

from numaserve.processes.logs import Summary

log = logging.getLogger("numaserve.router")
HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
SUMMARY_LOG_S = 10.0  # at most one log line per this long for a repeated event


def _refusals(curve: bool) -> dict[str, str]:
    """What a failed handshake means, by its cause, on a server with or without CURVE."""
    mismatch = (
        "a plaintext client (server.curve is set: clients need keys)"
        if curve
        else "a CurveZMQ client (server.curve is not set: clients connect without keys)"
    )
    return {
        "key": "a client key not in server.curve.authorized_keys_dir",
        "mismatch": mismatch,
        "crypto": "a client with the wrong server key",
        "protocol": "a peer that does not speak ZeroMQ's protocol (ZMTP 3)",
    }


class Connections:
    def __init__(self, clients: zmq.Socket, curve: bool):
        self.monitor = clients.get_monitor_socket(zmq.EVENT_DISCONNECTED | HANDSHAKE_FAILED)
        self.disconnects = Summary(log, "client connection(s) closed", SUMMARY_LOG_S)
        self.refused = {
            cause: Summary(
                log,
                f"client connection(s) refused in the handshake: {why}",
                SUMMARY_LOG_S,
                logging.WARNING,
            )
            for cause, why in _refusals(curve).items()
        }
        self.failures = Summary(
            log, "message(s) failed in the router and were dropped", SUMMARY_LOG_S, logging.ERROR
        )
        self.owed = 0  # failed handshakes whose disconnect has not come yet: not a leaving

    def on_events(self) -> None:
        """Count what the monitor socket has to say now."""
        now = time.monotonic()
        while self.monitor.poll(0):
            event = parse_monitor_message(self.monitor.recv_multipart())
            if event["event"] == zmq.EVENT_DISCONNECTED:
                if self.owed:
                    self.owed -= 1
                else:
                    self.disconnects.add(1, now)
                continue
            if event["event"] != zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:  # a port check, say
                self.owed += 1
                self.refused[_cause(event["event"], event["value"])].add(1, now)

    def flush(self, now: float) -> None:
        for summary in (self.disconnects, self.failures, *self.refused.values()):
            summary.flush(now)

    def counts(self) -> dict[str, int]:
        return {
            "client_disconnects": self.disconnects.total,
            "refused_handshakes": sum(s.total for s in self.refused.values()),
            "internal_errors": self.failures.total,
        }

    def close(self, clients: zmq.Socket) -> None:
        clients.disable_monitor()
        self.monitor.close(linger=0)


def _cause(event: int, value: int) -> str:
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return "key"
    if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
        return "mismatch"
    if value == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
        return "crypto"
    return "protocol"
