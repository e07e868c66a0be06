"""Stand-in workers for benchmarks: they speak the worker protocol (docs/protocol.md) and answer
every `run` at once, or after `delay` seconds, with a fixed 4-float embedding per input.

They stand in for the model so that a benchmark measures the router alone. All of them run in
one process and one poll loop (on the load's CPU), each on a DEALER socket of its own, so the
router sees `count` distinct instances.

Run:  python -m benchmarks.stand_in_workers --endpoint ipc://... --count 8 [--delay 0] [--cpu 1]
"""

from __future__ import annotations

import argparse
import heapq
import os
import time

import msgpack
import zmq

from numaserve.wire import protocol

VECTOR = b"\x00\x00\x00?" * 4  # four float32 0.5s, little-endian


def serve(endpoint: str, count: int, delay: float, heartbeat_s: float, pool: str) -> None:
    ctx = zmq.Context()
    poller = zmq.Poller()
    socks = []
    for n in range(count):
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(endpoint)
        ready = {"type": protocol.READY, "name": f"stand-in-{n}", "pool": pool, "pid": os.getpid()}
        sock.send_multipart(protocol.pack(ready))
        poller.register(sock, zmq.POLLIN)
        socks.append(sock)
    beat = protocol.pack({"type": protocol.HEARTBEAT})
    due: list[tuple[float, int, zmq.Socket, bytes]] = []  # delayed replies
    seq = 0
    next_beat = time.monotonic()
    while True:
        now = time.monotonic()
        wait = min(next_beat, due[0][0] if due else next_beat) - now
        for sock, _ in poller.poll(max(0.0, wait) * 1000):
            while sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                frames = sock.recv_multipart()
                body = msgpack.unpackb(frames[1], raw=False)
                if body.get("type") != protocol.RUN:
                    continue
                results = [{"embedding": VECTOR} for _ in body["inputs"]]
                reply = msgpack.packb(
                    {"type": protocol.RESULT, "job": body["job"], "results": results}
                )
                if delay:
                    seq += 1
                    heapq.heappush(due, (time.monotonic() + delay, seq, sock, reply))
                else:
                    sock.send_multipart([protocol.VERSION, reply])
        now = time.monotonic()
        while due and due[0][0] <= now:
            _, _, sock, reply = heapq.heappop(due)
            sock.send_multipart([protocol.VERSION, reply])
        if now >= next_beat:
            for sock in socks:
                sock.send_multipart(beat)
            next_beat = now + heartbeat_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", required=True, help="the router's worker endpoint")
    parser.add_argument("--count", type=int, default=8)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each answer")
    parser.add_argument("--heartbeat-ms", type=int, default=500)
    parser.add_argument("--pool", default="main")
    parser.add_argument("--cpu", type=int, help="pin to this CPU")
    args = parser.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    serve(args.endpoint, args.count, args.delay, args.heartbeat_ms / 1000, args.pool)


if __name__ == "__main__":
    main()
