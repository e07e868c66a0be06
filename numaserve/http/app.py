"""The HTTP front's application: which route answers a request, the key check, the model a
request names, and the one way every route runs a task (a protocol request to the shards).

The routes themselves (routes/: TEI's, OpenAI's, the /v1/rerank of Cohere and Jina, and
numaserve's own) only translate between their API's shapes and the protocol's.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Iterable
from typing import Any

from numaserve.http import api_errors
from numaserve.http.api_errors import ApiError
from numaserve.http.connection import Request, Response
from numaserve.http.keys import ApiKeys
from numaserve.http.stats import Stats
from numaserve.http.traced import traced
from numaserve.http.upstream import Upstream
from numaserve.processes.specs import HttpModel, HttpSpec
from numaserve.processes.tracing import Tracing
from numaserve.tasks.requests import PRIORITIES

log = logging.getLogger("numaserve.http")


class App:
    def __init__(
        self,
        spec: HttpSpec,
        upstream: Upstream,
        keys: ApiKeys,
        stats: Stats,
        routes: Iterable,
        tracing: Tracing | None = None,
    ):
        """`routes`: routes.ROUTES, every route served (the routes know the App; it knows
        them only as the Route records it is given). `tracing`: this process's, where
        tracing is on (processes/tracing.py)."""
        self.spec, self.upstream, self.keys, self.stats = spec, upstream, keys, stats
        self.tracing = tracing
        self.routes = {(r.method, r.path): r for r in routes}
        self.paths = {r.path for r in self.routes.values()}
        self.models = {m.name: m for m in spec.models}
        self.started = int(time.time())
        self.tokenizers: dict[str, Any] = {}

    async def handle(self, request: Request) -> Response:
        request.request_id = given_request_id(request.headers.get("x-request-id")) or (
            uuid.uuid4().hex
        )
        route = self.routes.get((request.method, request.path))
        if self.tracing is None:
            return await self.answer(request, route)
        return await traced(self.tracing, route, self.answer, request)

    async def answer(self, request: Request, route) -> Response:
        """The reply of `route` (None: no route serves this method and path)."""
        started = time.perf_counter()
        if route is None:
            response = self._no_route(request)
            name = "other"
        else:
            name = route.path
            try:
                if not route.open:
                    self.keys.check(request.headers.get("authorization"))
                response = await route.handler(self, request)
                if request.truncated:  # no API's body has room to say it: a header does
                    cut = ",".join(map(str, request.truncated))
                    response.headers = (*response.headers, ("x-truncated-inputs", cut))
            except ApiError as e:
                response = route.error(e)
        took = time.perf_counter() - started
        self.stats.count(name, response.status, took)
        response.headers = (*response.headers, ("x-request-id", request.request_id))
        if request.timings:
            response.headers = (*response.headers, *timing_headers(request, took))
        slow = self.spec.server.slow_request_ms
        if slow and took * 1000 >= slow:
            log_slow(request, response.status, took)
        return response

    def _no_route(self, request: Request) -> Response:
        if request.path in self.paths:
            methods = sorted(m for m, p in self.routes if p == request.path)
            error = ApiError(405, f"{request.path} takes {', '.join(methods)}")
            response = api_errors.shape_for(request.path)(error)
            response.headers = (("allow", ", ".join(methods)),)
            return response
        if request.path in ("/metrics", "/healthz", "/readyz"):
            metrics = self.spec.server.metrics
            where = (
                f"on server.metrics, http://{metrics}{request.path}"
                if metrics
                else ("on server.metrics, which this server's config turns off")
            )
            no_route = ApiError(404, f"{request.path} is served {where}, not on the HTTP API")
            return api_errors.shape_for(request.path)(no_route)
        no_route = ApiError(404, f"no route {request.path}; see /docs or /openapi.json")
        return api_errors.shape_for(request.path)(no_route)

    # -- what the routes share -------------------------------------------------------------

    def model(self, name: object, where: str = "model") -> HttpModel:
        """The model a request names (`where` says where it is named), or the only one."""
        served = ", ".join(self.models)
        if name is None:
            if len(self.models) == 1:
                return next(iter(self.models.values()))
            raise ApiError(
                400, f"this server serves several models ({served}): name one in {where}"
            )
        model = self.models.get(name) if isinstance(name, str) else None
        if model is None:
            raise ApiError(404, f"no model {name!r} here; this server serves {served}")
        return model

    def model_of(self, request: Request, body: dict) -> HttpModel:
        """TEI's routes name no model: numaserve takes `model` in the body or the query."""
        name = body.get("model")
        if name is None and request.query:
            name = _query(request.query).get("model")
        return self.model(name, "`model` (in the body, or ?model=)")

    async def run(self, request: Request, model: HttpModel, op: str, texts, **options) -> list:
        """A task's results, one per text, from the model's shards; an ApiError for theirs."""
        if request.gone:  # asked and hung up: nothing runs for nobody
            raise ApiError(499, "the client closed the connection")
        self.check_count(texts)
        body = {"op": op, "texts": texts, "timings": True}
        if request.trace is not None:
            body["traceparent"], body["tracestate"] = request.trace
            request.span.set_attributes(
                {"numaserve.model": model.name, "numaserve.op": op, "numaserve.texts": len(texts)}
            )
        if self.bulk(request):
            body["priority"] = "bulk"
        if self.spec.named:
            body["model"] = model.name
        body.update((k, v) for k, v in options.items() if v is not None)
        future = self.upstream.call(model.name, body)
        if request.connection is not None:
            request.connection.waiting = future
        reply = await future
        if reply.get("status") != "ok":
            raise api_errors.from_reply(reply.get("error") or {})
        results = reply["results"]
        for key, ms in (reply.get("timings") or {}).items():
            request.timings[key] = request.timings.get(key, 0.0) + ms
        request.characters += sum(map(characters, texts))
        request.tokens += sum(r.get("tokens", 0) for r in results)
        request.truncated += [
            r.get("index", i) for i, r in enumerate(results) if r.get("truncated")
        ]
        return results

    def bulk(self, request: Request) -> bool:
        """The request's priority: its X-Priority header, else its API key's default."""
        given = request.headers.get("x-priority")
        if given is None:
            return self.keys.is_bulk(request.headers.get("authorization"))
        priority = given.strip().lower()
        if priority not in PRIORITIES:
            raise ApiError(400, f"X-Priority is interactive or bulk; got {given[:40]!r}")
        return priority == "bulk"

    def check_count(self, texts: list) -> None:
        """More inputs than server.max_texts in one request is 413, before any is read."""
        limit = self.spec.server.max_texts
        if len(texts) > limit:
            raise ApiError(
                413, f"{len(texts)} inputs in one request; the limit is {limit} (server.max_texts)"
            )

    def tokenizer(self, model: HttpModel):
        """The model's fast tokenizer, loaded on first use: only /tokenize, /decode and token
        id inputs need it here (the shards tokenize everything they run)."""
        if model.name not in self.tokenizers:
            from numaserve.backends.tokenizer import load_fast_tokenizer

            tokenizer = load_fast_tokenizer(model.model.path)
            tokenizer.no_padding()  # some tokenizer.json files pad every text to a length
            tokenizer.no_truncation()
            self.tokenizers[model.name] = tokenizer
        return self.tokenizers[model.name]


