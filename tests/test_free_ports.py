"""The ports tests and benchmarks give the servers they start. A port the kernel may also hand
to an outgoing connection as its own (one in ip_local_port_range) can be taken between the
pick and the server's listen, by a worker's or a client's connection, and the server then
cannot listen: picks come from below that range, each once per process."""

import socket
from pathlib import Path

from numaserve.testing.ports import free_port


def ephemeral_range() -> tuple[int, int]:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return int(low), int(high)


def test_a_free_port_is_one_no_outgoing_connection_can_take():
    low, high = ephemeral_range()
    assert all(not low <= free_port() <= high for _ in range(50))


def test_a_free_port_is_free_to_listen_on():
    with socket.create_server(("127.0.0.1", free_port())) as listener:
        assert listener.getsockname()[1] > 0


def test_no_port_is_handed_out_twice():
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)


def test_two_workers_of_a_split_run_pick_from_slices_that_do_not_meet(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    picked = {}
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        picked[worker] = [free_port() for _ in range(200)]
    assert max(picked["gw0"]) < min(picked["gw1"])
