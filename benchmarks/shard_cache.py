"""What a cache per router shard costs in hit rate on Zipf traffic.

Each shard has a cache of its own (router/cache.py, `server.cache_entries` entries each), and
the frontend hands requests to the shards in turn, so every shard sees every popular text and
each must miss it once. This replays one Zipf-distributed stream of text keys through the real
`ResultCache`: one cache for one router, then N caches fed in turn as the frontend feeds them,
each with the full `cache_entries` (what numaserve does: N times the memory), and each with
1/N of it (the same memory as one router). Hit rates depend only on the stream and the caches'
policy, so this measures them without sockets.

Run:  .venv/bin/python -m benchmarks.shard_cache [--keys 1000000] [--requests 3000000]
          [--capacity 100000] [--zipf 1.0] [--shards 1 2 4 8] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from numaserve.router.cache import ResultCache


def zipf_stream(keys: int, requests: int, s: float, seed: int = 0) -> np.ndarray:
    """Key ranks drawn with P(rank k) proportional to 1 / k**s, over `keys` distinct keys."""
    weights = 1.0 / np.arange(1, keys + 1) ** s
    rng = np.random.default_rng(seed)
    return rng.choice(keys, size=requests, p=weights / weights.sum())


def hit_rate(stream: np.ndarray, shards: int, capacity: int) -> float:
    """Request i goes to shard i mod `shards`, as the frontend's round robin sends it."""
    caches = [ResultCache(capacity) for _ in range(shards)]
    for i, key in enumerate(stream.tolist()):
        cache = caches[i % shards]
        if cache.get(key) is None:
            cache.put(key, True)
    hits = sum(c.hits for c in caches)
    return hits / len(stream)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000, help="distinct texts")
    parser.add_argument("--requests", type=int, default=3_000_000)
    parser.add_argument("--capacity", type=int, default=100_000, help="server.cache_entries")
    parser.add_argument("--zipf", type=float, default=1.0, help="the exponent s")
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    stream = zipf_stream(args.keys, args.requests, args.zipf)
    results = {"settings": vars(args) | {"json": str(args.json)}, "shards": {}}
    print(
        f"Zipf s={args.zipf} over {args.keys:,} texts, {args.requests:,} requests, "
        f"cache_entries {args.capacity:,}\n\n"
        f"{'shards':>6} {'hit rate, full cache each':>26} {'hit rate, 1/N cache each':>25}"
    )
    for n in args.shards:
        full = hit_rate(stream, n, args.capacity)
        split = hit_rate(stream, n, args.capacity // n)
        results["shards"][n] = {"full_cache_each": full, "split_cache": split}
        print(f"{n:>6} {full:>26.1%} {split:>25.1%}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
