"""OpenTelemetry traces from every numaserve process (the fronts, the router shards, the
workers), joined into one trace per request by W3C Trace Context: a front reads a request's
`traceparent` header (or gRPC metadata) and passes its own span on in the protocol's `traceparent` key, a shard
passes its span to the instance that runs the texts, and the instance's forward pass is a span
of that trace (linked to every other request its batch served).

Off unless an OTLP endpoint is named (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
`OTEL_EXPORTER_OTLP_ENDPOINT`, which `server.tracing` may set for every process) or
`OTEL_TRACES_EXPORTER` names `console`; then each
process builds OpenTelemetry's own SDK from the `OTEL_*` variables, as every service
configured by them does: the exporter (`OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`: `http/protobuf`,
the default, or `grpc`; `..._HEADERS`, `..._TIMEOUT`, `..._COMPRESSION`), the sampler
(`OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG`; parent-based, always on, by default),
the resource (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`; `numaserve` by default) and the
batch processor (`OTEL_BSP_*`). When off, nothing here is imported by a hot path: the
processes hold `None` for their tracer and test it once per request.

Spans leave through OpenTelemetry's batch processor, on a thread of its own: a request never
waits for a collector. A collector that is down or slow loses spans, not time: the queue is
bounded (`OTEL_BSP_MAX_QUEUE_SIZE`, 2048), and what is lost is counted (`Tracing.dropped`):
spans dropped from a full queue as well as those an export failed to deliver.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from numaserve.config.schema import TracingConfig

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
PROTOCOLS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
SERVICE = "numaserve"  # the service's name where OTEL_SERVICE_NAME says none


# server.tracing's keys -> the variables they set for every process (config/schema.py)
VARIABLES = {
    "endpoint": "OTEL_EXPORTER_OTLP_ENDPOINT",
    "protocol": "OTEL_EXPORTER_OTLP_PROTOCOL",
    "headers": "OTEL_EXPORTER_OTLP_HEADERS",
    "sampler": "OTEL_TRACES_SAMPLER",
    "sampler_arg": "OTEL_TRACES_SAMPLER_ARG",
    "service_name": "OTEL_SERVICE_NAME",
    "resource_attributes": "OTEL_RESOURCE_ATTRIBUTES",
}


def environment(config: TracingConfig) -> dict[str, str]:
    """The variables server.tracing sets for the server's processes."""
    given = dataclasses.asdict(config)
    return {VARIABLES[key]: value for key, value in given.items() if value is not None}


