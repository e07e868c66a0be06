"""OpenTelemetry traces across the processes: a real server whose processes export to a real
OTLP receiver (numaserve/testing/otlp.py: OpenTelemetry's own protobuf messages, over HTTP and
over gRPC), real requests over HTTP and ZeroMQ, and the spans each process sent."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from numaserve.client import Client
from numaserve.testing.otlp import GrpcReceiver, HttpReceiver
from numaserve.testing.ports import free_port
from tests.harness import server as server_
from tests.harness.waiting import eventually

pytestmark = pytest.mark.slow

CONFIG = """
model: {path: "bundled:minilm", max_length: 128, backend: torch, quantize: none}
server: {endpoint: "@ENDPOINT@", max_batch: 4, slow_request_ms: 1}
placement: {pools: [{name: main, max_tokens: 128, instances: 1}]}
"""
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TEI_TIMING = (
    "x-compute-time",
    "x-total-time",
    "x-tokenization-time",
    "x-queue-time",
    "x-inference-time",
)
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}  # spans leave within 0.1 s


@pytest.fixture(scope="module")
def receiver():
    made = HttpReceiver()
    yield made
    made.close()


@pytest.fixture(scope="module")
def traced(tmp_path_factory, receiver):
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, **FAST_EXPORT}
    grpc = f"127.0.0.1:{free_port()}"
    config = CONFIG.replace("slow_request_ms: 1", f'slow_request_ms: 1, grpc: "{grpc}"')
    s = server_.Server(tmp_path_factory.mktemp("traced"), config, env=env)
    s.wait_ready()
    s.grpc = grpc
    yield s
    s.stop()


def spans_of(receiver, trace_id: str, names: set[str]) -> dict:
    """The trace's spans by name, once every one of `names` has come."""

    def arrived():
        spans = {s.name: s for s in receiver.received.of_trace(trace_id)}
        return spans if names <= set(spans) else None

    return eventually(arrived, timeout=30, every=0.1)


def test_an_http_request_is_one_trace_across_front_shard_and_worker_in_its_callers_trace(
    traced, receiver
):
    headers = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"}
    with httpx.Client(base_url=traced.url, timeout=30) as http:
        answer = http.post("/embed", json={"inputs": ["a traced text"]}, headers=headers)
    assert answer.status_code == 200
    assert answer.headers["traceresponse"].startswith(f"00-{CALLER_TRACE}-")
    names = {"POST /embed", "numaserve/embed", "forward pass"}
    spans = spans_of(receiver, CALLER_TRACE, names)
    front, shard, worker = spans["POST /embed"], spans["numaserve/embed"], spans["forward pass"]
    # parented as the request flowed: caller -> front -> shard -> forward pass
    assert front.parent_id == CALLER_SPAN
    assert shard.parent_id == front.span_id
    assert worker.parent_id == shard.span_id
    assert [s.resource["numaserve.process"] for s in (front, shard, worker)] == [
        "front",
        "router",
        "worker",
    ]
    assert front.resource["service.name"] == "numaserve"
    assert front.kind == 2 and shard.kind == 2  # server, server
    assert front.attributes["http.route"] == "/embed"
    assert front.attributes["http.response.status_code"] == 200
    assert shard.attributes["rpc.method"] == "embed"
    assert shard.attributes["numaserve.texts"] == 1
    assert "numaserve.cache.hits" not in shard.attributes  # none: counts of 0 are left out
    assert shard.attributes["numaserve.tokenize_ms"] >= 0
    ((event, dispatched),) = shard.events  # its one job: which instance, its wait in the queue
    assert event == "dispatched" and dispatched["numaserve.queue_ms"] >= 0
    assert shard.resource["numaserve.model"] == "default"
    # what holds for every span of an instance is on its resource
    assert worker.resource["numaserve.instance"] == dispatched["numaserve.instance"]
    assert worker.attributes["numaserve.batch.texts"] == 1
    head_ms = worker.attributes["numaserve.head_ms"]  # the pooling, within the pass's time
    assert 0 < head_ms * 1_000_000 < worker.end_ns - worker.start_ns
    assert worker.resource["numaserve.model.backend"] == "torch"
    assert "numaserve.cpus" in worker.resource and "numaserve.numa_nodes" in worker.resource
    # each child inside its parent's time
    assert front.start_ns <= shard.start_ns <= worker.start_ns <= worker.end_ns <= front.end_ns


