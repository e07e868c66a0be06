"""The first request after a start is served about as fast as the next ones: every path of
every instance warmed at the shapes it runs (worker.py), and what a router shard, an HTTP front
and a client load on a first reply (numpy, OpenTelemetry's propagator) loaded before it. A
real server (`numaserve start`), real clients, over ZeroMQ and HTTP."""

import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from numaserve.client import Client
from numaserve.testing.server import ENDPOINT, Server

CONFIG = f"""
model: {{path: bundled:minilm, backend: onnxruntime, quantize: int8}}
server: {{endpoint: "{ENDPOINT}", cache_entries: 0}}
placement: {{pools: [{{name: main, max_tokens: 256, cores_per_instance: 1, instances: 2}}]}}
"""
TEXTS = [f"How do I reset the password of account {i}?" for i in range(20)]


def loaded(pid: int, library: str) -> bool:
    return library in Path(f"/proc/{pid}/maps").read_text()


def timed(call) -> list[float]:
    """Each text's round trip in ms, the first first."""
    times = []
    for text in TEXTS:
        started = time.perf_counter()
        call(text)
        times.append((time.perf_counter() - started) * 1e3)
    return times


def within_3x_of_the_tenth(times: list[float]) -> bool:
    return times[0] <= 3 * statistics.median(times[9:])


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = Server(tmp_path_factory.mktemp("first"), CONFIG)
    server.wait_ready()
    yield server
    server.stop()


@pytest.mark.slow
def test_a_shard_and_an_http_front_hold_numpy_before_their_first_request(server):
    for pid in (server.shard_pid(0), *server.http_pids()):
        assert loaded(pid, "_multiarray_umath"), pid


@pytest.mark.slow
def test_the_first_request_over_zeromq_is_within_3x_of_the_tenth(server):
    with Client(server.endpoint, timeout=10) as client:
        times = timed(client.embed)
    assert within_3x_of_the_tenth(times), [round(t, 1) for t in times]


@pytest.mark.slow
def test_the_first_request_over_http_is_within_3x_of_the_tenth(server):
    with httpx.Client(base_url=server.url) as http:
        http.get("/health")  # the connection: the client's own cost, not the server's
        times = timed(lambda text: http.post("/embed", json={"inputs": text}).raise_for_status())
    assert within_3x_of_the_tenth(times), [round(t, 1) for t in times]


def test_a_client_loads_what_its_first_reply_needs_when_it_is_made():
    made = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from numaserve.client import Client;"
            "assert 'numpy' not in sys.modules; Client('tcp://127.0.0.1:9');"
            "print('numpy' in sys.modules, 'opentelemetry.trace.propagation.tracecontext' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert made.stdout.split() == ["True", "True"]
