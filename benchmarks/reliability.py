"""What a flood and a huge text cost: goodput under 25x overload against the same server at a
normal load, and the router's time and memory for a 4 MiB text, in one run.

Starts `numaserve start` as the hardening issue's attack did (two single-core instances,
cache off, the default model), then:
  huge      one text just under server.max_message_bytes (4 MiB): the router's CPU time for
            it, and its RSS before, right after and 5 s after
  normal    2 raw clients x 4 requests in flight, for --seconds
  overload  --clients raw clients x at most --depth requests in flight, for --seconds,
            offering --overload (25) times the normal phase's goodput at a steady rate
The clients never retry (tests/raw_load.py). Reported: answered ok per second (goodput) in
each phase and their ratio, every reply's code, requests never answered, p50/p99 latency of
`ok` and `overloaded` replies, the slowest reply of any kind, and the router's RSS.
The load runs in processes of its own (--procs), so the client's GIL is not the bottleneck.

Run:  .venv/bin/python -m benchmarks.reliability [--seconds 20] [--clients 50] [--depth 64]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import tempfile
import time
from pathlib import Path

import psutil

from benchmarks import machine
from numaserve.client import Client, NumaserveError
from numaserve.testing.load import Outcomes, RawLoad
from numaserve.testing.server import ENDPOINT, Server

CONFIG = """
server: {endpoint: "@ENDPOINT@", cache_entries: 0}
placement:
  pools: [{name: main, max_tokens: 256, cores_per_instance: 1, instances: 2}]
""".replace("@ENDPOINT@", ENDPOINT)


def run_load(endpoint, clients, depth, rate, seconds, tag, queue) -> None:
    load = RawLoad(endpoint, clients=clients, depth=depth, text=tag, rate=rate)
    time.sleep(seconds)
    queue.put(load.stop(drain_s=15))


def phase(endpoint, clients, depth, seconds, procs, router, rate=None) -> dict:
    """`rate`: requests/s offered in all (an open loop); None: a closed loop."""
    queue = multiprocessing.Queue()
    per = [clients // procs + (i < clients % procs) for i in range(procs)]
    workers = [
        multiprocessing.Process(
            target=run_load,
            args=(
                endpoint,
                n,
                depth,
                rate and rate / clients,
                seconds,
                f"p{i}-{time.time()}",
                queue,
            ),
        )
        for i, n in enumerate(per)
        if n
    ]
    rss = [router.memory_info().rss]
    for w in workers:
        w.start()
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        time.sleep(0.5)
        rss.append(router.memory_info().rss)
    total = Outcomes()
    for _ in workers:
        total.add(queue.get(timeout=seconds + 60))
    for w in workers:
        w.join()

    def pct(code: str, q: float) -> float | None:
        values = sorted(total.latency_ms.get(code, []))
        return round(values[min(len(values) - 1, int(q * len(values)))], 2) if values else None

    every = [v for values in total.latency_ms.values() for v in values]
    return {
        "clients": clients,
        "depth": depth,
        "offered_per_s": rate and round(rate),
        "seconds": seconds,
        **total.summary(),
        "goodput_per_s": round(total.codes["ok"] / seconds, 1),
        "ok_p50_ms": pct("ok", 0.5),
        "ok_p99_ms": pct("ok", 0.99),
        "overloaded_p50_ms": pct("overloaded", 0.5),
        "overloaded_p99_ms": pct("overloaded", 0.99),
        "slowest_reply_ms": round(max(every), 1) if every else None,
        "router_rss_mb": [round(min(rss) / 2**20, 1), round(max(rss) / 2**20, 1)],
    }


def huge_text(endpoint: str, router: psutil.Process) -> dict:
    text = "All work and no play makes a dull model. " * ((4 << 20) // 41 - 100)
    with Client(endpoint, timeout=60) as client:
        client.embed("warm up")
        rss, cpu = router.memory_info().rss, sum(router.cpu_times()[:2])
        started = time.monotonic()
        try:
            result = client.embed(text)
        except NumaserveError as e:  # as the server before the hardening issue answered
            result = e
        elapsed = time.monotonic() - started
        used, right_after = sum(router.cpu_times()[:2]) - cpu, router.memory_info().rss
        time.sleep(5)
        return {
            "bytes": len(text.encode()),
            **(
                {"error": f"{type(result).__name__}: {result}"}
                if isinstance(result, NumaserveError)
                else {"tokens": result.tokens, "truncated": result.truncated}
            ),
            "reply_s": round(elapsed, 3),
            "router_cpu_s": round(used, 3),
            "router_rss_mb": [
                round(v / 2**20, 1) for v in (rss, right_after, router.memory_info().rss)
            ],
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--depth", type=int, default=64)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument(
        "--overload",
        type=float,
        default=25,
        help="offered load as a multiple of the normal phase's goodput (an open loop); "
        "0: a closed loop, each client sending again as soon as it is answered",
    )
    parser.add_argument("--out", default="benchmarks/results/reliability.json")
    args = parser.parse_args()
    topology = machine.topology()
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp), CONFIG)
        try:
            server.wait_ready(timeout=300)
            router = psutil.Process(server.router_pid())
            huge = huge_text(server.endpoint, router)
            print("huge    ", json.dumps(huge))
            normal = phase(server.endpoint, 2, 4, args.seconds, 2, router)
            print("normal  ", json.dumps(normal))
            rate = args.overload * normal["goodput_per_s"] or None
            overload = phase(
                server.endpoint, args.clients, args.depth, args.seconds, args.procs, router, rate
            )
            print("overload", json.dumps(overload))
        finally:
            server.stop()
            warnings = [
                line
                for line in server.log().splitlines()
                if " WARNING " in line or " ERROR " in line
            ]
            print(f"the server logged {len(warnings)} warning(s) and error(s)")
            print("\n".join(warnings[:20]))
    result = {
        "topology": topology,
        "huge_text": huge,
        "normal": normal,
        "overload": overload,
        "goodput_ratio": round(overload["goodput_per_s"] / normal["goodput_per_s"], 3),
    }
    print("goodput under overload / normal:", result["goodput_ratio"])
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