def test_a_grpc_call_joins_its_callers_trace_from_its_metadata(traced, receiver):
    import grpc

    from numaserve.grpc_api.proto import tei

    pb, stubs = tei()
    trace = "5bf92f3577b34da6a3ce929d0e0e4737"
    with grpc.insecure_channel(traced.grpc) as channel:
        reply = stubs.EmbedStub(channel).Embed(
            pb.EmbedRequest(inputs="a text traced over gRPC"),  # not cached: it runs
            metadata=(("traceparent", f"00-{trace}-{CALLER_SPAN}-01"),),
        )
    assert len(reply.embeddings) == 384
    spans = spans_of(receiver, trace, {"tei.v1.Embed/Embed", "numaserve/embed", "forward pass"})
    front, shard = spans["tei.v1.Embed/Embed"], spans["numaserve/embed"]
    assert front.parent_id == CALLER_SPAN and shard.parent_id == front.span_id
    assert front.kind == 2 and front.attributes["rpc.system"] == "grpc"
    assert front.attributes["rpc.grpc.status_code"] == 0
    assert front.resource["numaserve.process"] == "front"


def test_an_http_reply_says_where_its_time_went_as_tei_does_and_the_log_leads_to_its_trace(
    traced,
):
    headers = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01", "x-request-id": "req-42"}
    with httpx.Client(base_url=traced.url, timeout=30) as http:
        answer = http.post("/embed", json={"inputs": ["one text", "two"]}, headers=headers)
        unnamed = http.post("/embed", json={"inputs": "x"}, headers={"x-request-id": "a b"})
    assert answer.headers["x-request-id"] == "req-42"
    assert len(unnamed.headers["x-request-id"]) == 32  # not a plain token: one is made
    timing = {h: int(answer.headers[h]) for h in TEI_TIMING}
    assert all(ms >= 0 for ms in timing.values())
    assert timing["x-compute-time"] <= timing["x-total-time"]
    assert answer.headers["x-compute-characters"] == "11"
    assert int(answer.headers["x-compute-tokens"]) == 4 + 3  # with [CLS] and [SEP] each
    # server.slow_request_ms: 1 logs every request, with where its time went and its ids
    line = eventually(
        lambda: next((x for x in traced.log().splitlines() if "request_id=req-42" in x), None)
    )
    assert "slow request POST /embed -> 200" in line and f"trace_id={CALLER_TRACE}" in line


def test_a_python_client_with_an_active_span_gets_numaserves_spans_in_its_trace(traced, receiver):
    from opentelemetry.sdk.trace import TracerProvider

    caller = TracerProvider().get_tracer("the caller")
    with caller.start_as_current_span("caller's work") as span:
        with Client(traced.endpoint, timeout=30) as client:
            client.embed(["a text from a traced service"])
        trace_id = f"{span.get_span_context().trace_id:032x}"
        caller_span = f"{span.get_span_context().span_id:016x}"
    spans = spans_of(receiver, trace_id, {"numaserve/embed", "forward pass"})
    assert spans["numaserve/embed"].parent_id == caller_span


def test_a_zeromq_request_without_a_trace_starts_its_own(traced, receiver):
    before = {s.trace_id for s in receiver.received.spans}
    with Client(traced.endpoint, timeout=30) as client:
        client.embed(["a request with no trace of its own"])

    def new_trace():
        shards = [
            s for s in receiver.received.spans if s.trace_id not in before and not s.parent_id
        ]
        return shards[0] if shards else None

    root = eventually(new_trace, timeout=30, every=0.1)
    assert root.name == "numaserve/embed"  # the shard's span is the trace's root
    spans = spans_of(receiver, root.trace_id, {"forward pass"})
    assert spans["forward pass"].trace_id == root.trace_id


