"""A client's request, checked completely before anything is done with it (docs/protocol.md).

The keys every request has are checked here; a task's own keys by its task (numaserve/tasks).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from numaserve.tasks import TASKS, Task
from numaserve.wire.protocol import (
    MAX_MODEL_NAME,
    TRUNCATION_DIRECTIONS,
    ErrorCode,
    check_text,
    reply_id,
)

# The `op` key: a task's name, a question for the server, or `cancel` (forget request `id`).
OPS = (*TASKS, "status", "ping", "cancel")
COMMON_KEYS = (
    "id",
    "op",
    "model",
    "texts",
    "deadline_ms",
    "truncate",
    "truncation_direction",
    "priority",
    "traceparent",
    "tracestate",
    "timings",
)
# `timings`: true asks the reply to say where the request's time went in the shard (`timings`:
# tokenize_ms, queue_ms, inference_ms, total_ms); the HTTP front asks, for TEI's headers.
# `traceparent` and `tracestate`: the caller's trace, as W3C Trace Context's headers say it,
# so that the server's spans join it (docs/monitoring.md). One that is not W3C's form is left
# out, as W3C says a receiver does: the request starts a trace of its own.
TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
MAX_TRACESTATE = 512  # W3C's 32 list members; a longer one is left out
# `priority`: interactive (the default: someone waits) or bulk (indexing, backfills): a shard
# serves interactive texts first and sheds bulk first (router/dispatch.py).
PRIORITIES = ("interactive", "bulk")
# A task's own key -> the tasks that take it.
OWNERS = {
    key: tuple(name for name, task in TASKS.items() if key in task.option_keys)
    for task in TASKS.values()
    for key in task.option_keys
}
REQUEST_KEYS = (*COMMON_KEYS, *OWNERS)
# A deadline longer than this is a mistake (or an attack on the deadline heap): refused.
MAX_DEADLINE_MS = 3_600_000
# A request's texts whose token vectors (embed's token_vectors) one reply may hold: each text's
# are up to max_length vectors, so their reply grows hundreds of times faster than pooled ones'.
TOKEN_VECTOR_TEXTS = 64

Text = str | tuple[str, str]  # a text, or a pair (a, b) for a task that takes pairs


class RequestError(ValueError):
    """A request we can answer only with an error: its id (if known), a code and why."""

    def __init__(self, code: ErrorCode, message: str, request_id=None):
        super().__init__(message)
        self.code, self.message, self.request_id = code, message, request_id


@dataclass(frozen=True)
class Request:
    id: int | str
    op: str
    texts: tuple[Text, ...] = ()  # rerank: the documents
    deadline_ms: float | None = None
    model: str | None = None  # the model asked for; None: the server's only one
    options: dict[str, Any] = field(default_factory=dict)  # the task's own (Task.options)
    truncate: bool | None = None  # cut a text over the limit, or refuse it; None: model.truncate
    truncation_direction: str | None = None  # "left": a cut keeps the end; None: "right"
    bulk: bool = False  # priority: bulk
    trace: tuple[str, str] | None = None  # (traceparent, tracestate): the caller's trace
    timings: bool = False  # the reply says where the time went

    @property
    def task(self) -> Task:
        return TASKS[self.op]

    def inputs(self) -> list[Text]:
        """What the model reads: the texts, or for rerank each (query, document)."""
        return self.task.inputs(self)

    def to_body(self) -> dict:
        """The request as a client sends it (a router passing it on sends this)."""
        body = {
            "id": self.id,
            "op": self.op,
            "texts": [list(t) if isinstance(t, tuple) else t for t in self.texts],
        }
        body |= {key: value for key, value in self.options.items() if value is not None}
        if self.deadline_ms is not None:
            body["deadline_ms"] = self.deadline_ms
        if self.model is not None:
            body["model"] = self.model
        if self.bulk:
            body["priority"] = "bulk"
        if self.truncate is not None:
            body["truncate"] = self.truncate
        if self.truncation_direction is not None:
            body["truncation_direction"] = self.truncation_direction
        if self.timings:
            body["timings"] = True
        if self.trace is not None:
            body["traceparent"], state = self.trace
            if state:
                body["tracestate"] = state
        return body

    @property
    def cuts_left(self) -> bool:
        return self.truncation_direction == "left"


def parse_request(body: dict, max_texts: int) -> Request:
    """Check a client request completely; every problem is a RequestError naming it."""
    request_id = _request_id(body.get("id"))

    def bad(message: str) -> RequestError:
        return RequestError(ErrorCode.BAD_REQUEST, message, request_id)

    unknown = [k for k in body if k not in REQUEST_KEYS]
    if unknown:
        raise bad(f"unknown key {unknown[0]!r}; a request has {', '.join(REQUEST_KEYS)}")
    op = body.get("op")
    if op not in OPS:
        raise bad(f"unknown op {op!r}; the ops are {', '.join(OPS)}")
    deadline, model = _deadline(body.get("deadline_ms"), bad), _model(body.get("model"), bad)
    truncate = body.get("truncate")
    if truncate is not None and not isinstance(truncate, bool):
        raise bad("truncate must be true or false (or left out: the server's model.truncate)")
    direction = body.get("truncation_direction")
    if direction is not None and direction not in TRUNCATION_DIRECTIONS:
        raise bad(
            "truncation_direction must be right (a cut keeps a text's start, the default) or "
            "left (it keeps the end)"
        )
    priority = body.get("priority", "interactive")
    if priority not in PRIORITIES:
        raise bad("priority must be interactive (the default) or bulk")
    trace = _trace(body.get("traceparent"), body.get("tracestate"))
    if op not in TASKS:
        return Request(request_id, op, (), deadline, model, trace=trace)
    task = TASKS[op]
    texts = _texts(body.get("texts"), task, max_texts, bad)
    misplaced = [k for k in body if k in OWNERS and task.name not in OWNERS[k]]
    if misplaced:  # a key of other tasks' (rerank's query on classify)
        keys = " and ".join(misplaced)
        verb = "are" if len(misplaced) > 1 else "is"
        owners = " and ".join(OWNERS[misplaced[0]])
        raise bad(f"{keys} {verb} for {owners}, not {task.name}")
    options = task.options(body, bad)
    if per_token(op, options) and len(texts) > TOKEN_VECTOR_TEXTS:
        raise bad(
            f"{len(texts)} texts ask for token vectors; the limit is {TOKEN_VECTOR_TEXTS} a "
            "request (a text's token vectors are up to max_length times its vector's size)"
        )
    bulk = priority == "bulk"
    timings = body.get("timings", False)
    if not isinstance(timings, bool):
        raise bad("timings must be true or false")
    return Request(
        request_id, op, texts, deadline, model, options, truncate, direction, bulk, trace, timings
    )


def per_token(op: str, options: dict) -> bool:
    """Whether a request's answer holds a vector per token (TOKEN_VECTOR_TEXTS bounds it)."""
    return TASKS[op].answers_per_token or bool(options.get("token_vectors"))


