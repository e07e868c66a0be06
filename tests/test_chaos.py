"""Chaos: a real `numaserve start` (two single-core instances, cache off) attacked as a
hostile client and a careless operator would, under load from raw clients that never retry
(tests/raw_load.py), so that every lost request shows. Slow: CI runs it with the slow suite.
docs/reliability.md gives the figures and how they were measured."""

import contextlib
import os
import re
import signal
import time
from pathlib import Path

import msgpack
import psutil
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numaserve.client import Client
from numaserve.config.schema import ServerConfig
from numaserve.testing.load import RawLoad
from numaserve.wire import protocol
from tests.harness import server as server_
from tests.harness.processes import still_running

pytestmark = pytest.mark.slow

CONFIG = """
model: {backend: onnxruntime, quantize: int8}
server: {endpoint: "@ENDPOINT@", cache_entries: 0, heartbeat_ms: 200}
supervisor: {backoff_initial_s: 0.2, stable_s: 3}
placement:
  pools: [{name: main, max_tokens: 256, cores_per_instance: 1, instances: 2}]
"""


def report(outcomes) -> None:
    """The counts, for docs/reliability.md (pytest -s shows them)."""
    print("outcomes:", outcomes.summary())


@pytest.fixture
def server(tmp_path):
    s = server_.Server(tmp_path, CONFIG)
    s.wait_ready()
    yield s
    s.stop()


def test_workers_killed_stopped_and_reloaded_lose_no_request(server):
    load = RawLoad(server.endpoint, clients=2, depth=4)
    time.sleep(1)
    for name, sig in [
        ("main-0", signal.SIGKILL),
        ("main-1", signal.SIGRTMIN + 2),
        ("main-0", signal.SIGSTOP),  # alive but silent: dropped, then killed as hung
        ("main-1", signal.SIGTERM),
    ]:
        before = server.instances()[name]
        os.kill(before["pid"], sig)
        after = server.wait_replaced(name, before["pid"])
        assert after["cpus"] == before["cpus"] and after["affinity_ok"]
        time.sleep(3.5)  # past supervisor.stable_s: not a crash loop
    server.reload()
    time.sleep(1)
    outcomes = load.stop()
    report(outcomes)
    assert outcomes.unanswered == 0, outcomes.summary()
    assert set(outcomes.codes) == {"ok"} and outcomes.sent > 500, outcomes.summary()
    assert server.proc.poll() is None


def test_a_killed_router_is_back_and_loses_at_most_what_it_held(server):
    load = RawLoad(server.endpoint, clients=2, depth=4)
    time.sleep(1)
    os.kill(server.router_pid(), signal.SIGKILL)
    time.sleep(0.5)
    server.wait_for(lambda: server.status(), what="the router back")
    time.sleep(2)
    outcomes = load.stop(drain_s=5)
    report(outcomes)
    assert outcomes.unanswered <= 8, outcomes.summary()  # 2 clients x 4 in flight at the kill
    # The new router holds texts until the running instances announce themselves to it.
    assert set(outcomes.codes) == {"ok"}, outcomes.summary()


def test_sigterm_under_load_answers_what_is_in_flight_and_leaves_nothing(server):
    load = RawLoad(server.endpoint, clients=2, depth=4)
    time.sleep(1)
    pids = server.pids()
    runtime = Path(re.search(r"workers on ipc://(\S+)/workers-0\.sock", server.log())[1])
    server.proc.send_signal(signal.SIGTERM)
    outcomes = load.stop(drain_s=15)  # no new requests; the replies still due
    report(outcomes)
    assert server.proc.wait(60) == 0
    assert outcomes.unanswered == 0, outcomes.summary()
    assert set(outcomes.codes) <= {"ok", "no_instance"}, outcomes.summary()
    assert not any(still_running(p) for p in pids)
    assert not runtime.exists()


def test_25x_overload_answers_every_request_and_memory_stays_bounded(server):
    router = psutil.Process(server.router_pid())
    rss = router.memory_info().rss
    load = RawLoad(server.endpoint, clients=25, depth=64)
    time.sleep(10)
    peak = router.memory_info().rss
    outcomes = load.stop(drain_s=10)
    report(outcomes)
    assert outcomes.unanswered == 0, outcomes.summary()
    assert set(outcomes.codes) <= {"ok", "overloaded"}, outcomes.summary()
    assert outcomes.codes["ok"] > 0 and outcomes.codes["overloaded"] > 0, outcomes.summary()
    print(f"router RSS: {rss / 2**20:.1f} MiB before, {peak / 2**20:.1f} MiB at the peak")
    assert peak - rss < 100 << 20
    with Client(server.endpoint, timeout=10) as client:
        assert client.embed("calm again").tokens > 0