def exporters(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The exporters this process sends spans to, as OpenTelemetry's SDK reads
    OTEL_TRACES_EXPORTER (a list: `otlp`, the default; `console`; `none`): `otlp` only where
    an endpoint is named, so that no process reaches for a collector nobody named."""
    if sdk_disabled(environ):
        return []
    named = environ.get("OTEL_TRACES_EXPORTER", "otlp").lower().split(",")
    endpoint = any(environ.get(name, "").strip() for name in ENDPOINTS)
    return [
        e
        for e in dict.fromkeys(n.strip() for n in named)
        if e == "console" or (e == "otlp" and endpoint)
    ]


def sdk_disabled(environ: Mapping[str, str]) -> bool:
    """OpenTelemetry's own switch for every signal (OTEL_SDK_DISABLED=true)."""
    return environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process traces: an exporter it can send to, the SDK not disabled."""
    return bool(exporters(environ))


def described(environ: Mapping[str, str] = os.environ) -> str:
    """One line for the start's log: whether traces go anywhere, where, and how sampled."""
    if sdk_disabled(environ):
        return "traces: off (OTEL_SDK_DISABLED=true)"
    chosen = exporters(environ)
    if not chosen:
        if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
            return "traces: off (OTEL_TRACES_EXPORTER=none)"
        return (
            "traces: off (name an OTLP endpoint in server.tracing.endpoint or "
            "OTEL_EXPORTER_OTLP_ENDPOINT, or set OTEL_TRACES_EXPORTER=console)"
        )
    where = []
    if "otlp" in chosen:
        endpoint = next(environ[n].strip() for n in ENDPOINTS if environ.get(n, "").strip())
        where.append(f"exported over OTLP ({_protocol(environ)}) to {endpoint}")
    if "console" in chosen:
        where.append("printed on standard output (OTEL_TRACES_EXPORTER=console)")
    sampler = environ.get("OTEL_TRACES_SAMPLER", "").strip() or "parentbased_always_on"
    argument = environ.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    return f"traces: {' and '.join(where)}, sampler {sampler}{' ' + argument if argument else ''}"


def _protocol(environ: Mapping[str, str]) -> str:
    return next((environ[n].strip() for n in PROTOCOLS if environ.get(n)), "http/protobuf")


def start(
    role: str,
    environ: Mapping[str, str] = os.environ,
    attributes: Mapping[str, str] | None = None,
) -> Tracing | None:
    """This process's tracing, set up from the environment; None where it is off.
    `attributes`: what holds for every span of the process (an instance's CPUs, its model),
    sent once per batch of spans on their resource, not on each span."""
    if not wanted(environ):
        return None
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from numaserve import __version__

    attributes = {"numaserve.process": role, **(attributes or {})}
    named = environ.get("OTEL_SERVICE_NAME") or "service.name=" in environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    if not named:
        attributes["service.name"] = SERVICE
    counted = CountedExporter(_exporter(environ, exporters(environ)))
    provider = TracerProvider(resource=Resource.create(attributes))
    # The processor reports what it drops only where the SDK's own metrics are on (read once,
    # as it is made); the provider, made before, keeps its per-span metrics off.
    with _variable("OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED", "true"):
        # CountedExporter is an exporter by its methods: the SDK is imported only where traced.
        exporter = cast("SpanExporter", counted)
        processor = BatchSpanProcessor(exporter, meter_provider=counted.meters())
    provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    return Tracing(provider.get_tracer("numaserve", __version__), provider, counted)


@contextlib.contextmanager
def _variable(name: str, value: str):
    """The environment variable `name` is `value` inside, then as before."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


def _exporter(environ: Mapping[str, str], chosen: list[str]):
    """The exporter of each chosen name, as one: OTLP's for the configured protocol (it reads
    its endpoint, headers, timeout and compression from the same variables itself), and the
    SDK's console exporter (a span a line of JSON on standard output)."""
    made: list[Any] = []
    if "otlp" in chosen:
        if _protocol(environ) == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc import trace_exporter as otlp
        else:
            from opentelemetry.exporter.otlp.proto.http import trace_exporter as otlp  # type: ignore[no-redef]
        made.append(otlp.OTLPSpanExporter())
    if "console" in chosen:
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        made.append(ConsoleSpanExporter())
    return made[0] if len(made) == 1 else Fanout(made)


class Fanout:
    """Several exporters as one: each batch goes to every one; a failure of any is one."""

    def __init__(self, exporters: list) -> None:
        self.exporters = exporters

    def export(self, spans):
        from opentelemetry.sdk.trace.export import SpanExportResult

        results = [e.export(spans) for e in self.exporters]
        ok = all(r == SpanExportResult.SUCCESS for r in results)
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def shutdown(self, *args, **kwargs):
        for exporter in self.exporters:
            exporter.shutdown(*args, **kwargs)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return all(e.force_flush(timeout_millis) for e in self.exporters)


class CountedExporter:
    """An exporter that counts the spans lost on their way out (`dropped`, for /metrics):
    those it could not deliver (a collector down, refusing, or too slow to answer) and those
    the batch processor dropped because its queue was full while an export waited, which the
    processor reports on OpenTelemetry's own `otel.sdk.processor.span.processed` counter with
    an `error.type` (`meters()`: a meter provider that keeps that count and nothing else)."""

    PROCESSED = "otel.sdk.processor.span.processed"

    def __init__(self, inner) -> None:
        self.inner = inner
        self.dropped = 0
        self.lock = threading.Lock()

    def lost(self, count: int) -> None:
        with self.lock:
            self.dropped += count

    def export(self, spans):
        from opentelemetry.sdk.trace.export import SpanExportResult

        try:
            result = self.inner.export(spans)
        except Exception:  # an exporter's own failure loses the batch, not the process
            result = SpanExportResult.FAILURE
        if result != SpanExportResult.SUCCESS:
            self.lost(len(spans))
        return result

    def meters(self):
        """A meter provider for the batch processor's own metrics: its dropped spans are
        counted here; every other instrument is OpenTelemetry's no-op one."""
        from opentelemetry.metrics import NoOpCounter, NoOpMeter, NoOpMeterProvider

        exporter = self

        class Processed(NoOpCounter):
            def add(self, amount, attributes=None, context=None) -> None:
                if attributes and attributes.get("error.type"):
                    exporter.lost(int(amount))

        class Meter(NoOpMeter):
            def create_counter(self, name, unit="", description=""):
                if name == exporter.PROCESSED:
                    return Processed(name, unit=unit, description=description)
                return super().create_counter(name, unit, description)

        class Provider(NoOpMeterProvider):
            def get_meter(self, name, version=None, schema_url=None, attributes=None):
                return Meter(name, version, schema_url)

        return Provider()

    def shutdown(self, *args, **kwargs):
        return self.inner.shutdown(*args, **kwargs)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


