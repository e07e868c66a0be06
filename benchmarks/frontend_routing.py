"""What routing by model costs the frontend: libzmq's proxy (one model) against the loop that
reads each request's `model` (a `models:` config), in one run, rounds alternating.

The real frontend (`python -m numaserve.router.frontend`), pinned to the first allowed CPU;
behind it, stand-in shards that answer each request at once (bare pyzmq ROUTERs, one per
model), and a load generator keeping `--inflight` requests outstanding, both on the other CPUs.
Each request is what the client library sends for one embed text: `{"id", "op", "model",
"texts"}`. For each mode: requests/s, and the frontend's CPU time per request (utime + stime
from /proc over the measured window, divided by the requests answered in it).

Run:  .venv/bin/python -m benchmarks.frontend_routing [--seconds 3] [--rounds 3]
          [--inflight 256] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import zmq

from numaserve.host.cpuset import Binding
from numaserve.host.topology import format_topology, read_topology
from numaserve.processes.specs import FrontendSpec, Route
from numaserve.testing.ports import free_port
from numaserve.wire import protocol

MODELS = ("toxicity", "embed")
TEXT = "the quick brown fox jumps over the lazy dog, and then some more words"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def echo(ctx: zmq.Context, endpoint: str, stop: threading.Event) -> None:
    """A stand-in shard: every request answered at once."""
    sock = ctx.socket(zmq.ROUTER)
    sock.linger = 0
    sock.connect(endpoint)
    while not stop.is_set():
        if sock.poll(50):
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                sock.send_multipart([*frames[:-1], b"\x80"])
    sock.close()


def measure(by_model: bool, seconds: float, inflight: int, cpu: int, node: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        models = MODELS if by_model else ("default",)
        spec = FrontendSpec(
            endpoint=f"tcp://127.0.0.1:{free_port()}",
            routes=tuple(Route(m, f"ipc://{tmp}/frontend-{m}.sock") for m in models),
            max_message_bytes=1 << 20,
            by_model=by_model,
            binding=Binding.of([cpu], [node]),
        )
        proc = subprocess.Popen(spec.argv())
        ctx = zmq.Context()
        stop = threading.Event()
        shards = [threading.Thread(target=echo, args=(ctx, r.shards, stop)) for r in spec.routes]
        for t in shards:
            t.start()
        client = ctx.socket(zmq.DEALER)
        client.linger = 0
        client.connect(spec.endpoint)
        bodies = [
            protocol.pack(
                {"id": i, "op": "embed", "model": models[i % len(models)], "texts": [TEXT]}
            )
            for i in range(inflight)
        ]
        try:
            for frames in bodies:  # the first round trip also waits for the connections
                client.send_multipart(frames)
            for _ in range(inflight):
                client.recv_multipart()
            answered, began, cpu_before = 0, time.perf_counter(), cpu_seconds(proc.pid)
            for frames in bodies:
                client.send_multipart(frames)
            while time.perf_counter() - began < seconds:
                client.recv_multipart()
                answered += 1
                client.send_multipart(bodies[answered % inflight])
            elapsed = time.perf_counter() - began
            used = cpu_seconds(proc.pid) - cpu_before
        finally:
            stop.set()
            for t in shards:
                t.join()
            client.close()
            proc.terminate()
            proc.wait()
            ctx.term()
    return {"requests_per_s": answered / elapsed, "frontend_cpu_us": 1e6 * used / answered}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--inflight", type=int, default=256)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    topo = read_topology()
    print(format_topology(topo), end="\n\n")
    allowed = sorted(os.sched_getaffinity(0))
    cpu = allowed[0]
    node = next(c.node for c in topo.cores if cpu in c.cpus)
    os.sched_setaffinity(0, allowed[1:] or allowed)  # the load apart from the frontend
    runs: dict[str, list[dict]] = {"proxy (one model)": [], "by model (two)": []}
    for _ in range(args.rounds):
        for name, by_model in (("proxy (one model)", False), ("by model (two)", True)):
            runs[name].append(measure(by_model, args.seconds, args.inflight, cpu, node))
    print(f"{'mode':<20} {'requests/s':>12} {'frontend CPU us/request':>25}")
    summary = {}
    for name, results in runs.items():
        rate = statistics.median(r["requests_per_s"] for r in results)
        cost = statistics.median(r["frontend_cpu_us"] for r in results)
        summary[name] = {"requests_per_s": rate, "frontend_cpu_us": cost, "rounds": results}
        print(f"{name:<20} {rate:>12,.0f} {cost:>25.1f}")
    proxy, routed = summary["proxy (one model)"], summary["by model (two)"]
    print(
        f"\nby model / proxy: {routed['requests_per_s'] / proxy['requests_per_s']:.2f}x the "
        f"requests/s, {routed['frontend_cpu_us'] / proxy['frontend_cpu_us']:.2f}x the CPU per "
        f"request (+{routed['frontend_cpu_us'] - proxy['frontend_cpu_us']:.1f} us)"
    )
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