def test_otlp_over_grpc_with_headers_and_a_ratio_of_zero_sends_only_the_callers_traces(
    tmp_path,
):
    """Over gRPC, with the auth header a hosted backend wants, sampling no trace of its own
    (parent-based, ratio 0): a request with no trace sends nothing; one in a sampled caller's
    trace is traced whole."""
    grpc = GrpcReceiver()
    try:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": grpc.endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20secret-token",
            "OTEL_SERVICE_NAME": "search-embedder",
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0",
            **FAST_EXPORT,
        }
        s = server_.Server(tmp_path, CONFIG, env=env)
        try:
            s.wait_ready()
            with Client(s.endpoint, timeout=30) as client:
                client.embed(["no trace, and a ratio of 0: not sampled"])
            headers = {"traceparent": f"00-{CALLER_TRACE[::-1]}-{CALLER_SPAN}-01"}
            with httpx.Client(base_url=s.url, timeout=30) as http:
                http.post("/embed", json={"inputs": "over grpc"}, headers=headers)
            spans = spans_of(grpc, CALLER_TRACE[::-1], {"POST /embed", "forward pass"})
            assert spans["forward pass"].resource["service.name"] == "search-embedder"
            assert grpc.received.headers[0]["authorization"] == "Bearer secret-token"
            assert {span.trace_id for span in grpc.received.spans} == {CALLER_TRACE[::-1]}
        finally:
            s.stop()
    finally:
        grpc.close()


def test_a_dead_collector_costs_requests_nothing_and_its_lost_spans_are_counted(tmp_path):
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}",  # no one listens
        "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
        **FAST_EXPORT,
    }
    s = server_.Server(tmp_path, CONFIG, env=env)
    try:
        s.wait_ready()
        with Client(s.endpoint, timeout=30) as client:
            for i in range(20):
                assert len(client.embed([f"text {i} for no collector"])) == 1
        with httpx.Client(base_url=s.url, timeout=30) as http:
            for i in range(5):
                assert http.post("/embed", json={"inputs": f"http {i}"}).status_code == 200

        eventually(lambda: dropped(s, "numaserve_router_spans_dropped", 25), timeout=30)
        eventually(lambda: dropped(s, "numaserve_router_instance_spans_dropped", 20), timeout=30)
        eventually(lambda: dropped(s, "numaserve_http_spans_dropped", 5), timeout=30)
    finally:
        s.stop()


def dropped(server, name: str, least: int) -> bool:
    """Whether /metrics counts at least `least` for the counter `name`."""
    text = httpx.get(f"http://{server.metrics}/metrics", timeout=5).text
    line = next((x for x in text.splitlines() if x.startswith(name + "_total")), "")
    return bool(line) and float(line.rsplit(" ", 1)[1]) >= least


# A receiver in a process of its own, to be killed: its address, then its count of spans
# received each time it grows.
RECEIVER = """
import time
from numaserve.testing.otlp import HttpReceiver
receiver, seen = HttpReceiver(), 0
print(receiver.endpoint, flush=True)
while True:
    time.sleep(0.05)
    if len(receiver.received.spans) != seen:
        seen = len(receiver.received.spans)
        print(seen, flush=True)
"""


def test_a_collector_killed_mid_run_costs_requests_nothing_and_its_lost_spans_are_counted(
    tmp_path,
):
    collector = subprocess.Popen(
        [sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE, text=True
    )
    endpoint = collector.stdout.readline().strip()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_TIMEOUT": "1"}
    s = server_.Server(tmp_path, CONFIG, env={**env, **FAST_EXPORT})
    try:
        s.wait_ready()
        with Client(s.endpoint, timeout=30) as client:
            for i in range(10):
                assert len(client.embed([f"text {i} while the collector runs"])) == 1
            while int(collector.stdout.readline()) < 10 * 2:  # each: the shard's, the worker's
                pass
            collector.kill()
            collector.wait()
            for i in range(20):
                assert len(client.embed([f"text {i} after the collector died"])) == 1
        assert s.proc.poll() is None
        eventually(lambda: dropped(s, "numaserve_router_spans_dropped", 20), timeout=30)
        eventually(lambda: dropped(s, "numaserve_router_instance_spans_dropped", 20), timeout=30)
    finally:
        collector.kill()
        s.stop()
