"""The HTTP API against the ZeroMQ endpoint of the same running server, on cache hits: what the
HTTP front costs when the model costs nothing. One `numaserve start` of configs/default.yaml
(cache on), its cache warmed with the texts; then, alternating, the same closed loop over
ZeroMQ and over HTTP (TEI's POST /embed), each round's requests/s, p99 and the CPU time each
of the server's processes spent a request (from /proc: the HTTP front's is its whole cost).

The cache-off comparison (HTTP against ZeroMQ and against infinity-emb, where the model runs)
is benchmarks/peers.py's, with `--systems numaserve,numaserve-http,infinity`.

Run:  .venv/bin/python -m benchmarks.http_api [--clients 32] [--requests 4000] [--rounds 3]
          [--texts 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.peers import ROOT, measure
from numaserve.host.topology import format_topology, read_topology
from numaserve.loadgen.bench import closed_loop, http_target, numaserve_target
from numaserve.loadgen.corpus import stdlib_sentences
from numaserve.testing.server import ENDPOINT, Server


class Way:
    """One way into the server: what `measure` drives and whose processes it reads."""

    def __init__(self, name: str, target, pid: int):
        self.name, self.target, self.pid = name, target, pid


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=4000, help="per round and way")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--texts", type=int, default=200, help="distinct texts, all cached")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    topo = read_topology()
    print(format_topology(topo), flush=True)
    texts = stdlib_sentences()[: args.texts]
    config = (ROOT / "configs/default.yaml").read_text().replace("tcp://127.0.0.1:5555", ENDPOINT)
    results: dict = {"topology": topo.to_json(), "settings": vars(args) | {"json": str(args.json)}}
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp), config, name=f"http-api-{time.monotonic_ns()}")
        try:
            server.wait_ready()
            ways = [
                Way("zeromq", numaserve_target([server.endpoint]), server.proc.pid),
                Way("http", http_target(f"{server.url}/embed"), server.proc.pid),
            ]
            closed_loop(ways[0].target, texts, 1, len(texts) * 3)  # every text cached
            rounds = results["rounds"] = []
            for r in range(args.rounds):
                row = {}
                for way in ways if r % 2 == 0 else ways[::-1]:  # ABBA: drift cancels
                    row[way.name] = measure(way, texts, args.clients, args.requests)
                    row[way.name].pop("latencies_ms")
                rounds.append(row)
                print(f"round {r + 1}: {line(row)}", flush=True)
        finally:
            server.stop()
    report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def by_role(result: dict, role: str) -> float:
    """CPU microseconds a request of the processes running `role` (numaserve.http: the fronts)."""
    per = result["cpu_ms_per_request_by_process"]
    return 1000 * sum(ms for name, ms in per.items() if name.split(" ")[0] == role)


def line(row: dict) -> str:
    z, h = row["zeromq"], row["http"]
    return (
        f"zeromq {z['throughput_rps']:.0f} req/s p99 {z['latency_ms']['p99']:.2f} ms, "
        f"http {h['throughput_rps']:.0f} req/s p99 {h['latency_ms']['p99']:.2f} ms "
        f"({h['throughput_rps'] / z['throughput_rps']:.2f}x); HTTP front "
        f"{by_role(h, 'numaserve.http'):.1f} us CPU a request, router "
        f"{by_role(h, 'numaserve.router'):.1f} us (over ZeroMQ {by_role(z, 'numaserve.router'):.1f})"
    )


def report(results: dict) -> None:
    rows = results["rounds"]
    ratios = [r["http"]["throughput_rps"] / r["zeromq"]["throughput_rps"] for r in rows]
    front = [by_role(r["http"], "numaserve.http") for r in rows]
    print(
        f"\ncache hits, {results['settings']['clients']} clients: HTTP/ZeroMQ throughput "
        f"median {statistics.median(ratios):.2f}x (rounds {', '.join(f'{x:.2f}' for x in ratios)});"
        f" HTTP front CPU a request median {statistics.median(front):.1f} us "
        f"(rounds {', '.join(f'{x:.1f}' for x in front)})"
    )


if __name__ == "__main__":
    main()
