"""One copy of the weights per NUMA node against one per instance: memory (PSS) and speed.

A model of Qwen3-Embedding-0.6B's shape (random weights, benchmarks/embedders.py's `qwen3`:
28 layers, width 1,024) on the path `quantize: auto` chose for it here, onnxruntime int8. N
instances (real processes, each one `OnnxModel` as a worker loads it, warmed on texts of 8 to
256 tokens) load either the artifact whole, each its own copy (`own`), or the node's copy of
its packed form (`shared`, backends/node_weights.py). Memory: each process's PSS
(/proc/PID/smaps_rollup), and in `shared` the PSS of the weights file's mappings, summed over
the instances: PSS splits a shared page among the processes that map it, so the sum is what
the weights cost the machine. Speed: one instance at a time on one pinned core, `own` and
`shared` in turns, round after round, texts a second on a fixed mix (8 short texts, then one
of 256 tokens); the ratio shared/own of each round.

Run:  .venv/bin/python -m benchmarks.shared_weights [--instances 8] [--rounds 5] [--cpu 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import machine

CHILD = """
import os, sys, time
os.sched_setaffinity(0, {cpu})
from numaserve.backends.base import Load
from numaserve.backends.onnx import OnnxModel
from numaserve.config.schema import ModelConfig
config = ModelConfig(path={path!r}, task="embed", max_length=512, backend="onnxruntime",
                     quantize="int8")
model = OnnxModel(Load(config, {isa!r}, 1, artifact={artifact!r}, node={node!r}))
short = [[101] + [(7 * i + 1000 + j) % 30000 for i in range(14)] + [102] for j in range(8)]
long = [[101] + [(11 * i + 2000) % 30000 for i in range(254)] + [102]]
for n in (8, 16, 64, 256):
    model.run([[(5 * i + 1000) % 30000 for i in range(n)]])
print("ready", flush=True)
for line in sys.stdin:
    seconds = float(line)
    texts, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        model.run(short)
        model.run(long)
        texts += 9
    print(texts / (time.perf_counter() - started), flush=True)
"""


def start(cpu: int, path: Path, isa, artifact: Path, node: int | None) -> subprocess.Popen:
    code = CHILD.format(cpu={cpu}, path=str(path), isa=isa, artifact=str(artifact), node=node)
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout.readline().strip() == "ready", "an instance did not start"
    return child


def pss_kb(pid: int, file: str | None = None) -> int:
    """The process's PSS, or that of its mappings of `file`."""
    if file is None:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
        return next(int(line.split()[1]) for line in rollup if line.startswith("Pss:"))
    total, inside = 0, False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5:
            inside = fields[-1] == file
        elif inside and fields[0] == "Pss:":
            total += int(fields[1])
    return total


def memory(n: int, cpu: int, path: Path, isa, artifact: Path, node: int | None, file) -> dict:
    """N instances at once: each one's PSS, and the weights file's PSS summed over them."""
    children = [start(cpu, path, isa, artifact, node) for _ in range(n)]
    try:
        each = [pss_kb(c.pid) for c in children]
        weights = sum(pss_kb(c.pid, file) for c in children) if file else None
    finally:
        for c in children:
            c.kill()
            c.wait()
    return {
        "instances": n,
        "pss_total_mb": round(sum(each) / 1024),
        "pss_each_mb": round(statistics.mean(each) / 1024),
        **({"weights_pss_mb": round(weights / 1024)} if weights is not None else {}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=6.0, help="a round's time a side")
    parser.add_argument("--cpu", type=int, default=1)
    parser.add_argument("--out", default="benchmarks/results/shared_weights.json")
    args = parser.parse_args()
    topology = machine.topology()

    from benchmarks.embedders import save
    from numaserve.backends.node_weights import DATA, node_copy, packed_form
    from numaserve.backends.onnx_build import artifact_for
    from numaserve.config.schema import ModelConfig
    from numaserve.host.topology import read_topology

    isa = read_topology().isa
    with tempfile.TemporaryDirectory() as tmp:
        path = save("qwen3", Path(tmp) / "qwen3")
        config = ModelConfig(
            path=str(path), task="embed", max_length=512, backend="onnxruntime", quantize="int8"
        )
        artifact = artifact_for(config, isa)
        packed = packed_form(artifact)
        shared_file = str(node_copy(packed, 0).parent / DATA)
        sides = {"own": (artifact, None, None), "shared": (packed, 0, shared_file)}
        result: dict = {"topology": topology, "cpu": args.cpu, "model": "qwen3 int8"}
        for side, (art, node, file) in sides.items():
            result[side] = {
                "one": memory(1, args.cpu, path, isa, art, node, file),
                "many": memory(args.instances, args.cpu, path, isa, art, node, file),
            }
            print(side, json.dumps(result[side]), flush=True)
        rates: dict[str, list[float]] = {side: [] for side in sides}
        children = {side: start(args.cpu, path, isa, *sides[side][:2]) for side in sides}
        try:
            for r in range(args.rounds):
                for side in list(sides)[r % 2 :] + list(sides)[: r % 2]:
                    children[side].stdin.write(f"{args.seconds}\n")
                    children[side].stdin.flush()
                    rates[side].append(float(children[side].stdout.readline()))
                    time.sleep(0.2)
        finally:
            for c in children.values():
                c.kill()
                c.wait()
    ratios = [s / o for s, o in zip(rates["shared"], rates["own"], strict=True)]
    result["texts_per_s"] = {side: [round(v, 2) for v in vs] for side, vs in rates.items()}
    result["shared_over_own"] = round(statistics.median(ratios), 3)
    result["shared_over_own_range"] = [round(min(ratios), 3), round(max(ratios), 3)]
    one, many = result["shared"]["one"]["weights_pss_mb"], result["shared"]["many"]
    result["weights_many_over_one"] = round(many["weights_pss_mb"] / one, 3)
    print(json.dumps(result, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
