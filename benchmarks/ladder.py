"""The published CPU recipe, step by step, each step a real numaserve server, in one run.

  1 BERT-base, padded to 128 tokens (the baseline)      fp32
  2 DistilBERT, padded to 128                           fp32
  3 DistilBERT, dynamic shapes (no padding at batch 1)  fp32
  4 + int8 dynamic quantization
  5 + the response cache, on traffic that repeats like real traffic (Zipf)
  6 placement: one pinned single-core instance per core against one instance on all cores

Models have random weights in the published shapes (transformers' BertConfig() and
DistilBertConfig() defaults): speed depends on the shape, not the weights. Texts are the stdlib
docstring sentences (numaserve/corpus.py), tokenized with the bundled MiniLM tokenizer
(bert-base-uncased's vocabulary). Steps 1-5 run one instance on one core and report the median
latency of one client sending requests back to back; step 6 reports throughput under 8 clients.

Run:  .venv/bin/python -m benchmarks.ladder [--requests 40] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

import psutil

from numaserve.checkpoint.paths import resolve_model_path
from numaserve.client import Client
from numaserve.corpus import stdlib_sentences
from numaserve.loadgen.bench import closed_loop, numaserve_target
from numaserve.testing.server import ENDPOINT, Server

CONFIG = """
model: {{path: "{model}", backend: {backend}, quantize: {quantize}, padding: {padding}, max_length: 128}}
server: {{endpoint: "{endpoint}", cache_entries: {cache}}}
placement:
  pools: [{{name: main, max_tokens: 128, cores_per_instance: {cores}, instances: {instances}}}]
