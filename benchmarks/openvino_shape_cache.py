"""OpenVINO's memory against the shapes it has seen: its CPU plugin keeps compiled kernels for
each input shape (CPU_RUNTIME_CACHE_CAPACITY entries, 5000 by default), and a server's traffic
brings a new (batch, tokens) shape with almost every micro-batch. One bf16 MiniLM instance, one
thread, pinned, runs 3000 batches of random shapes (1-8 texts of 3-256 tokens); its RSS and
time are printed every 1000 batches, for a capacity (or `default`).

Run:  .venv/bin/python -m benchmarks.openvino_shape_cache default|0|64 [--cpu 1]
"""

from __future__ import annotations

import argparse
import os
import random
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("capacity", help="CPU_RUNTIME_CACHE_CAPACITY, or default")
    parser.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)))
    args = parser.parse_args()
    os.sched_setaffinity(0, {args.cpu})

    import psutil

    from numaserve.backends import load_model, openvino
    from numaserve.config.schema import ModelConfig
    from numaserve.host.topology import read_topology

    if args.capacity != "default":
        openvino.RUNTIME_CACHE_SHAPES = int(args.capacity)
    else:
        openvino.RUNTIME_CACHE_SHAPES = None
    model = load_model(ModelConfig(backend="openvino", quantize="bf16"), read_topology().isa)
    me = psutil.Process()
    print(f"capacity {args.capacity}: loaded, RSS {me.memory_info().rss >> 20} MB")
    shapes = random.Random(0)
    started = time.perf_counter()
    for i in range(1, 3001):
        texts, tokens = shapes.randint(1, 8), shapes.randint(3, 256)
        model.run([[101] + [2000] * (tokens - 2) + [102]] * texts)
        if i % 1000 == 0:
            rss = me.memory_info().rss >> 20
            print(f"{i} batches: RSS {rss} MB, {time.perf_counter() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main()
