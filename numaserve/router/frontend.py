"""The frontend: one client endpoint in front of several router shards.

For one model, libzmq's own proxy, with no Python per message (the zguide's "shared queue"): a
ROUTER that clients reach on `server.endpoint`, and a DEALER on a private ipc socket that every
shard's client socket connects to. The DEALER hands each request to the next shard in turn; a
reply finds its client by the envelope the ROUTER added. A shard that dies loses the requests it
held (its clients retry, as they do when the one router dies); the others keep serving, and the
restarted shard reconnects.

For the models of a `models:` config, a DEALER per model, and a loop that reads each request's
`model` and hands it to that model's shards (`status` and `ping`, which are the whole server's,
to the first model's). A request that names no model where there are several, or one not
served, is answered here. A reload that adds or removes models writes the new FrontendSpec to
`routes_file` and sends SIGHUP: the new models' sockets are bound and the removed ones' closed
between two messages, while the others' requests flow.

Run as `python -m numaserve.router.frontend --spec JSON` (a FrontendSpec, processes/specs.py).
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
import traceback
from collections.abc import Callable

import zmq

from numaserve.config.schema import ConfigError
from numaserve.processes import exitcodes
from numaserve.processes.begin import begin
from numaserve.processes.logs import Summary
from numaserve.processes.specs import FrontendSpec
from numaserve.router.process import context
from numaserve.tasks import TASKS
from numaserve.wire import curve, protocol
from numaserve.wire.protocol import ErrorCode

log = logging.getLogger("numaserve.frontend")

STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
CAUGHT = {*STOP_SIGNALS, signal.SIGHUP}  # SIGHUP: new routes in spec.routes_file
CONTROL = "inproc://frontend-control"
ROUTES = b"ROUTES"  # from the main thread on SIGHUP: [ROUTES, JSON [[model, endpoint], ...]]
BATCH = 64  # messages taken from one socket before the others are looked at


def main(argv: list[str] | None = None) -> int:
    began = begin(FrontendSpec, argv, log, bad_spec=exitcodes.CRASH)
    if isinstance(began, int):
        return began
    spec = began.spec
    # Blocked here, and so in the proxy's thread too, the stop signals wait for sigwait below.
    # A Python handler could not stop the proxy: it runs only when libzmq returns to Python,
    # and a signal that lands while the proxy moves messages never makes it return.
    signal.pthread_sigmask(signal.SIG_BLOCK, CAUGHT)
    ctx = context()
    clients = ctx.socket(zmq.ROUTER)
    clients.setsockopt(zmq.MAXMSGSIZE, spec.max_message_bytes)
    routes = {route.model: ctx.socket(zmq.DEALER) for route in spec.routes}
    control = ctx.socket(zmq.PAIR)
    for sock in (clients, *routes.values(), control):
        sock.linger = 0
    auth = None
    shards = ", ".join(route.shards for route in spec.routes)
    try:
        if spec.curve:
            auth = curve.serve(
                ctx, clients, spec.curve.secret_key_file, spec.curve.authorized_keys_dir
            )
        clients.bind(spec.endpoint)
        for route in spec.routes:
            routes[route.model].bind(route.shards)
    except (zmq.ZMQError, curve.CurveError) as e:
        log.error("cannot listen on %s or %s: %s", spec.endpoint, shards, e)
        if auth is not None:
            auth.stop()
        ctx.destroy(linger=0)
        return exitcodes.MODEL if isinstance(e, curve.CurveError) else exitcodes.CRASH
    control.bind(CONTROL)
    if spec.by_model:
        target: Callable[..., None] = _route
        args: tuple = (ctx, clients, routes)
    else:
        (only,) = routes.values()
        target, args = _proxy, (ctx, clients, only)
    proxy = threading.Thread(target=target, args=args, name="proxy")
    proxy.start()
    log.info("listening on %s; shards on %s", spec.endpoint, shards)
    # SIGTERM ends the proxy (the supervisor stops the frontend after the shards have drained).
    while signal.sigwait(CAUGHT) == signal.SIGHUP:
        _reroute(spec, control)
    control.send(b"TERMINATE")
    proxy.join()
    control.close()
    if auth is not None:
        auth.stop()
    ctx.term()
    log.info("stopped")
    return exitcodes.OK


def _reroute(spec: FrontendSpec, control: zmq.Socket) -> None:
    """SIGHUP: a reload added or removed models; their routes are in spec.routes_file (the
    new FrontendSpec), for the routing thread to take up between two messages."""
    if not (spec.by_model and spec.routes_file):
        log.info("SIGHUP: one model's proxy has no routes to change")
        return
    try:
        with open(spec.routes_file) as f:
            new = FrontendSpec.from_json(f.read())
    except (OSError, ConfigError) as e:
        log.error("SIGHUP: routes not changed: %s: %s", spec.routes_file, e)
        return
    routes = [[route.model, route.shards] for route in new.routes]
    control.send_multipart([ROUTES, json.dumps(routes).encode()])


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


def _route(ctx: zmq.Context, clients: zmq.Socket, routes: dict[str, zmq.Socket]) -> None:
    """Each request to its model's shards, each reply to its client, until TERMINATE."""
    control = ctx.socket(zmq.PAIR)
    control.linger = 0
    control.connect(CONTROL)
    poller = zmq.Poller()
    for sock in (clients, control, *routes.values()):
        poller.register(sock, zmq.POLLIN)
    failures = Summary(
        log, "client message(s) failed in the frontend and were dropped", 10.0, logging.ERROR
    )
    try:
        while True:
            for sock, _ in poller.poll():
                if sock is control:
                    command = control.recv_multipart()
                    if command[0] != ROUTES:
                        return  # TERMINATE
                    _set_routes(ctx, poller, routes, json.loads(command[1]))
                    continue
                for _ in range(BATCH):  # what is waiting, without a poll per message
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if sock is not clients:
                        clients.send_multipart(frames)  # a reply: its envelope finds the client
                        continue
                    try:  # no message, however malformed, may stop the routing
                        _hand_out(clients, routes, frames)
                    except Exception:
                        failures.add(1, time.monotonic(), traceback.format_exc())
    finally:
        for sock in (clients, control, *routes.values()):
            sock.close(linger=0)


