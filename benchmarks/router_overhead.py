"""What the router costs: latency added to a request, and cache-hit throughput.

Starts a real router (pinned to CPU 0, the reserved core) and one worker (CPU 1) with the
default model (bundled MiniLM, int8; `--model` for another). Measures, in one run:
  in-process   tokenize + forward pass in a process pinned to CPU 1, one text at a time
  via router   the same texts through client -> router -> worker (each text once: no cache)
  cache hits   replies/s for texts the cache holds, from a pipelined load generator
  floor        the same two ZeroMQ hops with no work at all: a bare pyzmq broker on the
               router's CPU and an echo on the worker's, the client pausing between requests
               for as long as the model computes, so that threads go idle as they do when
               serving. No router can add less than this on the machine.

Run:  .venv/bin/python benchmarks/router_overhead.py [--texts 300] [--seconds 5]
          [--model bundled:minilm]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from numaserve import protocol
from numaserve.loadgen.corpus import stdlib_sentences
from tests.harness.cluster import Cluster, free_port  # the router and one worker, no supervisor

CONFIG = """
model: {{path: "{model}"}}
placement:
  reserved_cores: 1
  pools: [{{name: main, max_tokens: 256, instances: 1}}]
"""


def in_process_latencies(model: str, texts: list[str], cpu: int) -> list[float]:
    code = f"""
import json, os, time
os.sched_setaffinity(0, {{{cpu}}})
from numaserve.config import ModelConfig
from numaserve.backends import load_model
from numaserve.backends.tokenizer import Tokenizer
from numaserve.host.topology import read_topology
tok = Tokenizer({model!r}, 256)
model = load_model(ModelConfig(path={model!r}), isa=read_topology().isa, threads=1)
texts = {texts!r}
for t in texts[:20]:
    model.run([list(tok.encode([t])[0].ids)])
out = []
for t in texts:
    start = time.perf_counter()
    model.run([list(tok.encode([t])[0].ids)])
    out.append(time.perf_counter() - start)
print(json.dumps(out))
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def router_latencies(cluster: Cluster, texts: list[str]) -> list[float]:
    out = []
    with cluster.client(timeout=10) as client:
        for t in texts:
            start = time.perf_counter()
            client.embed(t)
            out.append(time.perf_counter() - start)
    return out


def cache_hit_rate(cluster: Cluster, texts: list[str], seconds: float, window: int = 128) -> float:
    with cluster.client(timeout=10) as client:
        for start in range(0, len(texts), 64):  # now all cached
            client.embed(texts[start : start + 64])
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(cluster.endpoint)
    requests = [protocol.pack({"id": i, "op": "embed", "texts": [t]}) for i, t in enumerate(texts)]
    for i in range(window):
        sock.send_multipart(requests[i % len(requests)])
    sent, done, start = window, 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        sock.recv_multipart()
        done += 1
        sock.send_multipart(requests[sent % len(requests)])
        sent += 1
    sock.close()
    return done / elapsed


def _broker(front: str, back: str, cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    ctx = zmq.Context()
    clients, workers = ctx.socket(zmq.ROUTER), ctx.socket(zmq.ROUTER)
    clients.bind(front)
    workers.bind(back)
    worker = workers.recv_multipart()[0]  # its READY
    poller = zmq.Poller()
    poller.register(clients, zmq.POLLIN)
    poller.register(workers, zmq.POLLIN)
    while True:
        for sock, _ in poller.poll():
            if sock is clients:
                workers.send_multipart([worker, *clients.recv_multipart()])
            else:
                clients.send_multipart(workers.recv_multipart()[1:])


def _echo(endpoint: str, cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    sock = zmq.Context().socket(zmq.DEALER)
    sock.connect(endpoint)
    sock.send(b"READY")
    while True:
        sock.send_multipart(sock.recv_multipart())


def zmq_floor(n: int, gap: float, broker_cpu: int, echo_cpu: int, tmp: str) -> list[float]:
    """Round trips through a bare broker and echo, `gap` seconds apart."""
    spawn = multiprocessing.get_context("spawn")
    front, back = f"tcp://127.0.0.1:{free_port()}", f"ipc://{tmp}/floor"
    procs = [
        spawn.Process(target=_broker, args=(front, back, broker_cpu), daemon=True),
        spawn.Process(target=_echo, args=(back, echo_cpu), daemon=True),
    ]
    for p in procs:
        p.start()
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(front)
    request = protocol.pack({"id": 1, "op": "embed", "texts": ["x" * 80]})
    out = []
    try:
        for i in range(n + 20):
            time.sleep(gap)
            start = time.perf_counter()
            sock.send_multipart(request)
            if not sock.poll(5000):
                raise TimeoutError("the floor's broker or echo did not answer")
            sock.recv_multipart()
            if i >= 20:  # after warm-up
                out.append(time.perf_counter() - start)
    finally:
        sock.close()
        for p in procs:
            p.kill()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--texts", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--model", default="bundled:minilm", help="model.path")
    args = parser.parse_args()
    texts = [t for t in stdlib_sentences() if 8 <= len(t.split()) <= 14][: args.texts]
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(Path(tmp), CONFIG.format(model=args.model)).start()
        try:
            worker_cpu = cluster.deployment.workers[0].cpus[0]
            router_cpu = cluster.deployment.routers[0].cpus[0]
            direct = in_process_latencies(args.model, texts, worker_cpu)
            routed = router_latencies(cluster, texts)
            hits = cache_hit_rate(cluster, texts, args.seconds)
        finally:
            cluster.stop()
        med_direct, med_routed = statistics.median(direct), statistics.median(routed)
        floor = statistics.median(zmq_floor(len(texts), med_direct, router_cpu, worker_cpu, tmp))
    print(
        f"{len(texts)} stdlib sentences of 8-14 words; {args.model} int8; router on CPU 0, worker on CPU {worker_cpu}"
    )
    print(f"median latency in-process (tokenize + model): {med_direct * 1000:.2f} ms")
    print(f"median latency via client -> router -> worker: {med_routed * 1000:.2f} ms")
    print(
        f"router adds to the median: {(med_routed - med_direct) * 1000:.2f} ms ({med_routed / med_direct:.2f}x)"
    )
    print(
        f"bare ZeroMQ client -> broker -> echo -> client, {med_direct * 1000:.1f} ms apart: "
        f"{floor * 1000:.2f} ms; numaserve's path adds {(med_routed - med_direct - floor) * 1000:.2f} ms above it"
    )
    print(f"cache hits: {hits:,.0f} requests/s (pipelined load generator, 128 in flight)")


if __name__ == "__main__":
    main()
