"""Which Linear layers, kept in fp32 (`model.keep_fp32`), bring int8 back to fp32's decisions,
and what each choice costs in speed.

For a cross-encoder (rerank) and a tagger (ner): fp32, int8, and int8 with groups of layers
kept in fp32. Each variant's agreement with fp32 is measured as accuracy_tasks.py does (top-1
agreement and Spearman over 200 queries x 10 documents; entity F1 over 1,077 sentences), and
its forward pass is timed on one core. The models are your own (`--rerank DIR`, `--ner DIR`,
checkpoints saved with save_pretrained; the stdlib sentences are the inputs) or, by default,
the MiniLM fine-tunes accuracy_tasks.py trains (about 7 minutes on 2 cores). Layer groups
are picked by module path as BERT-like checkpoints name them (`bert.encoder.layer.N.output.dense`);
a group that picks no layer of the model is reported as skipped.

Run:  .venv/bin/python -m benchmarks.int8_layers [--backend onnxruntime|torch]
          [--rerank DIR] [--ner DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.accuracy_tasks import (
    NER_EPOCHS,
    RERANK_EPOCHS,
    TaskData,
    ner_table,
    print_ner,
    print_rerank,
    rerank_table,
    train,
)
from numaserve.backends import load_model
from numaserve.backends.tokenizer import Tokenizer
from numaserve.backends.torch import linear_layers, load_transformers_model
from numaserve.config.schema import ModelConfig
from numaserve.host.topology import format_topology, read_topology

# Each group: a regular expression over the model's Linear layers' module paths; the layers it
# picks are passed to model.keep_fp32 by name.
GROUPS: dict[str, str] = {
    "int8": r"^$",
    "int8, head in fp32": r"^classifier$",
    "int8, FFN output in fp32": r"\.layer\.\d+\.output\.dense$",
    "int8, FFN in fp32": r"\.layer\.\d+\.(intermediate|output)\.dense$",
    "int8, first 2 layers in fp32": r"\.layer\.[01]\.",
    "int8, all but Q, K, V in fp32": r"(\.dense|^classifier)$",
}
TIMED_S = 2.0


def variants(directory: Path, task: str, backend: str) -> dict[str, ModelConfig]:
    """fp32 first (the reference), then every group that picks layers of this model."""
    base = ModelConfig(
        path=str(directory), task=task, backend=backend, quantize="none", max_length=128
    )
    out = {"fp32": base}
    layers = linear_layers(load_transformers_model(base))
    for name, pattern in GROUPS.items():
        keep = tuple(n for n in layers if re.search(pattern, n))
        if pattern != GROUPS["int8"] and not keep:
            print(f"{name}: skipped (no Linear layer of this model matches {pattern})")
            continue
        out[name] = replace(base, quantize="int8", keep_fp32=keep)
    return out


def ms_per_run(config: ModelConfig, ids: list[int], isa) -> float:
    """One forward pass on one thread, the model warmed up."""
    model = load_model(config, isa=isa, threads=1)
    for _ in range(5):
        model.run([ids])
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < TIMED_S:
        model.run([ids])
        runs += 1
    return (time.perf_counter() - start) / runs * 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", default="onnxruntime", choices=["onnxruntime", "torch"])
    parser.add_argument("--rerank", type=Path, help="a cross-encoder checkpoint to measure")
    parser.add_argument("--ner", type=Path, help="a token-classification checkpoint to measure")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    torch.set_num_threads(2)
    topology = read_topology()
    print(format_topology(topology))
    data = TaskData.build()
    results: dict = {"isa": list(topology.isa), "backend": args.backend}
    with tempfile.TemporaryDirectory() as tmp:
        rerank_dir = args.rerank or Path(tmp) / "rerank"
        if not args.rerank:
            train(rerank_dir, "rerank", data.pairs, epochs=RERANK_EPOCHS)
        configs = variants(rerank_dir, "rerank", args.backend)
        table = rerank_table(rerank_dir, data.queries, topology.isa, configs)
        query, documents = data.queries[0]
        (pair,) = Tokenizer(str(rerank_dir), 128).encode([(query, documents[0])])
        speed = {n: ms_per_run(c, list(pair.ids), topology.isa) for n, c in configs.items()}
        print(f"\nrerank ({rerank_dir}), {args.backend}; timed on a {len(pair.ids)}-token pair")
        print_rerank(table, speed)
        results["rerank"] = {n: {**row, "ms": speed[n]} for n, row in table.items()}

        ner_dir = args.ner or Path(tmp) / "ner"
        if not args.ner:
            train(ner_dir, "ner", data.ner_train, epochs=NER_EPOCHS)
        configs = variants(ner_dir, "ner", args.backend)
        table = ner_table(ner_dir, data.ner_test, topology.isa, configs)
        (text,) = Tokenizer(str(ner_dir), 128).encode([" ".join(data.ner_test[:2])])
        speed = {n: ms_per_run(c, list(text.ids), topology.isa) for n, c in configs.items()}
        print(f"\nner ({ner_dir}), {args.backend}; timed on a {len(text.ids)}-token text")
        print_ner(table, speed)
        results["ner"] = {n: {**row, "ms": speed[n]} for n, row in table.items()}
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
