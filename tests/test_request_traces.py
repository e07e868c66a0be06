"""A shard's spans of one request (router/traces.py), made by OpenTelemetry's own SDK and
read back from its in-memory exporter: what each says, without a server."""

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from numaserve.backends.tokenizer import Encoded
from numaserve.processes.tracing import CountedExporter, Tracing
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


def test_a_request_span_says_its_texts_tokens_and_cache_hits_and_tokenizing_is_its_child():
    made, exported = traces()
    request = pending("embed", [Encoded((1, 2, 3), False), Encoded((1, 2), True)])
    made.received(request, tokenized=1.002, hits=1)
    made.answered(request)
    tokenize, span = exported.get_finished_spans()
    assert span.name == "numaserve/embed" and tokenize.parent.span_id == span.context.span_id
    assert span.attributes["numaserve.texts"] == 2
    assert span.attributes["numaserve.tokens"] == 5
    assert span.attributes["numaserve.truncated"] == 1
    assert span.attributes["numaserve.cache.hits"] == 1
    assert "numaserve.windows" not in span.attributes  # none read in windows


def test_a_rerank_whose_long_document_is_read_in_windows_says_how_many_ran():
    made, exported = traces()
    long_document = Encoded((1, 2, 3), False, more=((1, 4, 5), (1, 6, 7)))
    request = pending("rerank", [Encoded((1, 8), False), long_document])
    made.received(request, tokenized=1.002, hits=0)
    made.answered(request)
    span = exported.get_finished_spans()[-1]
    assert span.attributes["numaserve.windows"] == 4  # 1 for the short one, 3 for the long