def _set_routes(
    ctx: zmq.Context, poller: zmq.Poller, routes: dict[str, zmq.Socket], wanted: list
) -> None:
    """A socket for each model new to the server (its shards connect to it next); those of
    the removed models closed (their shards have drained and exited). In the new order: the
    first model's shards answer status and ping."""
    old = dict(routes)
    routes.clear()
    for model, endpoint in wanted:
        sock = old.pop(model, None)
        if sock is None:
            sock = ctx.socket(zmq.DEALER)
            sock.linger = 0
            try:
                sock.bind(endpoint)
            except zmq.ZMQError as e:
                log.error("cannot listen for model %r's shards on %s: %s", model, endpoint, e)
                sock.close()
                continue
            poller.register(sock, zmq.POLLIN)
        routes[model] = sock
    for sock in old.values():
        poller.unregister(sock)
        sock.close()
    removed = f"; removed {', '.join(old)}" if old else ""
    log.info("routes: %s%s", ", ".join(routes), removed)


def _hand_out(clients: zmq.Socket, routes: dict[str, zmq.Socket], frames: list[bytes]) -> None:
    """A client's request to the shards of the model it names."""
    body = _body(frames)
    model = body.get("model")
    first = next(iter(routes))
    if isinstance(model, str) and model in routes:
        _pass(clients, routes, model, frames, body)
    elif model is None and (body.get("op") not in TASKS or len(routes) == 1):
        _pass(clients, routes, first, frames, body)  # status, ping, the only model
    elif model is None:
        message = f"this server serves several models ({', '.join(routes)}): name one in `model`"
        _refuse(clients, frames, body, ErrorCode.BAD_REQUEST, message)
    elif isinstance(model, str) and len(model) <= protocol.MAX_MODEL_NAME:
        message = f"no model {model!r} here; this server serves {', '.join(routes)}"
        _refuse(clients, frames, body, ErrorCode.BAD_REQUEST, message)
    else:  # not a name: a router says what is wrong with the request
        _pass(clients, routes, first, frames, body)


def _pass(
    clients: zmq.Socket, routes: dict[str, zmq.Socket], model: str, frames: list[bytes], body: dict
) -> None:
    """To one of the model's shards; with none taking requests (all restarting, or every one
    a high-water mark behind), answered no_instance at once, so that one model's outage
    never holds up the others' requests."""
    try:
        routes[model].send_multipart(frames, zmq.NOBLOCK)
    except zmq.Again:
        message = f"no router shard of model {model!r} is up or keeping up; retry shortly"
        _refuse(clients, frames, body, ErrorCode.NO_INSTANCE, message)


def _body(frames: list[bytes]) -> dict:
    """The request, or {} for anything that is not one (the router it goes to says why)."""
    if len(frames) < 3:
        return {}
    try:
        return protocol.unpack(frames[-2:])
    except protocol.ProtocolError:
        return {}


def _refuse(
    clients: zmq.Socket, frames: list[bytes], body: dict, code: ErrorCode, message: str
) -> None:
    reply = protocol.error_reply(protocol.reply_id(body.get("id")), code, message)
    clients.send_multipart([*frames[:-2], *protocol.pack(reply)])


if __name__ == "__main__":
    raise SystemExit(main())
