"""Every request a router shard is answering, from its receipt to its reply: no sockets.

The loop (loop.py) reads messages and hands them here; the book decides what to answer and
sends it through the `reply` it was given. Each step of a request's life (tokenized, answered
from the cache, admitted or refused, computed, retried, failed, expired, handed to a peer
shard, drained) is tested without a socket (tests/test_request_book.py). The pools and which
instance is free are dispatch.py's; the requests in flight and their deadlines in_flight.py's.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from itertools import islice
from typing import cast

from numaserve.backends.tokenizer import Tokenizer, TooLongError
from numaserve.router.cache import ResultCache
from numaserve.router.dispatch import Dispatcher, Item, Job, WorkerState
from numaserve.router.in_flight import Deadlines, Pending, Timed
from numaserve.router.metrics import RouterMetrics
from numaserve.router.traces import RequestTraces
from numaserve.tasks import TASKS
from numaserve.tasks.prompts import NO_PROMPTS, PromptError, Prompts
from numaserve.tasks.requests import Request
from numaserve.wire import protocol
from numaserve.wire.protocol import ErrorCode

log = logging.getLogger("numaserve.router")

OVERLOADED_MESSAGE = "the pool's queue is full; retry later"
# An upper bound on a text's token count from its UTF-8 length, before tokenizing: no
# tokenizer numaserve serves makes more than two tokens of a byte, plus special tokens.
TOKENS_PER_BYTE, SPECIAL_TOKENS = 2, 8
ERROR_CODES = {c.value: c for c in ErrorCode}

Reply = Callable[[list[bytes], dict], None]


def which_text(item: Item[Pending], message: str) -> str:
    """An error of one text, naming it where its request holds several."""
    return f"text {item.index}: {message}" if len(item.owner.encoded) > 1 else message


class RequestBook:
    def __init__(
        self,
        tokenizer: Tokenizer,
        dispatch: Dispatcher[Pending],
        cache: ResultCache,
        metrics: RouterMetrics,
        model_key: str,
        reply: Reply,
        *,
        task: str,
        max_queue_ms: int,
        hold_until: float = 0.0,
        prompts: Prompts = NO_PROMPTS,
        max_windows: int = 1,
        max_backlog: int = 2048,
        traces: RequestTraces | None = None,
    ):
        """`reply(envelope, body)` sends an answer. `model_key`: the configured model's
        (specs.model_key), the cache's key until instances announce their own. `hold_until`:
        until then, texts queue even where no instance is live yet (a router just started,
        whose instances are about to announce themselves). `max_windows`: the model's
        max_chunks_per_doc, the windows a long input is read in where its task reads them
        unasked (rerank) and its request says nothing. `max_backlog`: the texts of big
        requests held beyond the queues, at most (server.max_texts: one whole request's).
        `traces`: the requests' spans, where tracing is on (None: nothing is traced)."""
        self.tokenizer = tokenizer
        self.traces = traces
        self.dispatch = dispatch
        self.cache = cache
        self.metrics = metrics
        self.reply = reply
        self.max_queue_ms = max_queue_ms
        self.max_windows = max_windows
        self.hold_until = hold_until
        self.task = TASKS[task]
        self.prompts = prompts  # an embedding model's own (tasks/prompts.py)
        self.answers = TASKS[task].answers(tokenizer, prompts)  # what the task adds to results
        self.cached = TASKS[task].cached
        # Results are cached under the key of the model that computed them, and looked up
        # under those of the live instances: after a reload that changed the model, the old
        # one's results stop answering once its last instance is gone.
        self.model_key = model_key
        self.live_keys: tuple[str, ...] = (model_key,)
        self.active: dict[int, Pending] = {}  # requests not yet answered, by id()
        self.feeding: dict[int, Pending] = {}  # those with texts in a backlog, oldest first
        self.max_backlog = max_backlog
        self.backlogged = 0  # texts in every backlog
        self.deadlines = Deadlines()
        self.counters = {
            "requests": 0,
            "replies_ok": 0,
            "handed_over": 0,
            "dropped_frames": 0,
            "cancelled": 0,
        }
        self.errors: dict[str, int] = {}
        self.changed = False  # something new to schedule: texts queued, or an instance freed
        self.draining_until: float | None = None
        # Passes a request this shard has no instance for to a peer shard; True if it did.
        self.hand_over: Callable[[Pending], bool] | None = None

    # -- receipt ---------------------------------------------------------------------------

    def start(self, envelope: list[bytes], request: Request) -> None:
        """Tokenize, answer from the cache what it holds, and queue the rest: all of it, or
        a big request's first piece (its backlog follows as room opens, `feed`), or none."""
        now = time.monotonic()
        if self._surely_refused(request):  # shed load before the costly part
            self.error(envelope, request, ErrorCode.OVERLOADED, OVERLOADED_MESSAGE, now)
            return
        try:
            encoded = self._encode(request)
        except TooLongError as e:
            self.error(envelope, request, ErrorCode.TOO_LONG, str(e), now)
            return
        except PromptError as e:
            self.error(envelope, request, ErrorCode.BAD_REQUEST, str(e), now)
            return
        deadline = now + request.deadline_ms / 1000 if request.deadline_ms else None
        pending = Pending(envelope, request, encoded, [None] * len(encoded), deadline, now)
        misses = self._from_cache(pending)
        if request.timings:
            pending.timed = Timed(tokenize=time.monotonic() - now)
        if self.traces is not None:
            self.traces.received(pending, time.monotonic(), len(encoded) - len(misses))
        if not misses:
            self.complete(pending)
            return
        # Up to two micro-batches go whole, without counting the instances (the common case).
        pending.longest = max(len(item.ids) for item in misses)
        few = len(misses) <= 2 * self.dispatch.per_batch(pending.longest)
        piece = len(misses) if few else self.dispatch.piece(pending.longest)
        rest = len(misses) - piece
        if rest > 0 and self.backlogged + rest > self.max_backlog:
            held = f"{self.backlogged} texts of big requests wait here already"
            limit = f"at most {self.max_backlog} (server.max_texts)"
            self.fail(pending, ErrorCode.OVERLOADED, f"{held}, {limit}; retry later")
            return
        refused = self.dispatch.admit(misses[:piece], now, hold=now < self.hold_until)
        if refused is ErrorCode.OVERLOADED:
            self.fail(pending, refused, OVERLOADED_MESSAGE)
        elif refused is ErrorCode.NO_INSTANCE:
            self.fail(pending, refused, "no ready instance can serve texts this long")
        else:
            pending.remaining = len(misses)
            self.active[id(pending)] = pending
            self.changed = True
            if rest > 0:
                pending.backlog = deque(misses[piece:])
                self.feeding[id(pending)] = pending
                self.backlogged += rest
            if deadline is not None:
                self.deadlines.add(pending, deadline)

    def _encode(self, request: Request) -> list:
        """The request's inputs, its model's prompt before each, tokenized (in windows,
        where its task reads a long document so)."""
        windows = self._windows(request)
        if request.op != self.task.name:  # another task's request (serves_also)
            return self.task.encode_for(request, self.tokenizer, self.prompts, windows)
        name = request.options.get("prompt_name")
        if windows > 1:
            prompt = self.prompts.prompt(name)
            return self.tokenizer.encode_windows(request.inputs(), windows, prompt)
        inputs = self.prompts.applied(name, request.inputs())
        if self.task.tags(request.options):  # a tagger's inputs are texts, never pairs
            texts = cast(list[str], inputs)
            return self.tokenizer.encode_tagged(texts, request.truncate, request.cuts_left)
        encoded = self.tokenizer.encode(inputs, request.truncate, request.cuts_left)
        return self.prompts.fitted(request.options.get("prompt_name"), encoded)

    def feed(self, now: float) -> None:
        """Queue the next piece of each big request whose queued texts went to instances,
        oldest request first: a piece as large as the queue has room for, up to
        `Dispatcher.piece` of its texts queued or running at once."""
        hold = now < self.hold_until
        for pending in list(self.feeding.values()):
            backlog = pending.backlog
            if backlog is None:  # a feeding request holds its backlog until it is queued
                continue
            piece = self.dispatch.piece(pending.longest)
            size = min(piece - (pending.remaining - len(backlog)), len(backlog))
            refused: ErrorCode | None = ErrorCode.OVERLOADED
            while size > 0:  # the largest part of the piece that has room
                refused = self.dispatch.admit(list(islice(backlog, size)), now, hold=hold)
                if refused is not ErrorCode.OVERLOADED:
                    break
                size //= 2
            if refused is ErrorCode.NO_INSTANCE:
                self.fail(pending, refused, "no ready instance can serve texts this long")
            elif refused is None:
                for _ in range(size):
                    backlog.popleft()
                self.backlogged -= size
                pending.starved_since = None
                self.changed = True
                if not backlog:
                    del self.feeding[id(pending)]
            elif pending.remaining == len(backlog) and pending.starved_since is None:
                pending.starved_since = now  # none of its texts queued, and no room for more

    def _windows(self, request: Request) -> int:
        """How many windows a long document of `request` may be read in, where its task
        reads windows and a cut on the right is allowed (1 otherwise: cut, or refused, as
        asked)."""
        task = TASKS[request.op]  # a rerank by MaxSim reads windows as a cross-encoder's
        if not task.reads_windows or request.truncate is False or request.cuts_left:
            return 1
        if request.truncate is None and not self.tokenizer.truncate:
            return 1
        asked = request.options.get("max_chunks_per_doc")
        if asked is None:  # the model's max_chunks_per_doc where the task reads windows unasked
            return self.max_windows if task.windows_by_default else 1
        return asked

    def cancel(self, envelope: list[bytes], request_id) -> None:
        """Its client gave up on a request (an HTTP client hung up): it is forgotten, never
        answered, and its texts not yet with an instance never run. A scan: cancels are rare,
        and an index would cost every request."""
        for pending in list(self.active.values()):
            if pending.request.id == request_id and pending.envelope == envelope:
                if self.traces is not None and pending.span is not None:
                    self.traces.answered(pending, ("cancelled", "its client gave up"))
                self._forget(pending)
                self.counters["cancelled"] += 1
                return

    def _from_cache(self, pending: Pending) -> list[Item[Pending]]:
        """Fills in the results the cache holds; returns the texts still to compute. Token
        vectors are never cached: a text's are a hundred times its pooled vector's size, and
        the cache is bounded in entries."""
        misses = []
        whole = self.task.reads_rows(pending.request.options)
        uncached = whole or not self.cached
        bulk = pending.request.bulk
        for i, enc in enumerate(pending.encoded):
            for ids in enc.windows:  # one, but for a long document read in windows
                hit = None
                for key in () if uncached else self.live_keys:
                    hit = self.cache.get((key, ids, enc.second))
                    if hit is not None:
                        break
                if hit is not None:
                    self._put(pending, i, ids, hit)
                else:
                    pool = self.dispatch.own_pool(len(ids))
                    misses.append(Item(pending, i, ids, pool, enc.second, whole, bulk))
        return misses

    def _put(self, pending: Pending, index: int, ids: tuple[int, ...], result: dict) -> None:
        """A result for input `index`, read from `ids`: of a document read in windows, what
        stands for its windows' (the best score, the summed vector, all rows that count)."""
        result = self.answers.arrived(pending.request, index, ids, result)
        kept = pending.results[index]
        pending.results[index] = result if kept is None else self.answers.best(kept, result)

    def _surely_refused(self, request: Request) -> bool:
        """True when some text could not be queued whatever its token count turns out to be."""
        if not self.dispatch.some_queue_full(request.bulk):
            return False
        for text in request.inputs():
            size = (
                sum(len(t.encode()) for t in text)
                if isinstance(text, tuple)
                else len(text.encode())
            )
            if self.dispatch.surely_full(TOKENS_PER_BYTE * size + SPECIAL_TOKENS, request.bulk):
                return True
        return False

    # -- results ---------------------------------------------------------------------------

    def on_result(self, body: dict, now: float) -> None:
        """An instance's RESULT: its texts' results, or its error."""
        job_id = body.get("job")
        job = self.dispatch.finish(job_id, now) if type(job_id) is int else None
        if job is None:
            return
        self.changed = True
        if self.traces is not None and job.spans:
            self.traces.ran(job, body.get("error"), now)
        worker = self.dispatch.workers.get(job.worker)
        if worker is not None and "pass_s" in body:
            self.metrics.forward_pass(worker.name, body["pass_s"])
        error = body.get("error")
        results = body.get("results") or []
        if error is not None:
            self._job_failed(job, error)
        elif len(results) != len(job.items):
            for item in job.items:
                message = "an instance returned the wrong number of results"
                self.fail(item.owner, ErrorCode.INTERNAL, which_text(item, message))
        else:
            self._job_done(job, results, self.key_of(worker), body.get("pass_s"))

    def _job_failed(self, job: Job[Pending], error: dict) -> None:
        if error.get("code") == ErrorCode.NO_INSTANCE.value:  # it was stopping: try elsewhere
            self.retry(job.items, count_attempt=False)
            return
        code = ERROR_CODES.get(str(error.get("code")), ErrorCode.INTERNAL)
        for item in job.items:
            self.fail(item.owner, code, which_text(item, str(error.get("message"))))

    def _job_done(self, job: Job[Pending], results: list, computed_by: str, pass_s) -> None:
        """`pass_s`: the instance's forward pass, in seconds (as its RESULT says)."""
        for item, result in zip(job.items, results, strict=True):
            if self.cached and not item.whole:
                self.cache.put((computed_by, item.ids, item.second), result)
            pending = item.owner
            if pending.done:
                continue
            if pending.timed is not None and isinstance(pass_s, (int, float)):
                pending.timed.inference = max(pending.timed.inference, pass_s)
            self._put(pending, item.index, item.ids, result)
            pending.remaining -= 1
            if pending.remaining == 0:
                self.complete(pending)

    def key_of(self, worker: WorkerState | None) -> str:
        """The model key of the instance that computed a result (announced in its READY)."""
        key = worker.ready.model_key if worker is not None else None
        return key or self.model_key

    def instances_changed(self) -> None:
        """An instance came or went: the cache answers under the live instances' models."""
        keys = dict.fromkeys(self.key_of(w) for w in self.dispatch.workers.values())
        self.live_keys = tuple(keys) or (self.model_key,)
        self.changed = True

    def retry(self, items: list[Item[Pending]], count_attempt: bool) -> None:
        """Texts whose instance failed or left: queued again, or failed if they cannot be."""
        self.changed = True
        for item in self.dispatch.requeue(items, count_attempt):
            if item.attempts > 1:
                self.fail(
                    item.owner, ErrorCode.INTERNAL, "its instance failed, and so did the retry"
                )
            else:
                self.fail(item.owner, ErrorCode.NO_INSTANCE, "no instance is left to retry it on")

    # -- replies ---------------------------------------------------------------------------

    def complete(self, pending: Pending) -> None:
        request = pending.request
        results = [
            {**result, "tokens": enc.tokens_read, "truncated": enc.truncated}
            for result, enc in zip(pending.results, pending.encoded, strict=True)
        ]
        results = self.answers.finish(request, pending.encoded, results)
        if self.traces is not None and pending.span is not None:
            self.traces.answered(pending)
        self._forget(pending)
        self.counters["replies_ok"] += 1
        took = time.monotonic() - pending.received
        self.metrics.replied(request.op, "ok", took, request.bulk)
        timings = {"timings": pending.timed.to_wire(took)} if pending.timed else {}
        self.reply(pending.envelope, protocol.ok_reply(request.id, results=results, **timings))

    def fail(self, pending: Pending, code: ErrorCode, message: str) -> None:
        """Answer `pending` with an error, once; NO_INSTANCE first tries a peer shard."""
        if pending.done:
            return
        if code is ErrorCode.NO_INSTANCE and self.hand_over and self.hand_over(pending):
            if (
                self.traces is not None and pending.span is not None
            ):  # the peer's span goes on in the caller's trace
                self.traces.answered(pending, handed_over=True)
            self._forget(pending)
            self.counters["handed_over"] += 1
            return
        if self.traces is not None and pending.span is not None:
            self.traces.answered(pending, (code.value, message))
        self._forget(pending)
        self.error(pending.envelope, pending.request, code, message, pending.received)

    def error(
        self,
        envelope: list[bytes],
        request: Request,
        code: ErrorCode,
        message: str,
        received: float | None = None,
    ) -> None:
        self.error_reply(envelope, request.id, request.op, code, message, received, request.bulk)

    def error_reply(
        self,
        envelope: list[bytes],
        request_id: object,
        op: object,
        code: ErrorCode,
        message: str,
        received: float | None = None,
        bulk: bool = False,
    ) -> None:
        """Counted by code, op and priority; `received`: when the request was read, for those
        that got as far as `start`, whose latency the metrics keep."""
        self.errors[code.value] = self.errors.get(code.value, 0) + 1
        took = None if received is None else time.monotonic() - received
        self.metrics.replied(op, code.value, took, bulk)
        self.reply(envelope, protocol.error_reply(request_id, code, message))

    def _forget(self, pending: Pending) -> None:
        """Forget an answered request: memory follows what is in flight, not what was."""
        pending.done = True
        pending.results = pending.encoded = []
        if pending.backlog:
            self.backlogged -= len(pending.backlog)
        pending.backlog = None
        self.active.pop(id(pending), None)
        self.feeding.pop(id(pending), None)
        self.deadlines.answered(pending)

    # -- the clock -------------------------------------------------------------------------

    def expire(self, now: float) -> None:
        """Answer the requests past their deadline, and the texts that waited in a queue
        longer than server.max_queue_ms."""
        if self.deadlines:
            expired = self.deadlines.expired(now)
            for pending in expired:
                message = "the deadline passed before it could be answered"
                self.fail(pending, ErrorCode.DEADLINE_EXCEEDED, message)
            if expired:
                self.dispatch.drop_done()
        for pending in list(self.feeding.values()):
            if pending.starved_since is not None and (
                now - pending.starved_since >= self.max_queue_ms / 1000
            ):
                wait = f"server.max_queue_ms={self.max_queue_ms} ms"
                message = f"its texts not yet queued waited {wait} for room in the queue"
                self.fail(pending, ErrorCode.OVERLOADED, f"{message}; retry later")
        for item in self.dispatch.overdue(now):
            if self.dispatch.servable(item.pool):
                code, why = ErrorCode.OVERLOADED, "without reaching an instance; retry later"
            else:  # held for instances that never announced themselves
                code, why = ErrorCode.NO_INSTANCE, "and no instance can serve it"
            wait = f"server.max_queue_ms={self.max_queue_ms} ms"
            self.fail(item.owner, code, f"it waited {wait} in the queue {why}")

    def drop_silent(self, now: float, expiry: float, liveness: int) -> None:
        """Instances not heard from in `expiry` seconds are gone: their texts are retried."""
        for identity in self.dispatch.silent_workers(now, expiry):
            worker, lost = self.dispatch.remove_worker(identity)
            self.instances_changed()
            if worker is None:
                continue
            if worker.stopping and not lost:  # it said BYE and finished: a graceful stop
                log.info("instance %s stopped", worker.name)
                continue
            log.warning(
                "instance %s missed %d heartbeats: dropped; retrying its %d text(s)",
                worker.name,
                liveness,
                len(lost),
            )
            self.retry(lost, count_attempt=True)

    def fail_unservable(self, now: float) -> None:
        """Once the start's hold is over, queued texts no live instance can take fail."""
        if now < self.hold_until:
            return
        for item in self.dispatch.unservable_items():
            message = "no ready instance is left for texts this long"
            self.fail(item.owner, ErrorCode.NO_INSTANCE, message)

    # -- draining --------------------------------------------------------------------------

    def begin_drain(self, timeout_s: float) -> None:
        """Take no new requests; those in flight have `timeout_s` to be answered."""
        if self.draining_until is None:
            self.draining_until = time.monotonic() + timeout_s
            log.info(
                "draining: %d request(s) in flight, %.0f s at most", len(self.active), timeout_s
            )

    def drain_timed_out(self, now: float) -> bool:
        """At the drain's end, what is still in flight is answered with an error."""
        if self.draining_until is None or now < self.draining_until:
            return False
        log.warning(
            "drain timeout: %d request(s) still in flight are answered with an error",
            len(self.active),
        )
        for pending in list(self.active.values()):
            message = "the server stopped before it could answer"
            self.fail(pending, ErrorCode.NO_INSTANCE, message)
        return True
