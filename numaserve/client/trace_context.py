"""The caller's trace, sent with each request: where the calling service uses OpenTelemetry
and a span is current, its W3C context goes in the request's `traceparent` and `tracestate`,
so that numaserve's spans are part of the caller's trace. Without OpenTelemetry installed, or
with no span current, a request carries none (and the server's sampler starts a trace)."""

from __future__ import annotations

import importlib.util
from functools import cache


@cache
def _propagator():
    """W3C Trace Context's propagator, or None where OpenTelemetry's API is not installed
    (looked for once: a client that does not trace pays nothing per call)."""
    if importlib.util.find_spec("opentelemetry") is None:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator()


def caller_trace() -> dict[str, str]:
    """`traceparent` (and `tracestate`) of the current span, where there is one."""
    propagator = _propagator()
    if propagator is None:
        return {}
    carrier: dict[str, str] = {}
    propagator.inject(carrier)
    return carrier
