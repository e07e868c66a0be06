"""The router end to end: real router and worker processes, real sockets, the real client."""

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import msgpack
import numpy as np
import psutil
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numaserve.client import AsyncClient, BadRequest, Client, DeadlineExceeded, Overloaded, TooLong
from numaserve.testing.cluster import Cluster
from numaserve.wire import protocol
from tests.harness.waiting import eventually

# A named model path: `quantize: auto` would race the candidates for each of these layouts
# first (tests/test_choice.py covers that); the router is what this file tests.
LENGTH_POOLS = """
model: {backend: onnxruntime, quantize: int8}
server: {heartbeat_ms: 200}
placement:
  pools:
    - {name: short, max_tokens: 16, instances: 1}
    - {name: long, max_tokens: 256, instances: 1}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("router"), LENGTH_POOLS).start()
    yield c
    c.stop()


@pytest.fixture
def client(cluster):
    with cluster.client(timeout=10) as c:
        yield c


def served(status, name):
    return next(i["served"] for i in status["instances"] if i["name"] == name)


def raw_request(cluster, *frames, timeout=10.0):
    """Send frames on a fresh DEALER socket; the reply body, or None if none came."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(cluster.endpoint)
    try:
        sock.send_multipart(list(frames))
        if not sock.poll(timeout * 1000):
            return None
        return msgpack.unpackb(sock.recv_multipart()[-1], raw=False)
    finally:
        sock.close()


def test_embed_returns_unit_vectors_with_token_counts(client):
    a, b = client.embed(["The quick brown fox.", "A second, different sentence."])
    assert a.vector.shape == (384,) and a.vector.dtype == np.float32
    assert abs(np.linalg.norm(a.vector) - 1) < 1e-4
    assert (a.tokens, a.truncated) == (7, False)
    assert not np.allclose(a.vector, b.vector)


def test_a_single_string_gets_a_single_result(client):
    assert client.embed("Just one text.").vector.shape == (384,)


def test_short_texts_go_to_the_short_pool_and_long_ones_to_the_long_pool(client):
    before = client.status()
    client.embed("A short text about routing.")
    client.embed("A much longer text, " * 8 + "which cannot fit a sixteen-token band.")
    after = client.status()
    assert served(after, "short-0") - served(before, "short-0") == 1
    assert served(after, "long-0") - served(before, "long-0") == 1


def test_texts_over_max_length_are_truncated_and_the_reply_says_so(client):
    result = client.embed("word " * 400)
    assert (result.tokens, result.truncated) == (256, True)


def test_a_repeated_text_is_answered_from_the_cache_without_a_worker(client):
    client.embed("Cache me if you can.")
    before = client.status()
    again = client.embed("Cache me if you can.")
    after = client.status()
    assert sum(i["served"] for i in after["instances"]) == sum(
        i["served"] for i in before["instances"]
    )
    assert after["cache"]["hits"] == before["cache"]["hits"] + 1
    assert again.vector.shape == (384,)


def test_status_reports_instances_pools_and_cache(client):
    status = client.status()
    assert {i["name"] for i in status["instances"]} == {"short-0", "long-0"}
    assert [p["name"] for p in status["pools"]] == ["short", "long"]
    assert set(status["cache"]) >= {"hits", "misses", "hit_rate", "entries"}


def test_the_router_never_loads_torch(cluster):
    # It only tokenizes: torch would cost it 250 MB (docs/benchmarks.md, Peers).
    maps = Path(f"/proc/{cluster.router.pid}/maps").read_text()
    assert "tokenizers" in maps and "libtorch" not in maps


def test_closed_client_connections_are_counted_and_logged_in_summary(cluster, client):
    before = client.status()["requests"]["client_disconnects"]
    summary = re.compile(r"(\d+) client connection\(s\) closed.*\((\d+) in all\)")
    logged_before = len(summary.findall(cluster.log("router")))
    for _ in range(30):  # one connection per request, as the CLI makes
        with cluster.client(timeout=5) as c:
            c.ping()
    deadline = time.monotonic() + 10
    while client.status()["requests"]["client_disconnects"] < before + 30:
        assert time.monotonic() < deadline, "the router did not see the connections close"
        time.sleep(0.1)
    # Logged as they happen, or (within SUMMARY_LOG_S of an earlier line) at the next flush.
    deadline = time.monotonic() + 15
    while not any(int(total) >= before + 30 for _, total in summary.findall(cluster.log("router"))):
        assert time.monotonic() < deadline, "the closed connections were never logged"
        time.sleep(0.2)
    new_lines = summary.findall(cluster.log("router"))[logged_before:]
    assert 1 <= len(new_lines) <= 2  # a summary, not a line per connection


