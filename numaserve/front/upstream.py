"""The HTTP front's way to the router shards: a ZeroMQ DEALER per model, connected to the
private socket of each of that model's shards, read from the asyncio loop.

A request goes out as the protocol's own (docs/protocol.md) with an id of ours; the shard
tokenizes it (the front never does) and answers. A DEALER hands each request to the next
connected shard in turn. A request a shard took and never answered (it died holding it) is
sent once more after its window (requests are idempotent: the zguide's Lazy Pirate), and
after that answered `no_instance`; with no shard connected at all it is answered at once. The
window is `retry_after_s` and `per_text_s` more for each of its texts: a big request is
queued a piece at a time and runs for as long as its texts take, and a busy server is not a
dead shard.
A request whose client hung up is cancelled at the shards (the protocol's `cancel`), so that
texts still queued there never run: sent once to each shard, as a DEALER hands consecutive
messages to its peers in turn.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass

import zmq

from numaserve.router.process import NOBLOCK, send
from numaserve.wire import protocol
from numaserve.wire.protocol import ErrorCode

log = logging.getLogger("numaserve.front")
SWEEP_S = 0.25  # how often requests past their time are looked for


@dataclass
class Call:
    model: str
    body: dict
    future: asyncio.Future
    window: float  # how long a shard may hold it before it is sent again, or given up
    expires: float
    tries: int = 1


class Upstream:
    def __init__(
        self,
        ctx: zmq.Context,
        shards: dict[str, tuple[str, ...]],
        retry_after_s: float,
        per_text_s: float,
    ):
        """`shards`: each model's shards' private sockets, by model name."""
        self.sockets: dict[str, zmq.Socket] = {}
        for model, endpoints in shards.items():
            sock = ctx.socket(zmq.DEALER)
            sock.linger = 0
            # Queue nothing for a shard that is not there: a send with none connected fails at
            # once (answered no_instance) instead of waiting for one to come up.
            sock.setsockopt(zmq.IMMEDIATE, 1)
            for endpoint in endpoints:
                sock.connect(endpoint)
            self.sockets[model] = sock
        self.fanout = {model: len(endpoints) for model, endpoints in shards.items()}
        self.retry_after_s, self.per_text_s = retry_after_s, per_text_s
        self.calls: dict[int, Call] = {}
        self.ids = itertools.count(1)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.drain_soon = False

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        for sock in self.sockets.values():
            loop.add_reader(_fd(sock), self._drain)
        loop.call_later(SWEEP_S, self._sweep)

    def close(self) -> None:
        for sock in self.sockets.values():
            if self.loop is not None:
                self.loop.remove_reader(_fd(sock))
            sock.close(linger=0)

    def _loop(self) -> asyncio.AbstractEventLoop:
        """The loop `start` was given: nothing is called or read before it."""
        if self.loop is None:
            raise RuntimeError("Upstream used before start(loop)")
        return self.loop

    @property
    def in_flight(self) -> int:
        return len(self.calls)

    def call(self, model: str, body: dict, texts_ahead: int = 0) -> asyncio.Future:
        """The shard's reply (a dict) to `body`, a request without its id, for `model`.
        `texts_ahead`: texts sent beside it that the shards may run first (the other pieces of
        one big request), which its resend window allows for too."""
        future = self._loop().create_future()
        request_id = next(self.ids)
        body["id"] = request_id
        texts = body.get("texts")
        count = (len(texts) if isinstance(texts, list) else 1) + texts_ahead
        window = self.retry_after_s + self.per_text_s * count
        call = Call(model, body, future, window, time.monotonic() + window)
        if self._send(call):
            self.calls[request_id] = call
            future.add_done_callback(lambda f: self._cancel(request_id) if f.cancelled() else None)
        return future

    def _cancel(self, request_id: int) -> None:
        """The route's wait was cancelled (its client hung up): the shards drop the request."""
        call = self.calls.pop(request_id, None)
        if call is None:
            return
        sock = self.sockets[call.model]
        for _ in range(self.fanout[call.model]):
            try:
                send(sock, [], {"id": request_id, "op": "cancel"}, NOBLOCK)
            except zmq.Again:
                return

    def _send(self, call: Call) -> bool:
        try:
            send(self.sockets[call.model], [], call.body, NOBLOCK)
        except zmq.Again:
            _answer(call.future, _error(call, ErrorCode.NO_INSTANCE, "no router shard is up"))
            return False
        # ZeroMQ's descriptor signals edges only: a reply that came in while we sent would
        # raise none, so the socket is read once more after every burst of sends.
        if not self.drain_soon:
            self.drain_soon = True
            self._loop().call_soon(self._drain)
        return True

    def _drain(self) -> None:
        self.drain_soon = False
        for sock in self.sockets.values():
            while True:  # until there is none: what the edge-triggered descriptor asks
                try:  # not getsockopt(EVENTS) first: a poll syscall each time, as the router found
                    frames = sock.recv_multipart(NOBLOCK)
                except zmq.Again:
                    break
                self._reply(frames)

    def _reply(self, frames: list[bytes]) -> None:
        try:
            body = protocol.unpack(frames)
        except protocol.ProtocolError as e:
            log.error("a shard's reply that is not the protocol's: %s", e)
            return
        call = self.calls.pop(body.get("id", 0), None)
        if call is not None:  # else answered already (a retry's twin), or given up
            _answer(call.future, body)

    def _sweep(self) -> None:
        now = time.monotonic()
        for request_id, call in list(self.calls.items()):
            if now >= call.expires:
                del self.calls[request_id]
                if call.tries == 1:
                    log.warning(
                        "request %s unanswered for %.0f s: sent again", request_id, call.window
                    )
                    call.tries, call.expires = 2, now + call.window
                    if self._send(call):
                        self.calls[request_id] = call
                else:
                    message = "no router shard answered; the server logged why"
                    _answer(call.future, _error(call, ErrorCode.NO_INSTANCE, message))
        self._loop().call_later(SWEEP_S, self._sweep)


def _error(call: Call, code: ErrorCode, message: str) -> dict:
    return protocol.error_reply(call.body.get("id"), code, message)


def _answer(future: asyncio.Future, body: dict) -> None:
    if not future.done():
        future.set_result(body)


def _fd(sock: zmq.Socket) -> int:
    """The socket's descriptor, which signals (edge-triggered) that it may be read."""
    return int(sock.getsockopt(zmq.FD))
