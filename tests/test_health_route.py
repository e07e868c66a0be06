"""The HTTP API's `/health` (TEI's): 200 while some instance of every model can serve, 503
(Unhealthy) while none can, asked of the shards by `ping`, which a shard answers from what it
knows: its ready instances, and its ready peers'. A real router in a thread with stand-in
workers (tests/harness/stand_in.py), and a real HTTP front process in front of it."""

from __future__ import annotations

import dataclasses
import subprocess
import time

import httpx
import pytest

from numaserve.config.schema import ModelConfig
from numaserve.processes.specs import FrontModel, FrontSpec
from numaserve.testing.ports import free_port
from numaserve.wire import protocol
from tests.harness.stand_in import InProcessRouter


def ping(router: InProcessRouter) -> dict:
    sock = router.client_socket()
    try:
        sock.send_multipart(protocol.pack({"id": 1, "op": "ping"}))
        assert sock.poll(5000), "no answer to ping"
        return protocol.unpack(sock.recv_multipart())
    finally:
        sock.close(linger=0)


@pytest.fixture
def router(front_router):
    return front_router


@pytest.fixture
def front(router):
    """An HTTP front process, as the supervisor starts one, for the router's model."""
    address = f"127.0.0.1:{free_port()}"
    model = FrontModel("default", ModelConfig(), (router.spec.local,))
    server = dataclasses.replace(router.spec.server, http=address)
    spec = FrontSpec(models=(model,), named=False, server=server)
    proc = subprocess.Popen(spec.argv())
    url = f"http://{address}"
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(f"{url}/info", timeout=1)
            break
        except httpx.TransportError:
            assert proc.poll() is None, "the HTTP front exited"
            assert time.monotonic() < deadline, "the HTTP front never listened"
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(30)


def test_ping_says_how_many_instances_can_take_work(router):
    assert ping(router)["ready"] == 0
    router.add_worker("main-0")
    router.add_worker("main-1")
    assert ping(router)["ready"] == 2


def test_health_is_503_while_no_instance_can_serve_and_200_once_one_can(router, front):
    down = httpx.get(f"{front}/health", timeout=10)
    assert down.status_code == 503
    assert down.json() == {"error": "no instance ready for default", "error_type": "Unhealthy"}
    router.add_worker("main-0")
    assert httpx.get(f"{front}/health", timeout=10).status_code == 200


def test_health_asks_each_model_by_ping_not_by_status(router, front):
    router.add_worker("main-0")
    replies = router.router.metrics.replies
    assert httpx.get(f"{front}/health", timeout=10).status_code == 200
    assert replies.get(("ping", "ok", "interactive"), 0) == 1
    assert replies.get(("status", "ok", "interactive"), 0) == 0
