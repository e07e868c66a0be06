"""`numaserve tune`'s gain: the tuned config against the config as given, on short and mixed
texts, each pair measured as real servers in turns (given, tuned, tuned, given) in one run.

For each traffic (short: stdlib docstring sentences; mixed: runs of 1-16 of them, as
benchmarks/peers.py), `numaserve tune` runs as a user runs it (the CLI, `--minutes`,
`--p99-ms`) on the config as given (default: `model: {path: bundled:minilm}`, every other
key its default); then both configs are served in turns, each under numaserve.tune.verify's
load ladder (closed loop at 1, 2, 4 and 8 clients an instance, cache off), and each turn's
figure is the most texts a second at a step within the p99 target. The ratio is tuned over
given, per round, and its median.

`--neighbour` runs tune beside a busy neighbour: one process a CPU that spins and sleeps in
turns of 1-5 s each, at random, for as long as tune runs, and is gone before the turns, which
then measure what tune wrote on a quiet host. A tune that trusted a single timing taken in a
burst wrote a config that served 0.78x the default; the test is that this cannot recur.

Run:  .venv/bin/python -m benchmarks.tune_gain [--minutes 8] [--p99-ms 100] [--rounds 2]
          [--traffic short,mixed] [--config FILE] [--neighbour] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks.peers import mixed_texts
from numaserve.config.schema import load_config
from numaserve.corpus import stdlib_sentences
from numaserve.host.ledger import ledger_dir
from numaserve.host.topology import format_topology, read_topology
from numaserve.tune.tuned import as_given_mapping, verification_text
from numaserve.tune.verify import ladder, verify

GIVEN = "model: {path: bundled:minilm}\n"
STEP_S = 8.0
# A neighbour's process: busy, then idle, 1-5 s each, at random, until it is killed.
BURSTS = """
import random, time
rng = random.Random()
while True:
    end = time.monotonic() + rng.uniform(1, 5)
    while time.monotonic() < end:
        pass
    time.sleep(rng.uniform(1, 5))
"""


@contextlib.contextmanager
def neighbour(on: bool):
    """One bursty process a CPU, unpinned, for the block's length."""
    procs = [
        subprocess.Popen([sys.executable, "-c", BURSTS])
        for _ in range(len(os.sched_getaffinity(0)) if on else 0)
    ]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def instances(config_path: Path) -> int:
    from numaserve.host.placement import plan_placement

    config = load_config(config_path)
    return len(plan_placement(read_topology(), config.placement).slots)


def served_text(config_path: Path) -> str:
    raw = yaml.safe_load(config_path.read_text()) or {}
    return verification_text(as_given_mapping(raw, load_config(config_path)))


def run_tune(given: Path, corpus: Path, out: Path, args) -> str:
    exe = os.path.join(os.path.dirname(sys.executable), "numaserve")
    cmd = [
        exe,
        "tune",
        "--config",
        str(given),
        "--corpus",
        str(corpus),
        "--out",
        str(out),
        "--minutes",
        str(args.minutes),
        "--p99-ms",
        str(args.p99_ms),
    ]
    began = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    print(
        f"$ numaserve tune ... --minutes {args.minutes} --p99-ms {args.p99_ms}: "
        f"exit {done.returncode} in {time.monotonic() - began:.0f} s"
    )
    if done.returncode:
        sys.exit(done.stderr[-3000:])
    print(done.stdout)
    print("the probes' passes of one text (warm: a shape run just before; cold: a new one):")
    print("\n".join(line for line in done.stderr.splitlines() if ": 1 x " in line))
    return done.stdout


def turns(configs: dict[str, Path], texts: list[str], directory: Path, args) -> dict:
    figures: dict[str, list[float]] = {name: [] for name in configs}
    for r in range(args.rounds):
        order = list(configs.items())  # ABBA: the second of a pair measured slower here,
        for name, path in order if r % 2 == 0 else order[::-1]:  # identical configs alike
            v = verify(
                f"{name}{r}",
                served_text(path),
                directory,
                texts,
                "embed",
                ladder(instances(path)),
                args.p99_ms,
                STEP_S,
                time.monotonic() + 600,
                ledger_dir(),
            )
            best = v.best(args.p99_ms)
            figures[name].append(best.texts_per_s if best else 0.0)
            print(
                f"  round {r} {name}: {figures[name][-1]:.1f} texts/s "
                f"({best.clients if best else '-'} clients, p99 {best.p99_ms if best else '-'} ms)"
                + (f" {v.failure}" if v.failure else "")
            )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=8.0)
    parser.add_argument("--p99-ms", type=float, default=100.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--traffic", default="short,mixed")
    parser.add_argument(
        "--config", type=Path, help="the config as given (default: MiniLM, defaults)"
    )
    parser.add_argument("--neighbour", action="store_true", help="tune beside a busy one")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    print(format_topology(read_topology()))
    short = stdlib_sentences()
    traffic = {"short": short, "mixed": mixed_texts(short)}
    results = {}
    with tempfile.TemporaryDirectory(prefix="tune-gain-") as d:
        directory = Path(d)
        given = args.config or directory / "given.yaml"
        if args.config is None:
            given.write_text(GIVEN)
        for name in args.traffic.split(","):
            corpus = directory / f"{name}.txt"
            corpus.write_text("\n".join(t.replace("\n", " ") for t in traffic[name]))
            tuned = directory / f"tuned-{name}.yaml"
            print(f"\n== {name} texts: {corpus}")
            with neighbour(args.neighbour):
                table = run_tune(given, corpus, tuned, args)
            figures = turns({"given": given, "tuned": tuned}, traffic[name], directory, args)
            ratios = [
                t / g if g else float("inf")
                for g, t in zip(figures["given"], figures["tuned"], strict=True)
            ]
            print(
                f"{name}: tuned / given, per round: {', '.join(f'{x:.2f}' for x in ratios)}; "
                f"median {statistics.median(ratios):.2f}"
            )
            results[name] = {
                "table": table,
                "tuned_config": tuned.read_text(),
                **figures,  # texts/s by round: "given", "tuned"
                "ratios": ratios,
            }
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
