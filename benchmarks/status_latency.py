"""How long the status op takes on a server of two router shards, where the supervisor merges
every shard's status into the answer (docs/protocol.md): the median and p90 of 60 calls.

    .venv/bin/python -m benchmarks.status_latency
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from numaserve.client import Client
from numaserve.testing.server import Server

CONFIG = """
model: {path: bundled:minilm, backend: torch}
server: {endpoint: "@ENDPOINT@", routers: 2}
placement:
  pools: [{name: main, max_tokens: 256, instances: 2}]
"""


def main() -> None:
    server = Server(Path(tempfile.mkdtemp()), CONFIG)
    try:
        server.wait_for(lambda: len(server.status().get("shards", ())) == 2, what="two shards")
        server.wait_ready()
        times = []
        with Client(server.endpoint, timeout=5) as client:
            for _ in range(60):
                started = time.perf_counter()
                client.status()
                times.append((time.perf_counter() - started) * 1000)
                time.sleep(0.013)  # off the supervisor's 0.25 s rounds
        times.sort()
        print(
            f"status op on two shards: median {statistics.median(times):.1f} ms, "
            f"p90 {times[53]:.1f} ms, max {times[-1]:.1f} ms"
        )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
