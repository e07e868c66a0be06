"""The HTTP endpoint on server.metrics: /metrics for Prometheus, /healthz and /readyz for
probes. A thread of the supervisor's, serving what the loop last published.

Each scrape reads what only the OS knows now (each process's RSS and live affinity, the
nodes' numastat) and renders the latest Snapshot; it never waits on the supervisor's loop or
a router. Only GET and HEAD of these three paths are answered; the server is plain HTTP, as
Prometheus scrapes it: keep it on loopback or behind the host's firewall (docs/deployment.md).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psutil
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from numaserve.config.addresses import split_host_port
from numaserve.host.numastat import read_numastat
from numaserve.host.pinning import affinity_if_alive
from numaserve.monitoring import health
from numaserve.monitoring.exposition import Readings, families
from numaserve.monitoring.snapshot import Snapshot

log = logging.getLogger("numaserve.monitoring")
# The text format every Prometheus since 2.0 reads (newer clients announce 1.0.0, which older
# servers may not accept); names and labels here are plain ASCII, so the two print the same.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class MonitoringError(OSError):
    """The endpoint cannot listen where server.metrics says."""


def read_os(snapshot: Snapshot) -> Readings:
    pids = [snapshot.supervisor_pid] + [p.pid for p in snapshot.processes if p.pid]
    rss, affinity = {}, {}
    for pid in pids:
        try:
            rss[pid] = psutil.Process(pid).memory_info().rss
        except (psutil.Error, OSError):
            continue  # exited since the snapshot
    for process in snapshot.instances():
        cpus = affinity_if_alive(process.pid)
        if cpus is not None:
            affinity[process.pid] = cpus
    return Readings(
        rss=rss,
        affinity=affinity,
        numastat=read_numastat(),
        fronts=read_fronts(snapshot.front_stats),
    )


def read_fronts(paths: tuple[str, ...]) -> tuple[dict, ...]:
    """The fronts' latest counts; a front not yet started (no file) has none."""
    fronts = []
    for path in paths:
        try:
            with open(path) as f:
                fronts.append(json.load(f))
        except (OSError, ValueError):
            continue
    return tuple(fronts)


class _SnapshotCollector(Collector):
    def __init__(self, endpoint: MonitoringEndpoint) -> None:
        self.endpoint = endpoint

    def collect(self):
        snapshot = self.endpoint.snapshot
        if snapshot is not None:
            yield from families(snapshot, read_os(snapshot))


class MonitoringEndpoint:
    def __init__(self, address: str) -> None:
        self.address = address
        self.snapshot: Snapshot | None = None  # replaced whole by publish()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_SnapshotCollector(self))
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                endpoint.answer(self, body=True)

            def do_HEAD(self) -> None:
                endpoint.answer(self, body=False)

            def log_message(self, format: str, *args) -> None:
                log.debug("%s %s", self.address_string(), format % args)

        host, port = split_host_port(address)  # config/schema.py has checked the form
        try:
            self.server = ThreadingHTTPServer((host, port), Handler)
        except OSError as e:
            raise MonitoringError(
                f"server.metrics: cannot listen on {address}: {e.strerror}; set server.metrics "
                'to a free host:port, or to "" to turn the metrics and health endpoint off'
            ) from None
        self.server.daemon_threads = True
        self.thread = threading.Thread(
            target=self.server.serve_forever, name="numaserve-metrics", daemon=True
        )

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def start(self) -> None:
        self.thread.start()
        log.info("metrics and health on http://%s/metrics, /healthz, /readyz", self.address)

    def publish(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def answer(self, request: BaseHTTPRequestHandler, body: bool) -> None:
        path = request.path.split("?", 1)[0]
        if path == "/metrics":
            status, content_type, payload = self.render()
        elif path in ("/healthz", "/readyz"):
            check = health.alive if path == "/healthz" else health.ready
            problems = check(self.snapshot, time.monotonic())
            status = 503 if problems else 200
            content_type = "text/plain; charset=utf-8"
            payload = ("\n".join(problems) if problems else "ok").encode() + b"\n"
        else:
            status, content_type = 404, "text/plain; charset=utf-8"
            payload = b"not found: /metrics, /healthz and /readyz are served here\n"
        request.send_response(status)
        request.send_header("Content-Type", content_type)
        request.send_header("Content-Length", str(len(payload)))
        request.end_headers()
        if body:
            request.wfile.write(payload)

    def render(self) -> tuple[int, str, bytes]:
        """The exposition; a failure (a bug) is logged and answered 500, and the next scrape
        tries again: the supervisor goes on."""
        try:
            return 200, CONTENT_TYPE, generate_latest(self.registry)
        except Exception as e:
            log.exception("rendering /metrics failed")
            return (
                500,
                "text/plain; charset=utf-8",
                f"rendering the metrics failed: {e!r}\n".encode(),
            )

    def close(self) -> None:
        if self.thread.is_alive():
            self.server.shutdown()
        self.server.server_close()
