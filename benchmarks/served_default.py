"""Through the server: the default config (`quantize: auto`, what it chooses on this CPU)
against `backend: onnxruntime, quantize: int8`, on the same cores, in turns.

Both servers: bundled MiniLM, 2 instances x 1 core (every core of a 2-vCPU VM), cache off,
and the same micro-batching: `max_batch: 1` by default, so each text is one forward pass at
batch 1 and the model path is what differs (one text at a time), or with `--batching
server` the server's default micro-batching, which under `--clients 32` runs full
micro-batches (saturated). Each is started with `numaserve start`
(numaserve.testing.Server), warmed up, and loaded with `numaserve bench`'s closed loop;
they take turns ABBA round after round, and the ratio of each adjacent pair is reported: on
a noisy VM only ratios within one run mean anything. After each load, the forward passes
each model path ran (where an instance holds several) are printed. Texts: short (stdlib
first sentences, about 14 tokens) and prose (the peers' mixed texts: runs of 1-16
sentences, about 118 tokens median).

On a bigger machine, `--client-cpus` keeps the load generator off the server's cores (it
pins itself there once each server is up, so the server still sees the whole machine), and
`--against "ctranslate2 int8"` names the path the default chooses on this CPU class where a
machine lacks a candidate (OpenVINO) or the time for auto's race.

Run:  .venv/bin/python -m benchmarks.served_default [--rounds 2] [--requests 800]
          [--clients 8] [--batching one|server|32x512] [--traffic short,prose] [--model PATH]
          [--against NAME] [--baseline NAME] [--client-cpus 12-15] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from numaserve.host.cpulist import parse_cpulist
from numaserve.host.topology import read_topology
from numaserve.loadgen.bench import closed_loop, drawing, numaserve_target
from numaserve.status.format import model_path_lines
from numaserve.status.report import ServerReport
from numaserve.testing.server import ENDPOINT, Server

CONFIG = """\
model: {{path: "{model}", task: embed{precision}}}
placement: {{pools: [{{name: all, max_tokens: 256, cores_per_instance: 1, instances: 2}}]}}
server: {{endpoint: "{endpoint}", cache_entries: 0{batching}}}
"""
BATCHING = {"one": ", max_batch: 1", "server": ""}  # or TEXTSxTOKENS: max_batch, max_batch_tokens


def batching(name: str) -> str:
    if name in BATCHING:
        return BATCHING[name]
    texts, tokens = name.split("x")
    return f", max_batch: {int(texts)}, max_batch_tokens: {int(tokens)}"


SYSTEMS = {
    "default": "",
    # what a pool holds at most: the paths its bands need to be accurate, and no throughput path
    "default max_paths 2": ", max_paths: 2",
    "ctranslate2 int8": ", backend: ctranslate2, quantize: int8",
    "onnxruntime int8": ", backend: onnxruntime, quantize: int8",
}
BASELINE = "onnxruntime int8"


def corpus(kind: str) -> list[str]:
    from benchmarks.peers import mixed_texts
    from numaserve.corpus import stdlib_sentences

    short = stdlib_sentences()
    return short if kind == "short" else mixed_texts(short)


def serve_and_load(name: str, texts: list[str], args, work: Path) -> float:
    config = CONFIG.format(
        model=args.model,
        precision=SYSTEMS[name],
        endpoint=ENDPOINT,
        batching=batching(args.batching),
    )
    server = Server(work, config, name=name.replace(" ", "-"))
    everywhere = os.sched_getaffinity(0)
    try:
        server.wait_ready(timeout=900)
        if args.client_cpus:  # this thread, and the client threads it starts, inherit it
            os.sched_setaffinity(0, parse_cpulist(args.client_cpus))
        connect = numaserve_target([server.endpoint], timeout=30)
        closed_loop(connect, texts, args.clients, 100, draw=drawing("embed"))  # warm-up
        run = closed_loop(connect, texts, args.clients, args.requests, draw=drawing("embed"))
        rps = run.summary()["throughput_rps"]
        print(f"  {name}: {rps:.1f} req/s", flush=True)
        time.sleep(1.5)  # the instances' next heartbeats carry their passes by path
        report = ServerReport.from_wire(server.status())
        for line in model_path_lines(report.instances, several=False):
            print(f"    {line[:160]}", flush=True)
        return rps
    finally:
        os.sched_setaffinity(0, everywhere)
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=800)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--batching", default="one", help="one, server or TEXTSxTOKENS")
    parser.add_argument("--traffic", default="short,prose")
    parser.add_argument("--model", default="bundled:minilm")
    parser.add_argument("--against", default="default", choices=[*SYSTEMS][:3])
    parser.add_argument("--baseline", default=BASELINE, choices=[*SYSTEMS])
    parser.add_argument("--client-cpus", help="a CPU list for the load generator")
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
                order = [args.against, args.baseline]
                for name in order if r % 2 == 0 else order[::-1]:  # ABBA
                    results.setdefault(kind, {}).setdefault(name, []).append(
                        serve_and_load(name, texts, args, Path(tmp))
                    )
                pair = results[kind]
                ratios.append(pair[args.against][-1] / pair[args.baseline][-1])
            results[kind]["ratios"] = ratios
            print(
                f"{kind}: {args.against} / {args.baseline}: "
                + ", ".join(f"{x:.2f}" for x in ratios)
                + f" (median {statistics.median(ratios):.2f})",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
