"""What both clients share: endpoints, request ids, each connection's link and its watch,
and reading replies."""

from __future__ import annotations

import itertools
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import zmq

from numaserve.client.endpoints import RESOLVE_EVERY_S, Endpoints
from numaserve.client.errors import (
    ERRORS,
    MOVE_ON,
    HandshakeFailed,
    InternalError,
    NumaserveError,
    Timeout,
    TooLarge,
    Unreachable,
)
from numaserve.client.linkwatch import LinkWatch
from numaserve.client.probes import Probes
from numaserve.client.trace_context import caller_trace, propagation
from numaserve.tasks.requests import PRIORITIES, TOKEN_VECTOR_TEXTS, per_token
from numaserve.wire import protocol
from numaserve.wire.curve import ClientKeys

# A list longer than this (or larger than protocol.SMALLEST_MESSAGE_LIMIT) is split by the
# server's limits, asked once (its ping reply): no server takes fewer by default.
FEW_TEXTS = 64
REQUEST_FIELDS_BYTES = 4096  # a request's bytes besides its texts, and more
WATCH_POLL_S = 0.05  # how often a new connection's monitor is read while a reply is awaited


class Calls:
    """What both clients share: their settings, endpoints, request ids, and reading replies.

    `endpoints`: one or more servers; requests spread over all of them, and over every address
    a host name resolves to (client/endpoints.py). `timeout`: seconds to wait for a reply on
    each try; `retries`: how many more tries, each on a fresh socket to another endpoint where
    there is one; `connect_timeout`: seconds before an endpoint where nothing accepts the
    connection counts as not answering (no retries then); `max_message_bytes`: the largest
    request to send (default: the server's own limit, asked once a request is larger than any
    server's limit can be); `resolve_every`: seconds between lookups of the host names;
    `truncate`: whether the server cuts a text over the model's limit (True) or refuses it
    (False), over its model.truncate; None leaves that to the server. `truncation_direction`:
    which end a cut takes away, "right" (the default: the text's start is kept) or "left".
    `priority`: "interactive" (the server's default: someone waits for it) or "bulk" (indexing,
    backfills: served after interactive requests, and shed first under load)."""

    def __init__(
        self,
        endpoints: str | Sequence[str] = "tcp://127.0.0.1:5555",
        timeout: float = 5.0,
        retries: int = 3,
        curve: ClientKeys | None = None,
        model: str | None = None,
        connect_timeout: float = 2.0,
        max_message_bytes: int | None = None,
        resolve_every: float = RESOLVE_EVERY_S,
        truncate: bool | None = None,
        truncation_direction: str | None = None,
        priority: str | None = None,
    ):
        self.endpoints = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        if not self.endpoints or not all(isinstance(e, str) and e for e in self.endpoints):
            raise ValueError(f"endpoints: one or more endpoint strings; got {endpoints!r}")
        _check_positive("timeout", timeout)
        _check_positive("connect_timeout", connect_timeout)
        _check_positive("resolve_every", resolve_every)
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries: a whole number, 0 or more; got {retries!r}")
        if model is not None and not isinstance(model, str):
            raise TypeError(f"model: a model name (str) or None; got {type(model).__name__}")
        if truncate is not None and not isinstance(truncate, bool):
            raise TypeError(f"truncate: True, False or None; got {type(truncate).__name__}")
        if truncation_direction not in (None, *protocol.TRUNCATION_DIRECTIONS):
            raise ValueError(
                f"truncation_direction: 'right', 'left' or None; got {truncation_direction!r}"
            )
        if priority not in (None, *PRIORITIES):
            raise ValueError(f"priority: 'interactive', 'bulk' or None; got {priority!r}")
        self.priority = priority
        self.timeout, self.retries, self.curve = timeout, retries, curve
        self.connect_timeout = connect_timeout
        self.model, self.truncate = model, truncate
        self.truncation_direction = truncation_direction
        # None: ask the server (its ping reply) once a request is larger than any limit may be;
        # 0: a server that does not say
        self.max_message_bytes = max_message_bytes
        self.max_texts: int | None = None  # the server's server.max_texts, asked as above
        self._ids = itertools.count(1)
        self._prefix = f"{os.getpid()}-{id(self):x}-"
        self.pool = Endpoints(self.endpoints, resolve_every)
        self.served: Counter[str] = Counter()  # replies (of any status) by endpoint address
        self.open()
        self.probes = Probes(self.ctx, self._configure, timeout)
        # What every call needs, loaded with the client rather than by its first call, which
        # they made 10x slower than the next: numpy (a reply's vectors, 50-100 ms to import)
        # and OpenTelemetry's propagator, where installed (the caller's trace, 14 ms).
        import numpy  # noqa: F401

        propagation()

    def open(self) -> None:
        """The client's ZeroMQ context and first sockets (each client its own kind)."""
        raise NotImplementedError

    def request(self, op: str, texts=None, deadline_ms: float | None = None, **fields) -> dict:
        body = {"id": f"{self._prefix}{next(self._ids)}", "op": op}
        if texts is not None:  # status and ping are the server's
            settings = {
                "model": self.model,
                "truncate": self.truncate,
                "truncation_direction": self.truncation_direction,
                "priority": self.priority,
            }
            body |= {k: v for k, v in settings.items() if v is not None}
            body |= caller_trace()
        for key, value in {"texts": texts, "deadline_ms": deadline_ms, **fields}.items():
            if value is not None:
                body[key] = value
        return body

    def choose(self, tried: list[str]) -> str:
        """Where the next try goes (Endpoints.choose), after taking back the set-aside
        endpoints that answer again."""
        for endpoint in self.probes.answered():
            self.pool.answered(endpoint)
        self.pool.take_back()
        return self.pool.choose(tried)

    def forget(self, gone: list[str]) -> None:
        """Addresses a host name no longer resolves to: their sockets close (each client
        closes its own; the probes here)."""
        for endpoint in gone:
            self.probes.stop(endpoint)

    def failures(self) -> Failures:
        return Failures(list(self.pool.addresses))

    def attempts(self) -> int:
        return self.retries + 1

    @staticmethod
    def matches(frames: list[bytes], request_id) -> dict | None:
        """The reply to request_id, or None for a stale reply to an earlier attempt."""
        try:
            body = protocol.unpack(frames)
        except protocol.ProtocolError:
            return None
        return body if body.get("id") == request_id else None

    @staticmethod
    def result(body: dict):
        if body.get("status") == "ok":
            return body
        error = body.get("error") or {}
        raise ERRORS.get(error.get("code"), InternalError)(str(error.get("message")))

    def timed_out(self, op: str) -> Timeout:
        tried = ", ".join(self.endpoints)
        return Timeout(
            f"no reply to {op} within {self.timeout:g} s ({self.attempts()} tries on {tried}): "
            "the server took the connection but did not answer in time (busy, or stopping?)"
        )

    def socket(self, ctx, endpoint: str) -> Link:
        """A fresh DEALER to `endpoint`, speaking CURVE where this client has keys, and
        watched until its handshake passes."""
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        self._configure(sock, endpoint)
        link = Link(sock, endpoint, time.monotonic(), LinkWatch(sock))
        sock.connect(link.endpoint)
        return link

    def _configure(self, sock: zmq.Socket, endpoint: str) -> None:
        if self.curve is not None:
            self.curve.apply(sock)
        if endpoint.startswith("tcp://["):
            sock.ipv6 = True

    def no_reply(self, op: str, link: Link) -> NumaserveError:
        """Why a try on `link` ended without a reply: nothing took the connection, the
        handshake failed, or the server is there but slow."""
        return self.link_error(link, ended=True) or self.timed_out(op)

    def link_error(self, link: Link, ended: bool = False) -> NumaserveError | None:
        """Why the link's endpoint cannot answer, once its monitor shows it; None meanwhile
        (`ended`: the try's time is up). A link whose handshake passed stops being watched."""
        watch = link.watch
        if watch is None:
            return None
        watch.read()
        if watch.passed:
            link.unwatch()
            return None
        if watch.failed is not None:
            return HandshakeFailed(self._handshake_failure(link.endpoint, watch.failed))
        waited = time.monotonic() - link.opened
        if not (ended or waited >= self.connect_timeout):
            return None
        if watch.dropped:  # a CURVE server that cannot read us, or nothing behind a proxy
            return HandshakeFailed(self._handshake_failure(link.endpoint, None))
        if not watch.connected:
            return Unreachable(
                f"nothing is answering at {link.endpoint}: no connection within "
                f"{min(waited, self.connect_timeout):.1f} s (is a numaserve server running there?)"
            )
        return None

    def _handshake_failure(self, endpoint: str, event: int | None) -> str:
        """Why a handshake failed, from its HANDSHAKE_FAILED_* event (None: the connections
        were closed before it ended) and whether this client speaks CURVE."""
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return (
                f"{endpoint} refused this client's key: it is not in the server's "
                "server.curve.authorized_keys_dir"
            )
        what = (
            f"{endpoint} closed the connection before the ZeroMQ handshake ended"
            if event is None
            else f"the ZeroMQ handshake with {endpoint} failed"
        )
        if self.curve is not None:
            cause = (
                "the server key given is not this server's, or the server has no server.curve "
                "(then connect without keys)"
            )
        else:
            cause = (
                "a server with server.curve takes only clients with keys (ClientKeys; "
                "--server-key and --client-key)"
            )
        elsewhere = (
            "a proxy or port forward with no server behind it, or a server that is stopping"
            if event is None
            else "what listens there is not a numaserve server"
        )
        return f"{what}: {cause}; or {elsewhere}"

    def too_large(self, op: str, frames: list[bytes]) -> TooLarge | None:
        size = sum(len(f) for f in frames)
        if not self.max_message_bytes or size <= self.max_message_bytes:  # 0: not told
            return None
        return TooLarge(
            f"this {op} request is {size:,} bytes; the server takes at most "
            f"{self.max_message_bytes:,} (its server.max_message_bytes): send fewer or "
            "shorter texts in each request"
        )

    def learn(self, ping: dict) -> None:
        """The server's limits, from its ping reply (0: a server that does not say)."""
        self.max_message_bytes = ping.get("max_message_bytes", 0) or 0
        self.max_texts = ping.get("max_texts", 0) or 0

    def texts_unknown(self, texts: list) -> bool:
        """Whether to ask the server's limits before splitting `texts` into requests."""
        return self.max_texts is None and (
            len(texts) > FEW_TEXTS
            or (
                self.max_message_bytes is None
                and sum(map(_size, texts)) > protocol.SMALLEST_MESSAGE_LIMIT
            )
        )

    def requests(self, op: str, texts: list, fields: dict) -> list[tuple[list, dict]]:
        """`texts` as requests the server takes (`pieces`), each with its fields: a field
        that holds something for each text (late chunking's spans) holds its piece's."""
        out, start = [], 0
        for piece in self.pieces(op, texts, fields):
            out.append((piece, piece_fields(fields, start, len(piece))))
            start += len(piece)
        return out

    def pieces(self, op: str, texts: list, fields: dict) -> list[list]:
        """`texts` as requests the server takes: at most its max_texts each (64 where they
        ask for token vectors), and each within its max_message_bytes (a text over that is
        sent alone, and refused as such)."""
        most = self.max_texts or len(texts)
        if per_token(op, fields):
            most = min(most, TOKEN_VECTOR_TEXTS)
        budget = (self.max_message_bytes or 0) - REQUEST_FIELDS_BYTES
        pieces, piece, size = [], [], 0
        for text in texts:
            grown = size + _size(text)
            if piece and (len(piece) == most or (budget > 0 and grown > budget)):
                pieces.append(piece)
                piece, grown = [], _size(text)
            piece.append(text)
            size = grown
        return [*pieces, piece]

    @staticmethod
    def limit_unknown(frames: list[bytes], limit: int | None) -> bool:
        """Whether to ask the server's limit before sending these frames."""
        return limit is None and sum(len(f) for f in frames) > protocol.SMALLEST_MESSAGE_LIMIT

    def outcome(self, reply: dict | NumaserveError, link: Link, failures: Failures):
        """What a try came to: the reply, or the error to try again after; raised where no
        other try can help (an error reply, or every endpoint found unreachable). An endpoint
        that did not answer is set aside until it does."""
        if isinstance(reply, NumaserveError):
            if self.pool.set_aside(link.endpoint):
                self.probes.start(link.endpoint)
            if isinstance(reply, (Unreachable, HandshakeFailed)):
                failures.add(link.endpoint, reply)
            return reply
        self.pool.succeeded(link.endpoint)
        self.served[link.endpoint] += 1
        try:
            return self.result(reply)
        except NumaserveError as e:
            if isinstance(e, MOVE_ON) and len(self.pool.addresses) > 1:
                return e
            raise