@functools.cache
def _w3c():
    """W3C Trace Context's propagator (it holds no state)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator()


@dataclass
class Tracing:
    """One process's tracer, its provider (flushed at exit) and its exporter's counts."""

    tracer: Any
    provider: Any
    exporter: CountedExporter

    def parent(self, trace: tuple[str, str] | None):
        """The OpenTelemetry context a W3C (traceparent, tracestate) names; None starts a
        trace (the sampler decides whether it is recorded)."""
        if trace is None:
            return None
        return self.parent_of({"traceparent": trace[0], "tracestate": trace[1]})

    @staticmethod
    def parent_of(headers: Mapping[str, str]):
        """The context W3C headers (`traceparent`, `tracestate`) name; one they do not name
        (none, or malformed) starts a trace."""
        return _w3c().extract(headers)

    @staticmethod
    def w3c(span) -> tuple[str, str] | None:
        """A span's W3C (traceparent, tracestate), for the next process, as W3C's propagator
        writes them; None for a span with no valid context."""
        from opentelemetry.trace import set_span_in_context

        carrier: dict[str, str] = {}
        _w3c().inject(carrier, set_span_in_context(span))
        if "traceparent" not in carrier:
            return None
        return carrier["traceparent"], carrier.get("tracestate", "")

    def batch(self, parents: list, name: str, seconds: float, attributes: dict) -> None:
        """A span just ended that served several requests (a forward pass): a child of the
        first's (W3C traceparents, as the shard sent them), linked to every other's."""
        from opentelemetry import trace

        contexts = [c for c in map(span_context, parents) if c is not None]
        if not contexts:
            return
        ended = time.time_ns()
        span = self.tracer.start_span(
            name,
            trace.set_span_in_context(trace.NonRecordingSpan(contexts[0])),
            trace.SpanKind.INTERNAL,
            attributes,
            [trace.Link(c) for c in contexts[1:]],
            start_time=ended - int(seconds * 1e9),
        )
        span.end(ended)

    def dropped(self) -> int:
        return self.exporter.dropped

    def close(self) -> None:
        """Send what is queued (bounded by OTEL_BSP_EXPORT_TIMEOUT), then stop."""
        self.provider.shutdown()


def traceparent(context) -> str:
    """A span context as W3C's `traceparent` (version 00), as W3C's propagator writes it,
    without the propagator's context objects: a shard writes one for every traced request."""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def span_context(traceparent: object):
    """The remote span context a W3C `traceparent` names; None for one that names none
    (malformed, all-zero ids, version ff). Its reading of the header, without the
    propagator's: an instance reads one for every request of each batch."""
    from opentelemetry.trace import INVALID_SPAN_ID, INVALID_TRACE_ID, SpanContext, TraceFlags

    if not isinstance(traceparent, str) or len(traceparent) < 55:
        return None
    version, trace_id, span_id, flags = traceparent[:55].split("-", 3)
    if version == "ff" or len(version) != 2 or len(trace_id) != 32 or len(span_id) != 16:
        return None
    try:
        ids = int(trace_id, 16), int(span_id, 16), int(flags[:2], 16)
    except ValueError:
        return None
    if ids[0] == INVALID_TRACE_ID or ids[1] == INVALID_SPAN_ID:
        return None
    return SpanContext(ids[0], ids[1], is_remote=True, trace_flags=TraceFlags(ids[2]))
