"""Client library: `Client` (blocking) and `AsyncClient` (asyncio) for a numaserve server.

Each request goes out on a DEALER socket and waits up to `timeout` for the reply with its id.
On a timeout the socket is closed and a fresh one, to the next endpoint, sends the request
again (the zguide's Lazy Pirate), up to `retries` times: requests are idempotent. `overloaded`
and `no_instance` replies also move on to the next endpoint when there is more than one.

    with Client(["tcp://10.0.0.1:5555", "tcp://10.0.0.2:5555"], timeout=1.0) as client:
        vectors = [e.vector for e in client.embed(["first text", "second text"])]

A classify model that reads pairs (NLI) takes each pair as a tuple: `classify(("premise",
"hypothesis"))` is one Classification, `classify([("a", "b"), ("c", "d")])` a list. A
cross-encoder scores documents for a query: `rerank("query", ["doc 1", "doc 2"], top_k=1)`. A
token classifier finds entities: `ner("Ada Lovelace lived in London")`.

A server with `server.curve` admits only clients holding an authorised key pair:

    keys = ClientKeys.load(server_key="server.key", client_key="billing.key_secret")
    client = Client("tcp://10.0.0.1:5555", curve=keys)

A client for one model of a server that names its models asks for it by name:
`Client("tcp://10.0.0.1:5555", model="toxicity")` (without: the server's only model).

A Client is not thread-safe: use one per thread. An AsyncClient serves many coroutines at once.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Sequence

import zmq
import zmq.asyncio

from numaserve import protocol
from numaserve.curve import ClientKeys  # re-exported: `from numaserve.client import ClientKeys`
from numaserve.protocol import ErrorCode
from numaserve.tasks import TASKS

# The results each task returns, importable from here: `from numaserve.client import Embedding`.
from numaserve.tasks.classify import Classification as Classification
from numaserve.tasks.embed import Embedding as Embedding
from numaserve.tasks.ner import DEFAULT_AGGREGATION
from numaserve.tasks.ner import Entities as Entities
from numaserve.tasks.ner import Entity as Entity
from numaserve.tasks.rerank import Ranked


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


ERRORS = {
    cls.code: cls
    for cls in (BadRequest, TooLong, Overloaded, DeadlineExceeded, NoInstance, InternalError)
}
MOVE_ON = (Overloaded, NoInstance)  # worth trying on another endpoint


Texts = str | tuple[str, str] | Sequence[str | tuple[str, str]]  # one text or pair, or a list


class _Calls:
    """What both clients share: endpoints, request ids, and reading replies."""

    def __init__(
        self,
        endpoints: str | Sequence[str],
        timeout: float,
        retries: int,
        curve: ClientKeys | None,
        model: str | None,
    ):
        self.endpoints = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        if not self.endpoints:
            raise ValueError("at least one endpoint is needed")
        self.timeout, self.retries, self.curve = timeout, retries, curve
        self.model = model
        self._ids = itertools.count(1)
        self._prefix = f"{os.getpid()}-{id(self):x}-"
        self._endpoint = 0

    def request(self, op: str, texts=None, deadline_ms: float | None = None, **fields) -> dict:
        body = {"id": f"{self._prefix}{next(self._ids)}", "op": op}
        if self.model is not None and texts is not None:  # status and ping are the server's
            body["model"] = self.model
        for key, value in {"texts": texts, "deadline_ms": deadline_ms, **fields}.items():
            if value is not None:
                body[key] = value
        return body

    def next_endpoint(self) -> str:
        endpoint = self.endpoints[self._endpoint % len(self.endpoints)]
        self._endpoint += 1
        return endpoint

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
        hint = (
            "; with CURVE, a server that does not know this client's key, or a wrong server "
            "key, looks like this too"
            if self.curve
            else "; a server with server.curve answers no plaintext client"
        )
        return Timeout(
            f"no reply to {op} within {self.timeout} s ({self.attempts()} tries on {tried}){hint}"
        )

    def socket(self, ctx):
        """A fresh DEALER to the next endpoint, speaking CURVE where this client has keys."""
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        if self.curve is not None:
            self.curve.apply(sock)
        sock.connect(self.next_endpoint())
        return sock

    def should_move_on(self, error: NumaserveError) -> bool:
        return isinstance(error, MOVE_ON) and len(self.endpoints) > 1


def _batch(texts: Texts) -> tuple[list, bool]:
    """(the texts as a list, whether one text or pair was given rather than a list)."""
    single = isinstance(texts, (str, tuple))
    return ([texts] if single else list(texts)), single


def _results(op: str, body: dict, single: bool):
    items = [TASKS[op].from_wire(result) for result in body["results"]]
    return items[0] if single else items


class Client(_Calls):
    def __init__(
        self,
        endpoints: str | Sequence[str] = "tcp://127.0.0.1:5555",
        timeout: float = 5.0,
        retries: int = 3,
        curve: ClientKeys | None = None,
        model: str | None = None,
    ):
        super().__init__(endpoints, timeout, retries, curve, model)
        self.ctx = zmq.Context.instance()
        self.sock = self.socket(self.ctx)

    def embed(self, texts: str | Sequence[str], deadline_ms: float | None = None):
        """One Embedding for a string, a list of them for a list of strings."""
        batch, single = _batch(texts)
        return _results("embed", self.call("embed", batch, deadline_ms), single)

    def classify(self, texts: Texts, deadline_ms: float | None = None):
        """One Classification for a string or a pair (a tuple of two strings), a list of them
        for a list."""
        batch, single = _batch(texts)
        return _results("classify", self.call("classify", batch, deadline_ms), single)

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        top_k: int | None = None,
        deadline_ms: float | None = None,
    ) -> list[Ranked]:
        """Each document's score for `query`, in order; with `top_k`, the best k, best first."""
        body = self.call("rerank", list(documents), deadline_ms, query=query, top_k=top_k)
        return _results("rerank", body, False)

    def ner(
        self,
        texts: str | Sequence[str],
        aggregation: str = DEFAULT_AGGREGATION,
        deadline_ms: float | None = None,
    ):
        """The named entities of a string (an Entities), or of each of a list. `aggregation`:
        none, simple, first, average or max, as transformers' pipeline has them."""
        batch, single = _batch(texts)
        body = self.call("ner", batch, deadline_ms, aggregation=aggregation)
        return _results("ner", body, single)

    def status(self) -> dict:
        return self.call("status")["server"]

    def ping(self) -> float:
        """Seconds for a round trip to the router."""
        start = time.perf_counter()
        self.call("ping")
        return time.perf_counter() - start

    def call(self, op: str, texts=None, deadline_ms: float | None = None, **fields) -> dict:
        body = self.request(op, texts, deadline_ms, **fields)
        frames = protocol.pack(body)
        error: NumaserveError = Timeout(f"no reply to {op}")
        for attempt in range(self.attempts()):
            if attempt:
                self._fresh_socket()
            self.sock.send_multipart(frames)
            reply, deadline = None, time.monotonic() + self.timeout
            while reply is None and (left := deadline - time.monotonic()) > 0:
                if self.sock.poll(left * 1000):
                    reply = self.matches(self.sock.recv_multipart(), body["id"])
            if reply is None:
                error = self.timed_out(op)
                continue
            try:
                return self.result(reply)
            except NumaserveError as e:
                if not self.should_move_on(e):
                    raise
                error = e
        raise error

    def _fresh_socket(self) -> None:
        self.sock.close(linger=0)
        self.sock = self.socket(self.ctx)

    def close(self) -> None:
        self.sock.close(linger=0)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncClient(_Calls):
    """The asyncio twin of Client: each call borrows a socket of its own from a small pool."""

    def __init__(
        self,
        endpoints: str | Sequence[str] = "tcp://127.0.0.1:5555",
        timeout: float = 5.0,
        retries: int = 3,
        curve: ClientKeys | None = None,
        model: str | None = None,
    ):
        super().__init__(endpoints, timeout, retries, curve, model)
        self.ctx = zmq.asyncio.Context.instance()
        self._idle: list[zmq.asyncio.Socket] = []

    async def embed(self, texts: str | Sequence[str], deadline_ms: float | None = None):
        batch, single = _batch(texts)
        return _results("embed", await self.call("embed", batch, deadline_ms), single)

    async def classify(self, texts: Texts, deadline_ms: float | None = None):
        batch, single = _batch(texts)
        return _results("classify", await self.call("classify", batch, deadline_ms), single)

    async def rerank(
        self,
        query: str,
        documents: Sequence[str],
        top_k: int | None = None,
        deadline_ms: float | None = None,
    ) -> list[Ranked]:
        body = await self.call("rerank", list(documents), deadline_ms, query=query, top_k=top_k)
        return _results("rerank", body, False)

    async def ner(
        self,
        texts: str | Sequence[str],
        aggregation: str = DEFAULT_AGGREGATION,
        deadline_ms: float | None = None,
    ):
        batch, single = _batch(texts)
        body = await self.call("ner", batch, deadline_ms, aggregation=aggregation)
        return _results("ner", body, single)

    async def status(self) -> dict:
        return (await self.call("status"))["server"]

    async def ping(self) -> float:
        start = time.perf_counter()
        await self.call("ping")
        return time.perf_counter() - start

    async def call(self, op: str, texts=None, deadline_ms: float | None = None, **fields) -> dict:
        body = self.request(op, texts, deadline_ms, **fields)
        frames = protocol.pack(body)
        error: NumaserveError = Timeout(f"no reply to {op}")
        for attempt in range(self.attempts()):
            # A socket that timed out is closed; a fresh one goes to the next endpoint.
            sock = self._idle.pop() if self._idle and not attempt else self.socket(self.ctx)
            await sock.send_multipart(frames)
            try:
                reply = await asyncio.wait_for(self._reply_to(sock, body["id"]), self.timeout)
            except asyncio.TimeoutError:
                sock.close(linger=0)
                error = self.timed_out(op)
                continue
            self._idle.append(sock)
            try:
                return self.result(reply)
            except NumaserveError as e:
                if not self.should_move_on(e):
                    raise
                error = e
        raise error

    async def _reply_to(self, sock, request_id) -> dict:
        while True:
            reply = self.matches(await sock.recv_multipart(), request_id)
            if reply is not None:
                return reply

    def close(self) -> None:
        for sock in self._idle:
            sock.close(linger=0)
        self._idle.clear()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()
