"""Two numaserve servers on one host share it through the core ledger: real `numaserve start`
processes, one ledger directory, and each instance's live affinity read from the kernel. Slow
(each test starts servers): CI runs them in their own step."""

import os

import pytest

from numaserve.client import Client
from tests.harness import server as server_
from tests.harness.processes import wait_gone

pytestmark = pytest.mark.slow

CONFIG = """
model: {{path: "bundled:minilm", backend: onnxruntime, quantize: int8}}
server: {{endpoint: "{endpoint}", heartbeat_ms: 200, heartbeat_liveness: 3}}
supervisor: {{drain_timeout_s: 5, kill_timeout_s: 3}}
placement:
  pools: [{{name: main, max_tokens: 256, instances: {instances}}}]
"""


def start(tmp_path, name: str, instances: int | str) -> server_.Server:
    text = CONFIG.format(endpoint=server_.ENDPOINT, instances=instances)
    return server_.Server(tmp_path, text, {"NUMASERVE_LEDGER": str(tmp_path / "ledger")}, name)


def live_cpus(server: server_.Server) -> set[int]:
    """The CPUs the kernel lets this server's instances run on, now."""
    return {cpu for pid in server.pids()[1:] for cpu in os.sched_getaffinity(pid)}


def refused(server: server_.Server) -> str:
    assert server.proc.wait(120) == 75, server.log()
    return server.log()


@pytest.fixture
def servers():
    running = []
    yield running.append
    for s in running:
        s.stop()


def first_and_second(tmp_path, servers) -> tuple[server_.Server, server_.Server]:
    """A first server on one core, then a second with `instances: auto`, both ready."""
    first = start(tmp_path, "first", 1)
    servers(first)
    first.wait_ready()
    second = start(tmp_path, "second", "auto")
    servers(second)
    second.wait_ready()
    return first, second


def test_a_second_server_takes_only_the_cores_the_first_leaves(tmp_path, servers):
    first, second = first_and_second(tmp_path, servers)

    mine, theirs = live_cpus(first), live_cpus(second)
    assert mine and theirs and not mine & theirs
    assert mine | theirs == os.sched_getaffinity(0)  # auto took everything left
    with Client(second.endpoint, timeout=30) as client:
        assert client.embed("planned around the first server").vector.shape == (384,)


def test_a_server_with_no_room_is_refused_naming_the_holders_then_starts_once_one_stops(
    tmp_path, servers
):
    first, second = first_and_second(tmp_path, servers)

    third = start(tmp_path, "third", "auto")
    message = refused(third)
    for holder in (first, second):
        assert f"pid {holder.proc.pid} (config {holder.config})" in message
    assert str(tmp_path / "ledger") in message

    held = live_cpus(first)
    first.stop()
    third = start(tmp_path, "third", "auto")
    servers(third)
    third.wait_ready()
    assert live_cpus(third) == held
    assert not live_cpus(third) & live_cpus(second)


def test_a_killed_servers_cores_are_free_for_the_next(tmp_path, servers):
    first = start(tmp_path, "first", "auto")
    servers(first)
    first.wait_ready()
    pids = first.pids()
    first.proc.kill()  # SIGKILL: no chance to remove its own entry
    first.proc.wait()
    assert not wait_gone(pids[1:], 30)  # its instances die with it (lifecycle.py)

    second = start(tmp_path, "second", "auto")
    servers(second)
    second.wait_ready()
    assert live_cpus(second) == os.sched_getaffinity(0)
