"""`numaserve stop` signals only the very supervisor the server reports, on this host, and
waits a bounded time. The server is the real router (tests/stand_in.py); what it reports as
its supervisor is told to it over its worker socket, as the supervisor does."""

import subprocess
import sys
import time

import pytest
import zmq

from numaserve.client import Client
from numaserve.processes import procinfo
from numaserve.wire import protocol
from tests.harness.console import numaserve
from tests.harness.stand_in import InProcessRouter

STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"


@pytest.fixture
def router(tmp_path):
    r = InProcessRouter(tmp_path)
    yield r
    r.close()


@pytest.fixture
def bystander():
    """A process of this host that is not a numaserve supervisor, and ignores SIGTERM."""
    proc = subprocess.Popen([sys.executable, "-c", STUBBORN])
    time.sleep(0.3)  # its handler is set
    yield proc
    proc.kill()
    proc.wait()


def send_table(router: InProcessRouter, body: dict) -> None:
    sock = router.ctx.socket(zmq.DEALER)
    sock.connect(router.router.spec.workers_endpoint)
    sock.send_multipart(protocol.pack({"type": protocol.SUPERVISOR, "seq": 1, **body}))
    sock.close(linger=1000)


def report_supervisor(router: InProcessRouter, **fields) -> None:
    send_table(router, {"slots": [], "routers": [], **fields})
    deadline = time.monotonic() + 5
    while not (router.router.table and router.router.table.supervisor.pid == fields["pid"]):
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_malformed_slot_table_is_dropped_counted_and_the_router_serves_on(router):
    send_table(router, {"pid": 1, "slots": "not a list of slots", "routers": []})
    with Client(router.endpoint, timeout=5) as client:
        deadline = time.monotonic() + 5
        while client.status()["requests"]["dropped_frames"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert client.status()["supervisor"] == {}  # it never took the table
    assert router.router.table is None


def test_a_pid_from_another_host_is_not_signalled(router, bystander):
    report_supervisor(router, pid=bystander.pid, boot_id="another-host", started=1)
    result = numaserve("stop", "--endpoint", router.endpoint, "--no-wait")
    assert result.returncode == 1
    assert "is not a process of this host" in result.stderr
    assert "nothing was signalled" in result.stderr
    assert bystander.poll() is None


def test_a_reused_pid_is_not_signalled(router, bystander):
    reported = {**procinfo.identity(bystander.pid), "started": 1}  # another process's start
    report_supervisor(router, pid=bystander.pid, **reported)
    assert numaserve("stop", "--endpoint", router.endpoint, "--no-wait").returncode == 1


def test_the_wait_for_a_stop_is_bounded(router, bystander):
    report_supervisor(router, pid=bystander.pid, **procinfo.identity(bystander.pid))
    started = time.monotonic()
    result = numaserve("stop", "--endpoint", router.endpoint, "--stop-timeout", "1")
    assert result.returncode == 1
    assert f"pid {bystander.pid} is still running after 1 s" in result.stderr
    assert time.monotonic() - started < 15
    assert bystander.poll() is None  # it ignored SIGTERM, as asked
