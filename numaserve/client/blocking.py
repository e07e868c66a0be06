"""`Client`: the blocking client, one request at a time over a socket to each endpoint (not
thread-safe: one per thread)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import zmq

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


class Client(Calls):
    """A blocking client; its settings are Calls'."""

    def open(self) -> None:
        self.ctx = zmq.Context.instance()
        self.links: dict[str, Link] = {}  # by endpoint, opened at its first request

    def embed(
        self,
        texts: str | Sequence[str],
        deadline_ms: float | None = None,
        prompt_name: str | None = None,
        max_chunks_per_doc: int | None = None,
    ):
        """One Embedding for a string, a list of them for a list of strings. `prompt_name`:
        one of the model's own prompts, put before each text (the model's default where
        None, as sentence-transformers does). `max_chunks_per_doc`: a text longer than the
        model reads is read in up to that many overlapping windows, and gets the mean of
        their vectors, unit length (`Embedding.chunks` says how many); None or 1: it is cut."""
        batch, single = as_batch(texts, pairs=False)
        fields = prompt_field(prompt_name) | chunks_field(max_chunks_per_doc)
        body = self.call_texts("embed", batch, deadline_ms, **fields)
        return results("embed", body, single)

    def embed_tokens(
        self,
        texts: str | Sequence[str],
        deadline_ms: float | None = None,
        prompt_name: str | None = None,
    ):
        """One TokenEmbedding for a string (the model's vector of each of its tokens, as
        TEI's /embed_all answers), a list of them for a list. Never from the cache."""
        batch, single = as_batch(texts, pairs=False)
        fields = {"token_vectors": True, **prompt_field(prompt_name)}
        return results("embed", self.call_texts("embed", batch, deadline_ms, **fields), single)

    def embed_chunks(
        self,
        texts: str | Sequence[str],
        chunk_tokens: int | None = None,
        spans: Sequence[Sequence[tuple[int, int]]] | None = None,
        deadline_ms: float | None = None,
        prompt_name: str | None = None,
    ):
        """Late chunking: one ChunkEmbeddings for a string (its chunks' vectors, each pooled
        from its own tokens of one pass over the whole text), a list of them for a list. The
        chunks: `chunk_tokens` tokens each, or `spans`, a list of (start, end) character
        spans for each text."""
        batch, single = as_batch(texts, pairs=False)
        fields = {"late_chunking": late_chunking_field(chunk_tokens, spans, single)}
        body = self.call_texts("embed", batch, deadline_ms, **fields, **prompt_field(prompt_name))
        return results("embed", body, single)

    def embed_multi(
        self,
        texts: str | Sequence[str],
        deadline_ms: float | None = None,
        prompt_name: str | None = None,
        pool_factor: float | None = None,
    ):
        """One MultiVectors for a string (a late-interaction model's vector of each token
        that counts), a list of them for a list: read as queries where `prompt_name` is
        "query", as documents otherwise, as MultiVectorEncoder's encode_query and
        encode_document read them. `pool_factor`: a document's vectors pooled into about
        that many times fewer (sentence-transformers' HierarchicalTokenPooling). Never from
        the cache."""
        batch, single = as_batch(texts, pairs=False)
        fields = prompt_field(prompt_name) | pool_field(pool_factor)
        body = self.call_texts("multivector", batch, deadline_ms, **fields)
        return results("multivector", body, single)

    def sparse(self, texts: str | Sequence[str], deadline_ms: float | None = None):
        """One SparseEmbedding for a string (a SPLADE model's non-zero weights, by vocabulary
        index), a list of them for a list."""
        batch, single = as_batch(texts, pairs=False)
        return results("sparse", self.call_texts("sparse", batch, deadline_ms), single)

    def classify(self, texts: Texts, deadline_ms: float | None = None, raw_scores: bool = False):
        """One Classification for a string or a pair (a tuple of two strings), a list of them
        for a list. `raw_scores`: each with the model's logits too, before the softmax (or
        a multi-label model's sigmoid)."""
        batch, single = as_batch(texts)
        body = self.call_texts("classify", batch, deadline_ms, **raw_scores_field(raw_scores))
        return results("classify", body, single)

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        top_k: int | None = None,
        deadline_ms: float | None = None,
        raw_scores: bool = False,
        max_chunks_per_doc: int | None = None,
    ) -> list[Ranked]:
        """Each document's score for `query`, in order; with `top_k`, the best k, best first.
        `raw_scores`: each with the model's logit too, before its activation. A document
        longer than the model reads scores its best window's score (`Ranked.chunks` says
        how many were scored); `max_chunks_per_doc`: at most that many (1: it is cut)."""
        batch, fields = rerank_fields(query, documents, top_k, max_chunks_per_doc)
        fields |= raw_scores_field(raw_scores)
        return results("rerank", self.call("rerank", batch, deadline_ms, **fields), False)

    def ner(
        self,
        texts: str | Sequence[str],
        aggregation: str = DEFAULT_AGGREGATION,
        deadline_ms: float | None = None,
    ):
        """The named entities of a string (an Entities), or of each of a list. `aggregation`:
        none, simple, first, average or max, as transformers' pipeline has them."""
        batch, single = as_batch(texts, pairs=False)
        check_aggregation(aggregation)
        body = self.call_texts("ner", batch, deadline_ms, aggregation=aggregation)
        return results("ner", body, single)

    def status(self) -> dict:
        return self.call("status")["server"]

    def ping(self) -> float:
        """Seconds for a round trip to the router."""
        start = time.perf_counter()
        self.call("ping")
        return time.perf_counter() - start

    def call_texts(self, op: str, texts: list, deadline_ms=None, **fields) -> dict:
        """`call` for a list of texts, in as many requests as the server's limits need, one
        after another (each spread over the server's instances): one reply, in order.
        `deadline_ms` holds for each request."""
        if self.texts_unknown(texts):
            self.learn(self.call("ping"))
        requests = self.requests(op, texts, fields)
        return joined([self.call(op, p, deadline_ms, **f) for p, f in requests])

    def call(self, op: str, texts=None, deadline_ms: float | None = None, **fields) -> dict:
        check_deadline(deadline_ms)
        body = self.request(op, texts, deadline_ms, **fields)
        frames = protocol.pack(body)
        if self.limit_unknown(frames, self.max_message_bytes):
            self.learn(self.call("ping"))
        if (too_large := self.too_large(op, frames)) is not None:
            raise too_large
        if self.pool.resolve_due():
            self.forget(self.pool.update(self.pool.lookup()))
        failures, tried = self.failures(), []
        error: NumaserveError = Timeout(f"no reply to {op}")
        for _ in range(self.attempts()):
            tried.append(endpoint := self.choose(tried))
            link = self.links.get(endpoint)
            if link is None:
                link = self.links[endpoint] = self.socket(self.ctx, endpoint)
            link.sock.send_multipart(frames)
            reply = self._reply(op, link, body["id"])
            if isinstance(reply, NumaserveError):  # Lazy Pirate: a fresh socket next time
                self.links.pop(endpoint).close()
            outcome = self.outcome(reply, link, failures)
            if not isinstance(outcome, NumaserveError):
                return outcome
            error = outcome
        raise error

    def forget(self, gone: list[str]) -> None:
        super().forget(gone)
        for endpoint in gone:
            if endpoint in self.links:
                self.links.pop(endpoint).close()

    def _reply(self, op: str, link: Link, request_id) -> dict | NumaserveError:
        """The reply to request_id on `link`, or why there is none."""
        deadline = time.monotonic() + self.timeout
        while (left := deadline - time.monotonic()) > 0:
            if (problem := self.link_error(link)) is not None:
                return problem
            wait = left if link.watch is None else min(left, WATCH_POLL_S)
            if link.sock.poll(wait * 1000):
                reply = self.matches(link.sock.recv_multipart(), request_id)
                if reply is not None:
                    self.link_error(link)  # a passed handshake: stop watching
                    return reply
        return self.no_reply(op, link)

    def close(self) -> None:
        self.forget(list(self.links))
        self.probes.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
