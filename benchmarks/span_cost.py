"""What a traced request costs a router shard in OpenTelemetry's SDK: its spans made by
router/traces.py as a shard makes them (received, dispatched, ran, answered), then encoded by
OTLP's own encoder, as the batch processor's export would, in microseconds a request.

Run:  .venv/bin/python -m benchmarks.span_cost [--requests 5000]
"""

from __future__ import annotations

import argparse
import time

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from benchmarks import machine
from numaserve.backends.tokenizer import Encoded
from numaserve.processes.tracing import CountedExporter, Tracing
from numaserve.router.dispatch import Item, Job
from numaserve.router.in_flight import Pending
from numaserve.router.traces import RequestTraces
from numaserve.tasks.requests import Request


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5000)
    n = parser.parse_args().requests
    machine.topology()
    kept = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"numaserve.process": "router"}))
    provider.add_span_processor(SimpleSpanProcessor(kept))
    traces = RequestTraces(
        Tracing(provider.get_tracer("numaserve"), provider, CountedExporter(kept))
    )
    start = time.perf_counter()
    for i in range(n):
        now = time.monotonic()
        request = Request(id=i, op="embed", texts=("a text",))
        pending = Pending([b"c"], request, [Encoded((101, 7, 102), False)], [None], None, now)
        traces.received(pending, time.monotonic(), 0)
        job = Job(i, b"w", [Item(pending, 0, (101, 7, 102), 0, queued_at=time.monotonic())])
        traces.dispatched(job, "main-0", time.monotonic())
        traces.ran(job, None, time.monotonic())
        traces.answered(pending)
    made = time.perf_counter() - start
    spans = kept.get_finished_spans()
    start = time.perf_counter()
    for i in range(0, len(spans), 512):  # the batch processor's default batch
        encode_spans(spans[i : i + 512]).SerializeToString()
    encoded = time.perf_counter() - start
    print(f"{len(spans) / n:.0f} span(s) a request")
    print(f"made: {made / n * 1e6:.1f} us a request; encoded: {encoded / n * 1e6:.1f} us")


if __name__ == "__main__":
    main()
