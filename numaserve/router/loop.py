"""The router: one process between the clients and the worker pools.

Its sockets and event loop: each request's life from receipt to reply is the book's (book.py:
tokenized, answered from the cache, or dispatched by length by dispatch.py), status.py is what it
reports. Clients
reach it on `server.endpoint` (a ROUTER socket); workers connect to a second ROUTER socket over
ipc. Run as `python -m numaserve.router --spec JSON` (a RouterSpec, processes/specs.py).
"""

from __future__ import annotations

import logging
import os
import signal
import time
import traceback
from pathlib import Path

import zmq

from numaserve.backends.tokenizer import Tokenizer
from numaserve.checkpoint.errors import ModelLoadError
from numaserve.checkpoint.paths import resolve_model_path
from numaserve.processes import exitcodes
from numaserve.processes.begin import begin, import_numpy
from numaserve.processes.specs import RouterSpec, model_key
from numaserve.processes.tracing import Tracing
from numaserve.processes.tracing import start as start_tracing
from numaserve.router import status
from numaserve.router.book import RequestBook
from numaserve.router.cache import ResultCache
from numaserve.router.connections import Connections
from numaserve.router.dispatch import Dispatcher, Job
from numaserve.router.handover import Handover, is_handed_over
from numaserve.router.in_flight import Pending
from numaserve.router.metrics import RouterMetrics
from numaserve.router.process import EVENTS, NOBLOCK, POLLIN, context, send
from numaserve.router.traces import RequestTraces
from numaserve.status.report import BadReport, Ready, ServerReport, ShardReport, SlotTable
from numaserve.tasks import TASKS, serves
from numaserve.tasks.prompts import NO_PROMPTS, Prompts
from numaserve.tasks.requests import Request, RequestError, parse_request
from numaserve.wire import curve, protocol
from numaserve.wire.protocol import ErrorCode
from numaserve.wire.run import Run

log = logging.getLogger("numaserve.router")
CLIENT_BATCH = 32  # client messages handled before the workers' socket is looked at again
WORKER_BATCH = 256
# While busy, the router looks for worker results between client messages this often (a
# finished instance's next job waits at most this long behind clients), and polls its wake
# pipe and monitor socket this often.
YIELD_CHECK_S = 0.0001
BUSY_POLL_S = 0.001
TOKENIZER_MEMO_BYTES = 64 << 20
# A request handed to a peer shard that has not answered in this long is answered no_instance
# here (the peer died holding it): past any queue wait, and a client's usual timeout.
HANDOVER_TIMEOUT_S = 30.0
# A status op the supervisor has not answered for the whole server by then (it waits for the
# serving shards' fresh reports, STATUS_WAIT_S at most) is answered by this shard alone.
WHOLE_STATUS_TIMEOUT_S = protocol.STATUS_WAIT_S + 1.0


def read_request(
    book: RequestBook, envelope: list[bytes], version: bytes, body: dict, max_texts: int
) -> Request | None:
    """A client's request, checked; None where the book has answered it with an error."""
    if version != protocol.VERSION:
        message = f"unsupported protocol version {version[:16]!r}; this server speaks {protocol.VERSION!r}"
        request_id = protocol.reply_id(body.get("id"))
        book.error_reply(envelope, request_id, body.get("op"), ErrorCode.BAD_REQUEST, message)
        return None
    book.counters["requests"] += 1
    try:
        return parse_request(body, max_texts)
    except RequestError as e:
        book.error_reply(envelope, e.request_id, body.get("op"), e.code, e.message)
        return None


