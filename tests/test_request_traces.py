"""A shard's spans of one request (router/traces.py), made by OpenTelemetry's own SDK and
read back from its in-memory exporter: what each says, without a server."""

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, get_current_span, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from numaserve.backends.tokenizer import Encoded
from numaserve.processes.tracing import CountedExporter, Tracing, span_context, traceparent
from numaserve.router.dispatch import Item, Job
from numaserve.router.in_flight import Pending
from numaserve.router.traces import RequestTraces
from numaserve.wire.requests import Request


def traces() -> tuple[RequestTraces, InMemorySpanExporter]:
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    tracing = Tracing(provider.get_tracer("test"), provider, CountedExporter(exported))
    return RequestTraces(tracing), exported


def pending(op: str, encoded: list[Encoded]) -> Pending:
    request = Request(id=1, op=op, texts=("q", "d"))
    return Pending([b"client"], request, encoded, [None] * len(encoded), None, received=1.0)


def test_a_request_span_says_its_texts_tokens_cache_hits_and_its_time_tokenizing():
    made, exported = traces()
    request = pending("embed", [Encoded((1, 2, 3), False), Encoded((1, 2), True)])
    made.received(request, tokenized=1.002, hits=1)
    made.answered(request)
    (span,) = exported.get_finished_spans()  # tokenizing is a duration, not a span
    assert span.name == "numaserve/embed"
    assert span.attributes["numaserve.texts"] == 2
    assert span.attributes["numaserve.tokens"] == 5
    assert span.attributes["numaserve.truncated"] == 1
    assert span.attributes["numaserve.cache.hits"] == 1
    assert span.attributes["numaserve.tokenize_ms"] == 2.0
    assert "numaserve.windows" not in span.attributes  # none read in windows


def test_a_job_is_a_run_span_of_each_traced_request_it_serves_saying_its_wait_in_the_queue():
    made, exported = traces()
    first, second = (pending("embed", [Encoded((1, 2), False)]) for _ in range(2))
    for request in (first, second):
        made.received(request, tokenized=1.001, hits=0)
    items = [
        Item(first, 0, (1, 2), 0, queued_at=1.002),
        Item(second, 0, (1, 2), 0, queued_at=1.004),
    ]
    job = Job(7, b"w", items)
    parents = made.dispatched(job, "pool0-0", now=1.010)
    made.ran(job, None, now=1.020)
    runs = [s for s in exported.get_finished_spans() if s.name == "run on pool0-0"]
    assert [r.parent.span_id for r in runs] == [
        first.span.context.span_id,
        second.span.context.span_id,
    ]
    assert [r.attributes["numaserve.queue_ms"] for r in runs] == [8.0, 6.0]
    assert {r.attributes["numaserve.batch.texts"] for r in runs} == {2}
    # what the instance is told: each run's context, as W3C's propagator would write it
    written = []
    for run in runs:
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(
            carrier, set_span_in_context(NonRecordingSpan(run.context))
        )
        written.append(carrier["traceparent"])
    assert parents == written
    assert abs(runs[0].end_time - runs[0].start_time - 10_000_000) < 1_000  # dispatch to results


def test_a_rerank_whose_long_document_is_read_in_windows_says_how_many_ran():
    made, exported = traces()
    long_document = Encoded((1, 2, 3), False, more=((1, 4, 5), (1, 6, 7)))
    request = pending("rerank", [Encoded((1, 8), False), long_document])
    made.received(request, tokenized=1.002, hits=0)
    made.answered(request)
    span = exported.get_finished_spans()[-1]
    assert span.attributes["numaserve.windows"] == 4  # 1 for the short one, 3 for the long


def test_an_instance_reads_a_traceparent_as_w3cs_propagator_does():
    given = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    context = span_context(given)
    extracted = get_current_span(TraceContextTextMapPropagator().extract({"traceparent": given}))
    assert context == extracted.get_span_context() and traceparent(context) == given
    for malformed in (
        None,
        "",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # no trace
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # no span
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # a forbidden version
        "00-4bf92f3577b34da6a3ce929d0e0e473x-00f067aa0ba902b7-01",  # not hex
    ):
        assert span_context(malformed) is None, malformed


def test_a_forward_pass_of_two_requests_is_a_child_of_the_first_and_linked_to_the_second():
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    tracing = Tracing(provider.get_tracer("test"), provider, CountedExporter(exported))
    first = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    second = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    tracing.batch([first, second, None], "forward pass", 0.012, {"numaserve.batch.texts": 3})
    (span,) = exported.get_finished_spans()
    assert traceparent(span.parent) == first  # in the first's trace
    assert [traceparent(link.context) for link in span.links] == [second]
    assert span.end_time - span.start_time == 12_000_000
