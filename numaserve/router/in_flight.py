"""The client requests the router has not answered yet, and their deadlines."""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import Any

from numaserve.tasks.requests import Request


@dataclass
class Timed:
    """Where a request's time went in the shard, for a caller that asks (`timings`)."""

    tokenize: float = 0.0  # seconds tokenizing and looking up the cache
    queue: float = 0.0  # its longest wait in a queue
    inference: float = 0.0  # its longest forward pass

    def to_wire(self, total: float) -> dict:
        ms = {"tokenize_ms": self.tokenize, "queue_ms": self.queue}
        ms |= {"inference_ms": self.inference, "total_ms": total}
        return {key: round(seconds * 1000, 3) for key, seconds in ms.items()}


@dataclass(eq=False)
class Pending:
    """A client request waiting for its texts' results."""

    envelope: list[bytes]
    request: Request
    encoded: list
    results: list
    deadline: float | None  # None once its deadline has left the heap
    received: float = 0.0
    remaining: int = 0  # texts not yet answered: queued, running, or in the backlog
    done: bool = False
    # A big request's texts not yet queued (book.feed queues them a piece at a time), and
    # since when the queue has had no room for its next piece.
    backlog: deque | None = None
    starved_since: float | None = None
    longest: int = 1  # tokens of its longest text to run: what sizes its pieces
    span: Any = None  # its span, where tracing is on and it is traced (router/traces.py)
    timed: Timed | None = None  # where its time went, where its request asks


class Deadlines:
    """Pending requests by deadline, soonest first.

    An answered request stays in the heap until its deadline comes (removing it would cost a
    search); the heap is compacted once more than half of it is answered, so its size follows
    the requests in flight, not those of the last hour (`requests.MAX_DEADLINE_MS`)."""

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, Pending]] = []
        self.stale = 0  # entries of requests already answered

    def __len__(self) -> int:
        return len(self.heap)

    def add(self, pending: Pending, deadline: float) -> None:
        """`pending`, due at `deadline` (its own)."""
        heapq.heappush(self.heap, (deadline, id(pending), pending))

    def next(self) -> float | None:
        return self.heap[0][0] if self.heap else None

    def answered(self, pending: Pending) -> None:
        """`pending` (done) is answered; its entry, if still in the heap, is stale."""
        if pending.deadline is None:
            return
        self.stale += 1
        if self.stale > len(self.heap) // 2 + 64:
            self.heap = [entry for entry in self.heap if not entry[2].done]
            heapq.heapify(self.heap)
            self.stale = 0

    def expired(self, now: float) -> list[Pending]:
        """The unanswered requests whose deadline has passed, taken out of the heap."""
        due = []
        while self.heap and self.heap[0][0] <= now:
            _, _, pending = heapq.heappop(self.heap)
            if pending.done:
                self.stale = max(0, self.stale - 1)
            else:
                pending.deadline = None  # it left the heap: answering it counts nothing stale
                due.append(pending)
        return due