def _size(text) -> int:
    """A text's (or a pair's) bytes in a request, with msgpack's framing of each string."""
    parts = text if isinstance(text, (tuple, list)) else (text,)
    return sum(len(p.encode()) + 5 for p in parts) + 1


def joined(replies: list[dict]) -> dict:
    """The replies to a list's pieces as one reply: every result, in the list's order."""
    return {**replies[0], "results": [r for reply in replies for r in reply["results"]]}


class Failures:
    """The endpoints one call found unreachable or refusing: once that is all of them, the
    call fails at once, with what each said, instead of retrying into the same wall."""

    def __init__(self, endpoints: list[str]):
        self.endpoints = set(endpoints)
        self.errors: dict[str, NumaserveError] = {}

    def add(self, endpoint: str, error: NumaserveError) -> None:
        self.errors[endpoint] = error
        if set(self.errors) >= self.endpoints:
            errors = list(self.errors.values())
            if all(isinstance(e, Unreachable) for e in errors) and len(errors) > 1:
                where = ", ".join(self.errors)
                raise Unreachable(f"nothing is answering at {where}: no connection to any")
            if len(errors) == 1:
                raise errors[0]
            raise type(errors[-1])("; ".join(e.message for e in errors))


@dataclass
class Link:
    """A client socket, the endpoint it connects to, and its monitor until the handshake."""

    sock: zmq.Socket
    endpoint: str
    opened: float
    watch: LinkWatch | None

    def unwatch(self) -> None:
        if self.watch is not None:
            self.watch.close()
            self.watch = None

    def close(self) -> None:
        self.unwatch()
        self.sock.close(linger=0)


def _check_positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name}: a number of seconds above 0; got {value!r}")


def piece_fields(fields: dict, start: int, count: int) -> dict:
    """The fields of a request for texts `start` to `start + count` of a call's."""
    chunking = fields.get("late_chunking")
    if not isinstance(chunking, dict) or "spans" not in chunking:
        return fields
    return {**fields, "late_chunking": {"spans": chunking["spans"][start : start + count]}}
