"""The HTTP API of a front process (fronts.py): its socket on server.http (shared with the
other fronts by SO_REUSEPORT: the kernel spreads connections over them), one `Connection` per
client, and the App that answers them on the front's core."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

from numaserve.config.addresses import split_host_port
from numaserve.front.core import Core
from numaserve.front.stats import Stats
from numaserve.http import api_errors
from numaserve.http.app import App
from numaserve.http.connection import Connection, sweep
from numaserve.http.routes import ROUTES
from numaserve.processes.tracing import Tracing

BACKLOG = 1024


def listen(address: str) -> socket.socket:
    host, port = split_host_port(address)
    family, _, _, _, where = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(where)
    sock.listen(BACKLOG)
    sock.setblocking(False)
    return sock


class HttpServer:
    def __init__(
        self, core: Core, stats: Stats, tracing: Tracing | None, draining: Callable[[], bool]
    ):
        """`draining`: () -> bool, whether the process drains (answer what was asked, keep
        no connection alive)."""
        self.core, self.draining = core, draining
        self.app = App(core, stats, ROUTES, tracing)
        self.live: set[Connection] = set()
        self.server: asyncio.Server | None = None

    def connection(self) -> Connection:
        server = self.core.spec.server
        return Connection(
            self.app.handle,
            api_errors.refusal,
            (server.http_max_body_bytes, server.http_read_timeout_s),
            self.draining,
            self.live,
        )

    async def start(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(self.connection, sock=sock)
        loop.call_soon(sweep, self.live)

    def stop_listening(self) -> None:
        if self.server is not None:
            self.server.close()

    @property
    def busy(self) -> bool:
        """A request read and not yet answered."""
        return any(c.busy for c in self.live)

    def close_idle(self) -> None:
        for connection in list(self.live):
            connection.close_if_idle()