def test_ping_measures_the_round_trip_through_the_router(cluster, client):
    assert client.ping() < 0.25
    os.kill(cluster.router.pid, signal.SIGSTOP)  # the router answers 0.5 s late
    resume = threading.Timer(0.5, os.kill, (cluster.router.pid, signal.SIGCONT))
    resume.start()
    try:
        late = client.ping()
    finally:
        resume.join()
    # The ping starts a moment after the timer (0.003 s here, more on a busy machine), and
    # waits that much less than 0.5 s.
    assert 0.4 <= late < 2


def test_a_request_for_a_model_the_server_does_not_serve_names_the_one_it_does(cluster):
    with (
        cluster.client(timeout=10, model="toxicity") as c,
        pytest.raises(BadRequest, match="no model 'toxicity' here; this server serves 'default'"),
    ):
        c.embed("For another model.")


def test_a_request_may_name_the_only_model_default(cluster):
    with cluster.client(timeout=10, model="default") as c:
        assert c.embed("Named.").tokens > 0
        assert c.status()["instances"]  # status is the server's, whatever the model


def test_an_op_the_model_does_not_do_is_a_bad_request(client):
    with pytest.raises(BadRequest, match="does embed, not classify"):
        client.classify("Not a classifier.")


@pytest.mark.parametrize(
    "body, message",
    [
        ({"id": 1, "op": "summarize", "texts": ["x"]}, "unknown op 'summarize'"),
        ({"id": 2, "op": "embed", "texts": []}, "needs texts"),
        ({"id": 3, "op": "embed", "texts": ["fine", "  "]}, "text 1 is empty"),
        (
            {"id": 4, "op": "embed", "texts": ["x"] * 2049},
            "2049 texts in one request; the limit is 2048",
        ),
        (
            {"id": 41, "op": "embed", "texts": ["x"] * 65, "token_vectors": True},
            "65 texts ask for token vectors; the limit is 64",
        ),
        (
            {"id": 42, "op": "embed", "texts": ["x"], "priority": "urgent"},
            "priority must be interactive (the default) or bulk",
        ),
        ({"id": 5, "op": "embed", "texts": [7]}, "text 0 is not a string"),
        ({"id": 6, "op": "embed", "texts": ["x"], "deadline": 5}, "unknown key 'deadline'"),
        (
            {"id": 7, "op": "embed", "texts": ["x"], "deadline_ms": -1},
            "deadline_ms must be a number of milliseconds above 0",
        ),
        (
            {"id": 8, "op": "embed", "texts": ["x"], "deadline_ms": float("nan")},
            "deadline_ms must be a number of milliseconds above 0 and at most 3600000",
        ),
        (
            {"id": 9, "op": "embed", "texts": ["x"], "deadline_ms": 1e300},
            "deadline_ms must be a number of milliseconds above 0 and at most 3600000",
        ),
        ({"op": "ping"}, "id must be an integer or a string"),
        (
            {"id": 10, "op": "embed", "texts": ["x"], "model": 7},
            "model must be a model's name: a string of 1-64 characters",
        ),
        ({"id": 11, "op": "embed", "texts": ["x"], "model": "m" * 65}, "model must be"),
        ({"id": 12, "op": "embed", "texts": ["x"], "model": "toxicity"}, "no model 'toxicity'"),
    ],
)
def test_bad_requests_get_a_clear_error_and_the_router_keeps_serving(
    cluster, client, body, message
):
    reply = raw_request(cluster, protocol.VERSION, msgpack.packb(body))
    assert reply["status"] == "error"
    assert reply["error"]["code"] == "bad_request"
    assert message in reply["error"]["message"]
    assert reply["id"] == body.get("id")
    assert client.embed("still serving").tokens > 0


def test_text_that_is_not_utf8_is_named(cluster):
    body = (
        b"\x83\xa2id\x09\xa2op\xa5embed\xa5texts\x91\xa3\xff\xfe\xfd"  # texts: [str with bad bytes]
    )
    reply = raw_request(cluster, protocol.VERSION, body)
    assert (reply["id"], reply["error"]["code"]) == (9, "bad_request")
    assert reply["error"]["message"] == "text 0 is not valid UTF-8"


@pytest.mark.parametrize("version", [protocol.VERSION, b"NS9"])
def test_an_id_that_is_not_utf8_is_answered_and_the_router_lives(cluster, client, version):
    body = b"\x82\xa2id\xa1\xff\xa2op\xa4ping"  # {"id": "\xff", "op": "ping"}: 20 bytes
    pid = cluster.router.pid
    for _ in range(3):
        reply = raw_request(cluster, version, body)
        assert (reply["id"], reply["status"], reply["error"]["code"]) == (
            None,
            "error",
            "bad_request",
        )
    assert cluster.router.poll() is None and cluster.router.pid == pid
    assert client.ping() > 0