class Router:
    """One shard: its sockets and event loop. What each request becomes is the book's
    (book.py); which instance runs which text is dispatch.py's."""

    def __init__(
        self,
        spec: RouterSpec,
        tokenizer: Tokenizer,
        ctx: zmq.Context | None = None,
        prompts: Prompts = NO_PROMPTS,
        tracing: Tracing | None = None,
    ):
        """`prompts`: an embedding model's own (tasks/embed.py), read with its tokenizer.
        `tracing`: this process's, where tracing is on (processes/tracing.py)."""
        self.spec = spec
        self.traces = RequestTraces(tracing) if tracing else None
        self.server = spec.server
        self.dispatch = Dispatcher.for_server(spec.pools, spec.server)
        self.heartbeat = spec.server.heartbeat_ms / 1000
        self.expiry = self.heartbeat * spec.server.heartbeat_liveness
        self.metrics = RouterMetrics([pool.name for pool in spec.pools])
        self.book = RequestBook(
            tokenizer,
            self.dispatch,
            ResultCache(spec.server.cache_entries),
            self.metrics,
            model_key(spec.model),
            self._reply,
            task=spec.model.task,
            max_queue_ms=spec.server.max_queue_ms,
            # Running instances announce themselves again once they have not heard from a
            # router for `liveness` heartbeats: a restarted router holds texts for them that
            # long instead of answering no_instance.
            hold_until=time.monotonic() + self.expiry + 2 * self.heartbeat,
            prompts=prompts,
            max_windows=spec.model.max_chunks_per_doc,
            max_backlog=spec.server.max_texts,
            traces=self.traces,
        )
        self.ctx = ctx or zmq.Context.instance()
        self.clients = self.ctx.socket(zmq.ROUTER)
        self.clients.setsockopt(zmq.MAXMSGSIZE, spec.server.max_message_bytes)
        self.clients.setsockopt(zmq.ROUTER_MANDATORY, 0)
        self.clients.linger = 0
        self.workers = self.ctx.socket(zmq.ROUTER)
        self.workers.linger = 0
        self.connections = Connections(self.clients, spec.server.curve is not None)
        self.stopping = False
        self.table: SlotTable | None = None  # the supervisor's latest, for status and handover
        self.supervisor_identity: bytes | None = None  # its connection, once it has sent one
        self.whole = status.WholeStatusQueries(WHOLE_STATUS_TIMEOUT_S)
        self.handover = None
        if spec.handovers:
            self.handover = Handover(self.ctx, spec.shard, spec.handovers, HANDOVER_TIMEOUT_S)
            self.book.hand_over = self._hand_over
        self.auth = None  # CurveZMQ's authenticator, where this router holds the endpoint

    def bind(self) -> None:
        """Listen for workers; for clients, on server.endpoint, or, as one of several shards,
        by connecting to the frontend that hands their requests out; and on the private
        socket the HTTP fronts and peer shards send to."""
        if not self.spec.frontend:
            if keys := self.server.curve:
                self.auth = curve.serve(
                    self.ctx, self.clients, keys.secret_key_file, keys.authorized_keys_dir
                )
            self.clients.bind(self.server.endpoint)
        # Our peers from here on (the frontend, the HTTP fronts, peer shards) always read:
        # queue every reply for them. At libzmq's high-water mark a ROUTER drops what it
        # sends, and a peer starved of CPU under overload falls that far behind. (libzmq
        # copies the options at each bind and connect: server.endpoint's keep the default.)
        self.clients.setsockopt(zmq.SNDHWM, 0)
        if self.spec.frontend:
            self.clients.connect(self.spec.frontend)
        if self.spec.local:
            self.clients.bind(self.spec.local)
        self.workers.bind(self.spec.workers_endpoint)

    # -- the loop --------------------------------------------------------------------------

    def _poller(self, wake_fd: int | None) -> zmq.Poller:
        poller = zmq.Poller()
        for sock in (self.clients, self.workers, self.connections.monitor):
            poller.register(sock, zmq.POLLIN)
        if wake_fd is not None:
            poller.register(wake_fd, zmq.POLLIN)
        for sock in self.handover.peers.values() if self.handover else ():
            poller.register(sock, zmq.POLLIN)
        return poller

    def serve(self, wake_fd: int | None = None) -> None:
        poller = self._poller(wake_fd)
        next_beat = time.monotonic()
        busy, next_look = False, 0.0
        while not self.stopping:
            now = time.monotonic()
            # Poll only when the last pass found nothing to read; while messages keep coming,
            # look at the wake pipe and the monitor once per BUSY_POLL_S. A zmq poll costs a
            # syscall per socket, more than a message's own receive.
            events: dict = {}
            if not busy or now >= next_look:
                events = dict(poller.poll(int(self._poll_timeout(now, busy, next_beat) * 1000)))
                next_look = time.monotonic() + BUSY_POLL_S
            if wake_fd is not None and wake_fd in events:
                os.read(wake_fd, 64)
                self.book.begin_drain(self.spec.drain_timeout_s)
            busy = self._read_messages() > 0
            if self.connections.monitor in events:
                self.connections.on_events()
            now = time.monotonic()
            self.book.expire(now)
            if now >= next_beat:
                self._heartbeat(now)
                self.connections.flush(now)
                next_beat = now + self.heartbeat
            self._schedule(now)
            if self.book.draining_until is not None:
                self._check_drained(now)

    def _poll_timeout(self, now: float, busy: bool, next_beat: float) -> float:
        timeout = 0.0 if busy else next_beat - now
        for when in (self.book.deadlines.next(), self.dispatch.next_wakeup(now)):
            if when is not None:
                timeout = min(timeout, when - now)
        return max(0.0, timeout)

    def _read_messages(self) -> int:
        """Workers first, and then a small batch of clients: under a flood of requests an
        instance that finished gets its next job within one batch, not after the whole
        inbound queue (dispatch stays paced by the workers). Returns how many were read."""
        got = self._drain(self.workers, self.on_worker, WORKER_BATCH)
        if got:
            self._schedule(time.monotonic())
        got += self._drain(self.clients, self.on_client, CLIENT_BATCH, yield_to=self.workers)
        if self.handover and self.handover.passed:
            for envelope, body in self.handover.replies():
                self._reply(envelope, body)
        return got

    def _schedule(self, now: float) -> None:
        if self.book.changed or self.dispatch.max_wait:
            self.book.changed = False
            if self.book.feeding:
                self.book.feed(now)
            self._send_jobs(self.dispatch.schedule(now))

    def _drain(self, sock: zmq.Socket, handle, limit: int, yield_to=None) -> int:
        """Handle what is waiting, up to `limit` messages, so neither socket starves the other;
        stop early when `yield_to` has input (a worker's result: its next job must not wait
        behind a flood of clients), looked at once per YIELD_CHECK_S. Returns how many
        messages it handled.

        The one catch-all of the router: no message, however malformed, may stop it. A
        failure is counted and logged (at most once per SUMMARY_LOG_S) and the loop goes on.
        """
        look_at = time.monotonic() + YIELD_CHECK_S
        for handled in range(limit):
            try:  # not getsockopt(EVENTS) first: that costs a poll syscall every time
                frames = sock.recv_multipart(NOBLOCK)
            except zmq.Again:
                return handled
            try:
                handle(frames)
            except Exception:
                self.connections.failures.add(1, time.monotonic(), traceback.format_exc())
            if yield_to is not None and time.monotonic() >= look_at:
                if yield_to.getsockopt(EVENTS) & POLLIN:
                    return handled + 1
                look_at = time.monotonic() + YIELD_CHECK_S
        return limit

    # -- clients ---------------------------------------------------------------------------

    def on_client(self, frames: list[bytes]) -> None:
        if len(frames) < 3:
            self._drop(f"a client message of {len(frames)} frame(s)")
            return
        envelope, version, raw = frames[:-2], frames[-2], frames[-1]
        try:
            body = protocol.unpack([protocol.VERSION, raw])
        except protocol.ProtocolError as e:
            self._drop(f"an unparseable client message: {e}")
            return
        book = self.book
        request = read_request(book, envelope, version, body, self.server.max_texts)
        if request is None:
            return
        if request.op == "status" and self.supervisor_identity:
            # The supervisor answers for the whole server, as on its control socket.
            ask = self.whole.ask(envelope, request.id, time.monotonic())
            send(self.workers, [self.supervisor_identity], ask)
            return
        if request.op == "cancel":
            book.cancel(envelope, request.id)
            return
        if request.op in ("ping", "status"):
            self.metrics.replied(request.op, "ok")
            extra = (
                {"server": self.answered_alone().to_wire()}
                if request.op == "status"
                else {
                    "max_message_bytes": self.spec.server.max_message_bytes,
                    "max_texts": self.spec.server.max_texts,
                    "ready": self.ready_instances(),
                }
            )
            self._reply(envelope, protocol.ok_reply(request.id, **extra))
            return
        refusal = self._refusal(request)
        if refusal is None:
            book.start(envelope, request)
        else:
            book.error(envelope, request, *refusal)

    def _refusal(self, request: Request) -> tuple[ErrorCode, str] | None:
        """Why this shard answers a model request with an error before reading its texts."""
        if self.book.draining_until is not None:
            return ErrorCode.NO_INSTANCE, "the server is stopping; send it elsewhere"
        name, task = self.spec.model_name, self.spec.model.task
        if request.model is not None and request.model != name:
            return (
                ErrorCode.BAD_REQUEST,
                f"no model {request.model!r} here; this server serves {name!r}",
            )
        if not serves(task, request.op):
            return ErrorCode.BAD_REQUEST, f"this server's model does {task}, not {request.op}"
        return None

    def _hand_over(self, pending: Pending) -> bool:
        """Pass a request this shard has no instance for to a peer that has (and answer for
        it when the peer does); False where there is none, or it came from a peer, or the
        server is stopping."""
        if self.handover is None:
            return False
        if self.book.draining_until is not None or is_handed_over(pending.envelope):
            return False
        pools = self.dispatch.pools
        needed = {pools[self.dispatch.own_pool(len(e.ids))].config.name for e in pending.encoded}
        return self.handover.take(
            needed, self.table, pending.envelope, pending.request, pending.deadline
        )

    def _answer_status(self, envelope: list[bytes], request_id, server: dict) -> None:
        self.metrics.replied("status", "ok")
        self._reply(envelope, protocol.ok_reply(request_id, server=server))

    def _reply(self, envelope: list[bytes], body: dict) -> None:
        try:
            send(self.clients, envelope, body, NOBLOCK)
        except zmq.ZMQError as e:  # the client is gone, or its queue is full: its loss
            log.debug("reply not sent: %s", e)

    def _drop(self, what: str) -> None:
        self.book.counters["dropped_frames"] += 1
        log.warning("dropped %s", what)

    def _check_drained(self, now: float) -> None:
        if not self.book.active and not (self.handover and self.handover.passed):
            self.stopping = True
        elif self.book.drain_timed_out(now):
            self._expire_handovers(float("inf"))
            self.stopping = True

    # -- workers ---------------------------------------------------------------------------

    def on_worker(self, frames: list[bytes]) -> None:
        identity, rest = frames[0], frames[1:]
        try:
            body = protocol.unpack(rest)
        except protocol.ProtocolError as e:
            self._drop(f"a worker message: {e}")
            return
        now = time.monotonic()
        kind = body.get("type")
        if kind == protocol.SUPERVISOR:
            try:
                self.table = SlotTable.from_wire(body)
            except BadReport as e:
                self._drop(f"a slot table: {e}")
                return
            self.supervisor_identity = identity
            reply = {
                "type": protocol.STATUS,
                "seq": body.get("seq"),
                "routed_pids": list(status.routed_pids(self.dispatch)),
            }
            if self.table.report:
                reply["server"] = self.own_status().to_wire()
            send(self.workers, [identity], reply)
        elif kind == protocol.WHOLE and identity == self.supervisor_identity:
            answer = self.whole.answered(body)
            if answer is not None:
                envelope, request_id, whole = answer
                whole = whole or self.answered_alone().to_wire()
                self._answer_status(envelope, request_id, whole)
        elif kind == protocol.READY:
            self._on_ready(identity, body, now)
        elif kind == protocol.HEARTBEAT and isinstance(body.get("instance"), bytes):
            # From a worker's control connection: `instance` names its job connection.
            worker = self.dispatch.worker_seen(body["instance"], now)
            if worker is not None:
                worker.control = identity
                dropped = body.get("spans_dropped")
                if type(dropped) is int and dropped > worker.spans_dropped:
                    worker.spans_dropped = dropped
                passes = body.get("passes")
                if isinstance(passes, dict) and all(
                    isinstance(k, str) and type(v) is int for k, v in passes.items()
                ):
                    worker.passes = passes
        else:
            self._on_job_connection(identity, kind, body, now)

    def _on_ready(self, identity: bytes, body: dict, now: float) -> None:
        try:
            ready = Ready.from_wire(body)
        except BadReport as e:
            log.warning("ignored a READY from %r: %s", identity, e)
            return
        known = identity in self.dispatch.workers
        worker = self.dispatch.worker_ready(identity, ready, now)
        if worker is None:
            log.warning("ignored READY from %s: unknown pool %r", ready.name, ready.pool)
            return
        self.book.instances_changed()
        self.book.answers.learn(ready.labels)
        if not known:
            log.info(
                "instance %s ready (pool %s, CPUs %s, pid %s)",
                worker.name,
                ready.pool,
                list(ready.binding.cpus),
                ready.pid,
            )

    def _on_job_connection(self, identity: bytes, kind: object, body: dict, now: float) -> None:
        worker = self.dispatch.worker_seen(identity, now)
        if kind == protocol.BYE:
            # Answered on the same connection, after every run sent to it: the worker may
            # leave once it has this. Answered even when unknown (this router restarted).
            send(self.workers, [identity], {"type": protocol.BYE})
            if worker is not None and not worker.stopping:
                worker.stopping = True
                log.info("instance %s is stopping", worker.name)
        elif worker is not None and kind == protocol.RESULT:
            self.book.on_result(body, now)
        # else: expired, or never announced: it will send READY again

    def _heartbeat(self, now: float) -> None:
        self.book.drop_silent(now, self.expiry, self.server.heartbeat_liveness)
        self.book.fail_unservable(now)
        self._expire_handovers(now)
        for envelope, request_id in self.whole.expired(now):  # the supervisor did not answer
            self._answer_status(envelope, request_id, self.answered_alone().to_wire())
        beat = protocol.pack({"type": protocol.HEARTBEAT})
        for worker in self.dispatch.workers.values():
            self.workers.send_multipart([worker.control or worker.identity, *beat])

    def _expire_handovers(self, now: float) -> None:
        for passed in self.handover.expired(now) if self.handover else ():
            message = f"handed to router shard {passed.peer}, which did not answer in time"
            self.book.error_reply(
                passed.envelope, passed.request_id, passed.op, ErrorCode.NO_INSTANCE, message
            )

    def _send_jobs(self, jobs: list[Job[Pending]]) -> None:
        now = time.monotonic()
        for job in jobs:
            items = job.items
            inputs = [i.ids for i in items]
            contexts: tuple[str, ...] = ()
            if self.traces is not None:
                worker = self.dispatch.workers.get(job.worker)
                name = worker.name if worker else "?"
                contexts = tuple(self.traces.dispatched(job, name, now) or ())
            run = Run(
                job.id,
                inputs,
                [item.second for item in items] if any(item.second for item in items) else None,
                tuple(i for i, item in enumerate(items) if item.whole),
                contexts,
            )
            send(self.workers, [job.worker], run.to_wire())
            waited = [now - item.queued_at for item in items]
            for item, wait in zip(items, waited, strict=True):
                if (timed := item.owner.timed) is not None:
                    timed.queue = max(timed.queue, wait)
            self.metrics.dispatched(items[0].pool, waited, sum(map(len, inputs)))

    # -- status ----------------------------------------------------------------------------

    def ready_instances(self) -> int:
        """The instances of our model that can take work through this shard, for `ping`
        (what an HTTP front's /health asks): its own, and, by the supervisor's latest table,
        those of the ready peers it hands requests over to; none while it drains."""
        if self.book.draining_until is not None:
            return 0
        own = sum(1 for w in self.dispatch.workers.values() if not w.stopping)
        return own + (self.handover.ready_at_peers(self.table) if self.handover else 0)

    def own_status(self) -> ShardReport:
        """This shard's report of itself, as the supervisor hears it."""
        return status.shard(self.spec, self.dispatch, self.book, self.metrics, self.connections)

    def answered_alone(self) -> ServerReport:
        """The whole server's status as this shard alone can give it (no supervisor runs, or
        it did not answer)."""
        return status.answered_alone(self.own_status(), self.dispatch, self.table)

    def close(self) -> None:
        if self.handover:
            self.handover.close()
        self.connections.close(self.clients)
        for sock in (self.clients, self.workers):
            sock.close(linger=0)
        if self.auth is not None:
            self.auth.stop()


