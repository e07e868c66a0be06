"""The router: one process between the clients and the worker pools.

It tokenizes each text, answers repeats from the cache (cache.py), and dispatches the rest by
length (dispatch.py); requests.py keeps what is in flight, status.py what it reports. Clients
reach it on `server.endpoint` (a ROUTER socket); workers connect to a second ROUTER socket over
ipc. Run as `python -m numaserve.router --spec JSON` (a RouterSpec, specs.py).
"""

from __future__ import annotations

import logging
import os
import signal
import time
import traceback

import zmq
from zmq.utils.monitor import parse_monitor_message

from numaserve import curve, exitcodes, protocol
from numaserve.backends.tokenizer import Tokenizer, TooLongError
from numaserve.logs import Summary
from numaserve.modelpath import ModelLoadError
from numaserve.protocol import ErrorCode
from numaserve.router import status
from numaserve.router.cache import ResultCache
from numaserve.router.dispatch import Dispatcher, Item, Job, WorkerState
from numaserve.router.handover import Handover, is_handed_over
from numaserve.router.metrics import RouterMetrics
from numaserve.router.process import begin, context
from numaserve.router.requests import Deadlines, Pending
from numaserve.specs import RouterSpec, model_key

log = logging.getLogger("numaserve.router")
# A client the CurveZMQ handshake refused; its socket's disconnect follows.
HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
SUMMARY_LOG_S = 10.0  # at most one log line per this long for a repeated event
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
# An upper bound on a text's token count from its UTF-8 length, before tokenizing: no
# tokenizer numaserve serves makes more than two tokens of a byte, plus special tokens.
TOKENS_PER_BYTE, SPECIAL_TOKENS = 2, 8


OVERLOADED_MESSAGE = "the pool's queue is full; retry later"
# Plain ints: `events & zmq.POLLIN` with pyzmq's IntFlag builds an enum member per call, which
# cost the router 4% of its time.
EVENTS, POLLIN, NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)
SNDMORE = int(zmq.SNDMORE)


def send(sock: zmq.Socket, envelope: list[bytes], body: dict, flags: int = 0) -> None:
    """send_multipart's work for a protocol message, without its per-frame type checks and
    flag enums (a tenth of the router's cost of a send)."""
    version, payload = protocol.pack(body)
    for frame in envelope:
        sock.send(frame, SNDMORE | flags)
    sock.send(version, SNDMORE | flags)
    sock.send(payload, flags)


def ranked(results: list[dict], top_k: int | None) -> list[dict]:
    """rerank's answer: each document's score with its index; with top_k, the best k only,
    best first (documents that score the same keep their order)."""
    results = [{"index": i, **result} for i, result in enumerate(results)]
    if top_k is None:
        return results
    return sorted(results, key=lambda r: -r["score"])[:top_k]


class Entities:
    """ner's answers: each text's entities from its tokens' probabilities (entities.py)."""

    def __init__(self, tokenizer: Tokenizer):
        # numpy only where entities are found: importing it starts OpenBLAS's threads, and
        # only a router with a ner model needs it (after it has pinned itself).
        from numaserve.router import entities

        self.find = entities.entities
        self.word_aware = tokenizer.word_aware
        # The model's labels, as its instances announce them in READY: every result (and so
        # every cache entry) comes from an instance that has.
        self.labels: tuple[str, ...] = ()

    def found(self, pending: Pending, results: list[dict]) -> list[dict]:
        out = []
        for text, enc, result in zip(pending.request.texts, pending.encoded, results, strict=True):
            scores = protocol.embedding_from_wire(result.pop("scores"))
            rows = scores.reshape(len(enc.ids), len(self.labels))
            aggregation = pending.request.aggregation
            result["entities"] = self.find(
                text, enc.tokens, rows, self.labels, aggregation, self.word_aware
            )
            out.append(result)
        return out


