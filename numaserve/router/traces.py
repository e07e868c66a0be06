"""A shard's spans of the requests it serves, where tracing is on (processes/tracing.py).

Each request is one span of its caller's trace, `numaserve/OP` (an RPC server span: it came
over ZeroMQ), opened when the shard reads it and ended when it answers; its context goes to
the instance with each job (RUN's `trace`), so that the instance's forward pass is its child.
The tokenizing (with the cache's lookups) is a duration on it, and each dispatch to an
instance an event (which instance, its wait in the queue), not spans of their own: at 100%
sampling a request's shard spans cost ~136 us of CPU to make and encode in OpenTelemetry's SDK
with a span for each dispatch, ~98 with events (benchmarks/span_cost.py), and those spans said
nothing an attribute or an event does not. Times are the shard's monotonic clock's, carried
over to the wall clock once.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from numaserve.processes.tracing import traceparent
from numaserve.router.dispatch import Job
from numaserve.router.in_flight import Pending

if TYPE_CHECKING:
    from numaserve.processes.tracing import Tracing


class RequestTraces:
    def __init__(self, tracing: Tracing) -> None:
        from opentelemetry import trace

        self.tracing, self.tracer = tracing, tracing.tracer
        self.kinds, self.codes = trace.SpanKind, trace.StatusCode
        # monotonic seconds -> the wall clock's nanoseconds
        self.offset_ns = time.time_ns() - time.monotonic_ns()

    def wall(self, monotonic_s: float) -> int:
        return int(monotonic_s * 1e9) + self.offset_ns

    def received(self, pending: Pending, tokenized: float, hits: int) -> None:
        """A request read, tokenized and looked up in the cache: its span begins (at
        `pending.received`). One the sampler leaves out is not traced further (`pending.span`
        stays None): nothing of it is recorded."""
        request = pending.request
        span = self.tracer.start_span(
            f"numaserve/{request.op}",
            context=self.tracing.parent(request.trace),
            kind=self.kinds.SERVER,
            start_time=self.wall(pending.received),
        )
        if not span.is_recording():  # not sampled: nothing of it is traced, here or after
            return
        pending.span = span
        # Each attribute costs the shard ~5 us to check and encode, at every traced request:
        # the counts that are most often 0 are set only where they are not.
        attributes = {
            "rpc.system": "numaserve",
            "rpc.method": request.op,
            "numaserve.texts": len(pending.encoded),
            "numaserve.tokens": sum(e.tokens_read for e in pending.encoded),
            "numaserve.priority": "bulk" if request.bulk else "interactive",
            "numaserve.tokenize_ms": _ms(tokenized - pending.received),
        }
        if truncated := sum(1 for e in pending.encoded if e.truncated):
            attributes["numaserve.truncated"] = truncated
        if hits:
            attributes["numaserve.cache.hits"] = hits
        if windows := sum(len(e.more) for e in pending.encoded):
            # long documents read in windows (rerank): every window run
            attributes["numaserve.windows"] = len(pending.encoded) + windows
        span.set_attributes(attributes)

    def dispatched(self, job: Job[Pending], instance: str, now: float) -> list[str]:
        """A job sent to `instance`: each traced request it serves notes it on its span (the
        event `dispatched`: which instance, how many texts its batch holds, how long the
        request's texts waited in the queue); their W3C traceparents, for the instance's
        forward pass, a child of each request's span."""
        owners: dict[int, tuple[Pending, float]] = {}
        for item in job.items:
            pending = item.owner
            if pending.span is not None:
                queued = owners.get(id(pending), (pending, item.queued_at))[1]
                owners[id(pending)] = (pending, min(queued, item.queued_at))
        contexts = []
        for pending, queued in owners.values():
            span = pending.span
            span.add_event(
                "dispatched",
                {
                    "numaserve.instance": instance,
                    "numaserve.batch.texts": len(job.items),
                    "numaserve.queue_ms": _ms(now - queued),
                },
                self.wall(now),
            )
            job.spans.append(span)
            contexts.append(traceparent(span.get_span_context()))
        return contexts

    def ran(self, job: Job[Pending], error: dict | None, now: float) -> None:
        """A job's error back from its instance, noted on each traced request's span it
        served, where that span is still open (its results need no note: the instance's
        forward pass is their span)."""
        if error is None:
            return
        for span in job.spans:
            if span.is_recording():
                attributes = {"error.type": str(error.get("code"))}
                attributes["exception.message"] = str(error.get("message"))
                span.add_event("instance failed", attributes, self.wall(now))

    def answered(
        self, pending: Pending, error: tuple[str, str] | None = None, handed_over: bool = False
    ) -> None:
        """The request answered (or passed to a peer shard, which answers it): its span
        ends, with the error's code where it failed."""
        span = pending.span
        if handed_over:
            span.set_attribute("numaserve.handed_over", True)
        if error is not None:
            span.set_status(self.codes.ERROR, error[1])
            span.set_attribute("error.type", error[0])
        span.end()
        pending.span = None


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)
