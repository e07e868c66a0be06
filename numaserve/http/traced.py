"""A request's span in the HTTP front, where tracing is on (processes/tracing.py): an HTTP
server span as OpenTelemetry's semantic conventions name one (`POST /embed`), a child of the
caller's trace where its `traceparent` header names one, and the parent of the shards' spans
(`Core.run` passes its context in the protocol's `traceparent`). The reply says which trace it
was in: W3C's `traceresponse` header."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from numaserve.http.connection import Request, Response
from numaserve.processes.tracing import Tracing


async def traced(
    tracing: Tracing,
    route,
    answer: Callable[[Request, object], Awaitable[Response]],
    request: Request,
) -> Response:
    """`answer(request, route)` inside the request's span; `route`: None where none serves
    the request's method and path."""
    from opentelemetry.trace import SpanKind, StatusCode

    attributes = {
        "numaserve.request_id": request.request_id,
        "http.request.method": request.method,
        "url.path": request.path,
        "url.scheme": "http",
        "network.protocol.version": "1.1",
    }
    if route is not None:
        attributes["http.route"] = route.path
    agent = request.headers.get("user-agent")
    if agent:
        attributes["user_agent.original"] = agent[:256]
    name = f"{request.method} {route.path}" if route is not None else request.method
    headers = {k: request.headers[k] for k in ("traceparent", "tracestate") if k in request.headers}
    span = tracing.tracer.start_span(name, tracing.parent_of(headers), SpanKind.SERVER, attributes)
    request.span, request.trace = span, tracing.w3c(span)
    try:
        response = await answer(request, route)
    except BaseException as e:
        span.set_status(StatusCode.ERROR, type(e).__name__)
        span.end()
        raise
    span.set_attribute("http.response.status_code", response.status)
    if response.status >= 500:
        span.set_status(StatusCode.ERROR)
        span.set_attribute("error.type", str(response.status))
    span.end()
    if request.trace is not None:
        response.headers = (*response.headers, ("traceresponse", request.trace[0]))
    return response
