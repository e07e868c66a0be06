"""Spans on their way out of a process (processes/tracing.py): what a collector never gets is
counted, whichever way it was lost. A real SDK, exporter and socket, in a process of its own
(the SDK's tracer provider is one per process)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from numaserve.processes.tracing import ENDPOINTS, described

# A process that traces to a collector that takes connections and never answers: its export
# hangs, its queue (16 spans) fills, and what it makes after is dropped. It prints the count
# of spans lost, and leaves without waiting for the hung export.
HUNG_EXPORT = """
import os, time
from numaserve.processes.tracing import start
tracing = start("test")
for i in range(200):
    tracing.tracer.start_span(f"span {i}").end()
time.sleep(1)
print(tracing.dropped(), flush=True)
os._exit(0)
"""


def test_spans_dropped_from_a_full_queue_behind_a_hung_collector_are_counted():
    listener = socket.create_server(("127.0.0.1", 0), backlog=64)  # never accepts
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{listener.getsockname()[1]}",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "60",  # no export fails while the test looks
        "OTEL_BSP_MAX_QUEUE_SIZE": "16",
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "4",
    }
    with listener:
        run = subprocess.run(
            [sys.executable, "-c", HUNG_EXPORT], env=env, capture_output=True, text=True, timeout=60
        )
    assert run.returncode == 0, run.stderr
    # 200 made: at most 16 queued and one batch of 4 in the hung export; the rest lost
    assert int(run.stdout) >= 200 - 16 - 4


CONSOLE = """
from numaserve.processes.tracing import start
tracing = start("test")
tracing.tracer.start_span("a span to print").end()
tracing.close()
"""


def test_otel_traces_exporter_console_prints_each_span_with_no_collector():
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "console"}
    for name in ENDPOINTS:
        env.pop(name, None)
    run = subprocess.run(
        [sys.executable, "-c", CONSOLE], env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert '"name": "a span to print"' in run.stdout


@pytest.mark.parametrize(
    ("environ", "said"),
    [
        (
            {},
            "traces: off (name an OTLP endpoint in server.tracing.endpoint or "
            "OTEL_EXPORTER_OTLP_ENDPOINT, or set OTEL_TRACES_EXPORTER=console)",
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"},
            "traces: exported over OTLP (http/protobuf) to http://collector:4318, "
            "sampler parentbased_always_on",
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                "OTEL_TRACES_SAMPLER_ARG": "0.1",
            },
            "traces: exported over OTLP (grpc) to http://collector:4317, "
            "sampler parentbased_traceidratio 0.1",
        ),
        (
            {"OTEL_TRACES_EXPORTER": "console"},
            "traces: printed on standard output (OTEL_TRACES_EXPORTER=console), "
            "sampler parentbased_always_on",
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
                "OTEL_TRACES_EXPORTER": "none",
            },
            "traces: off (OTEL_TRACES_EXPORTER=none)",
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"},
            "traces: off (OTEL_SDK_DISABLED=true)",
        ),
    ],
)
def test_the_start_says_in_one_line_whether_traces_go_where_and_how_sampled(environ, said):
    assert described(environ) == said