"""


def save_models(directory: Path) -> dict[str, Path]:
    import torch
    import transformers
    from transformers import AutoTokenizer, BertConfig, BertModel, DistilBertConfig, DistilBertModel

    transformers.utils.logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("bundled:minilm"))
    paths = {}
    for name, build in (
        ("bert-base", lambda: BertModel(BertConfig())),
        ("distilbert", lambda: DistilBertModel(DistilBertConfig())),
    ):
        torch.manual_seed(0)  # before building: the same random weights every run
        model = build()
        paths[name] = directory / name
        model.save_pretrained(paths[name])
        tokenizer.save_pretrained(paths[name])
    return paths


def start_server(directory: Path, **settings) -> Server:
    """A `numaserve start` for one step, once every instance is ready."""
    server = Server(
        directory,
        CONFIG.format(endpoint=ENDPOINT, **settings),
        name=f"ladder-{time.monotonic_ns()}",
    )
    server.wait_ready()
    return server


def rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def zipf_traffic(texts: list[str], draws: int, s: float = 1.0, seed: int = 0) -> list[str]:
    """Requests drawn from `texts` with Zipf popularity: a few texts are asked for often."""
    rng = random.Random(seed)
    weights = [1 / (rank + 1) ** s for rank in range(len(texts))]
    return rng.choices(texts, weights=weights, k=draws)


# The published recipe's steps, each a server setting over the step before.
STEPS = [
    (
        "1 BERT-base, padded to 128",
        dict(model="bert-base", quantize="none", padding="max_length"),
    ),
    (
        "2 DistilBERT, padded to 128",
        dict(model="distilbert", quantize="none", padding="max_length"),
    ),
    (
        "3 DistilBERT, dynamic shapes",
        dict(model="distilbert", quantize="none", padding="dynamic"),
    ),
    ("4 + int8", dict(model="distilbert", quantize="int8", padding="dynamic")),
    (
        "4b ONNX Runtime, fp32, dynamic",
        dict(model="distilbert", quantize="none", padding="dynamic", backend="onnxruntime"),
    ),
    (
        "4c ONNX Runtime, int8, dynamic",
        dict(model="distilbert", quantize="int8", padding="dynamic", backend="onnxruntime"),
    ),
    (
        "5 + cache, Zipf traffic",
        dict(model="distilbert", quantize="int8", padding="dynamic", cache=1_000_000),
    ),
]


def placement_step(tmp: Path, models: dict, texts: list[str], requests: int) -> dict[str, float]:
    """Step 6: DistilBERT int8 on every core, as one instance and as one per core."""
    throughput = {}
    cpus = len(os.sched_getaffinity(0))
    for name, cores, instances in (
        ("one instance on all cores", cpus, 1),
        ("one single-core instance per core", 1, cpus),
    ):
        server = start_server(
            tmp,
            model=models["distilbert"],
            backend="torch",
            quantize="int8",
            padding="dynamic",
            cache=0,
            cores=cores,
            instances=instances,
        )
        target = numaserve_target([server.endpoint])
        try:
            closed_loop(target, texts, 8, 5)
            throughput[name] = closed_loop(target, texts, 8, requests * 3).summary()[
                "throughput_rps"
            ]
        finally:
            server.stop()
    return throughput


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=40, help="requests per latency step")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    texts = stdlib_sentences()
    rows, memory = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["NUMASERVE_CACHE"] = f"{tmp}/cache"  # ONNX artifacts: built in this run
        models = save_models(Path(tmp))
        for name, step in STEPS:
            settings = {
                "backend": "torch",
                "cache": 0,
                "cores": 1,
                "instances": 1,
                **step,
                "model": models[step["model"]],
            }
            server = start_server(Path(tmp), **settings)
            target = numaserve_target([server.endpoint])
            try:
                traffic = zipf_traffic(texts, 20_000) if settings["cache"] else texts
                closed_loop(target, traffic[:50], 1, 5, seed=1)  # warm the path
                if settings["cache"]:  # a cache that has seen some traffic, not this run's
                    closed_loop(target, traffic, 1, 300, seed=2)
                with Client(server.endpoint) as c:
                    before = c.status()["cache"]
                    n = args.requests * (10 if settings["cache"] else 1)
                    result = closed_loop(target, traffic, 1, n, seed=3)
                    after = c.status()["cache"]
                looked_up = (after["hits"] + after["misses"]) - (before["hits"] + before["misses"])
                hit_rate = (after["hits"] - before["hits"]) / looked_up if looked_up else 0.0
                variant = f"{step['model']} {settings['backend']} {settings['quantize']}"
                memory[variant] = rss_mb(server.pids()[1])  # [0] is the supervisor
            finally:
                server.stop()
            summary = result.summary()
            rows.append(
                {
                    "step": name,
                    "p50_ms": summary["latency_ms"]["p50"],
                    "mean_ms": summary["latency_ms"]["mean"],
                    "hit_rate": hit_rate,
                }
            )
        throughput = placement_step(Path(tmp), models, texts, args.requests)
    base = rows[0]["mean_ms"]
    print(
        f"{'step':<32}{'p50 ms':>9}{'mean ms':>9}{'speedup':>9}   (speedup: mean latency against step 1)"
    )
    for r in rows:
        extra = f"   cache hit rate {r['hit_rate']:.0%}" if r["hit_rate"] else ""
        print(
            f"{r['step']:<32}{r['p50_ms']:>9.2f}{r['mean_ms']:>9.2f}{base / r['mean_ms']:>8.1f}x{extra}"
        )
    one, many = (
        throughput["one instance on all cores"],
        throughput["one single-core instance per core"],
    )
    print(f"\n6 placement on {len(os.sched_getaffinity(0))} cores, DistilBERT int8, 8 clients:")
    print(f"  one instance on all cores         {one:8.1f} requests/s")
    print(f"  one single-core instance per core {many:8.1f} requests/s   ({many / one:.2f}x)")
    print(
        "\nmemory (RSS of one instance): " + ", ".join(f"{k} {v:.0f} MB" for k, v in memory.items())
    )
    if args.json:
        args.json.write_text(
            json.dumps({"steps": rows, "placement_rps": throughput, "rss_mb": memory}, indent=2)
        )


if __name__ == "__main__":
    main()
