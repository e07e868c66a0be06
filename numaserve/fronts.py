"""A front process: the front's core (front/) and the APIs on it, the HTTP API on server.http
(http/) and TEI's gRPC API on server.grpc (grpc_api/), on one uvloop loop, pinned to its
node's shards' reserved cores; one per NUMA node with shards, all sharing each port by
SO_REUSEPORT.

SIGTERM drains: the front stops listening, answers every call it holds (drain_timeout_s at
most), closes the connections with nothing asked of them, and exits. SIGHUP re-reads the API
keys at once.

Run as `python -m numaserve.fronts --spec JSON` (a FrontSpec, processes/specs.py).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import sys
import time

import uvloop

from numaserve.front.core import Core
from numaserve.front.keys import ApiKeys
from numaserve.front.stats import Stats
from numaserve.front.upstream import Upstream
from numaserve.http.server import HttpServer, listen
from numaserve.processes import exitcodes
from numaserve.processes.begin import begin, import_numpy
from numaserve.processes.specs import FrontSpec
from numaserve.processes.tracing import start as start_tracing
from numaserve.router.process import context

log = logging.getLogger("numaserve.front")
STATS_EVERY_S = 1.0
# A request a shard has not answered in this long is sent once more (the shard died holding
# it): longer than any queue wait (server.max_queue_ms) and a long text's run, and PER_TEXT_S
# more for each of its texts, which may run one after another on one busy core.
MIN_RETRY_AFTER_S = 10.0
PER_TEXT_S = 0.1


class Front:
    def __init__(self, spec: FrontSpec):
        self.spec = spec
        self.ctx = context()
        retry = max(MIN_RETRY_AFTER_S, 2 * spec.server.max_queue_ms / 1000 + 5)
        shards = {m.name: m.shards for m in spec.models}
        self.upstream = Upstream(self.ctx, shards, retry, PER_TEXT_S)
        self.keys = ApiKeys(spec.server.http_api_keys_file)
        self.stats = Stats(spec.index)
        self.tracing = start_tracing("front")
        self.core = Core(spec, self.upstream, self.keys)
        self.draining = False
        self.http = (
            HttpServer(self.core, self.stats, self.tracing, lambda: self.draining)
            if spec.server.http
            else None
        )
        self.grpc = None
        if spec.server.grpc:  # grpcio is loaded only where the gRPC API is on
            from numaserve.grpc_api.server import GrpcServer

            self.grpc = GrpcServer(self.core, self.stats, self.tracing)
        self.stopped: asyncio.Future | None = None

    async def serve(self, sock: socket.socket | None) -> int:
        loop = asyncio.get_running_loop()
        self.stopped = loop.create_future()
        self.upstream.start(loop)
        if self.grpc is not None:
            from numaserve.grpc_api.server import GrpcListenError

            try:
                await self.grpc.start(self.spec.server.grpc)
            except GrpcListenError as e:
                log.error("%s", e)
                self.upstream.close()
                return exitcodes.CRASH
        if self.http is not None:
            await self.http.start(sock)
        loop.add_signal_handler(signal.SIGTERM, self.drain)
        loop.add_signal_handler(signal.SIGINT, self.drain)
        loop.add_signal_handler(signal.SIGHUP, self.reload_keys)
        loop.call_soon(self._write_stats)
        log.info("on %s (front %d), serving %s", self.spec.where(), self.spec.index, self._models())
        await self.stopped
        await self._drain()
        return exitcodes.OK

    async def _drain(self) -> None:
        """Stop listening, answer what is held (drain_timeout_s at most), then close."""
        if self.http is not None:
            self.http.stop_listening()
        deadline = time.monotonic() + self.spec.drain_timeout_s
        grpc_stopped = (
            asyncio.ensure_future(self.grpc.stop(self.spec.drain_timeout_s)) if self.grpc else None
        )
        while (self.upstream.in_flight or (self.http and self.http.busy)) and (
            time.monotonic() < deadline
        ):
            if self.http is not None:
                self.http.close_idle()
            await asyncio.sleep(0.01)
        if self.http is not None:
            self.http.close_idle()
        if grpc_stopped is not None:
            await grpc_stopped
        self._write_stats()
        self.upstream.close()
        if self.tracing is not None:
            self.tracing.close()

    def _models(self) -> str:
        return ", ".join(m.name for m in self.spec.models)

    def drain(self) -> None:
        if not self.draining:
            self.draining = True
            connections = len(self.http.live) if self.http else 0
            log.info("draining: %d HTTP connection(s)", connections)
            self.stopped.set_result(None)

    def reload_keys(self) -> None:
        self.keys.stamp = None
        self.keys.reload()

    def _write_stats(self) -> None:
        self.stats.connections = len(self.http.live) if self.http else 0
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
    began = begin(FrontSpec, argv, log, bad_spec=exitcodes.CRASH)
    if isinstance(began, int):
        return began
    spec = began.spec
    import_numpy()
    sock = None
    if spec.server.http:
        try:
            sock = listen(spec.server.http)
        except OSError as e:
            log.error("cannot listen on %s (server.http): %s", spec.server.http, e.strerror or e)
            return exitcodes.CRASH
    front = Front(spec)
    code = uvloop.run(front.serve(sock))
    front.ctx.term()
    log.info("stopped")
    return code


if __name__ == "__main__":
    sys.exit(main())
