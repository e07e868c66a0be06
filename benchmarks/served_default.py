"""Through the server: the default config (`quantize: auto`, what it chooses on this CPU)
against `backend: onnxruntime, quantize: int8`, on the same cores, in turns.

Both servers: bundled MiniLM, 2 instances x 1 core (every core of a 2-vCPU VM), cache off,
`max_batch: 1`, so each text is one forward pass at batch 1 and the model path is what
differs. Each is started with `numaserve start` (numaserve.testing.Server), warmed up, and
loaded with `numaserve bench`'s closed loop (8 clients); they take turns ABBA round after
round, and the ratio of each adjacent pair is reported: on a noisy VM only ratios within one
run mean anything. Texts: short (stdlib first sentences, about 14 tokens) and prose (the
peers' mixed texts: runs of 1-16 sentences, about 118 tokens median).

Run:  .venv/bin/python -m benchmarks.served_default [--rounds 2] [--requests 800]
          [--traffic short,prose] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from numaserve.host.topology import read_topology
from numaserve.loadgen.bench import closed_loop, drawing, numaserve_target
from numaserve.testing.server import ENDPOINT, Server

CONFIG = """\
model: {{path: bundled:minilm, task: embed{precision}}}
placement: {{pools: [{{name: all, max_tokens: 256, cores_per_instance: 1}}]}}
server: {{endpoint: "{endpoint}", cache_entries: 0, max_batch: 1}}
"""
SYSTEMS = {"default": "", "onnxruntime int8": ", backend: onnxruntime, quantize: int8"}


def corpus(kind: str) -> list[str]:
    from benchmarks.peers import mixed_texts
    from numaserve.corpus import stdlib_sentences

    short = stdlib_sentences()
    return short if kind == "short" else mixed_texts(short)


def serve_and_load(name: str, texts: list[str], args, work: Path) -> float:
    config = CONFIG.format(precision=SYSTEMS[name], endpoint=ENDPOINT)
    server = Server(work, config, name=name.replace(" ", "-"))
    try:
        ready = server.wait_ready(timeout=900)
        paths = {"{backend} {quantize}".format(**i["model_path"]) for i in ready.values()}
        connect = numaserve_target([server.endpoint], timeout=30)
        closed_loop(connect, texts, args.clients, 100, draw=drawing("embed"))  # warm-up
        run = closed_loop(connect, texts, args.clients, args.requests, draw=drawing("embed"))
        rps = run.summary()["throughput_rps"]
        print(f"  {name}: {rps:.1f} req/s ({', '.join(sorted(paths))})", flush=True)
        return rps
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=800)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--traffic", default="short,prose")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    topology = read_topology()
    print(f"CPU ISA: {' '.join(topology.isa)}; {len(topology.cores)} physical cores")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.traffic.split(","):
            texts = corpus(kind)
            ratios = []
            for r in range(args.rounds):
                order = ["default", "onnxruntime int8"]
                for name in order if r % 2 == 0 else order[::-1]:  # ABBA
                    results.setdefault(kind, {}).setdefault(name, []).append(
                        serve_and_load(name, texts, args, Path(tmp))
                    )
                pair = results[kind]
                ratios.append(pair["default"][-1] / pair["onnxruntime int8"][-1])
            results[kind]["ratios"] = ratios
            print(
                f"{kind}: default / onnxruntime int8: "
                + ", ".join(f"{x:.2f}" for x in ratios)
                + f" (median {statistics.median(ratios):.2f})",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
