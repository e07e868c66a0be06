"""One client's HTTP/1.1 connection: an asyncio protocol over httptools' parser.

The cheapest of the servers measured (docs/benchmarks.md, "Which HTTP server library"): 5 us a
request against 19-44 us for uvicorn, granian and aiohttp. What a server library would
otherwise give is here, bounded: keep-alive and pipelining (answered in order), a head of at
most MAX_HEAD_BYTES (431), a body over the limit refused by its Content-Length before it is
read (413), `Expect: 100-continue`, and a whole request read within server.http_read_timeout_s (408):
a slow client holds nothing for ever. Malformed HTTP is 400 and the connection is closed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field

import httptools

from numaserve.front.core import Exchange

log = logging.getLogger("numaserve.http")

MAX_HEAD_BYTES = 64 << 10  # the request line and headers together
MAX_HEADERS = 100
IDLE_TIMEOUT_S = 75.0  # a kept-alive connection with no request in flight
SWEEP_S = 0.1  # how often the front looks for connections past their deadline
MAX_PIPELINED = 32  # requests read ahead of their answers; reading pauses past this

REASONS = {
    100: "Continue",
    200: "OK",
    204: "No Content",
    308: "Permanent Redirect",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Payload Too Large",
    415: "Unsupported Media Type",
    422: "Unprocessable Entity",
    424: "Failed Dependency",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


@dataclass
class Request(Exchange):
    """An HTTP request: what the front's core reads of any call (an `Exchange`), and its
    method, path, headers and body."""

    method: str
    path: str
    query: str
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    body: bytes = b""
    connection: Connection | None = field(default=None, repr=False)
    json: dict | None = field(default=None, repr=False)  # the body, once a route has read it

    @property
    def gone(self) -> bool:
        """The client hung up: its answer has nowhere to go."""
        return self.connection is None or self.connection.closed

    def waiting_on(self, future) -> None:
        """A connection lost cancels what its route awaits (the shards drop it)."""
        if self.connection is not None:
            self.connection.waiting = future


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()

    def encode(self, keep_alive: bool) -> bytes:
        head = [f"HTTP/1.1 {self.status} {REASONS.get(self.status, 'Unknown')}"]
        if self.body or self.status not in (204,):
            head.append(f"content-type: {self.content_type}")
        head.append(f"content-length: {len(self.body)}")
        head.extend(f"{name}: {value}" for name, value in self.headers)
        if not keep_alive:
            head.append("connection: close")
        return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + self.body


Handler = Callable[[Request], Awaitable[Response]]
# An answer made here, before any route sees the request (413, 431, 408, malformed HTTP):
# (status, why, the request's path where it was read, else "").
Refusal = Callable[[int, str, str], Response]


class Connection(asyncio.Protocol):
    def __init__(
        self,
        handle: Handler,
        refuse: Refusal,
        limits: tuple[int, float],
        draining: Callable,
        live: set,
    ):
        """`limits`: the most bytes of a body, and seconds to read a request in."""
        self.handle, self.refuse = handle, refuse
        self.max_body, self.read_timeout = limits
        self.draining = draining  # () -> bool: answer what was asked, keep nothing alive
        self.live = live  # the server's open connections, this one among them while open
        self.waiting: asyncio.Future | None = None  # the shards' answer a route awaits
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.closed = False
        self.queue: deque[tuple[Request, bool]] = deque()  # read, not yet answered
        self.busy = False
        self.head_bytes = 0
        self.request: Request | None = None  # the one being read
        self.url = b""
        self.header_name = b""
        self.body: list[bytes] = []
        self.body_bytes = 0
        # When the request being read, or the idle wait, runs out (the front's sweep reads it:
        # a timer a request cost the front 3% of its CPU); None while a route runs.
        self.deadline: float | None = None

    # -- asyncio ---------------------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.live.add(self)
        self.deadline = time.monotonic() + IDLE_TIMEOUT_S

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.live.discard(self)
        if self.waiting is not None and not self.waiting.done():
            self.waiting.cancel()  # the shards are told to drop it (upstream.py)

    def eof_received(self) -> bool:
        """The client closed its side: as nginx does, a client gone. What it asked and was not
        yet answered is cancelled (connection_lost); half a request is answered 400."""
        if self.request is not None:
            self._fail(400, "the connection ended in the middle of a request")
        else:
            self._close()
        return True

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(400, "protocol upgrades are not served here")
        except httptools.HttpParserError as e:
            # httptools wraps what a callback raised: a refusal of ours is its cause
            refused = e.__context__ if isinstance(e.__context__, _Refused) else None
            if refused is not None:
                self._fail(refused.status, refused.message)
            else:
                self._fail(400, f"malformed HTTP request: {e}")
        except _Refused as refused:
            self._fail(refused.status, refused.message)

    # -- httptools' callbacks --------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.url, self.body, self.body_bytes, self.head_bytes = b"", [], 0, 0
        self.request = Request("", "", "", {})
        self.deadline = time.monotonic() + self.read_timeout

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)
        headers = self.request.headers
        if len(headers) >= MAX_HEADERS:
            raise _Refused(431, f"more than {MAX_HEADERS} headers")
        headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        request = self.request
        request.method = self.parser.get_method().decode("latin-1")
        try:
            url = httptools.parse_url(self.url)
        except httptools.HttpParserInvalidURLError:
            raise _Refused(400, "malformed request target") from None
        request.path = (url.path or b"/").decode("latin-1")
        request.query = (url.query or b"").decode("latin-1")
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            raise _Refused(
                413,
                f"the body is {length} bytes; this server takes at most {self.max_body} "
                "(server.http_max_body_bytes)",
            )
        if request.headers.get("expect", "").lower() == "100-continue":
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, chunk: bytes) -> None:
        self.body_bytes += len(chunk)
        if self.body_bytes > self.max_body:  # chunked: no length to refuse it by up front
            raise _Refused(
                413,
                f"the body is over this server's {self.max_body} bytes "
                "(server.http_max_body_bytes)",
            )
        self.body.append(chunk)

    def on_message_complete(self) -> None:
        request, self.request = self.request, None
        request.body = b"".join(self.body)
        request.connection = self
        self.queue.append((request, self.parser.should_keep_alive()))
        if len(self.queue) > MAX_PIPELINED:
            self.transport.pause_reading()
        self._next()

    # -- answering, in order ---------------------------------------------------------------

    def _next(self) -> None:
        if self.busy or not self.queue or self.closed:
            if not self.queue and not self.busy and not self.closed:
                wait = IDLE_TIMEOUT_S if self.request is None else self.read_timeout
                self.deadline = time.monotonic() + wait
            return
        self.busy = True
        self.deadline = None
        request, keep_alive = self.queue.popleft()
        self._step(self.handle(request), keep_alive)

    def _step(self, route: Coroutine, keep_alive: bool) -> None:
        """Run the route's coroutine up to the future it awaits (the shards' answer), and on
        from there once that is done: what an asyncio Task would do, without a Task a request
        (10% of the front's CPU), as Python 3.12's eager tasks run a coroutine at once."""
        try:
            awaited = route.send(None)
        except StopIteration as done:
            self._answered(done.value, keep_alive)
        except asyncio.CancelledError:  # its client hung up
            self.busy = False
        except Exception:
            log.error("a route failed", exc_info=True)
            self._answered(self.refuse(500, "internal error; the server logged it", ""), False)
        else:
            if awaited is None:  # a bare yield (asyncio.sleep(0)): go on at the next turn
                asyncio.get_running_loop().call_soon(self._step, route, keep_alive)
            else:
                awaited.add_done_callback(lambda _: self._step(route, keep_alive))

    def _answered(self, response: Response, keep_alive: bool) -> None:
        self.busy = False
        if self.closed:
            return
        keep_alive = keep_alive and not self.draining()
        self.transport.write(response.encode(keep_alive))
        if not keep_alive:
            self._close()
            return
        if len(self.queue) <= MAX_PIPELINED // 2:
            self.transport.resume_reading()
        self._next()

    def _fail(self, status: int, message: str) -> None:
        """A request that cannot be read on: answered at once, and the connection closed (the
        rest of what it sent cannot be told apart from the next request)."""
        if self.closed:
            return
        path = self.request.path if self.request is not None else ""
        self.transport.write(self.refuse(status, message, path).encode(keep_alive=False))
        self._close()

    def _close(self) -> None:
        self.closed = True
        self.deadline = None
        self.transport.close()

    def close_if_idle(self) -> None:
        """Drain: a connection with nothing asked of it closes now."""
        if not self.busy and not self.queue and self.request is None and not self.closed:
            self._close()

    def expire(self, now: float) -> None:
        """The front's sweep: half a request read for too long is 408; an idle connection
        past its keep-alive is closed."""
        if self.deadline is None or now < self.deadline or self.busy or self.closed:
            return
        if self.request is not None:
            self._fail(408, f"the request was not read whole within {self.read_timeout:g} s")
        else:
            self._close()

    def _count_head(self, n: int) -> None:
        self.head_bytes += n
        if self.head_bytes > MAX_HEAD_BYTES:
            raise _Refused(431, f"the request line and headers are over {MAX_HEAD_BYTES} bytes")


def sweep(live: set[Connection]) -> None:
    """Every SWEEP_S, each open connection past its deadline: 408, or an idle one closed."""
    now = time.monotonic()
    for connection in list(live):
        connection.expire(now)
    asyncio.get_running_loop().call_later(SWEEP_S, sweep, live)


class _Refused(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message
