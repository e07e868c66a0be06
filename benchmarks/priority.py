"""Interactive queries beside a bulk flood: their latency with the flood marked bulk, unmarked,
and with no flood at all, through one real server.

Starts `numaserve start` with the default model and path, two single-core instances, the cache
off. First its capacity: requests of one short text a second, closed loop, 8 clients x 4 in
flight. Then, in each round, three phases in turns (the order rotates each round):
  idle      the probe alone: one client, one short query at a time, 10 a second (open loop)
  bulk      the probe, beside a flood at 3x capacity (open loop, 8 clients x up to 64 in
            flight) marked `priority: bulk`
  unmarked  the same flood without the mark
Reported: the probe's p50 and p99 in each phase; unmarked p99 / bulk p99; bulk p99 less idle
p99 against one micro-batch's forward pass (the mean of numaserve_forward_pass_seconds during
the bulk phase); the flood's goodput against the capacity the probe leaves.

With --server-cpus and --load-cpus the server (under `taskset`) and this process, which
generates every request, run on CPUs of their own (as benchmarks/reliability.py does).

Run:  .venv/bin/python -m benchmarks.priority [--rounds 3] [--seconds 15] [--out FILE]
          [--server-cpus 1 --load-cpus 0 --instances 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from benchmarks import machine
from benchmarks.reliability import config  # single-core instances, the cache off
from numaserve.host.cpulist import parse_cpulist
from numaserve.testing.load import RawLoad
from numaserve.testing.server import Server

PROBE_RATE = 10.0
FLOOD_CLIENTS = 8


def passes(server: Server) -> tuple[float, float]:
    """The forward passes' (sum of seconds, count) so far, over every instance."""
    text = httpx.get(f"http://{server.metrics}/metrics", timeout=10).text
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith("numaserve_forward_pass_seconds_sum"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith("numaserve_forward_pass_seconds_count"):
            count += float(line.rsplit(" ", 1)[1])
    return total, count


def phase(server: Server, seconds: float, flood_rate: float | None, bulk: bool) -> dict:
    probe = RawLoad(server.endpoint, clients=1, depth=1, text="query", rate=PROBE_RATE)
    flood = None
    if flood_rate:
        fields = {"priority": "bulk"} if bulk else {}
        flood = RawLoad(
            server.endpoint,
            clients=FLOOD_CLIENTS,
            depth=64,
            text="bulk",
            rate=flood_rate / FLOOD_CLIENTS,
            fields=fields,
        )
    before = passes(server)
    time.sleep(seconds)
    after = passes(server)
    probed = probe.stop()
    flooded = flood.stop() if flood else None
    ok = probed.latency_ms.get("ok", [])
    result = {
        "probe": {
            **probed.summary(),
            "p50_ms": round(float(np.percentile(ok, 50)), 2) if ok else None,
            "p99_ms": round(float(np.percentile(ok, 99)), 2) if ok else None,
        },
        "pass_ms": round(1000 * (after[0] - before[0]) / max(1.0, after[1] - before[1]), 2),
    }
    if flooded:
        result["flood"] = {**flooded.summary(), "goodput_per_s": flooded.codes["ok"] / seconds}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--server-cpus", help="the server's CPUs (taskset), e.g. 1")
    parser.add_argument("--load-cpus", help="this process's CPUs (the load), e.g. 0")
    args = parser.parse_args()
    topology = machine.topology()
    if args.load_cpus:
        os.sched_setaffinity(0, parse_cpulist(args.load_cpus))
    prefix = ("taskset", "-c", args.server_cpus) if args.server_cpus else ()
    with tempfile.TemporaryDirectory() as directory:
        server = Server(Path(directory), config(args.instances), prefix=prefix)
        try:
            server.wait_ready(timeout=900)
            closed = RawLoad(server.endpoint, clients=8, depth=4, text="capacity")
            time.sleep(args.seconds)
            capacity = closed.stop().codes["ok"] / args.seconds
            print(f"capacity: {capacity:.0f} requests/s")
            flood = 3 * capacity
            kinds = {
                "idle": (None, False),
                "bulk": (flood, True),
                "unmarked": (flood, False),
            }
            rounds = []
            for r in range(args.rounds):
                order = list(kinds)[r % 3 :] + list(kinds)[: r % 3]
                got = {k: phase(server, args.seconds, *kinds[k]) for k in order}
                rounds.append(got)
                print(json.dumps({k: got[k]["probe"]["p99_ms"] for k in kinds}))
        finally:
            server.stop()

    def med(key, *path):
        values = []
        for got in rounds:
            value = got[key]
            for p in path:
                value = value[p]
            values.append(value)
        return statistics.median(values), min(values), max(values)

    left = capacity - PROBE_RATE
    result = {
        "topology": topology,
        "server_cpus": args.server_cpus or "all",
        "load_cpus": args.load_cpus or "all",
        "instances": args.instances,
        "capacity_per_s": round(capacity, 1),
        "flood_per_s": round(3 * capacity, 1),
        "rounds": rounds,
        "p99_ms": {k: med(k, "probe", "p99_ms") for k in ("idle", "bulk", "unmarked")},
        "unmarked_over_bulk_p99": [
            round(g["unmarked"]["probe"]["p99_ms"] / g["bulk"]["probe"]["p99_ms"], 2)
            for g in rounds
        ],
        "bulk_minus_idle_p99_ms": [
            round(g["bulk"]["probe"]["p99_ms"] - g["idle"]["probe"]["p99_ms"], 2) for g in rounds
        ],
        "bulk_pass_ms": [g["bulk"]["pass_ms"] for g in rounds],
        "bulk_goodput_over_capacity_left": [
            round(g["bulk"]["flood"]["goodput_per_s"] / left, 3) for g in rounds
        ],
    }
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
