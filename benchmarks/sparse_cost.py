"""What a sparse embedding (SPLADE, `task: sparse`) costs against a dense one on the same
backbone: bundled MiniLM (6 layers, 384 wide) pooled to its 384-dim vector, against the same
encoder with a masked-LM head over its 30,522-entry vocabulary (the head's decoder tied to the
word embeddings, as BERT's is; its transform random: speed does not depend on its values),
saved as sentence-transformers' SparseEncoder saves a SPLADE model.

Each model is loaded as a worker loads it (ONNX Runtime, one thread, the precision asked)
and runs batches of one text, short (the stdlib sentences, about 10-20 tokens) and long (128
tokens, eight of the stdlib's passages cut to 128), dense and sparse alternating ABBA round by
round; the ratio of each round pair is reported with the median.

Run:  .venv/bin/python -m benchmarks.sparse_cost [--quantize int8|none] [--rounds 6]
          [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path

from numaserve.backends import load_model
from numaserve.backends.tokenizer import Tokenizer
from numaserve.checkpoint.paths import resolve_model_path
from numaserve.config.schema import ModelConfig
from numaserve.corpus import stdlib_passages, stdlib_sentences
from numaserve.host.topology import format_topology, read_topology

ROUND_S = 3.0


def save_minilm_splade(path: Path) -> Path:
    """bundled MiniLM's encoder with a masked-LM head, saved as a SparseEncoder."""
    import torch
    from transformers import AutoTokenizer, BertForMaskedLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sentence_transformers import SparseEncoder
        from sentence_transformers.sparse_encoder.models import MLMTransformer, SpladePooling

    minilm = resolve_model_path("bundled:minilm")
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        BertForMaskedLM.from_pretrained(minilm).save_pretrained(path)
    AutoTokenizer.from_pretrained(minilm).save_pretrained(path)
    encoder = SparseEncoder(modules=[MLMTransformer(str(path)), SpladePooling("max")], device="cpu")
    encoder.save(str(path))
    return path


def long_texts(count: int) -> list[str]:
    """Texts of the stdlib's passages, eight to a text: over 128 tokens, cut to 128."""
    passages = stdlib_passages()
    return [" ".join(passages[i * 8 : (i + 1) * 8]) for i in range(count)]


def texts_per_second(model, batches: list[list[int]], seconds: float) -> float:
    done, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        for ids in batches:
            model.run([ids])
        done += len(batches)
    return done / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quantize", choices=("int8", "none"), default="int8")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    topology = read_topology()
    print(format_topology(topology))
    with tempfile.TemporaryDirectory() as tmp:
        splade = save_minilm_splade(Path(tmp) / "splade")
        models = {
            task: load_model(
                ModelConfig(
                    path=path,
                    task=task,
                    backend="onnxruntime",
                    quantize=args.quantize,
                    max_length=128,
                ),
                topology.isa,
            )
            for task, path in (("embed", "bundled:minilm"), ("sparse", str(splade)))
        }
        tokenizer = Tokenizer("bundled:minilm", 128)
        lengths = {
            "short": [list(e.ids) for e in tokenizer.encode(stdlib_sentences(64))],
            "long": [list(e.ids) for e in tokenizer.encode(long_texts(16))],
        }
        figures = {}
        for name, batches in lengths.items():
            rates: dict[str, list[float]] = {"embed": [], "sparse": []}
            for task in models:  # warm up each
                texts_per_second(models[task], batches, 0.5)
            for round_number in range(args.rounds):
                order = ("embed", "sparse") if round_number % 2 == 0 else ("sparse", "embed")
                for task in order:
                    rates[task].append(texts_per_second(models[task], batches, ROUND_S))
            ratios = [d / s for d, s in zip(rates["embed"], rates["sparse"], strict=True)]
            tokens = statistics.median(len(b) for b in batches)
            figures[name] = {
                "median_tokens": tokens,
                "dense_texts_per_s": [round(r, 1) for r in rates["embed"]],
                "sparse_texts_per_s": [round(r, 1) for r in rates["sparse"]],
                "sparse_costs_x": [round(r, 2) for r in ratios],
                "median_x": round(statistics.median(ratios), 2),
            }
            print(
                f"{name} ({tokens:.0f} tokens), {args.quantize}: dense "
                f"{statistics.median(rates['embed']):.0f} texts/s, sparse "
                f"{statistics.median(rates['sparse']):.0f}; sparse costs "
                f"{figures[name]['median_x']}x per text (rounds {figures[name]['sparse_costs_x']})"
            )
    if args.json:
        args.json.write_text(json.dumps({"quantize": args.quantize, "lengths": figures}, indent=1))


if __name__ == "__main__":
    main()
