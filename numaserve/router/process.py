"""How a router-side process (a shard, the frontend) begins: its spec, its parent, its CPUs,
and its ZeroMQ context."""

from __future__ import annotations

import logging
import os

import zmq

from numaserve import exitcodes
from numaserve.host.pinning import PinningError, pin_current_process, restart_under_numactl
from numaserve.lifecycle import die_with_parent, read_spec


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
