"""Where each model path stands against the arithmetic a core has, at saturation: one pinned
core, short texts in micro-batches of 1, 8 and 32, texts a second, and that as a share of the
core's int8 (or bf16) multiply-add peak.

MiniLM-L6 does about 10.6 M multiply-adds a token in its Linear layers (6 layers x (4 x 384^2
+ 2 x 384 x 1536)); attention's are few at these lengths. A core's peak, in multiply-adds a
cycle: AVX-512 VNNI 128 int8 (two 512-bit vpdpbusd a cycle), AVX2 64 int8 (two 256-bit
vpmaddubsw chains), AMX 1024 int8 or 512 bf16 (one tile multiply a cycle, 16x64x16 per 16
cycles); AVX512_BF16 64 bf16. Clock: /proc/cpuinfo's "cpu MHz" of the pinned CPU (a VM's
nominal clock, not the turbo it runs at). The share says how much of a core's arithmetic the
path leaves unused at these shapes, not what it could reach.

Run:  .venv/bin/python -m benchmarks.saturation [--paths "ctranslate2 int8,onnxruntime int8"]
          [--texts 256] [--rounds 3] [--cpu 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

MACS_PER_TOKEN = 6 * (4 * 384 * 384 + 2 * 384 * 1536)
BATCHES = (1, 8, 32)
PEAK = {
    "int8": {"amx_int8": 1024, "avx512_vnni": 128, "avx2": 64},
    "bf16": {"amx_bf16": 512, "avx512_bf16": 64},
}


def clock_hz(cpu: int) -> float:
    """The CPU's clock as /proc/cpuinfo gives it."""
    from pathlib import Path

    for block in Path("/proc/cpuinfo").read_text().split("\n\n"):
        fields = {
            k.strip(): v.strip() for k, _, v in (x.partition(":") for x in block.splitlines())
        }
        if fields.get("processor") == str(cpu):
            return float(fields["cpu MHz"]) * 1e6
    raise SystemExit(f"/proc/cpuinfo has no clock for CPU {cpu}")


def peaks(kind: str, isa) -> dict[str, float]:
    return {unit: macs for unit, macs in PEAK[kind].items() if unit in isa}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--paths", default="ctranslate2 int8,onnxruntime int8,openvino bf16")
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)))
    args = parser.parse_args()
    os.sched_setaffinity(0, {args.cpu})

    from numaserve.backends import load_model
    from numaserve.backends.tokenizer import Tokenizer
    from numaserve.config.schema import ModelConfig
    from numaserve.corpus import stdlib_sentences
    from numaserve.host.topology import read_topology

    isa = read_topology().isa
    hz = clock_hz(args.cpu)
    ids = [
        list(e.ids) for e in Tokenizer("bundled:minilm", 256).encode(stdlib_sentences(args.texts))
    ]
    tokens = statistics.mean(map(len, ids))
    print(
        f"CPU ISA: {' '.join(isa)}; CPU {args.cpu} at {hz / 1e9:.2f} GHz nominal; "
        f"{len(ids)} texts, {tokens:.1f} tokens mean"
    )
    models = {}
    for name in args.paths.split(","):
        backend, quantize = name.split()
        models[name] = load_model(ModelConfig(backend=backend, quantize=quantize), isa, 1)
    rates = {(n, b): [] for n in models for b in BATCHES}
    for batch in BATCHES:
        groups = [ids[i : i + batch] for i in range(0, len(ids), batch)]
        for model in models.values():
            for g in groups[:4]:
                model.run(g)
        for _ in range(args.rounds):
            for name, model in models.items():  # in turns, so they share the machine's noise
                started = time.perf_counter()
                for g in groups:
                    model.run(g)
                rates[name, batch].append(len(ids) / (time.perf_counter() - started))
    print(
        f"\n{'model path':<20} "
        + " ".join(f"{'batch ' + str(b):>12}" for b in BATCHES)
        + "   share of the core's peak at the best batch"
    )
    for name in models:
        best = {b: statistics.median(rates[name, b]) for b in BATCHES}
        kind = "bf16" if name.endswith("bf16") else "int8"
        macs = max(best.values()) * tokens * MACS_PER_TOKEN
        shares = ", ".join(f"{unit} {macs / (m * hz):.1%}" for unit, m in peaks(kind, isa).items())
        print(f"{name:<20} " + " ".join(f"{best[b]:>9.0f}/s " for b in BATCHES) + f"  {shares}")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("NUMASERVE_CACHE", f"{tmp}/cache")
        main()
