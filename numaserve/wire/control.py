"""The supervisor's control socket, the CLI's end: `numaserve status` and `numaserve stop` on
the server's own host, off the data path (docs/protocol.md, "The control socket").

A Unix stream socket beside the server's entry in the host's ledger (host/ledger.py records
its path), for the server's user and root only: the file is 0600, and the supervisor checks
each peer's credentials too. One JSON object a line, each way. The CLI sends
`{"op": "status"}` or `{"op": "stop"}`; the supervisor answers `{"status": REPORT}` (the whole
server's, as the status op gives it), or `{"stopping": PID}` and, once every process has
stopped, `{"stopped": EXIT_CODE}`; or `{"error": MESSAGE}`.
"""

from __future__ import annotations

import errno
import json
import socket
import time

OPS = ("status", "stop")
REQUEST_BYTES = 4096  # a request line is a few bytes; more is not a request
ANSWER_BYTES = 64 << 20  # a whole server's status: a few KB an instance


class ControlError(Exception):
    """The control socket could not be asked, or its answer read; the message says why."""


def encode(message: dict) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> dict:
    """One line's object; ValueError for anything else."""
    message = json.loads(line)
    if not isinstance(message, dict):
        raise ValueError(f"expected a JSON object, got {type(message).__name__}")
    return message


class ControlConnection:
    """One conversation with a supervisor: a request, then its answers, line by line."""

    def __init__(self, path: str, timeout: float) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.buffer = b""
        try:
            self.sock.connect(path)
        except OSError as e:
            self.sock.close()
            raise ControlError(_why_not(path, e)) from None

    def ask(self, op: str) -> dict:
        """The first answer to `op`; ControlError for an error answer, or none."""
        try:
            self.sock.sendall(encode({"op": op}))
        except OSError as e:
            raise ControlError(f"the control socket {self.path}: {e.strerror or e}") from None
        answer = self.next(self.sock.gettimeout())
        if answer is None:
            raise ControlError(f"the supervisor closed its control socket ({self.path})")
        if "error" in answer:
            raise ControlError(str(answer["error"]))
        return answer

    def next(self, timeout: float | None) -> dict | None:
        """The next answer, within `timeout` seconds; None once the supervisor has closed the
        connection (it exited). ControlError when none came in time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buffer:
            if len(self.buffer) > ANSWER_BYTES:
                raise ControlError(f"an answer of over {ANSWER_BYTES} bytes from {self.path}")
            if deadline is not None:
                self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
            try:
                chunk = self.sock.recv(1 << 16)
            except TimeoutError:
                raise ControlError(f"no answer in {timeout:g} s from {self.path}") from None
            except OSError as e:
                raise ControlError(f"the control socket {self.path}: {e.strerror or e}") from None
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            return decode(line)
        except ValueError as e:
            raise ControlError(f"an answer that is not JSON from {self.path}: {e}") from None

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> ControlConnection:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _why_not(path: str, error: OSError) -> str:
    if error.errno == errno.EACCES:
        return f"not allowed to use the server's control socket {path}: run as its user or root"
    if error.errno in (errno.ENOENT, errno.ECONNREFUSED):
        return f"no supervisor listens on {path} any more (it has stopped)"
    return f"the control socket {path}: {error.strerror or error}"
