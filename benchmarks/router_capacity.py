"""How many requests a router passes, and what each costs it in CPU; or `--routers N` shards.

The real router (`python -m numaserve.router`) pinned to the first allowed CPU, with `--workers`
stand-in instances (benchmarks/stand_in_workers.py: the worker protocol, an answer at once) and
`--clients` pipelined load generators, each keeping `--inflight` requests outstanding. With
`--routers N`, N shards (one CPU each, `--workers` stand-ins each) behind the frontend
(router/frontend.py, a CPU of its own), as `server.routers: N` runs them. Which CPU each
process gets is printed (`layout`: on 2 CPUs, the router on one and all the rest on the
other). Each text is distinct. Measured in one run:
  floor        a bare pyzmq ROUTER that echoes each request, on the router's CPU: what ZeroMQ and
               Python cost at the least, and the most the load generators can drive here
  cache off    the router with server.cache_entries: 0: tokenize, queue, dispatch, reply
  cache hits   the router answering texts its cache holds (no worker involved)
  refused      the router under overload: its queue (server.queue_size 1) full and the
               stand-ins holding their texts past the run, so every request is answered
               `overloaded`: what shedding a request costs the router
For each: requests/s, and the router's CPU time per request (utime + stime from /proc over
the measured window, divided by the requests answered in it; with shards, all shards' CPU
together, and the frontend's apart). Also the tokenizer alone on the router's CPU, the same
distinct texts: as the router runs it (with its per-word memo), and the library alone, one
text per call and 32 per `encode_batch` call.

With `--curve`, every socket clients reach speaks CurveZMQ (keys made for the run): the
router's (or the frontend's) as `server.curve` sets it, the load generators' as the client
library sets it, and the floor's echo too, so that what CurveZMQ itself costs and what it
costs through numaserve are measured the same way.

Run:  .venv/bin/python -m benchmarks.router_capacity [--seconds 5] [--inflight 256]
          [--workers 8] [--routers 1] [--clients 1] [--model bundled:minilm] [--curve]
          [--json FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import msgpack
import psutil
import zmq

from numaserve.config.schema import CurveConfig, ModelConfig, PoolConfig, ServerConfig
from numaserve.corpus import stdlib_sentences
from numaserve.host.cpuset import Binding
from numaserve.host.topology import format_topology, read_topology
from numaserve.processes.specs import FrontendSpec, RouterSpec
from numaserve.testing.ports import free_port
from numaserve.wire import protocol
from numaserve.wire.curve import ClientKeys, keygen, read_key_pair

ROOT = Path(__file__).resolve().parents[1]
ERROR = msgpack.packb("status") + msgpack.packb("error")  # in an error reply's body


@dataclass(frozen=True)
class Layout:
    """Which CPU each process of a run is pinned to."""

    routers: tuple[int, ...]  # one per shard
    frontend: int | None  # with more than one shard
    stand_ins: tuple[int, ...]  # one stand-in process per shard
    load: tuple[int, ...]  # one load generator per CPU


def layout(cpus: list[int], routers: int, clients: int) -> Layout:
    """Shards first, a CPU each, then the frontend, then a CPU for each shard's stand-ins and
    one per load generator; where too few CPUs are left, the rest share the last one (on 2
    CPUs: the router on CPU 0, everything else on CPU 1)."""
    if len(cpus) < routers + 1:
        sys.exit(f"--routers {routers} needs {routers + 1} CPUs at least; {len(cpus)} allowed")
    rest = iter(cpus[routers + (routers > 1) :])
    others = [next(rest, cpus[-1]) for _ in range(routers + clients)]
    return Layout(
        routers=tuple(cpus[:routers]),
        frontend=cpus[routers] if routers > 1 else None,
        stand_ins=tuple(others[:routers]),
        load=tuple(others[routers:]),
    )


def cpu_seconds(pids: list[int]) -> float:
    """User + system time of all the processes' threads (benchmarks/reliability.py reads its
    router's, instances' and load's with it too)."""
    return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids)


def texts(count: int, distinct: bool) -> list[str]:
    """Real sentences; numbered, so that none repeats, unless `distinct` is off."""
    sentences = stdlib_sentences(500)
    if not distinct:
        return sentences[:count]
    return [f"{i}: {sentences[i % len(sentences)]}" for i in range(count)]


