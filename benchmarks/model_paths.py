"""Every model path numaserve can run, and one it does not offer, on one pinned core: each
one's accuracy through the gate (backends/gate.py) and its speed against today's default
(onnxruntime int8), on short texts and on mixed ones.

bundled:minilm, batch 1, no padding, 1 thread. Accuracy: the gate's 320 docstring passages
(2-300 words) against torch fp32. Speed: the peers corpus (benchmarks/peers.py): stdlib first
sentences (short) and runs of 1-16 of them (mixed); the candidates take turns round after
round, so they share the machine's noise. Memory: each candidate loaded alone in a fresh
process after 20 texts, its PSS.

Not offered, measured for the record (--static): ONNX Runtime static int8 (QDQ, calibrated on
128 other passages, the Linear layers' MatMuls). OpenVINO's static int8 by NNCF, measured so
until 2026-11-29, is offered now (`openvino int8`, backends/openvino_build.py).

`--isa "avx2 avx512f"`: choose and judge as on a CPU with only these extensions, with the gate
alone (`--gate-only`; speeds would be this CPU's): int8 then keeps 7-bit weights, whose
products cannot saturate AVX2's int16 pair sums, so its results are the ones an AVX2-only CPU
computes (docs/accuracy.md), and bf16 is not offered. CTranslate2 picks its kernels by the CPU
itself: `CT2_FORCE_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2` in the environment makes it run
AVX2's (as on an AMD CPU without VNNI), and `CT2_USE_MKL=0` its oneDNN/ruy path instead of
MKL's (what it runs on non-Intel CPUs).

Run:  .venv/bin/python -m benchmarks.model_paths [--texts 300] [--rounds 3] [--cpu 1] [--static]
          [--isa "avx2 avx512f" --gate-only] [--paths "onnxruntime int8,ctranslate2 int8"]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OFFERED = (
    ("onnxruntime", "int8", ()),
    ("onnxruntime", "int8", ("*.output.dense",)),
    ("onnxruntime", "none", ()),
    ("openvino", "int8", ()),
    ("openvino", "bf16", ()),
    ("openvino", "none", ()),
    ("torch", "int8", ()),
    ("torch", "none", ()),
    ("ctranslate2", "int8", ()),
    ("ctranslate2", "int16", ()),
    ("ctranslate2", "none", ()),
)


def label(backend: str, quantize: str, keep: tuple[str, ...]) -> str:
    return f"{backend} {quantize}" + (f" keep_fp32 {','.join(keep)}" if keep else "")


def offered(isa) -> list[tuple]:
    from numaserve.backends.openvino import BF16_ISA

    return [c for c in OFFERED if c[1] != "bf16" or BF16_ISA & set(isa)]


def load(candidate: tuple, isa, calibration: list[list[int]]):
    from numaserve.backends import load_model
    from numaserve.config.schema import ModelConfig

    backend, quantize, keep = candidate
    if backend.startswith("static"):
        from benchmarks.static_int8 import load_static

        return load_static(isa, calibration)
    return load_model(ModelConfig(backend=backend, quantize=quantize, keep_fp32=keep), isa, 1)


def pss_mb(candidate: tuple, cpu: int) -> float:
    """The candidate's PSS, loaded alone in a fresh process that ran 20 texts."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.model_paths",
            "--pss-of",
            json.dumps(candidate),
            "--cpu",
            str(cpu),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return float(out.split()[-1])


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--texts", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)))
    parser.add_argument("--static", action="store_true", help="also the one not offered")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--isa", help="ISA extensions to choose for, space-separated")
    parser.add_argument("--gate-only", action="store_true", help="accuracy, no timing")
    parser.add_argument(
        "--paths",
        help='only these model paths, comma-separated ("onnxruntime int8,ctranslate2 int8")',
    )
    parser.add_argument("--pss-of", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = arguments()
    os.sched_setaffinity(0, {args.cpu})  # before any runtime starts its threads

    from numaserve.backends.gate import gate_texts
    from numaserve.backends.tokenizer import Tokenizer
    from numaserve.corpus import stdlib_passages
    from numaserve.host.topology import read_topology

    isa = tuple(args.isa.split()) if args.isa else read_topology().isa
    tokenizer = Tokenizer("bundled:minilm", 512)
    passages = stdlib_passages()
    gate_set = gate_texts(passages)
    others = [t for t in passages if t not in set(gate_set)]
    every = max(1, len(passages) // 128)
    calibration = [list(e.ids) for e in tokenizer.encode(others[::every][:128])]
    if args.pss_of:
        candidate = tuple(tuple(x) if isinstance(x, list) else x for x in json.loads(args.pss_of))
        print(pss_here(load(candidate, isa, calibration), tokenizer))
        return
    print(f"CPU ISA: {' '.join(read_topology().isa)}; 1 thread on CPU {args.cpu}; bundled:minilm")
    if args.isa:
        print(f"chosen and judged as on a CPU with only: {' '.join(isa)}")
    candidates = offered(isa)
    if args.paths:
        wanted = set(args.paths.split(","))
        candidates = [c for c in candidates if label(*c) in wanted]
    if args.static:
        candidates += [("static-onnxruntime", "int8", ())]
    models, verdicts = judge_all(candidates, isa, calibration, tokenizer, gate_set)
    if args.gate_only:
        return
    times = time_all(models, tokenizer, args.texts, args.rounds)
    models.clear()
    report(candidates, verdicts, times, {c: pss_mb(c, args.cpu) for c in candidates}, args.json)


def pss_here(model, tokenizer) -> float:
    """This process's PSS in MB after the model ran 20 texts."""
    from numaserve.corpus import stdlib_sentences

    for e in tokenizer.encode(stdlib_sentences(20)):
        model.run([list(e.ids)])
    rollup = Path("/proc/self/smaps_rollup").read_text().split("\n")
    return next(int(line.split()[1]) for line in rollup if line.startswith("Pss:")) / 1024


def judge_all(candidates, isa, calibration, tokenizer, gate_set) -> tuple[dict, dict]:
    from numaserve.backends import load_model
    from numaserve.backends.gate import Gate
    from numaserve.config.schema import ModelConfig

    reference = load_model(ModelConfig(backend="torch", quantize="none"), isa, 1)
    gate = Gate("embed", tokenizer, gate_set, reference)
    models, verdicts = {}, {}
    for candidate in candidates:
        models[candidate] = load(candidate, isa, calibration)
        verdicts[candidate] = gate.judge(models[candidate])
        print(
            f"  {label(*candidate)}: {'passes' if verdicts[candidate].passed else 'FAILS'}: "
            f"{verdicts[candidate].figure}",
            flush=True,
        )
    return models, verdicts


def time_all(models: dict, tokenizer, count: int, rounds: int) -> dict:
    """Seconds per text of each model, by traffic: the models take turns, round by round."""
    from benchmarks.peers import mixed_texts
    from numaserve.corpus import stdlib_sentences

    short = stdlib_sentences()
    traffic = {"short": short[:count], "mixed": mixed_texts(short)[:count]}
    ids = {k: [list(e.ids) for e in tokenizer.encode(v)] for k, v in traffic.items()}
    for k, v in ids.items():
        print(f"{k}: {len(v)} texts, {statistics.median(map(len, v)):.0f} tokens median")
    times = {(c, k): [] for c in models for k in ids}
    for kind, inputs in ids.items():
        for model in models.values():
            for x in inputs[:20]:
                model.run([x])
        for _ in range(rounds):
            for candidate, model in models.items():
                started = time.perf_counter()
                for x in inputs:
                    model.run([x])
                times[candidate, kind].append((time.perf_counter() - started) / len(inputs))
    return times


def report(candidates, verdicts, times, pss, json_path: Path | None) -> None:
    today = candidates[0]
    median = {key: statistics.median(v) for key, v in times.items()}
    w = max(len(label(*c)) for c in candidates)
    print(f"\n{'model path':<{w}}  gate   short ms  vs today  mixed ms  vs today  PSS MB")
    rows = {}
    for c in candidates:
        s, m = median[c, "short"], median[c, "mixed"]
        rows[label(*c)] = {
            "gate": verdicts[c].passed,
            "figure": verdicts[c].figure,
            "short_ms": s * 1e3,
            "mixed_ms": m * 1e3,
            "pss_mb": pss[c],
            "short_vs_today": median[today, "short"] / s,
            "mixed_vs_today": median[today, "mixed"] / m,
        }
        r = rows[label(*c)]
        print(
            f"{label(*c):<{w}}  {'pass' if r['gate'] else 'FAIL'}  {r['short_ms']:>8.2f}"
            f"  {r['short_vs_today']:>7.2f}x  {r['mixed_ms']:>8.2f}  {r['mixed_vs_today']:>7.2f}x"
            f"  {pss[c]:>6.0f}"
        )
    if json_path:
        json_path.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("NUMASERVE_CACHE", f"{tmp}/cache")  # artifacts built in this run
        main()
