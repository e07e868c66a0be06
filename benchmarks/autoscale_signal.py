"""How the autoscalers' signal moves from idle to saturation: numaserve_instance_busy_ratio
(deploy/kubernetes/overlays/autoscale-hpa), each instance's seconds of forward passes a
second, read from the server's own /metrics as the prometheus-adapter rule computes it, at
offered loads from idle to past capacity, with the latency those loads see.

The server: `configs/default.yaml`'s model path (`quantize: auto`), 2 instances x 1 core, cache
off. Capacity is first found with `numaserve bench`'s closed loop (8 clients); then an open
loop offers each fraction of it for --seconds, and the busy ratio is the forward-pass seconds
the instances added over that window, over the window and the instances.

Run:  .venv/bin/python -m benchmarks.autoscale_signal [--seconds 20] [--traffic short]
          [--loads 0,0.2,0.4,0.6,0.8,0.9,1.0,1.2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from benchmarks.served_default import corpus
from numaserve.host.topology import format_topology, read_topology
from numaserve.loadgen.bench import closed_loop, drawing, numaserve_target, open_loop
from numaserve.status.report import RunningPath
from numaserve.testing.server import ENDPOINT, Server

CONFIG = """\
model: {{path: bundled:minilm, task: embed}}
placement: {{pools: [{{name: all, max_tokens: 256, cores_per_instance: 1}}]}}
server: {{endpoint: "{endpoint}", cache_entries: 0}}
"""


def busy_seconds(metrics: str) -> tuple[float, int]:
    """(the instances' forward-pass seconds so far, the ready instances), from /metrics."""
    total, ready = 0.0, 0
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == "numaserve_forward_pass_seconds_sum":
                total += sample.value
            elif sample.name == "numaserve_instance_up":
                ready += int(sample.value)
    return total, ready


def scrape(server: Server) -> tuple[float, float, int]:
    with urllib.request.urlopen(f"http://{server.metrics}/metrics", timeout=5) as reply:
        return (time.monotonic(), *busy_seconds(reply.read().decode()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--traffic", default="short")
    parser.add_argument("--loads", default="0,0.2,0.4,0.6,0.8,0.9,1.0,1.2")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    print(format_topology(read_topology()), flush=True)
    texts = corpus(args.traffic)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp), CONFIG.format(endpoint=ENDPOINT))
        try:
            ready = server.wait_ready(timeout=900)
            paths = {str(RunningPath.from_wire(i["model_path"]).runs.path) for i in ready.values()}
            connect = numaserve_target([server.endpoint], timeout=30)
            closed_loop(connect, texts, 8, 100, draw=drawing("embed"))  # warm-up
            capacity = closed_loop(connect, texts, 8, 1000, draw=drawing("embed"))
            capacity_rps = capacity.summary()["throughput_rps"]
            print(f"model path {', '.join(sorted(paths))}; capacity {capacity_rps:.0f} req/s")
            print(f"{'offered':>8} {'req/s':>8} {'served':>8} {'busy ratio':>10} {'p50 ms':>8} "
                  f"{'p99 ms':>8} {'errors':>6}")  # fmt: skip
            for load in (float(x) for x in args.loads.split(",")):
                before = scrape(server)
                if load == 0:
                    time.sleep(args.seconds)
                    summary = {"throughput_rps": 0.0, "latency_ms": {}, "errors": {}}
                else:
                    rate = load * capacity_rps
                    run = open_loop([server.endpoint], texts, rate, args.seconds, timeout=30)
                    summary = run.summary()
                after = scrape(server)
                ratio = (after[1] - before[1]) / (after[0] - before[0]) / max(after[2], 1)
                latency = summary["latency_ms"]
                row = {
                    "offered": load,
                    "offered_rps": round(load * capacity_rps, 1),
                    "served_rps": summary["throughput_rps"],
                    "busy_ratio": round(ratio, 3),
                    "p50_ms": latency.get("p50"),
                    "p99_ms": latency.get("p99"),
                    "errors": sum(summary["errors"].values()),
                }
                rows.append(row)
                print(
                    f"{load:>8.0%} {row['offered_rps']:>8.0f} {row['served_rps']:>8.0f} "
                    f"{ratio:>10.2f} {row['p50_ms'] or 0:>8.1f} {row['p99_ms'] or 0:>8.1f} "
                    f"{row['errors']:>6}",
                    flush=True,
                )
        finally:
            server.stop()
    if args.json:
        result = {"capacity_rps": capacity_rps, "paths": sorted(paths), "rows": rows}
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
