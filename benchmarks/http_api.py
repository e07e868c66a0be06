"""The HTTP API against the ZeroMQ endpoint of the same running server, on cache hits: what the
HTTP front costs when the model costs nothing. One `numaserve start` of configs/default.yaml
(cache on), its cache warmed with the texts; then, alternating, the same closed loop over
ZeroMQ and over HTTP (TEI's POST /embed), each round's requests/s, p99 and the CPU time each
of the server's processes spent a request (from /proc: the HTTP front's is its whole cost).

The load generator is Python (numaserve bench's closed loop) and shares the CPUs: its HTTP
client costs it more a request than its ZeroMQ one. `--wrk SECONDS` then also drives the HTTP
API with wrk (a C load generator, `apt-get install wrk`) on one cached text, at --clients
connections: the front's cost a request when it, not the generator, is the bound.

The cache-off comparison (HTTP against ZeroMQ and against infinity-emb, where the model runs)
is benchmarks/peers.py's, with `--systems numaserve,numaserve-http,infinity`.

Run:  .venv/bin/python -m benchmarks.http_api [--clients 32] [--requests 4000] [--rounds 3]
          [--texts 200] [--wrk 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.peers import ROOT, measure
from numaserve.corpus import stdlib_sentences
from numaserve.host.topology import format_topology, read_topology
from numaserve.loadgen.bench import closed_loop, http_target, numaserve_target
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
    parser.add_argument("--wrk", type=float, default=0, help="seconds of wrk each round; 0: none")
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
                if args.wrk:
                    row["wrk"] = wrk(server, texts[0], args.clients, args.wrk, Path(tmp))
                    print(f"  wrk: {row['wrk']}", flush=True)
                rounds.append(row)
                print(f"round {r + 1}: {line(row)}", flush=True)
        finally:
            server.stop()
    report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def cpu_s(pids: list[int]) -> dict[str, float]:
    """User and system CPU seconds of `pids`, from /proc."""
    user = system = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        user, system = user + int(fields[11]), system + int(fields[12])
    tick = 100  # USER_HZ
    return {"user": user / tick, "system": system / tick}


def wrk(server: Server, text: str, connections: int, seconds: float, tmp: Path) -> dict:
    """wrk on POST /embed of one cached text: requests/s, p99, and the fronts' CPU a request."""
    script = tmp / "post.lua"
    body = json.dumps({"inputs": text}).replace("'", "\\'")
    script.write_text(
        f"wrk.method = 'POST'\nwrk.body = '{body}'\n"
        "wrk.headers['Content-Type'] = 'application/json'\n"
    )
    fronts = server.http_pids()
    before = cpu_s(fronts)
    out = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{seconds:g}s",
            "--latency",
            "-s",
            str(script),
            f"{server.url}/embed",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    after = cpu_s(fronts)
    done = int(re.search(r"(\d+) requests in", out).group(1))
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[p99.group(2)]
    return {
        "requests_per_s": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        "p99_ms": round(float(p99.group(1)) * scale, 3),
        "front_us_per_request": {
            k: round(1e6 * (after[k] - before[k]) / done, 1) for k in ("user", "system")
        },
    }


def by_role(result: dict, role: str) -> float:
    """CPU microseconds a request of the processes running `role` (numaserve.fronts: the fronts)."""
    per = result["cpu_ms_per_request_by_process"]
    return 1000 * sum(ms for name, ms in per.items() if name.split(" ")[0] == role)


def line(row: dict) -> str:
    z, h = row["zeromq"], row["http"]
    return (
        f"zeromq {z['throughput_rps']:.0f} req/s p99 {z['latency_ms']['p99']:.2f} ms, "
        f"http {h['throughput_rps']:.0f} req/s p99 {h['latency_ms']['p99']:.2f} ms "
        f"({h['throughput_rps'] / z['throughput_rps']:.2f}x); HTTP front "
        f"{by_role(h, 'numaserve.fronts'):.1f} us CPU a request, router "
        f"{by_role(h, 'numaserve.router'):.1f} us (over ZeroMQ {by_role(z, 'numaserve.router'):.1f})"
    )


def report(results: dict) -> None:
    rows = results["rounds"]
    ratios = [r["http"]["throughput_rps"] / r["zeromq"]["throughput_rps"] for r in rows]
    front = [by_role(r["http"], "numaserve.fronts") for r in rows]
    print(
        f"\ncache hits, {results['settings']['clients']} clients: HTTP/ZeroMQ throughput "
        f"median {statistics.median(ratios):.2f}x (rounds {', '.join(f'{x:.2f}' for x in ratios)});"
        f" HTTP front CPU a request median {statistics.median(front):.1f} us "
        f"(rounds {', '.join(f'{x:.1f}' for x in front)})"
    )


if __name__ == "__main__":
    main()
