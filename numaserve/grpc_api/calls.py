"""One gRPC call's life on the front's core: its metadata read into an `Exchange` (its
request id, API key, priority, model and trace context), its key checked, its span where
tracing is on, its errors said as TEI's status codes, TEI's timing metadata, its counts for
/metrics and its line in the slow log. A stream's calls are answered in order, each as it
is ready, with at most `window` of them running: reading stops there, which is a stream's
backpressure, and a stream its client left cancels what it was still running."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from numaserve.front.core import Core, Exchange, given_request_id, log_slow, timing_fields
from numaserve.front.errors import ApiError
from numaserve.front.stats import Stats
from numaserve.processes.tracing import Tracing

# A front's statuses of its own, then TEI's error types (TEI's `From<ErrorResponse> for
# Status`).
BY_STATUS = {
    401: grpc.StatusCode.UNAUTHENTICATED,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    499: grpc.StatusCode.CANCELLED,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
BY_KIND = {
    "Unhealthy": grpc.StatusCode.UNAVAILABLE,
    "Backend": grpc.StatusCode.FAILED_PRECONDITION,
    "Overloaded": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "Validation": grpc.StatusCode.INVALID_ARGUMENT,
    "Tokenizer": grpc.StatusCode.FAILED_PRECONDITION,
    "Empty": grpc.StatusCode.INVALID_ARGUMENT,
}
STREAM_WINDOW = 64  # a stream's messages running at once; reading waits past this

Answer = Callable[[Exchange, object], Awaitable[object]]


@dataclasses.dataclass(frozen=True)
class Corrupt:
    """A message that is not its method's (grpcio would answer UNKNOWN for the exception a
    parser raises): what the parser said, for an INVALID_ARGUMENT."""

    why: str


def parser(message_type) -> Callable[[bytes], object]:
    """`message_type`'s parser for a method's messages, a Corrupt for bytes that are not one."""
    from google.protobuf.message import DecodeError

    def parse(data: bytes):
        try:
            return message_type.FromString(data)
        except DecodeError as e:
            return Corrupt(f"not a {message_type.DESCRIPTOR.full_name}: {e}")

    return parse


def checked(request):
    """A request as it was parsed, or the ApiError of one that could not be."""
    if isinstance(request, Corrupt):
        raise ApiError(422, request.why)
    return request


def status_of(error: ApiError) -> grpc.StatusCode:
    return BY_STATUS.get(error.status) or BY_KIND.get(error.kind, grpc.StatusCode.INTERNAL)


@dataclasses.dataclass(kw_only=True)
class GrpcExchange(Exchange):
    """A gRPC call, with the model its `model` metadata names (a `models:` server's), and
    when it began (TEI's Metadata counts its whole time)."""

    model: str | None = None
    started: float = dataclasses.field(default_factory=time.perf_counter)


class Calls:
    def __init__(self, core: Core, stats: Stats, tracing: Tracing | None):
        self.core, self.stats, self.tracing = core, stats, tracing

    def exchange(self, context: grpc.aio.ServicerContext) -> GrpcExchange:
        metadata = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        return GrpcExchange(
            request_id=given_request_id(metadata.get("x-request-id")) or uuid.uuid4().hex,
            authorization=metadata.get("authorization"),
            priority=metadata.get("x-priority"),
            model=metadata.get("model"),
            trace=(metadata["traceparent"], metadata.get("tracestate", ""))
            if "traceparent" in metadata
            else None,
        )

    async def unary(self, method: str, request, context: grpc.aio.ServicerContext, answer: Answer):
        """`answer(call, request)`'s reply, with TEI's timing metadata; an ApiError as its
        status code."""
        started = time.perf_counter()
        call = self.exchange(context)
        span = self._span(method, call)
        try:
            self.core.check_key(call)
            reply = await answer(call, checked(request))
        except ApiError as e:
            await self._fail(method, call, span, context, e, started)
        took = time.perf_counter() - started
        await context.send_initial_metadata(
            (*timing_fields(call, took), ("x-request-id", call.request_id))
        )
        self._end(method, call, span, grpc.StatusCode.OK, took)
        return reply

    async def stream(
        self,
        method: str,
        requests: AsyncIterator,
        context: grpc.aio.ServicerContext,
        answer: Answer,
    ) -> AsyncIterator:
        """Each request's reply, in the order they came; the first ApiError ends the stream
        with its status code, after the replies before it."""
        started = time.perf_counter()
        call = self.exchange(context)
        span = self._span(method, call)
        try:
            self.core.check_key(call)
            async for reply in in_order(requests, lambda r: answer(_one(call), checked(r))):
                yield reply
        except ApiError as e:
            await self._fail(method, call, span, context, e, started)
        self._end(method, call, span, grpc.StatusCode.OK, time.perf_counter() - started)

    async def _fail(self, method, call, span, context, error: ApiError, started: float):
        code = status_of(error)
        self._end(method, call, span, code, time.perf_counter() - started)
        await context.abort(code, error.message)

    def _span(self, method: str, call: Exchange):
        """The call's server span where tracing is on, a child of the caller's trace where
        its metadata names one (`traceparent`); the shards' spans are its children."""
        if self.tracing is None:
            call.trace = None
            return None
        from opentelemetry.trace import SpanKind

        service, _, name = method.strip("/").partition("/")
        headers = dict(zip(("traceparent", "tracestate"), call.trace or (), strict=False))
        attributes = {
            "numaserve.request_id": call.request_id,
            "rpc.system": "grpc",
            "rpc.service": service,
            "rpc.method": name,
        }
        span = self.tracing.tracer.start_span(
            method.strip("/"), self.tracing.parent_of(headers), SpanKind.SERVER, attributes
        )
        call.span, call.trace = span, self.tracing.w3c(span)
        return span

    def _end(self, method, call: Exchange, span, code: grpc.StatusCode, took: float) -> None:
        self.stats.count_grpc(method, code.name, took)
        if span is not None:
            from opentelemetry.trace import StatusCode

            span.set_attribute("rpc.grpc.status_code", code.value[0])
            if code is not grpc.StatusCode.OK:
                span.set_status(StatusCode.ERROR, code.name)
            span.end()
        slow = self.core.spec.server.slow_request_ms
        if slow and took * 1000 >= slow:
            log_slow(call, method, code.name, took)


def _one(stream: GrpcExchange) -> GrpcExchange:
    """One message of a stream: the stream's caller, key and trace, its own timings."""
    return dataclasses.replace(
        stream, timings={}, characters=0, tokens=0, truncated=[], started=time.perf_counter()
    )


async def in_order(
    requests: AsyncIterator, answer: Callable[[object], Awaitable], window: int = STREAM_WINDOW
) -> AsyncIterator:
    """Each request's answer, in the order the requests came, each started as it is read,
    at most `window` running; whatever still runs is cancelled when the caller stops
    reading (its client left) or an answer fails."""
    running: asyncio.Queue = asyncio.Queue(window)
    end = object()

    async def read() -> None:
        async for request in requests:
            await running.put(asyncio.ensure_future(answer(request)))
        await running.put(end)

    reader = asyncio.ensure_future(read())
    try:
        while True:
            head = asyncio.ensure_future(running.get())
            await asyncio.wait((head, reader), return_when=asyncio.FIRST_COMPLETED)
            if not head.done():  # the reader ended first: by the end, or by an error
                head.cancel()
                reader.result()  # its error, if any
                head = asyncio.ensure_future(running.get())
            task = await head
            if task is end:
                return
            yield await task
    finally:
        reader.cancel()
        while not running.empty():
            task = running.get_nowait()
            if task is not end:
                task.cancel()