def main(argv: list[str] | None = None) -> int:
    began = begin(RouterSpec, argv, log, bad_spec=exitcodes.MODEL)
    if isinstance(began, int):
        return began
    spec = began.spec
    import_numpy()
    try:
        tokenizer = Tokenizer(
            spec.model.path,
            spec.model.max_length,
            spec.model.truncate,
            memo_bytes=TOKENIZER_MEMO_BYTES if spec.server.cache_entries else 0,
        )
        prompts = TASKS[spec.model.task].prompts(Path(resolve_model_path(spec.model.path)))
    except ModelLoadError as e:
        log.error("%s", e)
        return exitcodes.MODEL
    tracing = start_tracing("router", attributes={"numaserve.model": spec.model_name})
    router = Router(spec, tokenizer, context(), prompts, tracing)
    try:
        router.bind()
    except curve.CurveError as e:
        log.error("%s", e)
        return exitcodes.MODEL  # a config error: a restart cannot fix it
    except zmq.ZMQError as e:
        log.error("cannot listen on %s or %s: %s", spec.server.endpoint, spec.workers_endpoint, e)
        return exitcodes.CRASH
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: os.write(wake_w, b"s"))
    clients = (
        f"shard {spec.shard} behind {spec.frontend}" if spec.frontend else spec.server.endpoint
    )
    log.info("listening on %s; workers on %s", clients, spec.workers_endpoint)
    router.serve(wake_r)
    router.close()
    if tracing is not None:
        tracing.close()
    log.info("stopped")
    return exitcodes.OK
