"""The supervisor's control socket, its end: where `numaserve status` and `numaserve stop`
ask the supervisor itself, not a router shard (the protocol: wire/control.py).

Its user and root only: the file is 0600, and each peer's credentials (SO_PEERCRED) are
checked as it connects, so that a socket file opened up by mistake does not open the server.
Never blocks the supervisor's loop: connections are non-blocking, read as bytes arrive, and
one that sends no whole request within REQUEST_S, or more than a request's bytes, is told so
and closed. The arbiter answers the requests (`Request.answer`); a `stop`'s asker stays
connected and hears `stopped` when the supervisor closes this socket.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
from dataclasses import dataclass, field
from pathlib import Path

from numaserve.wire.control import OPS, REQUEST_BYTES, decode, encode

log = logging.getLogger("numaserve.supervisor")
REQUEST_S = 5.0  # a connection's time to send its request line
SEND_S = 1.0  # the longest an answer may hold the loop (a peer that does not read)
PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass(eq=False)
class Peer:
    sock: socket.socket
    pid: int
    uid: int
    since: float
    buffer: bytes = b""
    waiting: bool = False  # asked to stop: hears `stopped` at the end


@dataclass(frozen=True)
class Request:
    op: str
    peer: Peer = field(repr=False)
    socket: ControlSocket = field(repr=False)

    def answer(self, body: dict, keep: bool = False) -> None:
        """`keep`: the peer hears the end too (a stop's asker)."""
        self.socket.send(self.peer, body)
        if keep:
            self.peer.waiting = True
        else:
            self.socket.drop(self.peer)

    def who(self) -> str:
        return f"pid {self.peer.pid}, uid {self.peer.uid}"


class ControlSocket:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.unlink(missing_ok=True)  # a dead server's of the same pid
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))  # no one else may write to it (connect) under umask 022
        os.chmod(path, 0o600)
        self.listener.listen(16)
        self.listener.setblocking(False)
        self.peers: list[Peer] = []

    def fds(self) -> list[int]:
        """What the loop waits on: a connection, or a request's bytes."""
        return [self.listener.fileno(), *(p.sock.fileno() for p in self.peers if not p.waiting)]

    def requests(self, now: float) -> list[Request]:
        """The whole requests sent since the last call; the bad ones are answered here."""
        self._accept(now)
        found = []
        for peer in [p for p in self.peers if not p.waiting]:
            op = self._read(peer, now)
            if op is not None:
                found.append(Request(op, peer, self))
        return found

    def _accept(self, now: float) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of file descriptors, say: the next turn tries again
                log.warning("control socket: %s", e, extra={"event": "control"})
                return
            sock.setblocking(False)
            pid, uid, _ = PEERCRED.unpack(
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED.size)
            )
            peer = Peer(sock, pid, uid, now)
            if uid not in (0, os.getuid()):
                log.warning(
                    "control socket: refused pid %d of uid %d", pid, uid, extra={"event": "control"}
                )
                self.refuse(peer, f"uid {uid} may not control this server")
                continue
            self.peers.append(peer)

    def _read(self, peer: Peer, now: float) -> str | None:
        """Its request's op, once the line is whole; None meanwhile, or once refused."""
        try:
            while chunk := peer.sock.recv(REQUEST_BYTES):
                peer.buffer += chunk
                if b"\n" in peer.buffer or len(peer.buffer) > REQUEST_BYTES:
                    break
            else:  # it closed its end
                self.drop(peer)
                return None
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self.drop(peer)
            return None
        line, newline, _ = peer.buffer.partition(b"\n")
        if not newline:
            if len(peer.buffer) > REQUEST_BYTES:
                self.refuse(peer, f"a request line is at most {REQUEST_BYTES} bytes")
            elif now - peer.since > REQUEST_S:
                self.refuse(peer, f"no request in {REQUEST_S:g} s")
            return None
        try:
            op = decode(line).get("op")
        except ValueError as e:
            self.refuse(peer, f"a request is one JSON object a line: {e}")
            return None
        if op not in OPS:
            self.refuse(peer, f"op: expected one of {', '.join(OPS)}, got {op!r:.40}")
            return None
        return op

    def refuse(self, peer: Peer, why: str) -> None:
        self.send(peer, {"error": why})
        self.drop(peer)

    def send(self, peer: Peer, body: dict) -> None:
        """Whole, within SEND_S; a peer that has gone or does not read loses it."""
        with contextlib.suppress(OSError):
            peer.sock.settimeout(SEND_S)
            peer.sock.sendall(encode(body))
            peer.sock.setblocking(False)

    def drop(self, peer: Peer) -> None:
        if peer in self.peers:
            self.peers.remove(peer)
        peer.sock.close()

    def close(self, farewell: dict | None = None) -> None:
        """Every connection closed, a stop's askers told `farewell` first; the socket gone."""
        for peer in list(self.peers):
            if peer.waiting and farewell is not None:
                self.send(peer, farewell)
            self.drop(peer)
        self.listener.close()
        self.path.unlink(missing_ok=True)
