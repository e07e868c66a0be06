"""A front's counts, for /metrics: HTTP requests by route and status, gRPC calls by method
and status code, and their latency.

Each front writes them to its stats file (FrontSpec.stats_file) once a second, whole (a rename),
and the supervisor's metrics endpoint reads them at each scrape: the fronts need no socket to
the supervisor. The histogram is the router's (same bounds), so that the two compare.
"""

from __future__ import annotations

import json
import os
from collections import Counter

from numaserve.router.metrics import LATENCY_BOUNDS, Histogram


class Stats:
    def __init__(self, index: int):
        self.index = index
        self.requests: Counter[tuple[str, int]] = Counter()
        self.latency: dict[str, Histogram] = {}  # by route
        self.grpc: Counter[tuple[str, str]] = Counter()  # by method and status code
        self.grpc_latency: dict[str, Histogram] = {}  # by method
        self.connections = 0
        self.spans_dropped = 0  # trace spans not delivered to the collector, where it traces

    def count(self, route: str, status: int, seconds: float) -> None:
        self.requests[route, status] += 1
        _observe(self.latency, route, seconds)

    def count_grpc(self, method: str, code: str, seconds: float) -> None:
        self.grpc[method, code] += 1
        _observe(self.grpc_latency, method, seconds)

    def to_json(self) -> dict:
        return {
            "front": self.index,
            "pid": os.getpid(),
            "connections": self.connections,
            "spans_dropped": self.spans_dropped,
            "requests": [[route, status, n] for (route, status), n in self.requests.items()],
            "latency": {route: hist.wire() for route, hist in self.latency.items()},
            "grpc": [[method, code, n] for (method, code), n in self.grpc.items()],
            "grpc_latency": {m: hist.wire() for m, hist in self.grpc_latency.items()},
        }

    def write(self, path: str) -> None:
        temporary = f"{path}.tmp"
        with open(temporary, "w") as f:
            json.dump(self.to_json(), f)
        os.replace(temporary, path)


def _observe(histograms: dict[str, Histogram], key: str, seconds: float) -> None:
    hist = histograms.get(key)
    if hist is None:
        hist = histograms[key] = Histogram(LATENCY_BOUNDS)
    hist.observe(seconds)
