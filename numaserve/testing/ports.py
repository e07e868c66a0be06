"""Free TCP ports for the servers tests and benchmarks start.

The kernel gives an outgoing connection a port of its own from ip_local_port_range; a port
picked there (binding port 0 does) can be taken by a worker's or a client's connection
before the server listens on it, and the server cannot listen. So the ports come from below
that range, checked free by binding, and each once per process."""

from __future__ import annotations

import random
import socket

from numaserve.host.local_ports import local_port_range

_LOWEST = 10000  # below: ports that well-known services listen on
_given: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port on `host` nobody listens on, that no outgoing connection can be given."""
    top = local_port_range()[0]
    for _ in range(1000):
        port = random.randrange(_LOWEST, top)
        if port in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise OSError(f"no free port on {host} between {_LOWEST} and {top} in 1000 tries")