WARMUP_S = 1.0


@dataclass(frozen=True)
class Keys:
    """A run's CurveZMQ keys: the server's files, and what a client holds."""

    server: CurveConfig
    client: ClientKeys


def make_keys(directory: str) -> Keys:
    server_public, server_secret = keygen(directory, "server")
    clients = Path(directory, "clients")
    clients.mkdir()
    client_public, client_secret = keygen(directory, "client")
    (clients / "client.key").write_bytes(client_public.read_bytes())
    return Keys(
        CurveConfig(str(server_secret), str(clients)),
        ClientKeys.load(server_public, client_secret),
    )


def load(
    endpoint: str,
    cpu: int,
    texts_: list[str],
    nth: int,
    of: int,
    inflight: int,
    seconds: float,
    curve: ClientKeys | None,
) -> tuple:
    """One load generator: pipelined requests, `inflight` outstanding, one text each (the
    `nth` of every `of` texts, so that generators never send the same one). Counts the replies
    (ok and errors) after the warm-up, for `seconds`."""
    os.sched_setaffinity(0, {cpu})
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.set_hwm(0)
    if curve is not None:
        curve.apply(sock)
    sock.connect(endpoint)
    packb = msgpack.packb

    def request(i: int) -> list[bytes]:
        text = texts_[(i * of + nth) % len(texts_)]
        return [protocol.VERSION, packb({"id": i, "op": "embed", "texts": [text]})]

    for i in range(inflight):
        sock.send_multipart(request(i))
    sent = inflight
    ok = errors = 0
    start = time.perf_counter()
    window = None
    while True:
        now = time.perf_counter()
        if window is None and now - start >= WARMUP_S:
            window = (now, ok + errors)
        if window is not None and now - window[0] >= seconds:
            break
        frames = sock.recv_multipart()
        if frames[-1].find(ERROR) < 0:
            ok += 1
        else:
            errors += 1
        sock.send_multipart(request(sent))
        sent += 1
    sock.close()
    return ok + errors - window[1], errors, time.perf_counter() - window[0]


def run_load(
    endpoint: str,
    measured: dict[str, list[int]],
    texts_: list[str],
    cpus: tuple[int, ...],
    inflight: int,
    seconds: float,
    curve: ClientKeys | None,
) -> dict:
    """A load generator on each of `cpus`, all at once, each keeping `inflight` requests
    outstanding; the CPU time of each group of `measured` processes over the same window (from
    this process: the generators' windows start together, after WARMUP_S)."""
    spawn = multiprocessing.get_context("spawn")
    of = len(cpus)
    with spawn.Pool(of) as pool:
        pending = pool.starmap_async(
            load,
            [
                (endpoint, cpu, texts_, n, of, inflight, seconds, curve)
                for n, cpu in enumerate(cpus)
            ],
        )
        time.sleep(WARMUP_S)
        before = {name: cpu_seconds(pids) for name, pids in measured.items()}
        time.sleep(seconds)
        used = {name: cpu_seconds(pids) - before[name] for name, pids in measured.items()}
        counts = pending.get()
    answered = sum(c[0] for c in counts)
    rate = sum(c[0] / c[2] for c in counts)
    result = {"requests_per_s": rate, "errors": sum(c[1] for c in counts)}
    for name, cpu in used.items():
        prefix = "" if name == "router" else f"{name}_"
        result[f"{prefix}cpu_us_per_request"] = 1e6 * cpu / answered
        result[f"{prefix}cpu_utilization"] = cpu / seconds
    return result


def _tokenizer_cost(model: str, cpu: int, texts_: list[str]) -> dict:
    os.sched_setaffinity(0, {cpu})
    from numaserve.backends.tokenizer import Tokenizer

    tokenizer = Tokenizer(model, 256)  # as the router has it: the per-word memo, where it applies
    raw = tokenizer.raw
    raw.encode_batch(texts_[:64])  # warm
    start = time.perf_counter()
    for text in texts_:
        tokenizer.encode([text])
    router = time.perf_counter() - start
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
        "us_per_text_router": 1e6 * router / len(texts_),
        "us_per_text_one_by_one": 1e6 * one / len(texts_),
        "us_per_text_batch_32": 1e6 * batched / len(texts_),
        "mean_tokens": tokens,
    }


