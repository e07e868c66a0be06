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
import threading

import zmq

from numaserve import curve, exitcodes
from numaserve.router.process import begin, context
from numaserve.specs import FrontendSpec

log = logging.getLogger("numaserve.frontend")

STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
CONTROL = "inproc://frontend-control"


def main(argv: list[str] | None = None) -> int:
    spec = begin(FrontendSpec, "numaserve.router.frontend", argv, log, exitcodes.CRASH)
    if isinstance(spec, int):
        return spec
    # Blocked here, and so in the proxy's thread too, the stop signals wait for sigwait below.
    # A Python handler could not stop the proxy: it runs only when libzmq returns to Python,
    # and a signal that lands while the proxy moves messages never makes it return.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    ctx = context()
    clients = ctx.socket(zmq.ROUTER)
    clients.setsockopt(zmq.MAXMSGSIZE, spec.max_message_bytes)
    shards = ctx.socket(zmq.DEALER)
    control = ctx.socket(zmq.PAIR)
    for sock in (clients, shards, control):
        sock.linger = 0
    auth = None
    try:
        if spec.curve:
            auth = curve.serve(
                ctx, clients, spec.curve.secret_key_file, spec.curve.authorized_keys_dir
            )
        clients.bind(spec.endpoint)
        shards.bind(spec.shards)
    except (zmq.ZMQError, curve.CurveError) as e:
        log.error("cannot listen on %s or %s: %s", spec.endpoint, spec.shards, e)
        if auth is not None:
            auth.stop()
        ctx.destroy(linger=0)
        return exitcodes.MODEL if isinstance(e, curve.CurveError) else exitcodes.CRASH
    control.bind(CONTROL)
    proxy = threading.Thread(target=_proxy, args=(ctx, clients, shards), name="proxy")
    proxy.start()
    log.info("listening on %s; shards on %s", spec.endpoint, spec.shards)
    # SIGTERM ends the proxy (the supervisor stops the frontend after the shards have drained).
    signal.sigwait(STOP_SIGNALS)
    control.send(b"TERMINATE")
    proxy.join()
    control.close()
    if auth is not None:
        auth.stop()
    ctx.term()
    log.info("stopped")
    return exitcodes.OK


def _proxy(ctx: zmq.Context, clients: zmq.Socket, shards: zmq.Socket) -> None:
    """libzmq's proxy, until TERMINATE arrives on the control socket; the sockets are this
    thread's from here on."""
    control = ctx.socket(zmq.PAIR)
    control.linger = 0
    control.connect(CONTROL)
    try:
        zmq.proxy_steerable(clients, shards, None, control)
    finally:
        for sock in (clients, shards, control):
            sock.close(linger=0)


if __name__ == "__main__":
    raise SystemExit(main())
