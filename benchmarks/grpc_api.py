"""TEI's gRPC API against the HTTP API and the ZeroMQ endpoint of the same running server:
`Embed` of one short text a call, at 1 and 32 clients, in rounds that rotate the three ways'
order (drift cancels); then 1,000 texts over one `EmbedStream` against 1,000 unary `Embed`
calls in turn, alternating.

One `numaserve start` of configs/default.yaml with server.grpc on; `--cache off` sets
server.cache_entries to 0 (every text runs the model: what a client sees), `--cache on`
warms the cache with the texts first (every call a hit: what the fronts themselves cost).
The load generator is Python, on the same CPUs: grpcio's client costs it more a call than
http.client or the ZeroMQ client, so a way's throughput here is a floor for what the server
would give a client on other cores; each way's CPU time a request, by process, is printed
with it (the fronts' is their whole cost).

Run:  .venv/bin/python -m benchmarks.grpc_api [--clients 1,32] [--requests 2000] [--rounds 3]
          [--cache off|on] [--stream 1000] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.http_api import Way, by_role
from benchmarks.peers import ROOT, measure
from numaserve.corpus import short_texts
from numaserve.grpc_api.proto import tei
from numaserve.host.topology import format_topology, read_topology
from numaserve.loadgen.bench import Failed, closed_loop, http_target, numaserve_target
from numaserve.testing.ports import free_port
from numaserve.testing.server import ENDPOINT, Server

WAYS = ("zeromq", "http", "grpc")


def grpc_target(address: str, timeout: float = 10.0):
    """One channel a client; each call TEI's Embed of one text."""
    import grpc

    pb, stubs = tei()

    @contextlib.contextmanager
    def connect():
        with grpc.insecure_channel(address) as channel:
            embed = stubs.EmbedStub(channel).Embed

            def send(text: str) -> object:
                try:
                    return embed(pb.EmbedRequest(inputs=text), timeout=timeout)
                except grpc.RpcError as e:
                    raise Failed(e.code().name, e.details() or "") from None

            yield send

    return connect


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", default="1,32")
    parser.add_argument("--requests", type=int, default=2000, help="per round, way and clients")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cache", choices=("off", "on"), default="off")
    parser.add_argument("--stream", type=int, default=1000, help="texts over one stream")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    topo = read_topology()
    print(format_topology(topo), flush=True)
    texts = short_texts()[:200]
    address = f"127.0.0.1:{free_port()}"
    config = (ROOT / "configs/default.yaml").read_text().replace("tcp://127.0.0.1:5555", ENDPOINT)
    config = _with_server_keys(config, address, args.cache == "off")
    results: dict = {"topology": topo.to_json(), "settings": vars(args) | {"json": str(args.json)}}
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp), config, name=f"grpc-api-{time.monotonic_ns()}")
        try:
            server.wait_ready()
            ways = {
                "zeromq": Way("zeromq", numaserve_target([server.endpoint]), server.proc.pid),
                "http": Way("http", http_target(f"{server.url}/embed"), server.proc.pid),
                "grpc": Way("grpc", grpc_target(address), server.proc.pid),
            }
            if args.cache == "on":
                closed_loop(ways["zeromq"].target, texts, 1, len(texts) * 3)
            results["unary"] = unary(ways, texts, args)
            results["stream"] = stream(address, texts, args.stream, args.rounds)
        finally:
            server.stop()
    report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def _with_server_keys(config: str, address: str, cache_off: bool) -> str:
    """configs/default.yaml's server section with grpc on (and the cache off)."""
    if "\nserver:\n" not in config or "cache_entries: 100000" not in config:
        raise SystemExit("configs/default.yaml's server section is not as this expects")
    if cache_off:
        config = config.replace("cache_entries: 100000", "cache_entries: 0")
    return config.replace("\nserver:\n", f'\nserver:\n  grpc: "{address}"\n', 1)


def unary(ways: dict[str, Way], texts: list[str], args) -> dict:
    """Each client count's rounds, each way in a rotated order."""
    by_clients = {}
    for clients in (int(c) for c in args.clients.split(",")):
        rounds = []
        for r in range(args.rounds):
            order = WAYS[r % 3 :] + WAYS[: r % 3]
            row = {}
            for name in order:
                row[name] = measure(ways[name], texts, clients, args.requests)
                row[name].pop("latencies_ms")
            rounds.append(row)
            print(f"{clients} client(s), round {r + 1}: {line(row)}", flush=True)
        by_clients[clients] = rounds
    return by_clients


def stream(address: str, texts: list[str], count: int, rounds: int) -> list[dict]:
    """`count` texts over one EmbedStream against as many unary Embed calls in turn."""
    import grpc

    pb, stubs = tei()
    asked = [pb.EmbedRequest(inputs=texts[i % len(texts)]) for i in range(count)]
    timed = []
    with grpc.insecure_channel(address) as channel:
        embed = stubs.EmbedStub(channel)
        list(embed.EmbedStream(iter(asked[:50])))  # warm both ways
        for r in range(rounds):
            row = {}
            for way in ("stream", "unary") if r % 2 == 0 else ("unary", "stream"):
                started = time.perf_counter()
                if way == "stream":
                    answered = sum(1 for _ in embed.EmbedStream(iter(asked)))
                else:
                    answered = sum(1 for request in asked if embed.Embed(request))
                row[way] = {"seconds": time.perf_counter() - started, "answered": answered}
            timed.append(row)
            print(
                f"{count} texts: one stream {row['stream']['seconds']:.2f} s, "
                f"{count} unary calls {row['unary']['seconds']:.2f} s "
                f"({row['unary']['seconds'] / row['stream']['seconds']:.2f}x)",
                flush=True,
            )
    return timed


def line(row: dict) -> str:
    parts = []
    for name in WAYS:
        r = row[name]
        parts.append(
            f"{name} {r['throughput_rps']:.0f}/s p50 {r['latency_ms']['p50']:.2f} ms"
            f" (front {by_role(r, 'numaserve.fronts'):.0f} us CPU)"
        )
    g, h = row["grpc"]["throughput_rps"], row["http"]["throughput_rps"]
    return "; ".join(parts) + f"; grpc/http {g / h:.2f}x"


def report(results: dict) -> None:
    print()
    for clients, rounds in results["unary"].items():
        ratio = [r["grpc"]["throughput_rps"] / r["http"]["throughput_rps"] for r in rounds]
        to_zmq = [r["grpc"]["throughput_rps"] / r["zeromq"]["throughput_rps"] for r in rounds]
        added = [r["grpc"]["latency_ms"]["p50"] - r["zeromq"]["latency_ms"]["p50"] for r in rounds]
        http_added = [
            r["http"]["latency_ms"]["p50"] - r["zeromq"]["latency_ms"]["p50"] for r in rounds
        ]
        print(
            f"{clients} client(s): gRPC/HTTP throughput median {statistics.median(ratio):.2f}x "
            f"(rounds {', '.join(f'{x:.2f}' for x in ratio)}), gRPC/ZeroMQ "
            f"{statistics.median(to_zmq):.2f}x; p50 added over ZeroMQ: gRPC "
            f"{statistics.median(added):.2f} ms, HTTP {statistics.median(http_added):.2f} ms"
        )
    speedups = [r["unary"]["seconds"] / r["stream"]["seconds"] for r in results["stream"]]
    print(
        f"one EmbedStream against unary calls in turn: {statistics.median(speedups):.2f}x faster "
        f"(rounds {', '.join(f'{x:.2f}' for x in speedups)})"
    )


if __name__ == "__main__":
    main()
