"""How a router-side process (a shard, the frontend, an HTTP front) begins: its spec, its
parent, its CPUs, and its ZeroMQ context; and how it sends a protocol message cheaply."""

from __future__ import annotations

import logging
import os

import zmq

from numaserve.host.pinning import (
    BOUND_BY,
    BOUND_BY_CPUSET,
    PinningError,
    pin_current_process,
    restart_under_numactl,
)
from numaserve.processes import exitcodes
from numaserve.processes.lifecycle import die_with_parent, read_spec
from numaserve.wire import protocol

# Plain ints: `events & zmq.POLLIN` with pyzmq's IntFlag builds an enum member per call, which
# cost the router 4% of its time.
EVENTS, POLLIN, NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)
SNDMORE = int(zmq.SNDMORE)


def begin(spec_type, module: str, argv: list[str] | None, log: logging.Logger, bad_spec: int):
    """The process's spec, once it dies with its parent and runs on its CPUs (where it names
    any); or the exit code to leave with: `bad_spec` for an unreadable spec, PINNING."""
    spec = read_spec(spec_type, module, argv, log)
    if spec is None:
        return bad_spec
    die_with_parent()
    if spec.cpus:
        try:
            method, cpus, nodes = pin_current_process(spec.cpus, spec.nodes)
        except PinningError as e:
            log.error("cannot pin %s: %s", module, e)
            return exitcodes.PINNING
        if method == BOUND_BY_CPUSET:
            log.info("%s: memory bound by %s", module, BOUND_BY[method])
        restart_under_numactl(method, cpus, nodes, spec.argv(), log)
    return spec


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
