"""How many requests one router passes, and what each costs it in CPU.

The real router (`python -m numaserve.router`) pinned to CPU 0, with `--workers` stand-in
instances (benchmarks/stand_in_workers.py: the worker protocol, an answer at once) and a
pipelined load generator keeping `--inflight` requests outstanding, both on CPU 1. Each text is
distinct. Measured in one run:
  floor        a bare pyzmq ROUTER that echoes each request, on CPU 0: what ZeroMQ and Python
               cost at the least, and the most the load generator can drive here
  cache off    the router with server.cache_entries: 0: tokenize, queue, dispatch, reply
  cache hits   the router answering texts its cache holds (no worker involved)
For each: requests/s, and the router's CPU time per request (utime + stime from /proc over
the measured window, divided by the requests answered in it). Also the tokenizer alone on the
router's CPU, one text per call and 32 per `encode_batch` call, the same distinct texts.

Run:  .venv/bin/python benchmarks/router_capacity.py [--seconds 5] [--inflight 256]
                                                       [--workers 8] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import psutil
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from numaserve import protocol
from numaserve.config import ModelConfig, PoolConfig, ServerConfig
from numaserve.host.topology import format_topology, read_topology
from numaserve.loadgen.corpus import stdlib_sentences
from numaserve.specs import RouterSpec
from tests.harness.cluster import free_port

ROOT = Path(__file__).resolve().parents[1]
ROUTER_CPU, LOAD_CPU = 0, 1
ERROR = msgpack.packb("status") + msgpack.packb("error")  # in an error reply's body


def cpu_seconds(pid: int) -> float:
    """User + system time of all the process's threads (as benchmarks/reliability.py reads it)."""
    return sum(psutil.Process(pid).cpu_times()[:2])


def texts(count: int, distinct: bool) -> list[str]:
    """Real sentences; numbered, so that none repeats, unless `distinct` is off."""
    sentences = stdlib_sentences(500)
    if not distinct:
        return sentences[:count]
    return [f"{i}: {sentences[i % len(sentences)]}" for i in range(count)]


def load(endpoint: str, pid: int, texts_: list[str], inflight: int, warmup: float, seconds: float):
    """Pipelined requests, `inflight` outstanding, one text each; counts the replies (ok and
    errors) and the server's CPU over the measured window. Runs pinned to LOAD_CPU."""
    os.sched_setaffinity(0, {LOAD_CPU})
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.set_hwm(0)
    sock.connect(endpoint)
    packb = msgpack.packb

    def request(i: int) -> list[bytes]:
        return [
            protocol.VERSION,
            packb({"id": i, "op": "embed", "texts": [texts_[i % len(texts_)]]}),
        ]

    for i in range(inflight):
        sock.send_multipart(request(i))
    sent = inflight
    ok = errors = 0
    start = time.perf_counter()
    window = None
    while True:
        now = time.perf_counter()
        if window is None and now - start >= warmup:
            window = (now, cpu_seconds(pid), ok + errors)
        if window is not None and now - window[0] >= seconds:
            break
        frames = sock.recv_multipart()
        if frames[-1].find(ERROR) < 0:
            ok += 1
        else:
            errors += 1
        sock.send_multipart(request(sent))
        sent += 1
    elapsed = time.perf_counter() - window[0]
    answered = ok + errors - window[2]
    cpu = cpu_seconds(pid) - window[1]
    sock.close()
    return {
        "requests_per_s": answered / elapsed,
        "cpu_us_per_request": 1e6 * cpu / answered,
        "cpu_utilization": cpu / elapsed,
        "errors": errors,
    }


def _tokenizer_cost(texts_: list[str]) -> dict:
    os.sched_setaffinity(0, {ROUTER_CPU})
    from numaserve.backends.tokenizer import Tokenizer

    raw = Tokenizer("bundled:minilm", 256).raw
    raw.encode_batch(texts_[:64])  # warm
    start = time.perf_counter()
    for text in texts_:
        raw.encode(text)
    one = time.perf_counter() - start
    start = time.perf_counter()
    for i in range(0, len(texts_), 32):
        raw.encode_batch(texts_[i : i + 32])
    batched = time.perf_counter() - start
    tokens = sum(len(e.ids) for e in raw.encode_batch(texts_[:500])) / 500
    return {
        "us_per_text_one_by_one": 1e6 * one / len(texts_),
        "us_per_text_batch_32": 1e6 * batched / len(texts_),
        "mean_tokens": tokens,
    }


