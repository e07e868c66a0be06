"""Router shards behind one endpoint (`server.routers`): real processes, a client sending
throughout. Slow: CI runs them in their own step. The NUMA placement of shards is planned and
tested in tests/test_shards.py; this machine has one node, so here `routers: 2` makes two
unpinned shards of one instance each."""

import os
import signal
import time

import pytest

from numaserve.testing.load import RawLoad
from tests.harness import server as server_
from tests.test_supervisor import Load

pytestmark = pytest.mark.slow

CONFIG = """
model: {path: bundled:minilm, backend: onnxruntime, quantize: int8}
server: {endpoint: "@ENDPOINT@", heartbeat_ms: 200, heartbeat_liveness: 3, routers: 2}
supervisor: {drain_timeout_s: 15, kill_timeout_s: 3, backoff_initial_s: 0.2, backoff_max_s: 2}
placement:
  pools: [{name: main, max_tokens: 256, instances: 2}]
"""


@pytest.fixture
def sharded(tmp_path):
    s = server_.Server(tmp_path, CONFIG)
    s.wait_for(lambda: len(s.status().get("shards", ())) == 2, what="two shards")
    s.wait_ready()
    yield s
    s.stop()


def test_two_shards_serve_one_endpoint_and_status_shows_the_whole_server(sharded):
    load = Load(sharded.endpoint)
    time.sleep(2)
    counts = load.stop()
    status = sharded.status()
    assert counts.get("ok", 0) > 50 and set(counts) == {"ok"}, counts
    assert [s["shard"] for s in status["shards"]] == [0, 1]
    assert [s["instances"] for s in status["shards"]] == [1, 1]
    # both shards took requests, and the totals add them up
    per_shard = [s["requests"]["replies_ok"] for s in status["shards"]]
    assert min(per_shard) > 0, per_shard
    assert {i["name"]: i["routed"] for i in status["instances"]} == {
        "main-0": True,
        "main-1": True,
    }
    assert status["pools"][0]["ready"] == 2


def test_a_killed_shard_is_restarted_while_the_other_keeps_serving(sharded):
    victim = sharded.shard_pid(1)
    load = Load(sharded.endpoint)
    time.sleep(1)
    os.kill(victim, signal.SIGKILL)
    sharded.wait_for(lambda: "restart router-1" in sharded.log(), what="shard 1 restarted")
    sharded.wait_for(
        lambda: (
            all(s["instances"] == 1 for s in sharded.status()["shards"])
            and all(i["routed"] for i in sharded.status()["instances"])
        ),
        what="both shards routing again",
    )
    time.sleep(1)
    counts = load.stop()
    # requests the dead shard held are retried by the client on a fresh socket
    assert counts.get("ok", 0) > 50 and set(counts) == {"ok"}, counts
    assert sharded.shard_pid(1) != victim


def test_sigterm_drains_every_shard_and_exits_0(sharded):
    load = Load(sharded.endpoint, clients=3)
    time.sleep(1)
    sharded.proc.send_signal(signal.SIGTERM)
    code = sharded.proc.wait(30)
    counts = load.stop()
    assert code == 0
    assert set(counts) <= Load.DRAIN_OUTCOMES and counts.get("Timeout", 0) <= 3, counts
    log = sharded.log()
    assert "exit router-0: exit 0" in log and "exit router-1: exit 0" in log
    assert "stopped" in log


def test_instances_killed_hung_stopped_and_reloaded_under_two_shards_refuse_nothing(sharded):
    """Each shard has one instance here: while it is gone, its shard hands texts to the
    other (router/handover.py) instead of answering no_instance. Raw clients never retry."""
    load = RawLoad(sharded.endpoint, clients=2, depth=4)
    time.sleep(1)
    for sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM):
        before = sharded.instances()["main-0"]
        os.kill(before["pid"], sig)
        sharded.wait_replaced("main-0", before["pid"])
        time.sleep(1)
    sharded.reload()
    time.sleep(1)
    outcomes = load.stop()
    assert outcomes.unanswered == 0, outcomes.summary()
    assert set(outcomes.codes) == {"ok"} and outcomes.sent > 300, outcomes.summary()
    assert sharded.status()["requests"]["handed_over"] > 0


def test_25x_overload_on_two_shards_answers_every_request(sharded):
    load = RawLoad(sharded.endpoint, clients=25, depth=64)
    time.sleep(8)
    outcomes = load.stop(drain_s=10)
    assert outcomes.unanswered == 0, outcomes.summary()
    assert set(outcomes.codes) <= {"ok", "overloaded"}, outcomes.summary()
    assert outcomes.codes["ok"] > 0 and outcomes.codes["overloaded"] > 0, outcomes.summary()
    assert all(s["instances"] == 1 for s in sharded.status()["shards"])
