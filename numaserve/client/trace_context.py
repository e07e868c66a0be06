"""The caller's trace, sent with each request: where the calling service uses OpenTelemetry
and a span is current, its W3C context goes in the request's `traceparent` and `tracestate`,
so that numaserve's spans are part of the caller's trace. Without OpenTelemetry installed, or
with no span current, a request carries none (and the server's sampler starts a trace)."""

from __future__ import annotations

import importlib.util
from functools import cache


@cache
def propagation():
    """OpenTelemetry's current-context getter and W3C Trace Context's propagator, or None
    where OpenTelemetry's API is not installed (looked for once)."""
    if importlib.util.find_spec("opentelemetry") is None:
        return None
    from opentelemetry.context import get_current
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return get_current, TraceContextTextMapPropagator()


def caller_trace() -> dict[str, str]:
    """`traceparent` (and `tracestate`) of the current span, where there is one. A caller
    that does not trace has an empty context: it pays one lookup a call, not an injection."""
    found = propagation()
    if found is None:
        return {}
    get_current, propagator = found
    current = get_current()
    if not current:
        return {}
    carrier: dict[str, str] = {}
    propagator.inject(carrier, current)
    return carrier
