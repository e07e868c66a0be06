"""A big request against the same texts in small ones, through one real server, and what a
2,048-text request holds in the router and the HTTP front.

Starts `numaserve start` with the default model and path (`quantize: auto`), two single-core
instances, the cache off (every text computed), and in each round, in turns (the order
rotates each round):
  big    one client, one request of the 2,048 texts
  eight  8 clients, the same texts as 32 requests of 64, taken from one queue
  one    one client, the 32 requests of 64 one after another
Reported per round: texts a second in each, and big's ratio to each (median and spread over
the rounds); the cosine of each of a sample of big's vectors to the same text sent alone;
the router shard's and the HTTP front's peak RSS growth for one 2,048-text HTTP /embed
(VmHWM, reset through /proc/PID/clear_refs before it, so root).

Run:  .venv/bin/python -m benchmarks.big_requests [--rounds 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from benchmarks import machine
from benchmarks.reliability import CONFIG  # two single-core instances, the cache off
from numaserve.client import Client
from numaserve.corpus import short_texts
from numaserve.testing.server import Server

TEXTS = 2048
PIECE = 64
CLIENTS = 8


def texts() -> list[str]:
    shipped = short_texts()
    return [shipped[i % len(shipped)] for i in range(TEXTS)]


def big(endpoint: str, batch: list[str]) -> list[np.ndarray]:
    with Client(endpoint, timeout=120) as client:
        return [e.vector for e in client.embed(batch)]


def eight(endpoint: str, batch: list[str]) -> None:
    pieces = [batch[i : i + PIECE] for i in range(0, len(batch), PIECE)]
    lock = threading.Lock()

    def client() -> None:
        with Client(endpoint, timeout=120) as c:
            while True:
                with lock:
                    if not pieces:
                        return
                    piece = pieces.pop()
                c.embed(piece)

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def one(endpoint: str, batch: list[str]) -> None:
    with Client(endpoint, timeout=120) as client:
        for i in range(0, len(batch), PIECE):
            client.embed(batch[i : i + PIECE])


def kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def peak_growth(server: Server, batch: list[str]) -> dict:
    """Each process's peak RSS over one 2,048-text HTTP request, above its RSS before."""
    pids = {"router": server.router_pid(), "http front": server.http_pids()[0]}
    before = {}
    for name, pid in pids.items():
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        before[name] = kib(pid, "VmRSS")
    answer = httpx.post(f"{server.url}/embed", json={"inputs": batch}, timeout=120)
    answer.raise_for_status()
    return {
        name: {
            "rss_before_mib": round(before[name] / 1024, 1),
            "peak_growth_mib": round((kib(pid, "VmHWM") - before[name]) / 1024, 1),
        }
        for name, pid in pids.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    topology = machine.topology()
    batch = texts()
    with tempfile.TemporaryDirectory() as directory:
        server = Server(Path(directory), CONFIG)
        try:
            server.wait_ready(timeout=900)
            endpoint = server.endpoint
            modes = {"big": big, "eight": eight, "one": one}
            one(endpoint, batch[:256])  # warm: each instance's first passes
            rates: dict[str, list[float]] = {m: [] for m in modes}
            for r in range(args.rounds):
                order = list(modes)[r % 3 :] + list(modes)[: r % 3]
                for mode in order:
                    began = time.perf_counter()
                    modes[mode](endpoint, batch)
                    rates[mode].append(TEXTS / (time.perf_counter() - began))
                line = ", ".join(f"{m} {rates[m][-1]:.0f}/s" for m in modes)
                print(f"round {r + 1}: {line}")
            vectors = big(endpoint, batch)
            sample = list(range(0, TEXTS, 41))
            with Client(endpoint, timeout=30) as client:
                alone = [client.embed(batch[i]).vector for i in sample]
            cosines = [
                float(np.dot(vectors[i], a) / np.linalg.norm(vectors[i]) / np.linalg.norm(a))
                for i, a in zip(sample, alone, strict=True)
            ]
            memory = peak_growth(server, batch)
        finally:
            server.stop()
    ratios = {
        f"big/{m}": [b / o for b, o in zip(rates["big"], rates[m], strict=True)]
        for m in ("eight", "one")
    }
    result = {
        "topology": topology,
        "texts": TEXTS,
        "texts_per_s": {m: [round(x, 1) for x in v] for m, v in rates.items()},
        "ratios": {
            k: {
                "median": round(statistics.median(v), 3),
                "min": round(min(v), 3),
                "max": round(max(v), 3),
            }
            for k, v in ratios.items()
        },
        "cosine_to_alone": {"lowest": round(min(cosines), 6), "texts": len(cosines)},
        "peak_rss_of_one_2048_text_http_request": memory,
    }
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