class Router:
    def __init__(self, spec: RouterSpec, tokenizer: Tokenizer, ctx: zmq.Context | None = None):
        self.spec = spec
        self.server = spec.server
        self.task = spec.model.task
        self.tokenizer = tokenizer
        # Results are cached under the key of the model that computed them, and looked up
        # under those of the live instances: after a reload that changed the model, the old
        # one's results stop answering once its last instance is gone.
        self.model_key = model_key(spec.model)
        self.live_keys: tuple[str, ...] = (self.model_key,)
        self.cache = ResultCache(spec.server.cache_entries)
        self.entities = Entities(tokenizer) if self.task == "ner" else None
        self.dispatch = Dispatcher(
            list(spec.pools),
            queue_size=spec.server.queue_size,
            spillover=spec.server.spillover,
            max_batch=spec.server.max_batch,
            max_wait=spec.server.max_wait_ms / 1000,
            max_batch_tokens=spec.server.max_batch_tokens,
            max_queue_wait=spec.server.max_queue_ms / 1000,
        )
        self.heartbeat = spec.server.heartbeat_ms / 1000
        self.expiry = self.heartbeat * spec.server.heartbeat_liveness
        # Running instances announce themselves again once they have not heard from a router
        # for `liveness` heartbeats: a restarted router holds texts for them that long
        # instead of answering no_instance.
        self.hold_until = time.monotonic() + self.expiry + 2 * self.heartbeat
        self.deadlines = Deadlines()
        self.counters = {
            "requests": 0,
            "replies_ok": 0,
            "handed_over": 0,
            "dropped_frames": 0,
        }
        self.disconnects = Summary(
            log,
            "client connection(s) closed: they left, or sent a message over "
            f"server.max_message_bytes={spec.server.max_message_bytes} and were dropped",
            SUMMARY_LOG_S,
        )
        self.failures = Summary(
            log, "message(s) failed in the router and were dropped", SUMMARY_LOG_S, logging.ERROR
        )
        self.errors: dict[str, int] = {}
        self.metrics = RouterMetrics([pool.name for pool in spec.pools])
        self.ctx = ctx or zmq.Context.instance()
        self.clients = self.ctx.socket(zmq.ROUTER)
        self.clients.setsockopt(zmq.MAXMSGSIZE, spec.server.max_message_bytes)
        self.clients.setsockopt(zmq.ROUTER_MANDATORY, 0)
        self.clients.linger = 0
        self.workers = self.ctx.socket(zmq.ROUTER)
        self.workers.linger = 0
        self.refused = Summary(
            log,
            "client connection(s) refused in the CurveZMQ handshake: a key not in "
            "server.curve.authorized_keys_dir, a wrong server key, or plaintext",
            SUMMARY_LOG_S,
            logging.WARNING,
        )
        self.failed_handshakes: set[int] = set()  # their sockets' disconnects are not a leaving
        self.monitor = self.clients.get_monitor_socket(zmq.EVENT_DISCONNECTED | HANDSHAKE_FAILED)
        self.stopping = False
        self.draining_until: float | None = None  # set by SIGTERM: finish what is in flight
        self.active: dict[int, Pending] = {}  # requests not yet answered, by id()
        self.supervisor: dict = {}  # the supervisor's slot table, for status
        self.handover = (
            Handover(self.ctx, spec.shard, spec.handovers, HANDOVER_TIMEOUT_S)
            if spec.handovers
            else None
        )
        self.changed = False  # something new to schedule: texts queued, or an instance freed
        self.auth = None  # CurveZMQ's authenticator, where this router holds the endpoint

    def bind(self) -> None:
        """Listen for workers; and for clients, on server.endpoint, or, as one of several
        shards, by connecting to the frontend that hands their requests out."""
        if self.spec.frontend:
            # Our peers here are the frontend and the other shards, which always read: queue
            # every reply for them. At libzmq's high-water mark a ROUTER drops what it sends,
            # and a frontend starved of CPU under overload falls that far behind.
            self.clients.setsockopt(zmq.SNDHWM, 0)
            self.clients.connect(self.spec.frontend)
            if self.spec.handovers:  # where peer shards pass requests on (router/handover.py)
                self.clients.bind(self.spec.handovers[self.spec.shard])
        else:
            keys = self.server.curve
            if keys:
                self.auth = curve.serve(
                    self.ctx, self.clients, keys.secret_key_file, keys.authorized_keys_dir
                )
            self.clients.bind(self.server.endpoint)
        self.workers.bind(self.spec.workers_endpoint)

    # -- the loop --------------------------------------------------------------------------

    def serve(self, wake_fd: int | None = None) -> None:
        poller = zmq.Poller()
        poller.register(self.clients, zmq.POLLIN)
        poller.register(self.workers, zmq.POLLIN)
        poller.register(self.monitor, zmq.POLLIN)
        if wake_fd is not None:
            poller.register(wake_fd, zmq.POLLIN)
        for sock in self.handover.peers.values() if self.handover else ():
            poller.register(sock, zmq.POLLIN)
        next_beat = time.monotonic()
        busy, next_look = False, 0.0
        while not self.stopping:
            now = time.monotonic()
            # Poll only when the last pass found nothing to read; while messages keep coming,
            # look at the wake pipe and the monitor once per BUSY_POLL_S. A zmq poll costs a
            # syscall per socket, more than a message's own receive.
            events: dict = {}
            if not busy or now >= next_look:
                timeout = 0.0 if busy else next_beat - now
                for when in (self.deadlines.next(), self.dispatch.next_wakeup(now)):
                    if when is not None:
                        timeout = min(timeout, when - now)
                events = dict(poller.poll(max(0.0, timeout) * 1000))
                next_look = time.monotonic() + BUSY_POLL_S
            if wake_fd is not None and wake_fd in events:
                os.read(wake_fd, 64)
                self.begin_drain()
            # Workers first, and then a small batch of clients: under a flood of requests
            # an instance that finished gets its next job within one batch, not after the
            # whole inbound queue (dispatch stays paced by the workers).
            got = self._drain(self.workers, self.on_worker, WORKER_BATCH)
            if got:
                self._schedule(time.monotonic())
            got += self._drain(self.clients, self.on_client, CLIENT_BATCH, yield_to=self.workers)
            if self.handover and self.handover.passed:
                for envelope, body in self.handover.replies():
                    self._reply(envelope, body)
            busy = got > 0
            if self.monitor in events:
                self._on_disconnect()
            now = time.monotonic()
            if self.deadlines:
                self._expire_deadlines(now)
            self._expire_queued(now)
            if now >= next_beat:
                self._heartbeat(now)
                self._log_summaries(now)
                next_beat = now + self.heartbeat
            self._schedule(now)
            if self.draining_until is not None:
                self._check_drained(now)

    def _schedule(self, now: float) -> None:
        if self.changed or self.dispatch.max_wait:
            self.changed = False
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
                self.failures.add(1, time.monotonic(), traceback.format_exc())
            if yield_to is not None and time.monotonic() >= look_at:
                if yield_to.getsockopt(EVENTS) & POLLIN:
                    return handled + 1
                look_at = time.monotonic() + YIELD_CHECK_S
        return limit

    def _on_disconnect(self) -> None:
        closed = refused = 0
        while self.monitor.poll(0):
            event = parse_monitor_message(self.monitor.recv_multipart())
            fd = event["value"]
            if event["event"] & HANDSHAKE_FAILED:
                self.failed_handshakes.add(fd)
                refused += 1
            elif fd in self.failed_handshakes:
                self.failed_handshakes.discard(fd)
            else:
                closed += 1
        now = time.monotonic()
        self.disconnects.add(closed, now)
        self.refused.add(refused, now)

    def _log_summaries(self, now: float) -> None:
        self.disconnects.flush(now)
        self.refused.flush(now)
        self.failures.flush(now)

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
        request_id = protocol.reply_id(body.get("id"))
        if version != protocol.VERSION:
            message = f"unsupported protocol version {version[:16]!r}; this server speaks {protocol.VERSION!r}"
            self._reply_error(envelope, request_id, body.get("op"), ErrorCode.BAD_REQUEST, message)
            return
        self.counters["requests"] += 1
        try:
            request = protocol.parse_request(body, self.server.max_texts)
        except protocol.RequestError as e:
            self._reply_error(envelope, e.request_id, body.get("op"), e.code, e.message)
            return
        if request.op == "ping":
            self.metrics.replied("ping", "ok")
            self._reply(envelope, protocol.ok_reply(request.id))
        elif request.op == "status":
            self.metrics.replied("status", "ok")
            self._reply(envelope, protocol.ok_reply(request.id, server=self.status()))
        elif self.draining_until is not None:
            message = "the server is stopping; send it elsewhere"
            self._reply_error(envelope, request.id, request.op, ErrorCode.NO_INSTANCE, message)
        elif request.model is not None and request.model != self.spec.model_name:
            message = (
                f"no model {request.model!r} here; this server serves {self.spec.model_name!r}"
            )
            self._reply_error(envelope, request.id, request.op, ErrorCode.BAD_REQUEST, message)
        elif request.op != self.task:
            message = f"this server's model does {self.task}, not {request.op}"
            self._reply_error(envelope, request.id, request.op, ErrorCode.BAD_REQUEST, message)
        else:
            self._start(envelope, request)

    def _start(self, envelope: list[bytes], request: protocol.Request) -> None:
        now = time.monotonic()
        if self._surely_refused(request):  # shed load before the costly part
            self._reply_error(
                envelope, request.id, request.op, ErrorCode.OVERLOADED, OVERLOADED_MESSAGE, now
            )
            return
        try:
            inputs = request.inputs()
            encoded = (
                self.tokenizer.encode_tagged(inputs)
                if self.entities
                else self.tokenizer.encode(inputs)
            )
        except TooLongError as e:
            self._reply_error(envelope, request.id, request.op, ErrorCode.TOO_LONG, str(e), now)
            return
        deadline = now + request.deadline_ms / 1000 if request.deadline_ms else None
        pending = Pending(envelope, request, encoded, [None] * len(encoded), deadline, now)
        misses = []
        for i, enc in enumerate(encoded):
            hit = None
            for key in self.live_keys:
                hit = self.cache.get((key, enc.ids, enc.second))
                if hit is not None:
                    break
            if hit is not None:
                pending.results[i] = hit
            else:
                pool = self.dispatch.pool_for(len(enc.ids))
                misses.append(Item(pending, i, enc.ids, pool, enc.second))
        if not misses:
            self._complete(pending)
            return
        refused = self.dispatch.admit(misses, now, hold=now < self.hold_until)
        if refused == "overloaded":
            self._fail(pending, ErrorCode.OVERLOADED, OVERLOADED_MESSAGE)
            return
        if refused == "no_instance":
            self._fail(
                pending, ErrorCode.NO_INSTANCE, "no ready instance can serve texts this long"
            )
            return
        pending.remaining = len(misses)
        self.active[id(pending)] = pending
        self.changed = True
        if deadline is not None:
            self.deadlines.add(pending)

    def _surely_refused(self, request: protocol.Request) -> bool:
        """True when some text could not be queued whatever its token count turns out to be."""
        if not self.dispatch.some_queue_full():
            return False
        for text in request.inputs():
            size = (
                sum(len(t.encode()) for t in text)
                if isinstance(text, tuple)
                else len(text.encode())
            )
            if self.dispatch.surely_full(TOKENS_PER_BYTE * size + SPECIAL_TOKENS):
                return True
        return False

    def _complete(self, pending: Pending) -> None:
        results = [
            {**result, "tokens": len(enc.ids), "truncated": enc.truncated}
            for result, enc in zip(pending.results, pending.encoded, strict=True)
        ]
        if pending.request.op == "rerank":
            results = ranked(results, pending.request.top_k)
        elif self.entities:
            results = self.entities.found(pending, results)
        self._finish(pending)
        self.counters["replies_ok"] += 1
        self.metrics.replied(pending.request.op, "ok", time.monotonic() - pending.received)
        self._reply(pending.envelope, protocol.ok_reply(pending.request.id, results=results))

    def _fail(self, pending: Pending, code: ErrorCode, message: str) -> None:
        if pending.done or (code is ErrorCode.NO_INSTANCE and self._hand_over(pending)):
            return
        self._finish(pending)
        request = pending.request
        self._reply_error(pending.envelope, request.id, request.op, code, message, pending.received)

    def _hand_over(self, pending: Pending) -> bool:
        """Pass a request this shard has no instance for to a peer that has (and answer for
        it when the peer does); False where there is none, or it came from a peer, or the
        server is stopping."""
        if (
            self.handover is None
            or self.draining_until is not None
            or is_handed_over(pending.envelope)
        ):
            return False
        pools = self.dispatch.pools
        needed = {pools[self.dispatch.pool_for(len(e.ids))].config.name for e in pending.encoded}
        peer = self.handover.peer_for(needed, self.supervisor.get("peers") or [])
        if peer is None:
            return False
        now = time.monotonic()
        left_ms = (pending.deadline - now) * 1000 if pending.deadline is not None else None
        if not self.handover.pass_on(peer, pending.envelope, pending.request, left_ms, now):
            return False
        self._finish(pending)
        self.counters["handed_over"] += 1
        return True

    def _finish(self, pending: Pending) -> None:
        """Forget an answered request: memory follows what is in flight, not what was."""
        pending.done = True
        pending.results = pending.encoded = []
        self.active.pop(id(pending), None)
        self.deadlines.answered(pending)

    def _reply_error(
        self,
        envelope,
        request_id,
        op: object,
        code: ErrorCode,
        message: str,
        received: float | None = None,
    ) -> None:
        """`received`: when the request was read, for those that got as far as `_start`."""
        self.errors[code.value] = self.errors.get(code.value, 0) + 1
        took = None if received is None else time.monotonic() - received
        self.metrics.replied(op, code.value, took)
        self._reply(envelope, protocol.error_reply(request_id, code, message))

    def _reply(self, envelope: list[bytes], body: dict) -> None:
        try:
            send(self.clients, envelope, body, NOBLOCK)
        except zmq.ZMQError as e:  # the client is gone, or its queue is full: its loss
            log.debug("reply not sent: %s", e)

    def _drop(self, what: str) -> None:
        self.counters["dropped_frames"] += 1
        log.warning("dropped %s", what)

    def _expire_deadlines(self, now: float) -> None:
        expired = self.deadlines.expired(now)
        for pending in expired:
            message = "the deadline passed before it could be answered"
            self._fail(pending, ErrorCode.DEADLINE_EXCEEDED, message)
        if expired:
            self.dispatch.drop_done()

    def _expire_queued(self, now: float) -> None:
        for item in self.dispatch.overdue(now):
            if self.dispatch.servable(item.pool):
                code, why = ErrorCode.OVERLOADED, "without reaching an instance; retry later"
            else:  # held for instances that never announced themselves
                code, why = ErrorCode.NO_INSTANCE, "and no instance can serve it"
            wait = f"server.max_queue_ms={self.server.max_queue_ms} ms"
            self._fail(item.owner, code, f"it waited {wait} in the queue {why}")

    # -- stopping --------------------------------------------------------------------------

    def begin_drain(self) -> None:
        """Stop taking requests; the loop ends when those in flight are answered, or at the
        drain timeout."""
        if self.draining_until is None:
            self.draining_until = time.monotonic() + self.spec.drain_timeout_s
            log.info(
                "draining: %d request(s) in flight, %.0f s at most",
                len(self.active),
                self.spec.drain_timeout_s,
            )

    def _check_drained(self, now: float) -> None:
        if not self.active and not (self.handover and self.handover.passed):
            self.stopping = True
        elif now >= self.draining_until:
            log.warning(
                "drain timeout: %d request(s) still in flight are answered with an error",
                len(self.active),
            )
            for pending in list(self.active.values()):
                self._fail(
                    pending, ErrorCode.NO_INSTANCE, "the server stopped before it could answer"
                )
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
            self.supervisor = body
            reply = {"type": protocol.STATUS, "server": self.own_status(), "seq": body.get("seq")}
            send(self.workers, [identity], reply)
            return
        if kind == protocol.READY:
            known = identity in self.dispatch.workers
            worker = self.dispatch.worker_ready(identity, body, now)
            if worker is None:
                log.warning(
                    "ignored READY from %s: unknown pool %r", body.get("name"), body.get("pool")
                )
                return
            self.changed = True
            self._find_live_keys()
            if self.entities and body.get("labels"):
                self.entities.labels = tuple(str(label) for label in body["labels"])
            if not known:
                cpus, pid = body.get("cpus"), body.get("pid")
                log.info(
                    "instance %s ready (pool %s, CPUs %s, pid %s)",
                    worker.name,
                    body.get("pool"),
                    cpus,
                    pid,
                )
            return
        if kind == protocol.HEARTBEAT and isinstance(body.get("instance"), bytes):
            # From a worker's control connection: `instance` names its job connection.
            worker = self.dispatch.worker_seen(body["instance"], now)
            if worker is not None:
                worker.control = identity
            return
        worker = self.dispatch.worker_seen(identity, now)
        if kind == protocol.BYE:
            # Answered on the same connection, after every run sent to it: the worker may
            # leave once it has this. Answered even when unknown (this router restarted).
            send(self.workers, [identity], {"type": protocol.BYE})
            if worker is not None and not worker.stopping:
                worker.stopping = True
                log.info("instance %s is stopping", worker.name)
        elif worker is None:
            return  # expired, or never announced: it will send READY again
        elif kind == protocol.RESULT:
            self._on_result(body, now)

    def _on_result(self, body: dict, now: float) -> None:
        job = self.dispatch.finish(body.get("job"), now)
        if job is None:
            return
        self.changed = True
        worker = self.dispatch.workers.get(job.worker)
        if worker is not None and "pass_s" in body:
            self.metrics.forward_pass(worker.name, body["pass_s"])
        computed_by = self._key_of(worker)
        error = body.get("error")
        if error is not None:
            if error.get("code") == ErrorCode.NO_INSTANCE.value:  # it was stopping: try elsewhere
                self._retry(job.items, count_attempt=False)
            else:
                codes = {c.value: c for c in ErrorCode}
                code = codes.get(error.get("code"), ErrorCode.INTERNAL)
                for item in job.items:
                    self._fail(item.owner, code, str(error.get("message")))
            return
        results = body.get("results") or []
        if len(results) != len(job.items):
            for item in job.items:
                self._fail(
                    item.owner,
                    ErrorCode.INTERNAL,
                    "an instance returned the wrong number of results",
                )
            return
        for item, result in zip(job.items, results, strict=True):
            self.cache.put((computed_by, item.ids, item.second), result)
            pending = item.owner
            if pending.done:
                continue
            pending.results[item.index] = result
            pending.remaining -= 1
            if pending.remaining == 0:
                self._complete(pending)

    def _key_of(self, worker: WorkerState | None) -> str:
        key = worker.info.get("model_key") if worker is not None else None
        return key if isinstance(key, str) else self.model_key

    def _find_live_keys(self) -> None:
        keys = dict.fromkeys(self._key_of(w) for w in self.dispatch.workers.values())
        self.live_keys = tuple(keys) or (self.model_key,)

    def _retry(self, items: list[Item], count_attempt: bool) -> None:
        self.changed = True
        for item in self.dispatch.requeue(items, count_attempt):
            reason = (
                "its instance failed, and so did the retry"
                if item.attempts > 1
                else "no instance is left to retry it on"
            )
            self._fail(
                item.owner,
                ErrorCode.INTERNAL if item.attempts > 1 else ErrorCode.NO_INSTANCE,
                reason,
            )

    def _heartbeat(self, now: float) -> None:
        for identity in self.dispatch.silent_workers(now, self.expiry):
            worker, lost = self.dispatch.remove_worker(identity)
            self._find_live_keys()
            if worker.stopping and not lost:  # it said BYE and finished: a graceful stop
                log.info("instance %s stopped", worker.name)
                continue
            log.warning(
                "instance %s missed %d heartbeats: dropped; retrying its %d text(s)",
                worker.name,
                self.server.heartbeat_liveness,
                len(lost),
            )
            self._retry(lost, count_attempt=True)
        for item in self.dispatch.unservable_items() if now >= self.hold_until else ():
            self._fail(
                item.owner, ErrorCode.NO_INSTANCE, "no ready instance is left for texts this long"
            )
        self._expire_handovers(now)
        beat = protocol.pack({"type": protocol.HEARTBEAT})
        for worker in self.dispatch.workers.values():
            self.workers.send_multipart([worker.control or worker.identity, *beat])

    def _expire_handovers(self, now: float) -> None:
        for passed in self.handover.expired(now) if self.handover else ():
            message = f"handed to router shard {passed.peer}, which did not answer in time"
            self._reply_error(
                passed.envelope, passed.request_id, passed.op, ErrorCode.NO_INSTANCE, message
            )

    def _send_jobs(self, jobs: list[Job]) -> None:
        now = time.monotonic()
        for job in jobs:
            items = job.items
            inputs = [i.ids for i in items]
            body = {"type": protocol.RUN, "job": job.id, "inputs": inputs}
            if any(item.second for item in items):
                body["segments"] = [item.second for item in items]
            send(self.workers, [job.worker], body)
            waited = [now - item.queued_at for item in items]
            self.metrics.dispatched(items[0].pool, waited, sum(map(len, inputs)))

    # -- status ----------------------------------------------------------------------------

    def status(self) -> dict:
        """The whole server's state, for the status op: this shard's own, merged with the
        other shards' latest (which the supervisor forwards with its slot table)."""
        if not self.spec.frontend:  # the only router
            return self.own_status()
        return status.whole_server(self.own_status(), self.supervisor.get("peers") or [])

    def own_status(self) -> dict:
        """This shard's state; where a supervisor runs, one entry per slot of its plan."""
        return {
            "task": self.task,
            "model_name": self.spec.model_name,
            "shard": self.spec.shard,
            "cpus": list(self.spec.cpus),
            "model": self.spec.model.path,
            "instances": status.instances(self.dispatch, self.supervisor.get("slots")),
            "pools": status.pools(self.dispatch, self.spec.model_name),
            "cache": self.cache.stats(),
            "requests": {
                **self.counters,
                "client_disconnects": self.disconnects.total,
                "refused_handshakes": self.refused.total,
                "internal_errors": self.failures.total,
            },
            "errors": dict(self.errors),
            "metrics": self.metrics.wire(),
            "draining": self.draining_until is not None,
            "routed_pids": status.routed_pids(self.dispatch),
            "supervisor": {
                k: v for k, v in self.supervisor.items() if k not in ("type", "slots", "peers")
            },
        }

    def close(self) -> None:
        if self.handover:
            self.handover.close()
        self.clients.disable_monitor()
        for sock in (self.monitor, self.clients, self.workers):
            sock.close(linger=0)
        if self.auth is not None:
            self.auth.stop()


def main(argv: list[str] | None = None) -> int:
    spec = begin(RouterSpec, "numaserve.router", argv, log, exitcodes.MODEL)
    if isinstance(spec, int):
        return spec
    try:
        tokenizer = Tokenizer(
            spec.model.path,
            spec.model.max_length,
            spec.model.truncate,
            memo_bytes=TOKENIZER_MEMO_BYTES if spec.server.cache_entries else 0,
        )
    except ModelLoadError as e:
        log.error("%s", e)
        return exitcodes.MODEL
    router = Router(spec, tokenizer, context())
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
    log.info("stopped")
    return exitcodes.OK