def test_a_4_mib_text_costs_the_router_under_half_a_second_and_no_lasting_memory(cluster, client):
    router = psutil.Process(cluster.router.pid)
    text = "All work and no play makes a dull model. " * ((4 << 20) // 41 - 100)
    client.embed("warm")
    rss, cpu = router.memory_info().rss, sum(router.cpu_times()[:2])
    result = client.embed(text)
    assert (result.tokens, result.truncated) == (256, True)
    assert sum(router.cpu_times()[:2]) - cpu < 0.5
    assert router.memory_info().rss - rss < 20 << 20


def test_a_wrong_protocol_version_is_answered(cluster):
    reply = raw_request(cluster, b"NS9", msgpack.packb({"id": 11, "op": "ping"}))
    assert reply["id"] == 11 and "unsupported protocol version" in reply["error"]["message"]


def test_unparseable_frames_are_dropped_and_logged(cluster, client):
    assert raw_request(cluster, protocol.VERSION, b"\xc1\xc1", timeout=0.5) is None
    assert raw_request(cluster, b"only one frame", timeout=0.5) is None
    assert client.ping() > 0
    assert "dropped an unparseable client message" in cluster.log("router")


def test_a_message_over_the_size_limit_is_dropped_and_the_router_keeps_serving(cluster, client):
    huge = msgpack.packb({"id": 1, "op": "embed", "texts": ["x" * (5 << 20)]})
    assert raw_request(cluster, protocol.VERSION, huge, timeout=1) is None
    assert client.embed("after the flood").tokens > 0


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    frames=st.lists(st.binary(max_size=64), min_size=0, max_size=4)
    | st.builds(lambda b: [protocol.VERSION, b], st.binary(max_size=64))
    | st.builds(
        lambda v: [protocol.VERSION, msgpack.packb(v)],
        st.recursive(
            st.none()
            | st.booleans()
            | st.integers(-(2**63), 2**64 - 1)  # what msgpack can encode at all
            | st.text(max_size=8)
            | st.binary(max_size=8),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(st.text(max_size=6), inner, max_size=4)
            ),
            max_leaves=8,
        ),
    )
)
def test_malformed_frames_never_stop_the_router(cluster, client, frames):
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(cluster.endpoint)
    if frames:
        sock.send_multipart(frames)
    sock.close()
    assert client.ping() > 0


def test_async_client_serves_many_coroutines_at_once(cluster):
    async def run():
        async with AsyncClient(cluster.endpoint, timeout=10) as client:
            texts = [f"Concurrent text number {i}." for i in range(12)]
            results = await asyncio.gather(*(client.embed(t) for t in texts))
            status = await client.status()
            return results, status

    results, status = asyncio.run(run())
    assert len(results) == 12 and all(r.vector.shape == (384,) for r in results)
    assert status["task"] == "embed"


def test_client_fails_over_to_the_next_endpoint(cluster):
    with Client(["tcp://127.0.0.1:1", cluster.endpoint], timeout=0.5, retries=2) as client:
        assert client.embed("failover works").tokens > 0


