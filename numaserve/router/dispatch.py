"""Which worker runs which text: the router's dispatch state, pure (no sockets, no clock).

Rules (tested in tests/test_dispatch.py):
- a text goes to the smallest pool whose max_tokens fits it, to the instance idle longest
  (the zguide's load-balancing broker: an instance takes one job at a time);
- when its pool has no idle instance, a larger pool's idle instance may take it (spillover);
- each pool's queue is bounded: a request that does not fit is refused whole (overloaded),
  and a text that has waited max_queue_wait is taken out (for the router to answer overloaded);
  a big request is queued a piece at a time (`piece`: the book feeds the next as room opens),
  so that it never fills a queue and the requests behind it wait for one piece, not all;
- two priorities: each pool queues bulk texts apart from interactive ones, each queue
  bounded by queue_size. An instance takes interactive texts first; while both wait, every
  BULK_EVERY-th batch it takes from its pool is bulk, so bulk is never starved, and takes all
  the room interactive traffic leaves. Under overload the bulk queue, drained last, fills
  first: bulk is shed first, and interactive texts never wait behind bulk ones;
- a job whose instance dies is retried once on another instance, then fails;
- micro-batching: an idle instance takes up to max_batch queued texts of similar length,
  waiting at most max_wait for a batch to fill; no more than its share of the queue (the
  rest is for its pool's other instances, about to be free), no more than max_batch_tokens
  padded tokens, and no text that would pad the batch past MAX_PADDING times its tokens.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from itertools import islice
from typing import Generic, Protocol, TypeVar

from numaserve.config.schema import PoolConfig, ServerConfig
from numaserve.status.report import Ready
from numaserve.wire.protocol import ErrorCode

# A batch runs at (texts x its longest text) tokens: a text whose length would make that more
# than this many times the texts' own tokens runs in another batch. Measured on MiniLM with
# mixed lengths (docs/configuration.md#micro-batching): unbounded, the padding cost more than
# batching saved, and batches of up to 8 ran at 0.70-0.92x the throughput of single texts.
MAX_PADDING = 1.25
# While interactive and bulk texts both wait in a pool, every BULK_EVERY-th batch its
# instances take is bulk: bulk keeps 1/8 of a pool that interactive traffic saturates.
BULK_EVERY = 8


class Owner(Protocol):
    """The request a text belongs to: once done (answered), its texts are dropped."""

    done: bool


OwnerT = TypeVar("OwnerT", bound=Owner)


@dataclass(eq=False)
class Item(Generic[OwnerT]):
    """One text on its way to a worker."""

    owner: OwnerT  # the request it belongs to (the router's in_flight.Pending)
    index: int
    ids: tuple[int, ...]
    pool: int  # its own pool: the smallest that fits
    second: int = 0  # a pair's: where its second text's tokens begin (tokenizer.Encoded)
    whole: bool = False  # each token's vector asked for (embed's token_vectors), not the pooled
    bulk: bool = False  # its request's priority is bulk
    queued_at: float = 0.0
    attempts: int = 0


@dataclass(eq=False)
class Job(Generic[OwnerT]):
    id: int
    worker: bytes
    items: list[Item[OwnerT]]
    spans: list = field(default_factory=list)  # its traced requests' spans (traces.py)


@dataclass(eq=False)
class WorkerState:
    identity: bytes
    name: str
    pool: int
    ready: Ready  # what it said of itself
    last_seen: float
    idle_since: float
    jobs: int = 0
    served: int = 0
    stopping: bool = False
    control: bytes | None = None  # its control connection, where heartbeats go, if it has one
    spans_dropped: int = 0  # trace spans it could not deliver, as its heartbeats say
    passes: dict[str, int] | None = None  # its model paths' passes, where it holds several


@dataclass
class PoolState(Generic[OwnerT]):
    config: PoolConfig
    queue: deque[Item[OwnerT]] = field(default_factory=deque)  # interactive texts
    bulk: deque[Item[OwnerT]] = field(default_factory=deque)
    passed_over: int = 0  # batches taken from `queue` in a row while bulk texts waited

    @property
    def queues(self) -> tuple[deque[Item[OwnerT]], deque[Item[OwnerT]]]:
        return self.queue, self.bulk

    def queue_of(self, bulk: bool) -> deque[Item[OwnerT]]:
        return self.bulk if bulk else self.queue

    def in_turn(self) -> tuple[deque[Item[OwnerT]], deque[Item[OwnerT]]]:
        """Where the next batch comes from first: interactive, but bulk once it has been
        passed over BULK_EVERY - 1 times."""
        if self.bulk and self.passed_over >= BULK_EVERY - 1:
            return self.bulk, self.queue
        return self.queue, self.bulk

    def took(self, queue: deque[Item[OwnerT]]) -> None:
        self.passed_over = 0 if queue is self.bulk or not self.bulk else self.passed_over + 1

    def queued(self) -> int:
        return len(self.queue) + len(self.bulk)


class Dispatcher(Generic[OwnerT]):
    def __init__(
        self,
        pools: list[PoolConfig],
        queue_size: int,
        spillover: bool = True,
        max_batch: int = 1,
        max_wait: float = 0.0,
        max_queue_wait: float = float("inf"),
        max_batch_tokens: int | None = None,
    ):
        self.pools: list[PoolState[OwnerT]] = [
            PoolState(p) for p in sorted(pools, key=lambda p: p.max_tokens)
        ]
        self.queue_size = queue_size
        self.spillover = spillover
        self.max_batch = max_batch
        self.max_wait = max_wait
        self.max_batch_tokens = max_batch_tokens or float("inf")
        self.max_queue_wait = max_queue_wait
        self.workers: dict[bytes, WorkerState] = {}
        self.jobs: dict[int, Job[OwnerT]] = {}
        self._next_job = 0
        self.gone_spans_dropped = 0  # the last count of each instance forgotten

    @classmethod
    def for_server(cls, pools: tuple[PoolConfig, ...], server: ServerConfig) -> Dispatcher:
        """A router shard's, with the server's queue and batching settings."""
        return cls(
            list(pools),
            queue_size=server.queue_size,
            spillover=server.spillover,
            max_batch=server.max_batch,
            max_wait=server.max_wait_ms / 1000,
            max_batch_tokens=server.max_batch_tokens,
            max_queue_wait=server.max_queue_ms / 1000,
        )

    # -- pools -----------------------------------------------------------------------------

    def pool_index(self, name: str) -> int | None:
        return next((i for i, p in enumerate(self.pools) if p.config.name == name), None)

    def pool_for(self, tokens: int) -> int | None:
        """The smallest pool whose band fits `tokens`."""
        return next((i for i, p in enumerate(self.pools) if tokens <= p.config.max_tokens), None)

    def own_pool(self, tokens: int) -> int:
        """The pool of a text the tokenizer read (cut to model.max_length at most): the
        config makes sure a pool takes every length up to it."""
        pool = self.pool_for(tokens)
        if pool is None:
            raise ValueError(f"no pool takes a text of {tokens} tokens")
        return pool

    def _capacity(self, pool: int, bulk: bool = False) -> tuple[int, int]:
        """How many live instances may run a text of `pool`, and how many more texts `pool`
        can take now (of `bulk`'s priority): its queue's free places, plus the idle instances
        that would take a text at once. One pass over the instances: this runs for every
        request."""
        live = idle = 0
        spill = self.spillover
        for w in self.workers.values():
            if not w.stopping and (w.pool == pool or (spill and w.pool > pool)):
                live += 1
                idle += not w.jobs
        return live, self.queue_size + idle - len(self.pools[pool].queue_of(bulk))

    def servable(self, pool: int) -> bool:
        return self._capacity(pool)[0] > 0

    # -- admission -------------------------------------------------------------------------

    def per_batch(self, tokens: int) -> int:
        """How many texts of `tokens` tokens one micro-batch holds: max_batch, fewer where
        max_batch_tokens says so, and at least one (a longer text runs alone)."""
        return max(1, int(min(self.max_batch, self.max_batch_tokens // max(1, tokens))))

    def piece(self, tokens: int = 1) -> int:
        """How many of one request's texts of up to `tokens` tokens may be queued at once:
        two micro-batches for each live instance (every instance kept busy, with one batch
        ready behind each), within a queue. The rest waits in its request's own backlog
        (book.py feeds it), so that none of its texts waits behind the others past
        max_queue_ms."""
        live = sum(1 for w in self.workers.values() if not w.stopping)
        return min(self.queue_size, 2 * self.per_batch(tokens) * max(1, live))

    def room(self, pool: int, bulk: bool = False) -> int:
        return self._capacity(pool, bulk)[1]

    def some_queue_full(self, bulk: bool = False) -> bool:
        """A cheap first look (a few pools): only then is surely_full worth asking."""
        return any(len(p.queue_of(bulk)) >= self.queue_size for p in self.pools)

    def surely_full(self, most_tokens: int, bulk: bool = False) -> bool:
        """True when a text of at most `most_tokens` tokens could not be queued in any pool
        that might be its own: the router then refuses it without tokenizing it."""
        last = self.pool_for(most_tokens)
        candidates = range(len(self.pools) if last is None else last + 1)
        return all(self.room(pool, bulk) <= 0 for pool in candidates)

    def admit(self, items: list[Item[OwnerT]], now: float, hold: bool = False) -> ErrorCode | None:
        """Queue all of `items`, or none: returns why not (NO_INSTANCE or OVERLOADED).
        `hold`: queue them even where no instance is live yet (a router just started, whose
        instances are about to announce themselves)."""
        need: dict[int, int] = {}
        for item in items:
            need[item.pool] = need.get(item.pool, 0) + 1
        bulk = bool(items) and items[0].bulk  # one request's: one priority
        for pool, count in need.items():
            live, room = self._capacity(pool, bulk)
            if not live and not hold:
                return ErrorCode.NO_INSTANCE
            if count > room:
                return ErrorCode.OVERLOADED
        for item in items:
            item.queued_at = now
            self.pools[item.pool].queue_of(bulk).append(item)
        return None

    def drop_done(self) -> None:
        """Forget queued texts of requests already answered (expired, failed)."""
        for pool in self.pools:
            for queue in pool.queues:
                if any(i.owner.done for i in queue):
                    kept = [i for i in queue if not i.owner.done]
                    queue.clear()
                    queue.extend(kept)

    # -- scheduling ------------------------------------------------------------------------

    def schedule(self, now: float) -> list[Job[OwnerT]]:
        """Give queued texts to idle instances, the one idle longest first.

        Two passes: every idle instance first takes from its own pool's queue; only then do
        the idle instances still left take a smaller pool's overflow (spillover), so a text
        never spills while an instance of its own pool is free. Texts of requests already
        answered are skipped as they come to the front (a scan of every queue on every call
        cost the router more than a text's dispatch).
        """
        started = []
        idle = sorted(
            (w for w in self.workers.values() if not w.jobs and not w.stopping),
            key=lambda w: w.idle_since,
        )
        spill_passes = [range(w.pool - 1, -1, -1) for w in idle] if self.spillover else []
        for sources in ([[w.pool] for w in idle], spill_passes):
            for worker, pools in zip(idle, sources, strict=False):
                if worker.jobs:
                    continue
                items = self._take(pools, now)
                if items:
                    started.append(self._start(worker, items))
        return started

    def _take(self, pools, now: float) -> list[Item[OwnerT]]:
        for source in pools:
            state = self.pools[source]
            for queue in state.queues:
                while queue and queue[0].owner.done:
                    queue.popleft()
            queue = next((q for q in state.in_turn() if q), None)
            if queue is None:
                continue
            if len(queue) < self.max_batch and now - queue[0].queued_at < self.max_wait:
                continue  # let the batch fill a little longer
            state.took(queue)
            return self._batch(queue, source)
        return []

    def _batch(self, queue: deque[Item[OwnerT]], pool: int) -> list[Item[OwnerT]]:
        """The oldest text, plus the queued texts nearest its length: up to max_batch, up to
        this instance's share of the queue, within max_batch_tokens and MAX_PADDING."""
        first = queue.popleft()
        if self.max_batch == 1 or not queue:
            return [first]
        instances = sum(1 for w in self.workers.values() if w.pool == pool and not w.stopping)
        share = -(-(len(queue) + 1) // max(1, instances))  # the queue split evenly, rounded up
        window = [i for i in islice(queue, 4 * self.max_batch) if not i.owner.done]
        window.sort(key=lambda i: abs(len(i.ids) - len(first.ids)))
        chosen: list[Item[OwnerT]] = []
        longest = tokens = len(first.ids)
        for item in window[: min(self.max_batch, share) - 1]:
            size = len(item.ids)
            padded = (len(chosen) + 2) * max(longest, size)
            if padded > self.max_batch_tokens or padded > MAX_PADDING * (tokens + size):
                continue
            chosen.append(item)
            longest, tokens = max(longest, size), tokens + size
        picked = set(map(id, chosen))
        remaining = [i for i in queue if id(i) not in picked]
        queue.clear()
        queue.extend(remaining)
        return [first, *chosen]

    def _start(self, worker: WorkerState, items: list[Item[OwnerT]]) -> Job[OwnerT]:
        self._next_job += 1
        job = Job(self._next_job, worker.identity, items)
        self.jobs[job.id] = job
        worker.jobs += 1
        return job

    def next_wakeup(self, now: float) -> float | None:
        """When a waiting micro-batch must be sent even if not full, or the oldest queued
        text has waited its longest."""
        wait = min(self.max_wait or float("inf"), self.max_queue_wait)
        if wait == float("inf"):
            return None
        waits = [q[0].queued_at + wait for p in self.pools for q in p.queues if q]
        return min(waits) if waits else None

    def overdue(self, now: float) -> list[Item[OwnerT]]:
        """Take out the queued texts that have waited max_queue_wait (oldest first in each
        queue: a retried text goes back to the front with its first queueing time)."""
        late = []
        for pool in self.pools:
            for queue in pool.queues:
                while queue and now - queue[0].queued_at >= self.max_queue_wait:
                    item = queue.popleft()
                    if not item.owner.done:
                        late.append(item)
        return late

    # -- results and failures --------------------------------------------------------------

    def finish(self, job_id: int, now: float) -> Job[OwnerT] | None:
        """A job's result came back; None for a job we no longer track."""
        job = self.jobs.pop(job_id, None)
        if job is None:
            return None
        worker = self.workers.get(job.worker)
        if worker is not None:
            worker.jobs -= 1
            worker.served += 1
            worker.idle_since = now
        return job

    def requeue(self, items: list[Item[OwnerT]], count_attempt: bool) -> list[Item[OwnerT]]:
        """Put texts back at the front of their pools; returns those that may not be retried."""
        failed = []
        for item in reversed(items):
            if item.owner.done:
                continue
            if count_attempt:
                item.attempts += 1
            if item.attempts > 1 or not self.servable(item.pool):
                failed.append(item)
            else:  # its queued_at stays: the wait bound counts from its first queueing
                self.pools[item.pool].queue_of(item.bulk).appendleft(item)
        return failed

    # -- workers ---------------------------------------------------------------------------

    def worker_ready(self, identity: bytes, ready: Ready, now: float) -> WorkerState | None:
        """A READY: a new instance, or a known one announcing itself again."""
        pool = self.pool_index(ready.pool)
        if pool is None:
            return None
        worker = self.workers.get(identity)
        if worker is None:
            worker = WorkerState(identity, ready.name, pool, ready, now, now)
            self.workers[identity] = worker
        worker.ready, worker.last_seen = ready, now
        return worker

    def worker_seen(self, identity: bytes, now: float) -> WorkerState | None:
        worker = self.workers.get(identity)
        if worker is not None:
            worker.last_seen = now
        return worker

    def remove_worker(self, identity: bytes) -> tuple[WorkerState | None, list[Item[OwnerT]]]:
        """Forget an instance; returns it and the texts it was running."""
        worker = self.workers.pop(identity, None)
        if worker is not None:
            self.gone_spans_dropped += worker.spans_dropped
        lost = [job for job in self.jobs.values() if job.worker == identity]
        for job in lost:
            del self.jobs[job.id]
        return worker, [item for job in lost for item in job.items]

    def spans_dropped(self) -> int:
        """Trace spans the instances could not deliver, those forgotten included: a count
        that only grows, however often they restart."""
        return self.gone_spans_dropped + sum(w.spans_dropped for w in self.workers.values())

    def silent_workers(self, now: float, timeout: float) -> list[bytes]:
        return [w.identity for w in self.workers.values() if now - w.last_seen > timeout]

    def unservable_items(self) -> list[Item[OwnerT]]:
        """Queued texts no live instance can run any more (their pools emptied): take them out."""
        stranded = []
        for i, pool in enumerate(self.pools):
            if pool.queued() and not self.servable(i):
                for queue in pool.queues:
                    stranded += [item for item in queue if not item.owner.done]
                    queue.clear()
        return stranded
