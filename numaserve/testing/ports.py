"""Free TCP ports for the servers tests and benchmarks start.

The kernel gives an outgoing connection a port of its own from ip_local_port_range; a port
picked there (binding port 0 does) can be taken by a worker's or a client's connection
before the server listens on it, and the server cannot listen. So the ports come from below
that range, checked free by binding, and each once per process. Test runs split over
processes (pytest-xdist's workers) each take their own slice of that span, so that two never
pick the same port in the moment between the check and the listen."""

from __future__ import annotations

import os
import random
import socket

from numaserve.host.local_ports import local_port_range

_LOWEST = 10000  # below: ports that well-known services listen on
_given: set[int] = set()


def _span() -> tuple[int, int]:
    """The ports this process picks from: below the local range, and under pytest-xdist the
    slice of its worker (`gw0`, `gw1`, ... of PYTEST_XDIST_WORKER_COUNT)."""
    low, top = _LOWEST, local_port_range()[0]
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not (worker.startswith("gw") and worker[2:].isdigit() and count > 1):
        return low, top
    width = (top - low) // count
    low += int(worker[2:]) * width
    return low, low + width


def free_port(host: str = "127.0.0.1") -> int:
    """A port on `host` nobody listens on, that no outgoing connection can be given."""
    low, top = _span()
    for _ in range(1000):
        port = random.randrange(low, top)
        if port in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise OSError(f"no free port on {host} between {low} and {top} in 1000 tries")
