"""The errors a call can raise: one class per protocol error code, and the client's own."""

from __future__ import annotations

from numaserve.wire.protocol import ErrorCode


class NumaserveError(Exception):
    """An error reply from the server; `code` is the protocol's error code."""

    code = "error"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class BadRequest(NumaserveError):
    code = ErrorCode.BAD_REQUEST.value


class TooLong(NumaserveError):
    code = ErrorCode.TOO_LONG.value


class Overloaded(NumaserveError):
    code = ErrorCode.OVERLOADED.value


class DeadlineExceeded(NumaserveError):
    code = ErrorCode.DEADLINE_EXCEEDED.value


class NoInstance(NumaserveError):
    code = ErrorCode.NO_INSTANCE.value


class InternalError(NumaserveError):
    code = ErrorCode.INTERNAL.value


class Timeout(NumaserveError):
    """No reply after every retry on every endpoint."""

    code = "timeout"


class Unreachable(Timeout):
    """Nothing accepted a connection at any endpoint within `connect_timeout`: no server is
    listening there (a Timeout, so that code catching those catches this too)."""

    code = "unreachable"


class HandshakeFailed(Timeout):
    """Something is listening, but the ZeroMQ handshake failed: a CurveZMQ server and a
    plaintext client, keys the server does not accept, or not a numaserve server."""

    code = "handshake_failed"


class TooLarge(BadRequest):
    """The request is larger than the server takes (its server.max_message_bytes): the client
    refuses it before sending, since the server would drop the connection without a reply."""

    code = "too_large"


ERRORS = {
    cls.code: cls
    for cls in (BadRequest, TooLong, Overloaded, DeadlineExceeded, NoInstance, InternalError)
}
MOVE_ON = (Overloaded, NoInstance)  # worth trying on another endpoint
WATCH_POLL_S = 0.05  # how often a new connection's monitor is read while a reply is awaited
