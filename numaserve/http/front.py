"""An HTTP front process: its socket on server.http (shared with the other fronts by
SO_REUSEPORT: the kernel spreads connections over them), its asyncio loop on uvloop, and its
stop.

SIGTERM drains: the front stops listening, closes the connections with nothing asked of
them, answers every request it holds (drain_timeout_s at most), and exits. SIGHUP re-reads
the API keys at once.

Run as `python -m numaserve.http --spec JSON` (an HttpSpec, processes/specs.py).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time

import uvloop

from numaserve.config.addresses import split_host_port
from numaserve.http import api_errors
from numaserve.http.app import App
from numaserve.http.connection import Connection, sweep
from numaserve.http.keys import ApiKeys
from numaserve.http.routes import ROUTES
from numaserve.http.stats import Stats
from numaserve.http.upstream import Upstream
from numaserve.processes import exitcodes
from numaserve.processes.begin import begin, import_numpy
from numaserve.processes.specs import HttpSpec
from numaserve.processes.tracing import start as start_tracing
from numaserve.router.process import context

log = logging.getLogger("numaserve.http")
BACKLOG = 1024
STATS_EVERY_S = 1.0
# A request a shard has not answered in this long is sent once more (the shard died holding
# it): longer than any queue wait (server.max_queue_ms) and a long text's run.
MIN_RETRY_AFTER_S = 10.0


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


class Front:
    def __init__(self, spec: HttpSpec):
        self.spec = spec
        self.ctx = context()
        retry = max(MIN_RETRY_AFTER_S, 2 * spec.server.max_queue_ms / 1000 + 5)
        shards = {m.name: m.shards for m in spec.models}
        self.upstream = Upstream(self.ctx, shards, retry)
        self.keys = ApiKeys(spec.server.http_api_keys_file)
        self.stats = Stats(spec.index)
        self.tracing = start_tracing("http")
        self.app = App(spec, self.upstream, self.keys, self.stats, ROUTES, self.tracing)
        self.live: set[Connection] = set()
        self.draining = False
        self.stopped: asyncio.Future | None = None

    def connection(self) -> Connection:
        return Connection(
            self.app.handle,
            api_errors.refusal,
            (self.spec.server.http_max_body_bytes, self.spec.server.http_read_timeout_s),
            lambda: self.draining,
            self.live,
        )

    async def serve(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        self.stopped = loop.create_future()
        self.upstream.start(loop)
        server = await loop.create_server(self.connection, sock=sock)
        loop.add_signal_handler(signal.SIGTERM, self.drain)
        loop.add_signal_handler(signal.SIGINT, self.drain)
        loop.add_signal_handler(signal.SIGHUP, self.reload_keys)
        loop.call_soon(self._write_stats)
        loop.call_soon(sweep, self.live)
        await self.stopped
        server.close()
        deadline = time.monotonic() + self.spec.drain_timeout_s
        while (self.upstream.in_flight or any(c.busy for c in self.live)) and (
            time.monotonic() < deadline
        ):
            for connection in list(self.live):
                connection.close_if_idle()
            await asyncio.sleep(0.01)
        for connection in list(self.live):
            connection.close_if_idle()
        self._write_stats()
        self.upstream.close()
        if self.tracing is not None:
            self.tracing.close()

    def drain(self) -> None:
        if not self.draining:
            self.draining = True
            log.info("draining: %d connection(s)", len(self.live))
            self.stopped.set_result(None)

    def reload_keys(self) -> None:
        self.keys.stamp = None
        self.keys.reload()

    def _write_stats(self) -> None:
        self.stats.connections = len(self.live)
        if self.tracing is not None:
            self.stats.spans_dropped = self.tracing.dropped()
        if self.spec.stats_file:
            try:
                self.stats.write(self.spec.stats_file)
            except OSError as e:
                log.warning("cannot write %s: %s", self.spec.stats_file, e)
        if not self.draining:
            asyncio.get_running_loop().call_later(STATS_EVERY_S, self._write_stats)


def main(argv: list[str] | None = None) -> int:
    began = begin(HttpSpec, argv, log, bad_spec=exitcodes.CRASH)
    if isinstance(began, int):
        return began
    spec = began.spec
    import_numpy()
    try:
        sock = listen(spec.address)
    except OSError as e:
        log.error("cannot listen on %s (server.http): %s", spec.address, e.strerror or e)
        return exitcodes.CRASH
    front = Front(spec)
    models = ", ".join(m.name for m in spec.models)
    log.info("HTTP on %s (front %d), serving %s", spec.address, spec.index, models)
    uvloop.run(front.serve(sock))
    front.ctx.term()
    log.info("stopped")
    return exitcodes.OK