def _trace(parent: object, state: object) -> tuple[str, str] | None:
    """The caller's W3C trace context, where `traceparent` is in W3C's form; else None."""
    if not isinstance(parent, str) or not TRACEPARENT.fullmatch(parent):
        return None
    ok = isinstance(state, str) and len(state) <= MAX_TRACESTATE and state.isprintable()
    return parent, state if ok else ""


def _request_id(raw_id: object) -> int | str:
    if isinstance(raw_id, bool) or not isinstance(raw_id, (int, str)):
        raise RequestError(ErrorCode.BAD_REQUEST, "id must be an integer or a string")
    request_id = reply_id(raw_id)
    if request_id is None:
        raise RequestError(ErrorCode.BAD_REQUEST, "id is a string that is not valid UTF-8")
    return request_id


def _deadline(deadline: object, bad) -> float | None:
    if deadline is not None and (
        isinstance(deadline, bool)
        or not isinstance(deadline, (int, float))
        or not math.isfinite(deadline)
        or not 0 < deadline <= MAX_DEADLINE_MS
    ):
        raise bad(
            f"deadline_ms must be a number of milliseconds above 0 and at most {MAX_DEADLINE_MS}"
        )
    return deadline


def _model(model: object, bad) -> str | None:
    if model is not None and (
        not isinstance(model, str)
        or not 0 < len(model) <= MAX_MODEL_NAME
        or not model.isprintable()
    ):
        raise bad(f"model must be a model's name: a string of 1-{MAX_MODEL_NAME} characters")
    return model


def _texts(texts: object, task: Task, max_texts: int, bad) -> tuple[Text, ...]:
    """A task's texts (rerank's documents); pairs [a, b] where the task takes them."""
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts:
        raise bad(
            f"{task.name} needs texts ({task.inputs_are}): a string or a non-empty list of strings"
        )
    if len(texts) > max_texts:
        raise bad(f"{len(texts)} texts in one request; the limit is {max_texts} (server.max_texts)")
    checked: list[Text] = []
    for i, text in enumerate(texts):
        if task.takes_pairs and isinstance(text, list):  # a pair: [a, b]
            if len(text) != 2:
                raise bad(f"text {i} is a list of {len(text)}; a pair is a list of two texts")
            for j, part in enumerate(text):
                check_text(part, f"text {i}[{j}]", bad)
            checked.append((text[0], text[1]))
        else:
            check_text(text, f"text {i}", bad, _pairs_hint(text))
            checked.append(text)
    return tuple(checked)


def _pairs_hint(text: object) -> str:
    if not isinstance(text, list):
        return ""
    return f"; pairs [a, b] are for {' and '.join(t.name for t in TASKS.values() if t.takes_pairs)}"
