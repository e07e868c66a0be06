"""The HTTP front's counts, for /metrics: requests by route and status, and their latency.

Each front writes them to its stats file (HttpSpec.stats_file) once a second, whole (a rename),
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
        self.connections = 0
        self.spans_dropped = 0  # trace spans not delivered to the collector, where it traces

    def count(self, route: str, status: int, seconds: float) -> None:
        self.requests[route, status] += 1
        hist = self.latency.get(route)
        if hist is None:
            hist = self.latency[route] = Histogram(LATENCY_BOUNDS)
        hist.observe(seconds)

    def to_json(self) -> dict:
        return {
            "front": self.index,
            "pid": os.getpid(),
            "connections": self.connections,
            "spans_dropped": self.spans_dropped,
            "requests": [[route, status, n] for (route, status), n in self.requests.items()],
            "latency": {route: hist.wire() for route, hist in self.latency.items()},
        }

    def write(self, path: str) -> None:
        temporary = f"{path}.tmp"
        with open(temporary, "w") as f:
            json.dump(self.to_json(), f)
        os.replace(temporary, path)