def tokenizer_cost(model: str, cpu: int) -> dict:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_tokenizer_cost, (model, cpu, texts(5000, True)))


def _echo(endpoint: str, cpu: int, curve: CurveConfig | None) -> None:
    os.sched_setaffinity(0, {cpu})
    sock = zmq.Context().socket(zmq.ROUTER)
    if curve is not None:  # no authenticator: libzmq admits any client key
        sock.curve_server = True
        sock.curve_publickey, sock.curve_secretkey = read_key_pair(curve.secret_key_file, "key")
    sock.bind(endpoint)
    while True:
        sock.send_multipart(sock.recv_multipart())


def floor(args, lay: Layout, keys: Keys | None) -> dict:
    """A bare pyzmq ROUTER echo on the (first) router's CPU, driven by the same generators."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    proc = multiprocessing.get_context("spawn").Process(
        target=_echo, args=(endpoint, lay.routers[0], keys and keys.server)
    )
    proc.start()
    try:
        texts_ = texts(100_000, True)
        return run_load(
            endpoint,
            {"router": [proc.pid]},
            texts_,
            lay.load,
            args.inflight,
            args.seconds,
            keys and keys.client,
        )
    finally:
        proc.kill()
        proc.join()


def router(
    args,
    lay: Layout,
    node_of: dict[int, int],
    tmp: str,
    cache_entries: int,
    texts_: list[str],
    keys: Keys | None,
    refuse: bool = False,
) -> dict:
    """The real router, or `--routers` shards behind the frontend, each shard with
    `--workers` stand-in instances of its own; with `refuse`, instances that hold their
    texts for an hour and a queue of one, so that every request is refused."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    sharded = len(lay.routers) > 1
    name = f"{cache_entries}{'-refuse' if refuse else ''}"
    shards_endpoint = f"ipc://{tmp}/frontend-{name}.sock"
    server = ServerConfig(
        endpoint=endpoint,
        cache_entries=cache_entries,
        max_batch=1,  # the router's work a text, as docs/benchmarks.md gives it
        curve=keys and keys.server,
        **({"queue_size": 1, "max_queue_ms": 3_600_000} if refuse else {"queue_size": 4096}),
    )
    client = keys and keys.client
    log = open(f"{tmp}/router-{name}.log", "w")  # noqa: SIM115 (closed below)
    procs, routers = [], []
    try:
        if sharded:
            frontend = FrontendSpec(
                endpoint=endpoint,
                shards=shards_endpoint,
                max_message_bytes=server.max_message_bytes,
                curve=server.curve,
                binding=Binding.of([lay.frontend], [node_of[lay.frontend]]),
            )
            procs.append(subprocess.Popen(frontend.argv(), stderr=log))
        for shard, (cpu, stand_in_cpu) in enumerate(zip(lay.routers, lay.stand_ins, strict=True)):
            workers = f"ipc://{tmp}/workers-{name}-{shard}.sock"
            spec = RouterSpec(
                workers_endpoint=workers,
                pools=(PoolConfig(name="main", max_tokens=256),),
                model=ModelConfig(path=args.model, max_length=256),
                server=server,
                binding=Binding.of([cpu], [node_of[cpu]]),
                shard=shard,
                frontend=shards_endpoint if sharded else None,
            )
            routers.append(subprocess.Popen(spec.argv(), stderr=log))
            procs.append(
                subprocess.Popen(
                    [
                        *(sys.executable, str(ROOT / "benchmarks/stand_in_workers.py")),
                        *("--endpoint", workers, "--count", str(args.workers)),
                        *("--cpu", str(stand_in_cpu)),
                        *(("--delay", "3600") if refuse else ()),
                    ],
                    stderr=log,
                )
            )
        procs.extend(routers)
        try:
            wait_for_instances(endpoint, len(routers), args.workers, procs, client)
        except RuntimeError as e:
            log.flush()
            sys.exit(f"{Path(log.name).read_text()[-2000:]}\n{e} (log above)")
        if cache_entries:  # fill every shard's cache with the texts the load then repeats
            warm(endpoint, texts_, len(routers), client)
        measured = {"router": [p.pid for p in routers]}
        if sharded:
            measured["frontend"] = [procs[0].pid]
        return run_load(endpoint, measured, texts_, lay.load, args.inflight, args.seconds, client)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        log.close()


