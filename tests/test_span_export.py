"""Spans on their way out of a process (processes/tracing.py): what a collector never gets is
counted, whichever way it was lost. A real SDK, exporter and socket, in a process of its own
(the SDK's tracer provider is one per process)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

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
