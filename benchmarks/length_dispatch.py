"""Length-aware dispatch against length-blind, on the same cores, in one run.

Mostly short texts with some long ones, sent open loop (each at its own fixed rate, so both
layouts get exactly the same offered load):
  length-aware   a `small` pool (texts up to 64 tokens) and a `large` pool (up to 256), one
                 single-core instance each: a short text never queues behind a long one
  length-blind   the same cores as two equal instances of one pool that takes every text
Reports p50/p99 of the short requests (what length-aware dispatch is for) and of the long,
at each short-text rate given (a sweep shows where the layouts part).

Run:  .venv/bin/python -m benchmarks.length_dispatch [--short-rate 60 100 140] [--long-rate 6]
          [--duration 30] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path

from numaserve.corpus import stdlib_sentences
from numaserve.loadgen.bench import open_loop
from numaserve.testing.server import ENDPOINT, Server

CONFIG = """
model: {{path: bundled:minilm, max_length: 256}}
server: {{endpoint: "{endpoint}", cache_entries: 0, max_batch: 1}}  # the layouts alone
placement:
  reserved_cores: 0
  pools: {pools}
"""
LAYOUTS = {
    "length-aware": "[{name: small, max_tokens: 64, instances: 1},"
    " {name: large, max_tokens: 256, instances: 1}]",
    "length-blind": "[{name: main, max_tokens: 256, instances: 2}]",
}


def workload(texts: list[str]) -> tuple[list[str], list[str]]:
    """Short: single sentences of 6-25 words. Long: runs of sentences of 150-190 words
    (about 200-250 tokens), cut from the same corpus."""
    short = [t for t in texts if 6 <= len(t.split()) <= 25]
    long, run = [], []
    for t in texts:
        run.append(t)
        if 150 <= sum(len(r.split()) for r in run) <= 190:
            long.append(" ".join(run))
            run = []
        elif sum(len(r.split()) for r in run) > 190:
            run = []
    return short, long


def drive(
    endpoint: str, short: list[str], long: list[str], rates: tuple[float, float], seconds: float
) -> dict:
    """Both open loops at once, each in its own thread with its own event loop."""
    results = {}

    def run(name: str, texts: list[str], rate: float, seed: int) -> None:
        results[name] = open_loop([endpoint], texts, rate, seconds, seed=seed)

    threads = [
        threading.Thread(target=run, args=("short", short, rates[0], 1)),
        threading.Thread(target=run, args=("long", long, rates[1], 2)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {name: r.summary() for name, r in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--short-rate",
        type=float,
        nargs="+",
        default=[60.0, 100.0, 140.0],
        help="short texts per second (several: a sweep)",
    )
    parser.add_argument("--long-rate", type=float, default=6.0, help="long texts per second")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds per layout")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    short, long = workload(stdlib_sentences())
    out: dict[str, dict[str, dict]] = {}  # rate -> layout -> short/long summary
    with tempfile.TemporaryDirectory() as tmp:
        for layout, pools in LAYOUTS.items():
            server = Server(
                Path(tmp),
                CONFIG.format(endpoint=ENDPOINT, pools=pools),
                name=f"{layout}-{time.monotonic_ns()}",
            )
            try:
                server.wait_ready()
                for rate in args.short_rate:
                    rates = (rate, args.long_rate)
                    drive(server.endpoint, short, long, rates, 3.0)  # warm
                    out.setdefault(f"{rate:g}", {})[layout] = drive(
                        server.endpoint, short, long, rates, args.duration
                    )
            finally:
                server.stop()
    print(
        f"short texts at each rate + {args.long_rate:g} long/s, {args.duration:g} s each; "
        f"{len(short)} short texts (6-25 words), {len(long)} long (150-190 words)\n"
    )
    print(
        f"{'short/s':<9}{'layout':<14}{'short p50':>10}{'short p99':>10}{'long p50':>10}"
        f"{'long p99':>10}{'errors':>8}   short p50, p99: blind / aware"
    )
    for rate, layouts in out.items():
        for layout, r in layouts.items():
            errors = sum(sum(s["errors"].values()) for s in r.values())
            aware, blind = layouts["length-aware"]["short"], r["short"]
            ratio = (
                f"{blind['latency_ms']['p50'] / aware['latency_ms']['p50']:.2f}x, "
                f"{blind['latency_ms']['p99'] / aware['latency_ms']['p99']:.2f}x"
                if layout == "length-blind"
                else ""
            )
            print(
                f"{rate:<9}{layout:<14}{r['short']['latency_ms']['p50']:>10.2f}"
                f"{r['short']['latency_ms']['p99']:>10.2f}{r['long']['latency_ms']['p50']:>10.2f}"
                f"{r['long']['latency_ms']['p99']:>10.2f}{errors:>8}   {ratio}"
            )
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args), "rates": out}, indent=1, default=str))


if __name__ == "__main__":
    main()
