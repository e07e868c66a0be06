"""What the client library costs a request, against another version of it: round trips of
one cached text (the router's cache answers, so the client's own work shows) through the real
router, this client and the baseline's alternating in rounds on the same connection setup.

    git show REV:numaserve/client.py > /tmp/baseline_client.py   # (before the package split)
    .venv/bin/python -m benchmarks.client_ab --baseline /tmp/baseline_client.py
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
from pathlib import Path

from numaserve import client as current
from numaserve.testing.cluster import Cluster  # the router and one worker, no supervisor

CONFIG = """
model: {path: bundled:minilm}
placement:
  pools: [{name: main, max_tokens: 256, instances: 1}]
"""


def load_baseline(path: str):
    spec = importlib.util.spec_from_file_location("baseline_client", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def round_trips(module, endpoint: str, calls: int) -> float:
    """Microseconds per embed of one cached text, on a client made for the round."""
    with module.Client(endpoint, timeout=5) as client:
        client.embed("a text the router's cache answers")  # connected, and cached
        began = time.perf_counter()
        for _ in range(calls):
            client.embed("a text the router's cache answers")
        return (time.perf_counter() - began) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", required=True, help="another version's client module file")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    baseline = load_baseline(args.baseline)
    cluster = Cluster(Path(tempfile.mkdtemp()), CONFIG).start()
    try:
        times: dict[str, list[float]] = {"baseline": [], "current": []}
        for _ in range(args.rounds):
            for name, module in (("baseline", baseline), ("current", current)):
                times[name].append(round_trips(module, cluster.endpoint, args.calls))
    finally:
        cluster.stop()
    for name, values in times.items():
        print(
            f"{name:<9} median {statistics.median(values):.1f} us, "
            f"{min(values):.1f}-{max(values):.1f} (rounds: {len(values)})"
        )
    ratios = [c / b for b, c in zip(times["baseline"], times["current"], strict=True)]
    print(
        f"current/baseline per round: median {statistics.median(ratios):.3f}, "
        f"{min(ratios):.3f}-{max(ratios):.3f}"
    )


if __name__ == "__main__":
    main()
