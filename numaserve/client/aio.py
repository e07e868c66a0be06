"""`AsyncClient`: the asyncio client; each call borrows a socket of its own from a small pool
for its endpoint, so one client serves many coroutines at once, spread over every endpoint."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import zmq.asyncio

from numaserve.client.arguments import (
    Texts,
    as_batch,
    check_aggregation,
    check_deadline,
    chunks_field,
    late_chunking_field,
    pool_field,
    prompt_field,
    raw_scores_field,
    rerank_fields,
    results,
)
from numaserve.client.calls import WATCH_POLL_S, Calls, Link, joined
from numaserve.client.errors import NumaserveError, Timeout
from numaserve.tasks.ner import DEFAULT_AGGREGATION
from numaserve.tasks.rerank import Ranked
from numaserve.wire import protocol


class AsyncClient(Calls):
    """The asyncio twin of Client (its settings are Calls'): each call borrows a socket of its
    own from a small pool."""

    def open(self) -> None:
        self.ctx = zmq.asyncio.Context.instance()
        self._idle: dict[str, list[Link]] = {}  # by endpoint: sockets with no call waiting

    async def embed(
        self,
        texts: str | Sequence[str],
        deadline_ms: float | None = None,
        prompt_name: str | None = None,
        max_chunks_per_doc: int | None = None,
    ):
        batch, single = as_batch(texts, pairs=False)
        fields = prompt_field(prompt_name) | chunks_field(max_chunks_per_doc)
        body = await self.call_texts("embed", batch, deadline_ms, **fields)
        return results("embed", body, single)

    async def embed_tokens(
        self,
        texts: str | Sequence[str],
        deadline_ms: float | None = None,
        prompt_name: str | None = None,
    ):
        batch, single = as_batch(texts, pairs=False)
        fields = {"token_vectors": True, **prompt_field(prompt_name)}
        return results(
            "embed", await self.call_texts("embed", batch, deadline_ms, **fields), single
        )

    async def embed_chunks(
        self,
        texts: str | Sequence[str],
        chunk_tokens: int | None = None,
        spans: Sequence[Sequence[tuple[int, int]]] | None = None,
        deadline_ms: float | None = None,
        prompt_name: str | None = None,
    ):
        batch, single = as_batch(texts, pairs=False)
        fields = {"late_chunking": late_chunking_field(chunk_tokens, spans, single)}
        fields |= prompt_field(prompt_name)
        body = await self.call_texts("embed", batch, deadline_ms, **fields)
        return results("embed", body, single)

    async def embed_multi(
        self,
        texts: str | Sequence[str],
        deadline_ms: float | None = None,
        prompt_name: str | None = None,
        pool_factor: float | None = None,
    ):
        batch, single = as_batch(texts, pairs=False)
        fields = prompt_field(prompt_name) | pool_field(pool_factor)
        body = await self.call_texts("multivector", batch, deadline_ms, **fields)
        return results("multivector", body, single)

    async def sparse(self, texts: str | Sequence[str], deadline_ms: float | None = None):
        batch, single = as_batch(texts, pairs=False)
        return results("sparse", await self.call_texts("sparse", batch, deadline_ms), single)

    async def classify(
        self, texts: Texts, deadline_ms: float | None = None, raw_scores: bool = False
    ):
        batch, single = as_batch(texts)
        body = await self.call_texts("classify", batch, deadline_ms, **raw_scores_field(raw_scores))
        return results("classify", body, single)

    async def rerank(
        self,
        query: str,
        documents: Sequence[str],
        top_k: int | None = None,
        deadline_ms: float | None = None,
        raw_scores: bool = False,
        max_chunks_per_doc: int | None = None,
    ) -> list[Ranked]:
        batch, fields = rerank_fields(query, documents, top_k, max_chunks_per_doc)
        fields |= raw_scores_field(raw_scores)
        return results("rerank", await self.call("rerank", batch, deadline_ms, **fields), False)

    async def ner(
        self,
        texts: str | Sequence[str],
        aggregation: str = DEFAULT_AGGREGATION,
        deadline_ms: float | None = None,
    ):
        batch, single = as_batch(texts, pairs=False)
        check_aggregation(aggregation)
        body = await self.call_texts("ner", batch, deadline_ms, aggregation=aggregation)
        return results("ner", body, single)

    async def status(self) -> dict:
        return (await self.call("status"))["server"]

    async def ping(self) -> float:
        start = time.perf_counter()
        await self.call("ping")
        return time.perf_counter() - start

    async def call_texts(self, op: str, texts: list, deadline_ms=None, **fields) -> dict:
        """`call` for a list of texts, in as many requests as the server's limits need, one
        after another (each spread over the server's instances): one reply, in order.
        `deadline_ms` holds for each request."""
        if self.texts_unknown(texts):
            self.learn(await self.call("ping"))
        requests = self.requests(op, texts, fields)
        return joined([await self.call(op, p, deadline_ms, **f) for p, f in requests])

    async def call(self, op: str, texts=None, deadline_ms: float | None = None, **fields) -> dict:
        check_deadline(deadline_ms)
        body = self.request(op, texts, deadline_ms, **fields)
        frames = protocol.pack(body)
        if self.limit_unknown(frames, self.max_message_bytes):
            self.learn(await self.call("ping"))
        if (too_large := self.too_large(op, frames)) is not None:
            raise too_large
        if self.pool.resolve_due():
            found = await asyncio.get_running_loop().run_in_executor(None, self.pool.lookup)
            self.forget(self.pool.update(found))
        failures, tried = self.failures(), []
        error: NumaserveError = Timeout(f"no reply to {op}")
        for attempt in range(self.attempts()):
            tried.append(endpoint := self.choose(tried))
            idle = self._idle.setdefault(endpoint, [])
            # A socket that timed out is closed; a retry goes out on a fresh one.
            link = idle.pop() if idle and not attempt else self.socket(self.ctx, endpoint)
            self.pool.sent(endpoint)
            try:
                await link.sock.send_multipart(frames)
                reply = await self._reply(op, link, body["id"])
            finally:
                self.pool.done(endpoint)
            if isinstance(reply, NumaserveError) or endpoint not in self.pool.addresses:
                link.close()
            else:
                idle.append(link)
            outcome = self.outcome(reply, link, failures)
            if not isinstance(outcome, NumaserveError):
                return outcome
            error = outcome
        raise error

    async def _reply(self, op: str, link: Link, request_id) -> dict | NumaserveError:
        deadline = time.monotonic() + self.timeout
        reply = asyncio.ensure_future(self._reply_to(link.sock, request_id))
        try:
            while link.watch is not None and (left := deadline - time.monotonic()) > 0:
                done, _ = await asyncio.wait({reply}, timeout=min(left, WATCH_POLL_S))
                if (problem := self.link_error(link)) is not None:
                    return problem
                if done:
                    return reply.result()
            return await asyncio.wait_for(reply, max(deadline - time.monotonic(), 0))
        except asyncio.TimeoutError:
            return self.no_reply(op, link)
        finally:
            reply.cancel()

    async def _reply_to(self, sock, request_id) -> dict:
        while True:
            reply = self.matches(await sock.recv_multipart(), request_id)
            if reply is not None:
                return reply

    def forget(self, gone: list[str]) -> None:
        super().forget(gone)
        for endpoint in gone:
            for link in self._idle.pop(endpoint, []):
                link.close()

    def close(self) -> None:
        self.forget(list(self._idle))
        self.probes.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()
