"""What a router-side process (a shard, the frontend, an HTTP front) shares once begun
(processes/begin.py): its ZeroMQ context, and how it sends a protocol message cheaply."""

from __future__ import annotations

import os

import zmq

from numaserve.wire import protocol

# Plain ints: `events & zmq.POLLIN` with pyzmq's IntFlag builds an enum member per call, which
# cost the router 4% of its time.
EVENTS, POLLIN, NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)
SNDMORE = int(zmq.SNDMORE)


def context() -> zmq.Context:
    """A context whose I/O thread runs SCHED_BATCH. Pinned to the router's core, libzmq's I/O
    thread was woken by every send and, under CFS wakeup preemption, ran at once: two context
    switches a request and 29% of the router's CPU. SCHED_BATCH does not preempt on wakeup: it
    runs when the router waits, with several messages to move at once."""
    ctx = zmq.Context()
    ctx.set(zmq.THREAD_SCHED_POLICY, os.SCHED_BATCH)
    return ctx


def send(sock: zmq.Socket, envelope: list[bytes], body: dict, flags: int = 0) -> None:
    """send_multipart's work for a protocol message, without its per-frame type checks and
    flag enums (a tenth of the router's cost of a send)."""
    version, payload = protocol.pack(body)
    for frame in envelope:
        sock.send(frame, SNDMORE | flags)
    sock.send(version, SNDMORE | flags)
    sock.send(payload, flags)