def wait_for_instances(
    endpoint: str, shards: int, count: int, procs, curve: ClientKeys | None
) -> None:
    """Until every shard has said (through the frontend, which hands the status requests to
    each in turn) that `count` instances are ready."""
    from numaserve.client import Client

    ready: dict[int, int] = {}
    deadline = time.monotonic() + 60
    with Client(endpoint, timeout=2, retries=0, curve=curve) as client:
        while time.monotonic() < deadline:
            try:
                status = client.status()
                ready[status.get("shard", 0)] = sum(p["ready"] for p in status["pools"])
            except Exception:
                if dead := [p.args[2] for p in procs if p.poll() is not None]:
                    raise RuntimeError(f"exited: {dead}") from None
                time.sleep(0.2)
                continue
            if len(ready) == shards and min(ready.values()) >= count:
                return
            time.sleep(0.05)
    raise RuntimeError(f"not every shard at {endpoint} saw {count} instances: {ready}")


def warm(endpoint: str, texts_: list[str], shards: int, curve: ClientKeys | None) -> None:
    """Each batch sent once to each shard: the frontend hands consecutive requests to the
    shards in turn."""
    from numaserve.client import Client

    with Client(endpoint, timeout=10, curve=curve) as client:
        for start in range(0, len(texts_), 64):
            for _ in range(shards):
                client.embed(texts_[start : start + 64])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--inflight", type=int, default=256, help="per load generator")
    parser.add_argument("--workers", type=int, default=8, help="stand-in instances per shard")
    parser.add_argument("--routers", type=int, default=1, help="router shards")
    parser.add_argument("--clients", type=int, default=1, help="load generator processes")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--curve", action="store_true", help="CurveZMQ on the client sockets")
    parser.add_argument(
        "--model", default="bundled:minilm", help="model.path whose tokenizer the router runs"
    )
    args = parser.parse_args()
    topo = read_topology()
    print(format_topology(topo), flush=True)
    lay = layout(sorted(os.sched_getaffinity(0)), args.routers, args.clients)
    print(f"CPUs: {lay}", flush=True)
    results = {
        "topology": topo.to_json(),
        "settings": vars(args) | {"json": str(args.json)},
        "layout": dataclasses.asdict(lay),
    }
    node_of = {cpu: core.node for core in topo.cores for cpu in core.cpus}
    with tempfile.TemporaryDirectory() as tmp:
        keys = make_keys(tmp) if args.curve else None
        results["floor"] = floor(args, lay, keys)
        results["cache_off"] = router(args, lay, node_of, tmp, 0, texts(1_000_000, True), keys)
        results["cache_hits"] = router(args, lay, node_of, tmp, 100_000, texts(500, False), keys)
        results["refused"] = router(
            args, lay, node_of, tmp, 0, texts(1_000_000, True), keys, refuse=True
        )
    results["tokenizer"] = tokenizer_cost(args.model, lay.routers[0])
    print(
        f"\n{'':12} {'requests/s':>11} {'router CPU us/request':>22} {'CPU use':>8}"
        f" {'frontend CPU use':>17} {'errors':>7}"
    )
    for name in ("floor", "cache_off", "cache_hits", "refused"):
        r = results[name]
        front = f"{r['frontend_cpu_utilization']:.0%}" if "frontend_cpu_utilization" in r else "-"
        print(
            f"{name:12} {r['requests_per_s']:11,.0f} {r['cpu_us_per_request']:22.1f} "
            f"{r['cpu_utilization']:8.0%} {front:>17} {r['errors']:7}"
        )
    t = results["tokenizer"]
    print(
        f"\ntokenizer on the router's CPU ({t['mean_tokens']:.0f} tokens a text): "
        f"{t['us_per_text_router']:.1f} us a text as the router tokenizes; the library alone "
        f"{t['us_per_text_one_by_one']:.1f} us one by one, "
        f"{t['us_per_text_batch_32']:.1f} us in batches of 32"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
