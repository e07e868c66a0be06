"""numaserve against its peers: same model, machine, load and load generator, in one run.

  numaserve   `numaserve start` with configs/default.yaml (one pinned single-core instance
              per core, int8), cache off: the peers have none, and cache hits would flatter us
  fastapi     the published "serve BERT with FastAPI on CPU" setup: gunicorn + uvicorn workers,
              workers = cores, torch threads = 1, int8 (benchmarks/peers/fastapi_app.py)
  ray         Ray Serve, one replica per core, one CPU and one torch thread each, int8
              (benchmarks/peers/ray_app.py); left out with --no-ray

All serve the bundled MiniLM embedding model; the run checks each one's vectors against the
fp32 model's, computed in-process, so that all are seen to do the same work.
Each round starts each server, warms it, and drives it with the same closed loop (`numaserve
bench`'s generator; HTTP for the peer), so ratios within a round compare like with like.

Run:  .venv/bin/python benchmarks/peers.py [--clients 16] [--requests 100] [--rounds 2]
          [--json out.json]
Needs the bench extra: pip install -c constraints.txt -e '.[bench]'
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.peers.minilm import Embedder
from numaserve.client import Client
from numaserve.loadgen.bench import closed_loop, http_target, numaserve_target
from numaserve.loadgen.corpus import stdlib_sentences
from tests.harness.cluster import free_port
from tests.harness.server import ENDPOINT, Server

ROOT = Path(__file__).resolve().parents[1]


def memory(root_pid: int) -> dict:
    """RSS of each process in the server's tree, and the tree's total PSS (shared pages
    such as torch's libraries counted once, split between the processes that map them)."""
    root = psutil.Process(root_pid)
    procs = [root, *root.children(recursive=True)]
    full = [p.memory_full_info() for p in procs]
    return {
        "processes": len(procs),
        "rss_mb": sorted(round(m.rss / 2**20, 1) for m in full),
        "total_rss_mb": round(sum(m.rss for m in full) / 2**20, 1),
        "total_pss_mb": round(sum(m.pss for m in full) / 2**20, 1),
    }


class Numaserve:
    name = "numaserve"

    def __init__(self, directory: Path) -> None:
        config = (ROOT / "configs/default.yaml").read_text()
        config = config.replace("tcp://127.0.0.1:5555", ENDPOINT)
        config = config.replace("cache_entries: 100000", "cache_entries: 0")
        self.server = Server(directory, config, name=f"peers-{time.monotonic_ns()}")
        self.server.wait_ready()
        self.pid = self.server.proc.pid
        self.target = numaserve_target([self.server.endpoint])

    def embed(self, text: str) -> list[float]:
        with Client(self.server.endpoint) as c:
            return c.embed(text).vector.tolist()

    def stop(self) -> None:
        self.server.stop()


class HttpPeer:
    """A peer server started as a process tree, serving POST /embed over HTTP."""

    name = ""

    def __init__(self, directory: Path) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.workers = len(os.sched_getaffinity(0))
        self.log = (directory / f"{self.name}-{port}.log").open("w")
        self.proc = subprocess.Popen(
            self.argv(port),
            cwd=ROOT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid = self.proc.pid
        self.target = http_target(f"{self.url}/embed")
        deadline = time.monotonic() + 300
        while not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} did not start; see {self.log.name}")
            time.sleep(1)

    def argv(self, port: int) -> list[str]:
        raise NotImplementedError

    def _answers(self) -> bool:
        try:  # every worker has loaded its model once a few requests in a row are answered
            for _ in range(4 * self.workers):
                self.embed("warm up")
            return True
        except OSError:
            return False

    def embed(self, text: str) -> list[float]:
        request = urllib.request.Request(
            f"{self.url}/embed",
            json.dumps({"text": text}).encode(),
            {"Content-Type": "application/json"},
        )
        return json.loads(urllib.request.urlopen(request, timeout=10).read())["embedding"]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()


class FastAPIPeer(HttpPeer):
    name = "fastapi"

    def argv(self, port: int) -> list[str]:
        return [
            str(Path(sys.executable).with_name("gunicorn")),
            f"--workers={self.workers}",
            "--worker-class=uvicorn.workers.UvicornWorker",
            f"--bind=127.0.0.1:{port}",
            "--timeout=120",
            "benchmarks.peers.fastapi_app:app",
        ]


class RayPeer(HttpPeer):
    name = "ray"

    def argv(self, port: int) -> list[str]:
        return [sys.executable, "-m", "benchmarks.peers.ray_app", f"--port={port}"]


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(
        sum(x * x for x in a) * sum(y * y for y in b)
    )


def measure(system, texts: list[str], clients: int, requests: int) -> dict:
    closed_loop(system.target, texts, clients, 10, seed=1)  # warm every instance
    summary = closed_loop(system.target, texts, clients, requests, seed=2)
    result = summary.summary()
    result["latencies_ms"] = sorted(round(x * 1000, 3) for x in summary.latencies)
    result["memory"] = memory(system.pid)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=100, help="per client")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-ray", action="store_true", help="leave Ray Serve out")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    systems = [Numaserve, FastAPIPeer] + ([] if args.no_ray else [RayPeer])
    texts = stdlib_sentences()
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            row = {}
            for kind in systems:
                system = kind(Path(tmp))
                try:
                    if r == 0:
                        row[f"{system.name}_vectors"] = [system.embed(t) for t in texts[:20]]
                    row[system.name] = measure(system, texts, args.clients, args.requests)
                finally:
                    system.stop()
            rounds.append(row)
    reference = Embedder(quantize=False)
    fp32 = [reference.embed(t) for t in texts[:20]]
    agreement = {
        kind.name: [
            cosine(a, b) for a, b in zip(rounds[0].pop(f"{kind.name}_vectors"), fp32, strict=True)
        ]
        for kind in systems
    }
    print(f"{args.clients} clients x {args.requests} requests, {len(texts)} stdlib sentences")
    print("same work: cosine of each server's embeddings to the fp32 model's, 20 sentences")
    for name, cosines in agreement.items():
        print(f"  {name:<10} mean {sum(cosines) / len(cosines):.4f}  lowest {min(cosines):.4f}")
    print()
    print(
        f"{'round':<6}{'server':<11}{'req/s':>8}{'p50 ms':>9}{'p99 ms':>9}{'PSS MB':>9}"
        f"{'RSS MB':>9}   numaserve: throughput x, p99 x"
    )
    for i, row in enumerate(rounds, 1):
        ours = row["numaserve"]
        for name, s in row.items():
            ratio = (
                f"{ours['throughput_rps'] / s['throughput_rps']:.2f}x, "
                f"{ours['latency_ms']['p99'] / s['latency_ms']['p99']:.2f}x"
                if name != "numaserve"
                else ""
            )
            print(
                f"{i:<6}{name:<11}{s['throughput_rps']:>8.1f}{s['latency_ms']['p50']:>9.2f}"
                f"{s['latency_ms']['p99']:>9.2f}{s['memory']['total_pss_mb']:>9.0f}"
                f"{s['memory']['total_rss_mb']:>9.0f}   {ratio}"
            )
    print("\nRSS of each process, MB:")
    for name, s in rounds[-1].items():
        print(f"  {name:<10} {s['memory']['rss_mb']}")
    if args.json:
        args.json.write_text(json.dumps({"agreement": agreement, "rounds": rounds}, indent=1))


if __name__ == "__main__":
    main()