# -- fuzz ------------------------------------------------------------------------------------


class BadStr(bytes):
    """A msgpack str whose bytes are not UTF-8."""


def encode(value, packer: msgpack.Packer) -> bytes:
    """msgpack of `value`, where a BadStr becomes a str of invalid UTF-8 (msgpack.packb
    cannot write one)."""
    if isinstance(value, BadStr):
        n = len(value)
        head = bytes([0xA0 | n]) if n < 32 else b"\xd9" + bytes([n])
        return head + value
    if isinstance(value, dict):
        return packer.pack_map_header(len(value)) + b"".join(
            encode(k, packer) + encode(v, packer) for k, v in value.items()
        )
    if isinstance(value, list):
        return packer.pack_array_header(len(value)) + b"".join(encode(v, packer) for v in value)
    return packer.pack(value)


scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([1e300, -1e300, 0.0, -0.0, 2**53 + 1])
    | st.text(max_size=12)
    | st.binary(max_size=12).map(BadStr)
    | st.binary(max_size=12)
)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(scalars, children, max_size=4)
    ),
    max_leaves=10,
)
keys = st.sampled_from(["id", "op", "texts", "deadline_ms"]) | scalars
ops = st.sampled_from(["embed", "classify", "ping", "status", "ner"]) | values
bodies = st.fixed_dictionaries(
    {},
    optional={
        "id": values,
        "op": ops,
        "texts": values | st.lists(st.text(max_size=30) | st.binary(max_size=8).map(BadStr)),
        "deadline_ms": values,
    },
) | st.dictionaries(keys, values, max_size=5)
frames = st.one_of(
    bodies.map(lambda b: [protocol.VERSION, encode(b, msgpack.Packer())]),
    st.tuples(st.binary(max_size=8), bodies).map(
        lambda vb: [vb[0], encode(vb[1], msgpack.Packer())]
    ),
    st.lists(st.binary(max_size=16), min_size=1, max_size=5),  # wrong frame counts
    values.map(lambda v: [protocol.VERSION, encode(v, msgpack.Packer())]),  # not a map
)


@pytest.fixture
def fuzz_target(server):
    router = psutil.Process(server.router_pid())
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(server.endpoint)
    yield server, router, sock
    ctx.destroy(linger=0)


def test_10000_fuzzed_messages_crash_nothing_and_lose_no_legitimate_request(fuzz_target):
    server, router, sock = fuzz_target
    pids = sorted(server.pids())
    rss = router.memory_info().rss
    load = RawLoad(server.endpoint, clients=1, depth=2)  # legitimate traffic throughout
    sent = 0

    @settings(
        max_examples=10_000,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(frames)
    def send(message):
        nonlocal sent
        sent += 1
        with contextlib.suppress(zmq.Again):
            sock.send_multipart(message, zmq.NOBLOCK)
        while sock.poll(0):
            sock.recv_multipart()  # replies, if any, are not checked: survival is

    send()
    limit = ServerConfig().max_message_bytes
    for size in (limit - 64, limit + 64):  # just under and just over the limit
        body = {"id": "big", "op": "embed", "texts": ["word " * ((size - 40) // 5)]}
        sock.send_multipart([protocol.VERSION, msgpack.packb(body)])
    huge = {"id": "many", "op": "embed", "texts": ["x"] * 10_000}
    sock.send_multipart(protocol.pack(huge))
    time.sleep(2)
    outcomes = load.stop()
    report(outcomes)
    assert sent >= 10_000
    assert outcomes.unanswered == 0 and set(outcomes.codes) == {"ok"}, outcomes.summary()
    assert sorted(server.pids()) == pids  # no process crashed or restarted
    after = router.memory_info().rss
    print(f"{sent} fuzzed messages; router RSS {rss / 2**20:.1f} -> {after / 2**20:.1f} MiB")
    assert after - rss < 20 << 20
