"""The frontend: one client endpoint in front of several router shards, with no Python per message.

libzmq's own proxy (the zguide's "shared queue"): a ROUTER that clients reach on
`server.endpoint`, and a DEALER on a private ipc socket that every shard's client socket connects
to. The DEALER hands each request to the next shard in turn; a reply finds its client by the
envelope the ROUTER added. A shard that dies loses the requests it held (its clients retry, as
they do when the one router dies); the others keep serving, and the restarted shard reconnects.

Run as `python -m numaserve.router.frontend --spec JSON` (a FrontendSpec, specs.py).
"""

from __future__ import annotations

import logging
import signal

import zmq

from numaserve import exitcodes
from numaserve.router.process import begin, context
from numaserve.specs import FrontendSpec

log = logging.getLogger("numaserve.frontend")


class _Stopped(Exception):
    pass


def _stop(*_) -> None:
    raise _Stopped


def main(argv: list[str] | None = None) -> int:
    spec = begin(FrontendSpec, "numaserve.router.frontend", argv, log, exitcodes.CRASH)
    if isinstance(spec, int):
        return spec
    ctx = context()
    clients = ctx.socket(zmq.ROUTER)
    clients.setsockopt(zmq.MAXMSGSIZE, spec.max_message_bytes)
    shards = ctx.socket(zmq.DEALER)
    for sock in (clients, shards):
        sock.linger = 0
    try:
        clients.bind(spec.endpoint)
        shards.bind(spec.shards)
    except zmq.ZMQError as e:
        log.error("cannot listen on %s or %s: %s", spec.endpoint, spec.shards, e)
        return exitcodes.CRASH
    # SIGTERM ends the proxy (the supervisor stops the frontend after the shards have drained):
    # pyzmq runs the handler when libzmq's poll is interrupted, and the exception leaves proxy().
    signal.signal(signal.SIGTERM, _stop)
    log.info("listening on %s; shards on %s", spec.endpoint, spec.shards)
    try:
        zmq.proxy(clients, shards)
    except _Stopped:
        pass
    finally:
        clients.close(linger=0)
        shards.close(linger=0)
        ctx.term()
    log.info("stopped")
    return exitcodes.OK


if __name__ == "__main__":
    raise SystemExit(main())