def tokenizer_cost() -> dict:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_tokenizer_cost, (texts(5000, True),))


def _echo(endpoint: str) -> None:
    os.sched_setaffinity(0, {ROUTER_CPU})
    sock = zmq.Context().socket(zmq.ROUTER)
    sock.bind(endpoint)
    while True:
        sock.send_multipart(sock.recv_multipart())


def run_load(endpoint: str, pid: int, texts_: list[str], args) -> dict:
    spawn = multiprocessing.get_context("spawn")
    with spawn.Pool(1) as pool:
        return pool.apply(load, (endpoint, pid, texts_, args.inflight, 1.0, args.seconds))


def floor(args) -> dict:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    proc = multiprocessing.get_context("spawn").Process(target=_echo, args=(endpoint,))
    proc.start()
    try:
        return run_load(endpoint, proc.pid, texts(100_000, True), args)
    finally:
        proc.kill()
        proc.join()


def router(args, tmp: str, cache_entries: int, texts_: list[str]) -> dict:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    workers = f"ipc://{tmp}/workers-{cache_entries}.sock"
    spec = RouterSpec(
        workers_endpoint=workers,
        pools=(PoolConfig(name="main", max_tokens=256),),
        model=ModelConfig(max_length=256),
        server=ServerConfig(endpoint=endpoint, cache_entries=cache_entries, queue_size=4096),
        cpus=(ROUTER_CPU,),
        nodes=(0,),
    )
    log = open(f"{tmp}/router-{cache_entries}.log", "w")  # noqa: SIM115 (closed below)
    router_proc = subprocess.Popen(spec.argv(), stderr=log)
    stand_ins = subprocess.Popen(
        [
            *(sys.executable, str(ROOT / "benchmarks/stand_in_workers.py")),
            *("--endpoint", workers, "--count", str(args.workers), "--cpu", str(LOAD_CPU)),
        ],
        stderr=log,
    )
    try:
        try:
            wait_for_instances(endpoint, args.workers)
        except RuntimeError:
            log.flush()
            sys.exit(f"{Path(log.name).read_text()[-2000:]}\nthe router did not start (above)")
        if cache_entries:  # fill the cache with the texts the load then repeats
            warm(endpoint, texts_)
        return run_load(endpoint, router_proc.pid, texts_, args)
    finally:
        for p in (stand_ins, router_proc):
            p.kill()
            p.wait()
        log.close()


def wait_for_instances(endpoint: str, count: int) -> None:
    from numaserve.client import Client

    deadline = time.monotonic() + 60
    with Client(endpoint, timeout=2, retries=0) as client:
        while time.monotonic() < deadline:
            try:
                if sum(p["ready"] for p in client.status()["pools"]) >= count:
                    return
            except Exception:
                pass
            time.sleep(0.2)
    raise RuntimeError(f"the router at {endpoint} did not see {count} instances")


def warm(endpoint: str, texts_: list[str]) -> None:
    from numaserve.client import Client

    with Client(endpoint, timeout=10) as client:
        for start in range(0, len(texts_), 64):
            client.embed(texts_[start : start + 64])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--inflight", type=int, default=256)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    topo = read_topology()
    print(format_topology(topo), flush=True)
    results = {"topology": topo.to_json(), "settings": vars(args) | {"json": str(args.json)}}
    with tempfile.TemporaryDirectory() as tmp:
        results["floor"] = floor(args)
        results["cache_off"] = router(args, tmp, 0, texts(1_000_000, True))
        results["cache_hits"] = router(args, tmp, 100_000, texts(500, False))
    results["tokenizer"] = tokenizer_cost()
    print(
        f"\n{'':12} {'requests/s':>11} {'router CPU us/request':>22} {'CPU use':>8} {'errors':>7}"
    )
    for name in ("floor", "cache_off", "cache_hits"):
        r = results[name]
        print(
            f"{name:12} {r['requests_per_s']:11,.0f} {r['cpu_us_per_request']:22.1f} "
            f"{r['cpu_utilization']:8.0%} {r['errors']:7}"
        )
    t = results["tokenizer"]
    print(
        f"\ntokenizer on the router's CPU ({t['mean_tokens']:.0f} tokens a text): "
        f"{t['us_per_text_one_by_one']:.1f} us a text one by one, "
        f"{t['us_per_text_batch_32']:.1f} us in batches of 32"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
