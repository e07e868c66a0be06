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
from numaserve.tasks.requests import Request


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


def test_a_job_is_an_event_on_each_traced_request_it_serves_saying_its_wait_in_the_queue():
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
    for request in (first, second):
        made.answered(request)
    spans = exported.get_finished_spans()
    assert [s.name for s in spans] == ["numaserve/embed"] * 2  # no span of its own
    events = [s.events[0] for s in spans]
    assert {e.name for e in events} == {"dispatched"}
    assert [e.attributes["numaserve.queue_ms"] for e in events] == [8.0, 6.0]
    assert {e.attributes["numaserve.instance"] for e in events} == {"pool0-0"}
    assert {e.attributes["numaserve.batch.texts"] for e in events} == {2}
    # what the instance is told: each request's context, as W3C's propagator would write it
    written = []
    for span in spans:
        carrier: dict[str, str] = {}
        context = set_span_in_context(NonRecordingSpan(span.context))
        TraceContextTextMapPropagator().inject(carrier, context)
        written.append(carrier["traceparent"])
    assert parents == written


def test_an_instances_error_is_an_event_on_each_request_it_failed_still_open():
    made, exported = traces()
    open_, answered = (pending("embed", [Encoded((1, 2), False)]) for _ in range(2))
    for request in (open_, answered):
        made.received(request, tokenized=1.001, hits=0)
    job = Job(7, b"w", [Item(r, 0, (1, 2), 0, queued_at=1.002) for r in (open_, answered)])
    made.dispatched(job, "pool0-0", now=1.010)
    made.answered(answered)  # its deadline passed first: its span has ended
    made.ran(job, {"code": "internal", "message": "the forward pass failed"}, now=1.020)
    made.answered(open_, ("internal", "the forward pass failed"))
    ended_first, ended_last = exported.get_finished_spans()
    assert [e.name for e in ended_first.events] == ["dispatched"]  # nothing after its end
    assert [e.name for e in ended_last.events] == ["dispatched", "instance failed"]
    assert ended_last.events[1].attributes["error.type"] == "internal"


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
