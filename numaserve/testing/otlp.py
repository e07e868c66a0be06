"""A real OTLP trace receiver, for tests and benchmarks (tests/test_tracing.py,
benchmarks/default_ab.py --collector): OTLP over HTTP/protobuf (POST /v1/traces) and over gRPC
(TraceService/Export), decoding OpenTelemetry's own `opentelemetry-proto` messages into one
flat record per span, as a collector would receive them."""

from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclass(frozen=True)
class Span:
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root
    name: str
    kind: int  # opentelemetry.proto's SpanKind: 2 server, 3 client, 1 internal
    start_ns: int
    end_ns: int
    attributes: dict
    resource: dict  # service.name, numaserve.process, ...
    links: tuple[str, ...]  # the span ids linked to
    status: int  # 0 unset, 1 ok, 2 error
    events: tuple[tuple[str, dict], ...] = ()  # (name, attributes) of each, in order


def _value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def _attributes(pairs) -> dict:
    return {a.key: _value(a.value) for a in pairs}


@dataclass
class Received:
    spans: list[Span] = field(default_factory=list)
    headers: list[dict] = field(default_factory=list)  # each export's HTTP headers
    lock: threading.Lock = field(default_factory=threading.Lock)
    undecoded: list[bytes] = field(default_factory=list)  # a lazy receiver's bodies

    def decode_kept(self) -> None:
        """Decode the bodies a lazy receiver kept (HttpReceiver(lazy=True)) into `spans`."""
        with self.lock:
            bodies, self.undecoded = self.undecoded, []
        for body in bodies:
            request = trace_service_pb2.ExportTraceServiceRequest()
            request.ParseFromString(body)
            self.add(request, {})

    def add(self, request: trace_service_pb2.ExportTraceServiceRequest, headers: dict) -> None:
        spans = [
            Span(
                s.trace_id.hex(),
                s.span_id.hex(),
                s.parent_span_id.hex(),
                s.name,
                s.kind,
                s.start_time_unix_nano,
                s.end_time_unix_nano,
                _attributes(s.attributes),
                _attributes(rs.resource.attributes),
                tuple(link.span_id.hex() for link in s.links),
                s.status.code,
                tuple((e.name, _attributes(e.attributes)) for e in s.events),
            )
            for rs in request.resource_spans
            for ss in rs.scope_spans
            for s in ss.spans
        ]
        with self.lock:
            self.spans += spans
            self.headers.append(headers)

    def of_trace(self, trace_id: str) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]


class HttpReceiver:
    """OTLP/HTTP with protobuf bodies on 127.0.0.1, as a collector's `otlp` receiver.
    `lazy`: keep each body as it came and decode none until `received.decode_kept()`, so
    that a benchmark's receiver takes the machine it measures no more time than a collector
    elsewhere would."""

    def __init__(self, lazy: bool = False) -> None:
        self.received = Received()
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                if lazy:
                    with received.lock:
                        received.undecoded.append(body)
                else:
                    request = trace_service_pb2.ExportTraceServiceRequest()
                    request.ParseFromString(body)
                    received.add(request, {k.lower(): v for k, v in self.headers.items()})
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class GrpcReceiver:
    """OTLP/gRPC on 127.0.0.1 (TraceService/Export)."""

    def __init__(self) -> None:
        import grpc

        self.received = Received()
        received = self.received

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):
                received.add(request, dict(context.invocation_metadata()))
                return trace_service_pb2.ExportTraceServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.endpoint = f"http://127.0.0.1:{port}"

    def close(self) -> None:
        self.server.stop(0)
