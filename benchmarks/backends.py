"""torch against ONNX Runtime, fp32 and int8, on one pinned core: the numbers that choose
numaserve's default backend (issue 8).

Each model shape is loaded four ways through numaserve's own loader (load_model, 1 thread),
and the four take turns, round after round, on the same tokenized stdlib sentences at batch 1
without padding, so they share the machine's noise. Reports the median latency per text and
each variant's speed against torch int8. The models: the bundled MiniLM-L6 (the default
model, real weights) and random weights in transformers' DistilBertConfig() and BertConfig()
shapes (speed depends on the shape, not the weights).

Run:  .venv/bin/python -m benchmarks.backends [--texts 300] [--rounds 3] [--cpu 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

VARIANTS = (("torch", "none"), ("torch", "int8"), ("onnxruntime", "none"), ("onnxruntime", "int8"))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--texts", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)))
    parser.add_argument("--models", default="minilm,distilbert,bert-base")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    os.sched_setaffinity(0, {args.cpu})  # before torch or onnxruntime start their threads

    from benchmarks.ladder import save_models
    from numaserve.backends import load_model
    from numaserve.backends.tokenizer import Tokenizer
    from numaserve.config.schema import ModelConfig
    from numaserve.corpus import stdlib_sentences
    from numaserve.host.topology import read_topology

    isa = read_topology().isa
    texts = stdlib_sentences(args.texts)
    ids = [list(e.ids) for e in Tokenizer("bundled:minilm", 256).encode(texts)]
    print(
        f"{len(ids)} texts, {statistics.median(map(len, ids)):.0f} tokens median, batch 1, "
        f"1 thread on CPU {args.cpu}; ISA {' '.join(i for i in isa if i.startswith('avx'))}"
    )
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["NUMASERVE_CACHE"] = f"{tmp}/cache"  # ONNX artifacts built in this run
        paths = {"minilm": "bundled:minilm"} | {
            name: str(path) for name, path in save_models(Path(tmp)).items()
        }
        for name in args.models.split(","):
            models = {}
            for backend, quantize in VARIANTS:
                config = ModelConfig(path=paths[name], backend=backend, quantize=quantize)
                started = time.perf_counter()
                models[backend, quantize] = load_model(config, isa=isa, threads=1)
                loaded = time.perf_counter() - started
                print(f"  {name} {backend} {quantize}: ready in {loaded:.1f} s")
            for model in models.values():  # warm-up: one-off costs of each shape
                for x in ids[:20]:
                    model.run([x])
            timings = {v: [] for v in VARIANTS}
            per_round = []
            for _ in range(args.rounds):
                medians = {}
                for variant, model in models.items():
                    times = []
                    for x in ids:
                        start = time.perf_counter()
                        model.run([x])
                        times.append(time.perf_counter() - start)
                    timings[variant] += times
                    medians[variant] = statistics.median(times)
                per_round.append(medians[VARIANTS[1]] / medians[VARIANTS[3]])
            results[name] = report(name, timings, per_round)
            del models
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


def report(name: str, timings: dict, per_round: list[float]) -> dict:
    baseline = statistics.median(timings["torch", "int8"])
    print(f"\n{name}{'':<22}median ms   vs torch int8")
    rows = {}
    for (backend, quantize), times in timings.items():
        median = statistics.median(times)
        rows[f"{backend} {quantize}"] = median * 1e3
        print(f"  {backend:<12} {quantize:<8}{median * 1e3:>15.2f}{baseline / median:>12.2f}x")
    rounds = ", ".join(f"{r:.2f}x" for r in per_round)
    print(f"  onnxruntime int8 against torch int8, round by round: {rounds}")
    return {"median_ms": rows, "onnx_int8_speedup_by_round": per_round}


if __name__ == "__main__":
    main()
