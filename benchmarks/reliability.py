"""What a flood and a huge text cost: goodput under 25x overload against the same server at a
normal load, and the router's time and memory for a 4 MiB text, in one run.

Starts `numaserve start` (single-core instances, cache off, the default model), then:
  huge      one text just under server.max_message_bytes (4 MiB): the router's CPU time for
            it, and its RSS before, right after and 5 s after
  normal    2 raw clients x --normal-depth (32) requests in flight, for --seconds: the
            server's capacity (enough in flight for full micro-batches on every instance)
  overload  for each multiple in --overload (2, 5, 25): --clients raw clients x at most
            --depth requests in flight, for --seconds, offering that multiple of the normal
            phase's goodput at a steady rate (an open loop)
The clients never retry (numaserve/testing/load.py). Reported: answered ok per second
(goodput) in each phase and its ratio to normal, every reply's code, requests never answered,
p50/p99 latency of `ok` and `overloaded` replies, the slowest reply of any kind, the router's
RSS, and the CPU time the router, the instances and the load generator each used.

With --server-cpus and --load-cpus the server (started under `taskset`: it plans on the CPUs
it is allowed) and the load generator's processes run on CPUs of their own, so that the
goodput measured is the server's and not what the generator left it. Without them both share
every CPU, as on a machine whose clients run beside the server.

Run:  .venv/bin/python -m benchmarks.reliability [--server-cpus 1 --load-cpus 0]
      [--overload 2,5,25] [--instances 2] [--seconds 20] [--clients 50] [--depth 64]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
import time
from pathlib import Path

import psutil

from benchmarks import machine
from benchmarks.router_capacity import cpu_seconds
from numaserve.client import Client, NumaserveError
from numaserve.host.cpulist import parse_cpulist
from numaserve.testing.load import Outcomes, RawLoad
from numaserve.testing.server import ENDPOINT, Server


def config(instances: int = 2) -> str:
    """Single-core instances of the default model, the cache off: every text computed."""
    return f"""
server: {{endpoint: "{ENDPOINT}", cache_entries: 0}}
placement:
  pools: [{{name: main, max_tokens: 256, cores_per_instance: 1, instances: {instances}}}]
"""


CONFIG = config()  # two instances, as the hardening issue's attack ran


def run_load(endpoint, clients, depth, rate, seconds, tag, queue, cpus) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)
    load = RawLoad(endpoint, clients=clients, depth=depth, text=tag, rate=rate)
    time.sleep(seconds)
    queue.put(load.stop(drain_s=15))


def phase(endpoint, clients, depth, seconds, procs, server, rate=None, cpus=None) -> dict:
    """`rate`: requests/s offered in all (an open loop); None: a closed loop. `cpus`: the
    CPUs the load processes are pinned to (None: any)."""
    router = psutil.Process(server.router_pid())
    instances = [i["pid"] for i in server.instances().values()]
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
                cpus,
            ),
        )
        for i, n in enumerate(per)
        if n
    ]
    rss = [router.memory_info().rss]
    for w in workers:
        w.start()
    groups = ([router.pid], instances, [w.pid for w in workers])
    before = [cpu_seconds(pids) for pids in groups]
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        time.sleep(0.5)
        rss.append(router.memory_info().rss)
    used = [cpu_seconds(pids) for pids in groups]  # the load drains, still alive
    elapsed = time.monotonic() - started
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
        # CPUs' worth each used over the phase
        "cpus_used": {
            name: round((u - b) / elapsed, 2)
            for name, u, b in zip(("router", "instances", "load"), used, before, strict=True)
        },
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
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument(
        "--normal-depth",
        type=int,
        default=32,
        help="requests each of the normal phase's two clients keeps in flight (4 before "
        "2026-11-28: too few for full micro-batches, so capacity read low)",
    )
    parser.add_argument(
        "--overload",
        default="25",
        help="offered loads, as multiples of the normal phase's goodput (an open loop), "
        "comma-separated; 0: a closed loop, each client sending again once answered",
    )
    parser.add_argument("--server-cpus", help="the server's CPUs (taskset), e.g. 1")
    parser.add_argument("--load-cpus", help="the load generator's CPUs, e.g. 0")
    parser.add_argument("--skip-huge", action="store_true", help="no 4 MiB text")
    parser.add_argument("--out", default="benchmarks/results/reliability.json")
    args = parser.parse_args()
    topology = machine.topology()
    load_cpus = parse_cpulist(args.load_cpus) if args.load_cpus else None
    prefix = ("taskset", "-c", args.server_cpus) if args.server_cpus else ()
    result: dict = {
        "topology": topology,
        "server_cpus": args.server_cpus or "all",
        "load_cpus": args.load_cpus or "all",
        "instances": args.instances,
    }
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp), config(args.instances), prefix=prefix)
        try:
            server.wait_ready(timeout=300)
            if not args.skip_huge:
                router = psutil.Process(server.router_pid())
                result["huge_text"] = huge_text(server.endpoint, router)
                print("huge    ", json.dumps(result["huge_text"]))
            normal = phase(
                server.endpoint, 2, args.normal_depth, args.seconds, 2, server, cpus=load_cpus
            )
            result["normal"] = normal
            print("normal  ", json.dumps(normal))
            result["overload"] = {}
            for multiple in (float(m) for m in args.overload.split(",")):
                rate = multiple * normal["goodput_per_s"] or None
                overload = phase(
                    server.endpoint,
                    args.clients,
                    args.depth,
                    args.seconds,
                    args.procs,
                    server,
                    rate,
                    load_cpus,
                )
                overload["goodput_ratio"] = round(
                    overload["goodput_per_s"] / normal["goodput_per_s"], 3
                )
                result["overload"][f"{multiple:g}x"] = overload
                print(f"{multiple:g}x".ljust(8), json.dumps(overload))
        finally:
            server.stop()
            warnings = [
                line
                for line in server.log().splitlines()
                if " WARNING " in line or " ERROR " in line
            ]
            print(f"the server logged {len(warnings)} warning(s) and error(s)")
            print("\n".join(warnings[:20]))
    for name, overload in result["overload"].items():
        print(f"goodput at {name} / normal: {overload['goodput_ratio']}")
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
