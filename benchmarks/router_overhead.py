"""What the router costs: latency added to a request, and cache-hit throughput.

Starts a real router (pinned to CPU 0, the reserved core) and one worker (CPU 1) with the
default model (bundled MiniLM, int8; `--model` for another). Measures:
  in-process   tokenize + forward pass in a process pinned to CPU 1, one text at a time
  via router   the same texts through client -> router -> worker (each text once: no cache)
  floor        the same two ZeroMQ hops with no work at all: a bare pyzmq broker on the
               router's CPU and an echo on the worker's, the client pausing between requests
               for as long as the model computes, so that threads go idle as they do when
               serving. No router can add less than this on the machine.
  cache hits   replies/s for texts the cache holds, from a pipelined load generator

This machine's speed drifts within minutes, so the first three are measured in rounds, each
round all three back to back on its own `--texts` sentences, and what the path adds above the
floor is taken within each round.

Run:  .venv/bin/python -m benchmarks.router_overhead [--texts 200] [--rounds 5] [--seconds 5]
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

from numaserve.corpus import stdlib_sentences
from numaserve.testing.cluster import Cluster  # the router and one worker, no supervisor
from numaserve.testing.ports import free_port
from numaserve.wire import protocol

CONFIG = """
model: {{path: "{model}"}}
placement:
  reserved_cores: 1
  pools: [{{name: main, max_tokens: 256, instances: 1}}]
"""


class InProcess:
    """The model alone, in a process of its own pinned to `cpu`: tokenize and run each text
    it is sent, and answer each text's seconds."""

    CODE = """
import json, os, sys, time
os.sched_setaffinity(0, {{{cpu}}})
from numaserve.config.schema import ModelConfig
from numaserve.backends import load_model
from numaserve.backends.tokenizer import Tokenizer
from numaserve.host.topology import read_topology
tok = Tokenizer({model!r}, 256)
model = load_model(ModelConfig(path={model!r}), isa=read_topology().isa, threads=1)
for line in sys.stdin:
    out = []
    for t in json.loads(line):
        start = time.perf_counter()
        model.run([list(tok.encode([t])[0].ids)])
        out.append(time.perf_counter() - start)
    print(json.dumps(out), flush=True)
"""

    def __init__(self, model: str, cpu: int):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", self.CODE.format(model=model, cpu=cpu)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def latencies(self, texts: list[str]) -> list[float]:
        self.proc.stdin.write(json.dumps(texts) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the in-process model exited; its error is above")
        return json.loads(line)

    def close(self) -> None:
        self.proc.kill()


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


class Floor:
    """A bare broker on `broker_cpu` and an echo on `echo_cpu`: two ZeroMQ hops, no work."""

    def __init__(self, broker_cpu: int, echo_cpu: int, tmp: str):
        spawn = multiprocessing.get_context("spawn")
        front, back = f"tcp://127.0.0.1:{free_port()}", f"ipc://{tmp}/floor"
        self.procs = [
            spawn.Process(target=_broker, args=(front, back, broker_cpu), daemon=True),
            spawn.Process(target=_echo, args=(back, echo_cpu), daemon=True),
        ]
        for p in self.procs:
            p.start()
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.connect(front)
        self.request = protocol.pack({"id": 1, "op": "embed", "texts": ["x" * 80]})
        self.latencies(20, 0.001)  # connected, and warm

    def latencies(self, n: int, gap: float) -> list[float]:
        """Round trips, `gap` seconds apart."""
        out = []
        for _ in range(n):
            time.sleep(gap)
            start = time.perf_counter()
            self.sock.send_multipart(self.request)
            if not self.sock.poll(5000):
                raise TimeoutError("the floor's broker or echo did not answer")
            self.sock.recv_multipart()
            out.append(time.perf_counter() - start)
        return out

    def close(self) -> None:
        self.sock.close()
        for p in self.procs:
            p.kill()


WARM_UP = 20  # texts the model alone runs before the first round


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--texts", type=int, default=200, help="sentences a round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0, help="of cache hits")
    parser.add_argument("--model", default="bundled:minilm", help="model.path")
    args = parser.parse_args()
    sentences = [t for t in stdlib_sentences() if 8 <= len(t.split()) <= 14]
    warm_up, sentences = sentences[-WARM_UP:], sentences[:-WARM_UP]  # texts no round uses
    if args.texts * args.rounds > len(sentences):
        parser.error(f"--texts x --rounds is over the {len(sentences)} distinct sentences")
    print(f"{args.rounds} rounds of {args.texts} stdlib sentences of 8-14 words; {args.model} int8")
    print("round  in-process  via router  router adds  floor  above the floor   (medians, ms)")
    above = []  # what the path adds above the floor, a round's medians
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(Path(tmp), CONFIG.format(model=args.model)).start()
        worker_cpu = next(iter(cluster.deployment.workers[0].slot.cpus))
        router_cpu = next(iter(cluster.deployment.routers[0].binding.cpus))
        direct, floor = InProcess(args.model, worker_cpu), Floor(router_cpu, worker_cpu, tmp)
        try:
            direct.latencies(warm_up)
            for r in range(args.rounds):
                texts = sentences[r * args.texts : (r + 1) * args.texts]
                alone = statistics.median(direct.latencies(texts))
                routed = statistics.median(router_latencies(cluster, texts))
                bare = statistics.median(floor.latencies(len(texts), alone))
                above.append(routed - alone - bare)
                print(
                    f"{r + 1:>5}  {ms(alone):>10}  {ms(routed):>10}  {ms(routed - alone):>11}"
                    f"  {ms(bare):>5}  {ms(above[-1]):>15}"
                )
            hits = cache_hit_rate(cluster, sentences[: args.texts], args.seconds)
        finally:
            direct.close()
            floor.close()
            cluster.stop()
    print(f"router on CPU {router_cpu}, worker on CPU {worker_cpu}")
    print(
        f"numaserve's path adds above the floor: median of the rounds {ms(statistics.median(above))}"
        f" ms, from {ms(min(above))} to {ms(max(above))}"
    )
    print(f"cache hits: {hits:,.0f} requests/s (pipelined load generator, 128 in flight)")


if __name__ == "__main__":
    main()