def test_cli_embed_prints_json(cluster):
    exe = os.path.join(os.path.dirname(sys.executable), "numaserve")
    out = subprocess.run(
        [exe, "embed", "hello there", "--endpoint", cluster.endpoint],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    (result,) = json.loads(out.stdout)["results"]
    assert len(result["embedding"]) == 384 and result["truncated"] is False


@pytest.mark.parametrize(
    "mode, expected",
    [(["--clients", "3", "--requests", "5"], 15), (["--rate", "20", "--duration", "1"], 20)],
)
def test_bench_drives_a_live_server_and_reports_json(cluster, tmp_path, mode, expected):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a short text\n" + "a much longer text " * 10 + "\n")
    exe = os.path.join(os.path.dirname(sys.executable), "numaserve")
    out = subprocess.run(
        [exe, "bench", "--endpoint", cluster.endpoint, "--corpus", str(corpus), "--json", *mode],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["ok"] == summary["requests"] == expected and summary["errors"] == {}
    assert (
        0
        < summary["latency_ms"]["p50"]
        <= summary["latency_ms"]["p99"]
        <= summary["latency_ms"]["max"]
    )


STRICT = """
model: {truncate: false, max_length: 256, backend: onnxruntime, quantize: int8}
server: {queue_size: 4, max_batch: 4, max_batch_tokens: 1024, max_texts: 8, heartbeat_ms: 1000}
placement:
  pools:
    - {name: all, max_tokens: 256, instances: 1}
"""


@pytest.fixture(scope="module")
def strict(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("strict"), STRICT).start()
    yield c
    c.stop()


def test_too_long_text_is_refused_when_truncation_is_off(strict):
    with (
        strict.client(timeout=10) as client,
        pytest.raises(TooLong, match="text 1 has 302 tokens; the limit is 256"),
    ):
        client.embed(["fine", "word " * 300])


def send_texts(cluster, texts: list[str], request_id="busy"):
    """Send one request on a socket of its own, without waiting for the reply."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(cluster.endpoint)
    sock.send_multipart(protocol.pack({"id": request_id, "op": "embed", "texts": texts}))
    return sock


def long_texts(tag: str, n: int = 4) -> list[str]:
    """n texts of about 250 tokens: as one micro-batch, a forward pass of about 0.1 s here."""
    return [f"{tag} {i} " + "busy work " * 120 for i in range(n)]


@contextmanager
def paused_on_a_busy_batch(cluster, client, tag: str):
    """Send a busy batch, and pause (SIGSTOP) the one instance once it holds it: nothing
    queued can drain under the test, however slow the host. The pause stays well inside the
    heartbeat expiry (3 s in STRICT). Yields the busy request's socket."""
    (worker,) = cluster.workers.values()
    busy = send_texts(cluster, long_texts(tag))
    eventually(lambda: client.status()["instances"][0]["busy"] > 0, timeout=10, every=0.005)
    os.kill(worker.pid, signal.SIGSTOP)
    try:
        yield busy
    finally:
        os.kill(worker.pid, signal.SIGCONT)


def test_expired_request_is_answered_deadline_exceeded_and_never_run(strict):
    with strict.client(timeout=10, retries=0) as client:
        entries = client.status()["cache"]["entries"]
        with (
            paused_on_a_busy_batch(strict, client, "deadline") as busy,
            pytest.raises(DeadlineExceeded),
        ):
            client.embed("too late for this", deadline_ms=20)
        assert busy.poll(30_000)
        busy.close()
        assert client.status()["cache"]["entries"] == entries + 4  # the busy texts, not ours


def test_a_flood_gets_overloaded_replies_memory_stays_bounded_and_it_recovers(strict):
    router = psutil.Process(strict.router.pid)
    flood = zmq.Context.instance().socket(zmq.DEALER)
    flood.linger = 0
    flood.connect(strict.endpoint)
    rss_before = router.memory_info().rss
    for round_ in range(5):
        for i in range(400):
            body = {"id": i, "op": "embed", "texts": [f"flood {round_} {i} " + "x " * 20]}
            flood.send_multipart(protocol.pack(body))
        codes = {}
        for _ in range(400):
            assert flood.poll(60_000)
            reply = protocol.unpack(flood.recv_multipart())
            code = reply["status"] if reply["status"] == "ok" else reply["error"]["code"]
            codes[code] = codes.get(code, 0) + 1
        assert codes.get("overloaded", 0) > 300, codes
        assert set(codes) <= {"ok", "overloaded"}
    flood.close()
    assert router.memory_info().rss - rss_before < 50 << 20
    with strict.client(timeout=10) as client:
        assert client.embed("calm again").tokens > 0
        assert client.status()["pools"][0]["queue"] == 0


def test_overloaded_is_raised_by_the_client(strict):
    with (
        strict.client(timeout=10, retries=0) as client,
        paused_on_a_busy_batch(strict, client, "overload") as busy,
    ):
        queued = send_texts(strict, long_texts("queued"), request_id="queued")
        # the queue is full
        eventually(lambda: client.status()["pools"][0]["queue"] == 4, timeout=10, every=0.005)
        with pytest.raises(Overloaded):
            client.embed("no room")
    for sock in (busy, queued):
        assert sock.poll(60_000)
        sock.close()


RETRY = """
model: {backend: onnxruntime, quantize: int8}
server: {heartbeat_ms: 100, heartbeat_liveness: 3, max_batch: 8}
placement:
  pools:
    - {name: all, max_tokens: 256, instances: 2}
"""


def test_a_worker_killed_mid_request_is_retried_on_another(tmp_path):
    cluster = Cluster(tmp_path, RETRY).start()
    try:
        sock = send_texts(cluster, long_texts("retry", 8))
        deadline = time.monotonic() + 10
        with cluster.client(timeout=10) as client:
            while time.monotonic() < deadline:
                busy = [i for i in client.status()["instances"] if i["busy"]]
                if busy:
                    break
                time.sleep(0.01)
            os.kill(busy[0]["pid"], signal.SIGKILL)
            assert sock.poll(60_000), "no answer after the worker died"
            reply = protocol.unpack(sock.recv_multipart())
            assert reply["status"] == "ok" and len(reply["results"]) == 8
            assert "missed 3 heartbeats: dropped; retrying its" in cluster.log("router")
            assert client.embed("the survivor still serves").tokens > 0
    finally:
        cluster.stop()
