"""Worker throughput: the raw model loop against real pinned workers, in one run.

Model: the DistilBERT shape (transformers' DistilBertConfig() defaults, random weights), int8,
dynamic shapes, inputs of 12 tokens. Measured, each for --seconds:
  raw        the model called in a loop in this process, 1 thread, pinned to one CPU
  1x1        one worker on one core, driven over ZeroMQ (closed loop, 2 requests in flight)
  2x1        two single-core workers, one per core
  1x2        one worker with two cores and two threads

Run:  .venv/bin/python -m benchmarks.worker_throughput [--seconds 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zmq

from numaserve.config.schema import ModelConfig
from numaserve.host.cpuset import Binding
from numaserve.host.placement import Slot
from numaserve.host.topology import read_topology
from numaserve.processes.specs import WorkerSpec
from numaserve.wire import protocol

TOKENS = 12
IN_FLIGHT = 2  # per worker: hides the round trip, as a router's queue does


def save_distilbert(directory: Path) -> Path:
    import torch
    import transformers
    from transformers import DistilBertConfig, DistilBertModel

    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    DistilBertModel(DistilBertConfig()).save_pretrained(directory)
    return directory


def sample_ids() -> list[int]:
    return [101] + [2000 + 37 * i for i in range(TOKENS - 2)] + [102]


def raw_loop(model_dir: Path, seconds: float, isa) -> float:
    """The model alone, in a child process pinned to CPU 0 (so torch starts pinned)."""
    code = f"""
import os, time, json
os.sched_setaffinity(0, {{0}})
from numaserve.config.schema import ModelConfig
from numaserve.backends import load_model
m = load_model(ModelConfig(path={str(model_dir)!r}), isa={tuple(isa)!r}, threads=1)
ids = [{sample_ids()!r}]
for _ in range(20): m.run(ids)
n, start = 0, time.perf_counter()
while time.perf_counter() - start < {seconds}:
    m.run(ids); n += 1
print(json.dumps(n / (time.perf_counter() - start)))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def drive_workers(model_dir: Path, layout: list[tuple[int, ...]], seconds: float, isa) -> float:
    """Start one worker per CPU tuple, keep IN_FLIGHT requests at each, count replies/s."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    endpoint = f"ipc://{tempfile.mkdtemp()}/w.sock"
    router.bind(endpoint)
    procs = []
    log = open(os.environ.get("NUMASERVE_BENCH_LOG", os.devnull), "a")  # noqa: SIM115
    for i, cpus in enumerate(layout):
        spec = WorkerSpec(
            slot=Slot(f"bench-{i}", "bench", Binding.of(cpus, [0]), threads=len(cpus)),
            router=endpoint,
            max_tokens=TOKENS,
            isa=tuple(isa),
            model=ModelConfig(path=str(model_dir)),
        )
        procs.append(subprocess.Popen(spec.argv(), stderr=log))
    idents = set()
    while len(idents) < len(layout):
        ident, *frames = router.recv_multipart()
        if protocol.unpack(frames)["type"] == protocol.READY:
            idents.add(ident)
    rate = count_replies(router, idents, seconds)
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(30)
    router.close(linger=0)
    ctx.term()
    return rate


def count_replies(router: zmq.Socket, idents: set[bytes], seconds: float) -> float:
    """Replies a second, with IN_FLIGHT runs kept at each worker, counted after a one-second
    warm-up."""
    request = {"type": protocol.RUN, "job": 0, "inputs": [sample_ids()]}
    for ident in idents:
        for _ in range(IN_FLIGHT):
            router.send_multipart([ident, *protocol.pack(request)])
    done, start, counting = 0, time.perf_counter(), False
    warm_until = start + 1.0
    while True:
        ident, *frames = router.recv_multipart()
        if protocol.unpack(frames)["type"] != protocol.RESULT:
            continue
        now = time.perf_counter()
        if not counting and now >= warm_until:
            counting, done, start = True, 0, now
        elif counting:
            done += 1
            if now - start >= seconds:
                break
        router.send_multipart([ident, *protocol.pack(request)])
    return done / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    topo = read_topology()
    cpus = sorted(topo.allowed_cpus)
    if len(cpus) < 2:
        sys.exit("needs 2 CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_distilbert(Path(tmp) / "distilbert")
        results = {
            "raw": raw_loop(model_dir, args.seconds, topo.isa),
            "1x1": drive_workers(model_dir, [(cpus[0],)], args.seconds, topo.isa),
            "2x1": drive_workers(model_dir, [(cpus[0],), (cpus[1],)], args.seconds, topo.isa),
            "1x2": drive_workers(model_dir, [(cpus[0], cpus[1])], args.seconds, topo.isa),
        }
    print(
        f"DistilBERT shape, int8, dynamic shapes, {TOKENS} tokens; {os.cpu_count()} CPUs; ISA {' '.join(topo.isa)}"
    )
    print(f"{'setup':<34}{'inferences/s':>14}{'vs raw loop':>13}")
    names = {
        "raw": "raw model loop, 1 thread",
        "1x1": "1 worker x 1 core (ZeroMQ)",
        "2x1": "2 workers x 1 core",
        "1x2": "1 worker x 2 cores (2 threads)",
    }
    for key, rate in results.items():
        print(f"{names[key]:<34}{rate:>14.1f}{rate / results['raw']:>12.2f}x")
    print(f"2 x 1-core instances vs 1 x 2-core instance: {results['2x1'] / results['1x2']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