REQUEST_ID = re.compile(r"[A-Za-z0-9._:/=+-]{1,128}")


def given_request_id(value: str | None) -> str | None:
    """A client's X-Request-Id, echoed where it is a plain token of up to 128 characters
    (another is replaced: it goes into headers and log lines)."""
    return value if value is not None and REQUEST_ID.fullmatch(value) else None


def characters(text) -> int:
    """A text's characters, or a pair's (token ids count none)."""
    if isinstance(text, str):
        return len(text)
    return sum(len(t) for t in text if isinstance(t, str)) if isinstance(text, list) else 0


def timing_headers(request: Request, took: float) -> tuple[tuple[str, str], ...]:
    """TEI's timing headers, in whole milliseconds as TEI writes them: the front's whole
    time, the shards' part, and within it tokenizing, the queue and the forward pass."""
    ms = request.timings
    return (
        ("x-compute-type", "cpu"),
        ("x-compute-time", str(round(ms.get("total_ms", 0.0)))),
        ("x-compute-characters", str(request.characters)),
        ("x-compute-tokens", str(request.tokens)),
        ("x-total-time", str(round(took * 1000))),
        ("x-tokenization-time", str(round(ms.get("tokenize_ms", 0.0)))),
        ("x-queue-time", str(round(ms.get("queue_ms", 0.0)))),
        ("x-inference-time", str(round(ms.get("inference_ms", 0.0)))),
    )


def log_slow(request: Request, status: int, took: float) -> None:
    """One line for a request slower than server.slow_request_ms: where its time went, its
    request id, and its trace id where it is traced (a log line leads to its trace)."""
    ms, request_id = request.timings, request.request_id
    trace_id = request.trace[0].split("-")[1] if request.trace else None
    log.warning(
        "slow request %s %s -> %d: %.0f ms (in the shards %.0f: tokenize %.1f, queue %.1f, "
        "forward pass %.1f), %d characters, %d tokens; request_id=%s%s",
        request.method,
        request.path,
        status,
        took * 1000,
        ms.get("total_ms", 0.0),
        ms.get("tokenize_ms", 0.0),
        ms.get("queue_ms", 0.0),
        ms.get("inference_ms", 0.0),
        request.characters,
        request.tokens,
        request_id,
        f" trace_id={trace_id}" if trace_id else "",
        extra={"request_id": request_id, **({"trace_id": trace_id} if trace_id else {})},
    )


def _query(query: str) -> dict[str, str]:
    from urllib.parse import parse_qs

    return {k: v[-1] for k, v in parse_qs(query).items()}
