"""What the client library costs a request, against another version of it: round trips of
one cached text (the router's cache answers, so the client's own work shows) through the real
router, this client and the baseline's alternating in rounds on the same connection setup.

    git show REV:numaserve/client.py > /tmp/baseline_client.py   # (before the package split)
    .venv/bin/python -m benchmarks.client_ab --baseline /tmp/baseline_client.py
    .venv/bin/python -m benchmarks.client_ab --baseline-rev REV     # any commit: its whole tree

With --baseline-rev each round runs in a child process whose numaserve is the commit's (taken
with `git archive`) or this tree's, so the client package and what it imports both change.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
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


ROUND = """
import sys, time
from numaserve import client
with client.Client(sys.argv[1], timeout=5) as c:
    c.embed("a text the router's cache answers")
    began = time.perf_counter()
    for _ in range(int(sys.argv[2])):
        c.embed("a text the router's cache answers")
    print((time.perf_counter() - began) / int(sys.argv[2]) * 1e6)
"""


def round_trips_in(tree: Path, endpoint: str, calls: int) -> float:
    """round_trips with the numaserve package of `tree`, in a child process."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", ROUND, endpoint, str(calls)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=tree,
    )
    return float(out.stdout.split()[-1])


def rev_tree(rev: str) -> Path:
    """The numaserve package of commit `rev`, unpacked in a temporary directory."""
    tree = Path(tempfile.mkdtemp(prefix="client-ab-"))
    archive = subprocess.run(["git", "archive", rev, "numaserve"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def main() -> None:
    parser = argparse.ArgumentParser()
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--baseline", help="another version's client module file")
    which.add_argument("--baseline-rev", help="a commit, whose numaserve package is the baseline")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    if args.baseline_rev:
        here = Path(current.__file__).resolve().parents[2]
        base = rev_tree(args.baseline_rev)

        def measure(name, endpoint):
            return round_trips_in(base if name == "baseline" else here, endpoint, args.calls)
    else:
        modules = {"baseline": load_baseline(args.baseline), "current": current}

        def measure(name, endpoint):
            return round_trips(modules[name], endpoint, args.calls)

    cluster = Cluster(Path(tempfile.mkdtemp()), CONFIG).start()
    try:
        times: dict[str, list[float]] = {"baseline": [], "current": []}
        for _ in range(args.rounds):
            for name in times:
                times[name].append(measure(name, cluster.endpoint))
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
