"""sd_notify against real unix datagram sockets, the way systemd listens."""

import os
import socket

import pytest

from numaserve.supervisor.sdnotify import Notifier


@pytest.fixture
def listener(tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify.sock")
    sock.bind(path)
    sock.settimeout(5)
    yield path, sock
    sock.close()


def test_ready_is_sent_with_status_and_main_pid(listener):
    path, sock = listener
    assert Notifier({"NOTIFY_SOCKET": path}).ready("serving 2 instances")
    assert sock.recv(4096).decode().split("\n") == [
        "READY=1",
        "STATUS=serving 2 instances",
        f"MAINPID={os.getpid()}",
    ]


def test_abstract_namespace_socket_is_reached():
    name = f"numaserve-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(5)
    try:
        assert Notifier({"NOTIFY_SOCKET": "@" + name}).status("draining")
        assert sock.recv(4096) == b"STATUS=draining"
    finally:
        sock.close()


def test_watchdog_interval_is_half_the_timeout(listener):
    path, sock = listener
    notifier = Notifier(
        {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "10000000", "WATCHDOG_PID": str(os.getpid())}
    )
    assert notifier.watchdog_interval == 5.0
    assert notifier.watchdog()
    assert sock.recv(4096) == b"WATCHDOG=1"


def test_watchdog_meant_for_another_process_is_ignored(listener):
    path, _ = listener
    assert (
        Notifier(
            {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "10000000", "WATCHDOG_PID": "1"}
        ).watchdog_interval
        is None
    )


def test_outside_systemd_nothing_is_sent():
    notifier = Notifier({})
    assert not notifier.enabled
    assert not notifier.ready("x")


def test_a_vanished_socket_is_not_an_error(tmp_path):
    assert not Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")}).status("x")
