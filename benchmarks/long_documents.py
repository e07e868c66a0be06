"""A long document reranked by its windows: its score against its windows scored one by one,
and the time of a request as the windows it is read in grow.

Saves a cross-encoder of MiniLM-L6's shape (6 layers, 384 wide, 512 positions; random
weights, a fixed seed; the bundled tokenizer) and serves it with `numaserve start`: fp32
(`quantize: none`, so that the scores compare with sentence-transformers'), one single-core
instance, the cache off, `max_length` 512. The document is made of words that are one token
each, so that each window decodes to a text that tokenizes back to the same tokens and
sentence-transformers' CrossEncoder can score it as a text of its own. Measured:
  score   a 2,000-word document reranked whole: its score against the best of its windows
          scored one by one by CrossEncoder (the windows cut by hand: 512 less the query and
          the pair's three special tokens, each overlapping the next by a quarter)
  time    the same query against a longer document read in 1, 2, 4, 8 and 16 windows
          (`max_chunks_per_doc`), in rounds whose order rotates: median ms a request for each,
          ms per window, and a least-squares line through the medians (its intercept and its
          worst point's distance from it)

Run:  .venv/bin/python -m benchmarks.long_documents [--rounds 7] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from benchmarks import machine
from numaserve.checkpoint.paths import resolve_model_path
from numaserve.client import Client
from numaserve.testing.server import ENDPOINT, Server
from numaserve.testing.windows import document, windows_by_hand

QUERY = "where do foxes live"
SCORED_WORDS = 2000
CHUNKS = (1, 2, 4, 8, 16)
MAX_LENGTH = 512


def config(path: Path) -> str:
    return f"""
server: {{endpoint: "{ENDPOINT}", cache_entries: 0}}
model: {{path: "{path}", task: rerank, quantize: none, max_length: {MAX_LENGTH}}}
placement:
  pools: [{{name: main, max_tokens: {MAX_LENGTH}, cores_per_instance: 1, instances: 1}}]
"""


def save_cross_encoder(path: Path) -> Path:
    """MiniLM-L6's shape with random weights (seed 0), one label, the bundled tokenizer."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    shape = BertConfig(
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=12,
        intermediate_size=1536,
        max_position_embeddings=MAX_LENGTH,
        num_labels=1,
    )
    BertForSequenceClassification(shape).save_pretrained(path)
    AutoTokenizer.from_pretrained(resolve_model_path("bundled:minilm")).save_pretrained(path)
    return path


def windows(path: Path, text: str) -> list[str]:
    """The document's windows as the router cuts them, each decoded to a text."""
    from transformers import AutoTokenizer

    return windows_by_hand(AutoTokenizer.from_pretrained(path), QUERY, text, MAX_LENGTH)


def cross_encoder_scores(path: Path, windows: list[str]) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sentence_transformers import CrossEncoder

        encoder = CrossEncoder(str(path), device="cpu")
        return np.array([encoder.predict([(QUERY, w)])[0] for w in windows])


def timed(client, text: str, chunks: int) -> tuple[float, int]:
    started = time.perf_counter()
    (result,) = client.rerank(QUERY, [text], max_chunks_per_doc=chunks)
    return (time.perf_counter() - started) * 1000, result.chunks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default="benchmarks/results/long_documents.json")
    args = parser.parse_args()
    topology = machine.topology()
    scored = document(SCORED_WORDS)
    longest = document(16 * 400)  # more than 16 windows' worth
    with tempfile.TemporaryDirectory() as tmp:
        path = save_cross_encoder(Path(tmp) / "ce")
        cut = windows(path, scored)
        by_hand = cross_encoder_scores(path, cut)
        server = Server(Path(tmp), config(path))
        try:
            server.wait_ready(timeout=600)
            with Client(server.endpoint, timeout=120) as client:
                (whole,) = client.rerank(QUERY, [scored], max_chunks_per_doc=len(cut))
                score = {
                    "words": SCORED_WORDS,
                    "windows": len(cut),
                    "chunks_scored": whole.chunks,
                    "score": whole.score,
                    "best_window_by_hand": float(by_hand.max()),
                    "difference": abs(whole.score - float(by_hand.max())),
                }
                print("score", json.dumps(score))
                for chunks in CHUNKS:  # warm each shape
                    timed(client, longest, chunks)
                times: dict[int, list[float]] = {c: [] for c in CHUNKS}
                for r in range(args.rounds):
                    order = CHUNKS[r % len(CHUNKS) :] + CHUNKS[: r % len(CHUNKS)]
                    for chunks in order:
                        ms, read = timed(client, longest, chunks)
                        assert read == chunks, (read, chunks)
                        times[chunks].append(ms)
        finally:
            server.stop()
    medians = {c: statistics.median(v) for c, v in times.items()}
    slope, intercept = np.polyfit(list(medians), list(medians.values()), 1)
    worst = max(abs(m - (slope * c + intercept)) / m for c, m in medians.items())
    result = {
        "topology": topology,
        "score": score,
        "ms_per_request": {
            str(c): {
                "median": round(m, 1),
                "min": round(min(times[c]), 1),
                "max": round(max(times[c]), 1),
            }
            for c, m in medians.items()
        },
        "ms_per_window": {str(c): round(m / c, 1) for c, m in medians.items()},
        "line": {
            "ms_per_window": round(float(slope), 1),
            "intercept_ms": round(float(intercept), 1),
            "worst_distance": round(float(worst), 3),
        },
        "rounds": args.rounds,
    }
    print(json.dumps(result["ms_per_request"]))
    print("ms per window:", result["ms_per_window"], "line:", result["line"])
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
