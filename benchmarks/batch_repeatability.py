"""What micro-batching does to int8 results: each text run alone, then in batches of 8 of
nearest length (as the router forms them), both against the fp32 model.

Dynamic int8 quantization scales each activation tensor by its largest value, and in a batch
that tensor holds every text of the batch: a text's result then depends slightly on its
companions. This measures how much (batched against alone), and whether it costs accuracy
(each against fp32).

Run:  .venv/bin/python -m benchmarks.batch_repeatability [--texts 400] [--batch 8]
"""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks.peer_apps.minilm import Embedder, cosine
from numaserve.backends import load_model
from numaserve.backends.tokenizer import Tokenizer
from numaserve.config.schema import ModelConfig
from numaserve.corpus import stdlib_sentences
from numaserve.host.topology import format_topology, read_topology


def cosines(a: list[np.ndarray], b: list[np.ndarray]) -> np.ndarray:
    return np.array([cosine(x, y) for x, y in zip(a, b, strict=True)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=400)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    topo = read_topology()
    print(format_topology(topo))
    texts = stdlib_sentences()[: args.texts]
    ids = [e.ids for e in Tokenizer("bundled:minilm", 256).raw.encode_batch(texts)]
    model = load_model(
        ModelConfig(path="bundled:minilm", task="embed", max_length=256), isa=topo.isa, threads=1
    )
    alone = [np.asarray(model.run([i])[0], dtype=np.float64) for i in ids]
    batched: list[np.ndarray] = [np.empty(0)] * len(ids)
    by_length = sorted(range(len(ids)), key=lambda k: len(ids[k]))
    for start in range(0, len(by_length), args.batch):
        group = by_length[start : start + args.batch]
        for k, vector in zip(group, model.run([ids[k] for k in group]), strict=True):
            batched[k] = np.asarray(vector, dtype=np.float64)
    reference = Embedder(quantize=False)
    fp32 = [np.asarray(reference.embed(t)) for t in texts]
    print(f"\n{len(texts)} stdlib sentences, int8 (ONNX Runtime), batches of {args.batch}:")
    for name, c in (
        ("alone against fp32", cosines(alone, fp32)),
        ("batched against fp32", cosines(batched, fp32)),
        ("batched against alone", cosines(batched, alone)),
    ):
        print(f"  cosine, {name:<22} mean {c.mean():.4f}  lowest {c.min():.4f}")
    worst = max(float(np.abs(a - b).max()) for a, b in zip(alone, batched, strict=True))
    print(f"  largest difference of one element, batched against alone: {worst:.4f}")


if __name__ == "__main__":
    main()
