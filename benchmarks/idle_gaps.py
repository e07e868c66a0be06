"""What idle moments between forward passes cost the passes themselves.

A served instance waits between jobs (the result's trip to the router and the next job's
back), where the model alone runs them back to back. On a VM those idle moments can make the
next pass slower: the vCPU halts, the host runs something else on the core, the caches cool.
This runs the model alone on one CPU, back to back and with a pause after every pass, the
variants alternating in rounds, and reports CPU per pass (process time, so the pause itself
does not count) and passes per second of wall time.

Run:  .venv/bin/python -m benchmarks.idle_gaps [--model bundled:minilm] [--cpu 1]
          [--gaps 0,0.3,1] [--rounds 3] [--seconds 4] [--words 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from numaserve.backends import load_model
from numaserve.backends.tokenizer import Tokenizer
from numaserve.config.schema import ModelConfig
from numaserve.corpus import stdlib_sentences
from numaserve.host.topology import format_topology, read_topology


def measure(model, inputs: list[list[int]], gap_s: float, seconds: float) -> tuple[float, float]:
    """(ms of CPU a pass, passes a second of wall time) over `seconds`."""
    runs, cpu0, wall0 = 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - wall0 < seconds:
        model.run([inputs[runs % len(inputs)]])
        runs += 1
        if gap_s:
            time.sleep(gap_s)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return cpu / runs * 1000, runs / wall


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="bundled:minilm", help="model.path")
    parser.add_argument("--cpu", type=int, default=1)
    parser.add_argument("--gaps", default="0,0.3,1", help="pauses after each pass, in ms")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--words", type=int, default=40)
    args = parser.parse_args()
    os.sched_setaffinity(0, {args.cpu})
    topology = read_topology()
    print(format_topology(topology))
    config = ModelConfig(path=args.model, max_length=256)
    model = load_model(config, isa=topology.isa, threads=1)
    words = " ".join(stdlib_sentences(500)).split()
    texts = [" ".join(words[i : i + args.words]) for i in range(0, 50 * args.words, args.words)]
    inputs = [list(e.ids) for e in Tokenizer(args.model, 256).encode(texts)]
    for ids in inputs[:10]:
        model.run([ids])
    gaps = [float(g) for g in args.gaps.split(",")]
    cpu: dict[float, list[float]] = {g: [] for g in gaps}
    rate: dict[float, list[float]] = {g: [] for g in gaps}
    for _ in range(args.rounds):
        for gap in gaps:
            ms, per_s = measure(model, inputs, gap / 1000, args.seconds)
            cpu[gap].append(ms)
            rate[gap].append(per_s)
    mean_tokens = statistics.mean(len(i) for i in inputs)
    print(f"\n{args.model}, {mean_tokens:.0f} tokens a text, CPU {args.cpu}, {args.rounds} rounds")
    print(f"{'pause after a pass':>20}{'CPU ms a pass':>16}{'vs back to back':>17}{'passes/s':>10}")
    base = statistics.median(cpu[gaps[0]])
    for gap in gaps:
        ms = statistics.median(cpu[gap])
        print(f"{gap:>17.1f} ms{ms:>16.2f}{ms / base:>17.3f}{statistics.median(rate[gap]):>10.1f}")


if __name__ == "__main__":
    main()
