"""What an instance's memory grows by with each model path it holds: one, two or three paths
of MiniLM (the default model) as `quantize: auto` keeps them where a band of lengths runs
its own path and its micro-batches another (backends/banded.py).

Each side is an instance as a worker loads it (`load_prepared`, from a prepared record made
here, one thread, pinned), warmed on every path at the shapes it serves (texts of 4 to 128
tokens alone, micro-batches of 8 short ones), then its PSS and RSS read from
/proc/PID/smaps_rollup. The paths: CTranslate2 int8 (the pool's own), CTranslate2 int16 for
texts of up to 16 tokens, and OpenVINO bf16 for their micro-batches from 4 texts (ONNX
Runtime fp32 on a CPU without bf16): what auto keeps on a CPU with AMX.

Run:  .venv/bin/python -m benchmarks.paths_memory [--cpu 1] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import machine

CHILD = """
import os, sys
os.sched_setaffinity(0, {{{cpu}}})
from numaserve.backends import load_prepared
from numaserve.config.schema import ModelConfig
config = ModelConfig(path="bundled:minilm", max_length=128)
model = load_prepared(config, "main", {record!r}, {isa!r}, 1)
for n in (4, 8, 12, 16, 32, 64, 128):
    for _ in range(3):
        model.run([[101] + [(7 * i + 1000) % 30000 for i in range(n - 2)] + [102]])
for _ in range(3):
    model.run([[101] + [(7 * i + j + 1000) % 30000 for i in range(10)] + [102] for j in range(8)])
rollup = open(f"/proc/{{os.getpid()}}/smaps_rollup").read().splitlines()
kb = {{line.split()[0][:-1]: int(line.split()[1]) for line in rollup[1:]}}
print(kb["Pss"], kb["Rss"], getattr(model, "ran", None))
"""


def records(directory: Path, isa: tuple[str, ...]) -> dict[str, Path]:
    """Prepared records of one, two and three paths, their artifacts built (and kept)."""
    from numaserve.backends import prepare_model
    from numaserve.config.paths import BandPath, BatchedPath, ModelPath, PoolPath
    from numaserve.config.schema import ModelConfig

    base = ModelConfig(path="bundled:minilm", max_length=128)
    throughput = ModelPath(
        *(("openvino", "bf16") if "amx_bf16" in isa else ("onnxruntime", "none"))
    )
    paths = [ModelPath("ctranslate2", "int8"), ModelPath("ctranslate2", "int16"), throughput]
    built = {}
    for p in paths:
        record = prepare_model(p.applied_to(base), isa)
        if record is None:
            raise SystemExit(f"{p} could not be prepared here (the log says why)")
        built[p] = record
    own, short, batched = (built[p].pools["default"] for p in paths)
    sides = {
        "1 path": own,
        "2 paths": PoolPath(
            own.path,
            "bench",
            (BandPath(16, short.path, "bench", artifact=short.artifact),),
            artifact=own.artifact,
        ),
        "3 paths": PoolPath(
            own.path,
            "bench",
            (
                BandPath(
                    16,
                    short.path,
                    "bench",
                    BatchedPath(4, batched.path, "bench", artifact=batched.artifact),
                    artifact=short.artifact,
                ),
            ),
            artifact=own.artifact,
        ),
    }
    found = {}
    for side, entry in sides.items():
        record = built[paths[0]]
        one = type(record)(record.model, record.directory, record.digest, {"main": entry})
        found[side] = directory / f"{side.replace(' ', '-')}.json"
        one.write(found[side])
    return found


def measure(record: Path, isa, cpu: int) -> tuple[int, int, str]:
    code = CHILD.format(cpu=cpu, record=str(record), isa=isa)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    pss, rss, ran = out.stdout.split(maxsplit=2)
    return int(pss), int(rss), ran.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3, help="instances measured a side, in turns")
    parser.add_argument("--out", default="benchmarks/results/paths_memory.json")
    args = parser.parse_args()
    topology = machine.topology()
    from numaserve.host.topology import read_topology

    isa = read_topology().isa
    with tempfile.TemporaryDirectory() as tmp:
        sides = records(Path(tmp), isa)
        seen: dict[str, list[tuple[int, int]]] = {side: [] for side in sides}
        ran = {}
        for _ in range(args.repeat):
            for side, record in sides.items():
                pss, rss, ran[side] = measure(record, isa, args.cpu)
                seen[side].append((pss, rss))
    result = {"topology": topology, "cpu": args.cpu, "model": "bundled:minilm", "sides": {}}
    one = statistics.median(p for p, _ in seen["1 path"])
    for side, values in seen.items():
        pss = statistics.median(p for p, _ in values)
        rss = statistics.median(r for _, r in values)
        result["sides"][side] = {
            "pss_mb": round(pss / 1024, 1),
            "rss_mb": round(rss / 1024, 1),
            "more_than_one_path_mb": round((pss - one) / 1024, 1),
            "passes": ran[side],
        }
        print(
            f"{side:8} PSS {pss / 1024:6.1f} MB  RSS {rss / 1024:6.1f} MB  "
            f"+{(pss - one) / 1024:5.1f} MB over one path   passes {ran[side]}"
        )
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
