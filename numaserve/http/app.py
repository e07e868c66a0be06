"""The HTTP API's application, an adapter on the front's core (front/core.py): which route
answers a request, its key and priority read from its headers, the model it names, TEI's
timing headers, and the one way every route runs a task (Core.run).

The routes themselves (routes/: TEI's, OpenAI's, the /v1/rerank of Cohere and Jina, and
numaserve's own) only translate between their API's shapes and the protocol's.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable

from numaserve.front.core import Core, given_request_id, log_slow, timing_fields
from numaserve.front.errors import ApiError
from numaserve.front.stats import Stats
from numaserve.http import api_errors
from numaserve.http.connection import Request, Response
from numaserve.http.traced import traced
from numaserve.processes.specs import FrontModel
from numaserve.processes.tracing import Tracing


class App:
    def __init__(self, core: Core, stats: Stats, routes: Iterable, tracing: Tracing | None = None):
        """`core`: the front's (front/core.py), which runs every route's texts. `routes`:
        routes.ROUTES, every route served (the routes know the App; it knows them only as the
        Route records it is given). `tracing`: this process's, where tracing is on
        (processes/tracing.py)."""
        self.core, self.stats, self.tracing = core, stats, tracing
        self.spec = core.spec
        self.routes = {(r.method, r.path): r for r in routes}
        self.paths = {r.path for r in self.routes.values()}

    async def handle(self, request: Request) -> Response:
        headers = request.headers
        request.request_id = given_request_id(headers.get("x-request-id")) or uuid.uuid4().hex
        request.authorization = headers.get("authorization")
        request.priority = headers.get("x-priority")
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
                    self.core.check_key(request)
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
            response.headers = (*response.headers, *timing_fields(request, took))
        slow = self.spec.server.slow_request_ms
        if slow and took * 1000 >= slow:
            log_slow(request, f"{request.method} {request.path}", response.status, took)
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

    def model_of(self, request: Request, body: dict) -> FrontModel:
        """TEI's routes name no model: numaserve takes `model` in the body or the query."""
        name = body.get("model")
        if name is None and request.query:
            name = _query(request.query).get("model")
        return self.core.model(name, "`model` (in the body, or ?model=)")


def _query(query: str) -> dict[str, str]:
    from urllib.parse import parse_qs

    return {k: v[-1] for k, v in parse_qs(query).items()}
