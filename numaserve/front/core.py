"""The front's core, which knows no transport: the model a call names, the count check, its
priority, the protocol request to the model's shards, and what the shards said of it (where
its time went, its characters and tokens, the texts they cut).

The HTTP API (http/) and the gRPC API (grpc_api/) are adapters on it: each reads its own
wire into an `Exchange` and texts, runs them here, and writes the results its own way.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

from numaserve.front import errors
from numaserve.front.errors import ApiError
from numaserve.front.keys import ApiKeys
from numaserve.front.upstream import Upstream
from numaserve.processes.specs import FrontModel, FrontSpec
from numaserve.tasks.requests import PRIORITIES, TOKEN_VECTOR_TEXTS, per_token

log = logging.getLogger("numaserve.front")


@dataclass(kw_only=True)
class Exchange:
    """One call to a front, whatever its transport: what the caller said of it (its request
    id, API key, priority, trace) and what the shards said of its texts (Core.run)."""

    request_id: str = ""  # the caller's X-Request-Id (or x-request-id metadata), or one made
    authorization: str | None = None  # `Bearer KEY`
    priority: str | None = None  # X-Priority (or x-priority metadata): interactive or bulk
    # Where traced: its span, and that span's W3C context for the shards.
    span: Any = field(default=None, repr=False)
    trace: tuple[str, str] | None = field(default=None, repr=False)
    timings: dict[str, float] = field(default_factory=dict, repr=False)
    characters: int = field(default=0, repr=False)
    tokens: int = field(default=0, repr=False)
    truncated: list[int] = field(default_factory=list, repr=False)  # the inputs cut

    @property
    def gone(self) -> bool:
        """The caller hung up: its answer has nowhere to go."""
        return False

    def waiting_on(self, future) -> None:
        """The shards' answer the call now awaits, for a transport that cancels it itself
        when its caller hangs up (HTTP's connection); gRPC cancels the awaiting task."""


class Core:
    def __init__(self, spec: FrontSpec, upstream: Upstream, keys: ApiKeys):
        self.spec, self.upstream, self.keys = spec, upstream, keys
        self.models = {m.name: m for m in spec.models}
        self.started = int(time.time())
        self.tokenizers: dict[str, Any] = {}

    def model(self, name: object, where: str = "model") -> FrontModel:
        """The model a call names (`where` says where it is named), or the only one."""
        served = ", ".join(self.models)
        if name is None:
            default = self.spec.server.default_model
            if len(self.models) == 1 or default:
                return self.models[default] if default else next(iter(self.models.values()))
            raise ApiError(
                400,
                f"this server serves several models ({served}): name one in {where}, or set "
                "server.default_model",
            )
        model = self.models.get(name) if isinstance(name, str) else None
        if model is None:
            raise ApiError(404, f"no model {name!r} here; this server serves {served}")
        return model

    def check_key(self, call: Exchange) -> None:
        self.keys.check(call.authorization)

    async def run(self, call: Exchange, model: FrontModel, op: str, texts, **options) -> list:
        """A task's results, one per text, from the model's shards; an ApiError for theirs."""
        if call.gone:  # asked and hung up: nothing runs for nobody
            raise ApiError(499, "the client closed the connection")
        self.check_count(texts)
        body = {"op": op, "texts": texts, "timings": True}
        if call.trace is not None:
            body["traceparent"], body["tracestate"] = call.trace
            call.span.set_attributes(
                {"numaserve.model": model.name, "numaserve.op": op, "numaserve.texts": len(texts)}
            )
        if self.bulk(call):
            body["priority"] = "bulk"
        if self.spec.named:
            body["model"] = model.name
        body.update((k, v) for k, v in options.items() if v is not None)
        # Token vectors travel in pieces the shards take (TOKEN_VECTOR_TEXTS texts each), two
        # at a time (one runs while the other's reply travels: more would only fill the
        # queues), and are answered whole.
        size = TOKEN_VECTOR_TEXTS if per_token(op, options) else max(len(texts), 1)
        pieces = [texts[i : i + size] for i in range(0, max(len(texts), 1), size)]
        ahead = min(len(texts), 2 * size) - size if len(pieces) > 1 else 0
        turns = asyncio.Semaphore(2)

        async def piece(part: list):
            async with turns:
                return await self.upstream.call(model.name, {**body, "texts": part}, ahead)

        gathered = asyncio.gather(*(piece(p) for p in pieces))
        call.waiting_on(gathered)
        replies = await gathered
        results = []
        timings: dict[str, float] = {}
        for reply in replies:
            if reply.get("status") != "ok":
                raise errors.from_reply(reply.get("error") or {})
            results += reply["results"]
            for key, ms in (reply.get("timings") or {}).items():
                timings[key] = max(timings.get(key, 0.0), ms)  # the pieces ran side by side
        for key, ms in timings.items():
            call.timings[key] = call.timings.get(key, 0.0) + ms
        call.characters += sum(map(characters, texts))
        call.tokens += sum(r.get("tokens", 0) for r in results)
        call.truncated += [r.get("index", i) for i, r in enumerate(results) if r.get("truncated")]
        return results

    def bulk(self, call: Exchange) -> bool:
        """The call's priority: as it says, else its API key's default."""
        if call.priority is None:
            return self.keys.is_bulk(call.authorization)
        priority = call.priority.strip().lower()
        if priority not in PRIORITIES:
            raise ApiError(400, f"X-Priority is interactive or bulk; got {call.priority[:40]!r}")
        return priority == "bulk"

    def check_count(self, texts: list) -> None:
        """More inputs than server.max_texts in one request is 413, before any is read."""
        limit = self.spec.server.max_texts
        if len(texts) > limit:
            raise ApiError(
                413, f"{len(texts)} inputs in one request; the limit is {limit} (server.max_texts)"
            )

    async def serving(self, model: FrontModel) -> bool:
        """Whether some instance of `model` can serve, as its shards know (their `ping`: their
        ready instances and their ready peers'), not the whole server's status."""
        reply = await self.upstream.call(model.name, {"op": "ping"})
        if reply.get("status") != "ok":
            raise errors.from_reply(reply.get("error") or {})
        ready = reply.get("ready")
        if not isinstance(ready, int):
            raise ApiError(
                503, f"a shard's ping without its ready instances: {ready!r:.40}", "Unhealthy"
            )
        return ready > 0

    def tokenizer(self, model: FrontModel):
        """The model's fast tokenizer, loaded on first use: only tokenizing, decoding and
        token id inputs need it here (the shards tokenize everything they run)."""
        if model.name not in self.tokenizers:
            from numaserve.backends.tokenizer import load_fast_tokenizer

            tokenizer = load_fast_tokenizer(model.model.path)
            tokenizer.no_padding()  # some tokenizer.json files pad every text to a length
            tokenizer.no_truncation()
            self.tokenizers[model.name] = tokenizer
        return self.tokenizers[model.name]


REQUEST_ID = re.compile(r"[A-Za-z0-9._:/=+-]{1,128}")


def given_request_id(value: str | None) -> str | None:
    """A caller's request id, echoed where it is a plain token of up to 128 characters
    (another is replaced: it goes into headers and log lines)."""
    return value if value is not None and REQUEST_ID.fullmatch(value) else None


def characters(text) -> int:
    """A text's characters, or a pair's (token ids count none)."""
    if isinstance(text, str):
        return len(text)
    return sum(len(t) for t in text if isinstance(t, str)) if isinstance(text, list) else 0


def timing_fields(call: Exchange, took: float) -> tuple[tuple[str, str], ...]:
    """TEI's timing headers (HTTP headers, gRPC metadata), in whole milliseconds as TEI writes
    them: the front's whole time, the shards' part, and within it tokenizing, the queue and
    the forward pass."""
    ms = call.timings
    return (
        ("x-compute-type", "cpu"),
        ("x-compute-time", str(round(ms.get("total_ms", 0.0)))),
        ("x-compute-characters", str(call.characters)),
        ("x-compute-tokens", str(call.tokens)),
        ("x-total-time", str(round(took * 1000))),
        ("x-tokenization-time", str(round(ms.get("tokenize_ms", 0.0)))),
        ("x-queue-time", str(round(ms.get("queue_ms", 0.0)))),
        ("x-inference-time", str(round(ms.get("inference_ms", 0.0)))),
    )


def log_slow(call: Exchange, what: str, outcome: object, took: float) -> None:
    """One line for a call slower than server.slow_request_ms (`what`: `POST /embed`, or a
    gRPC method): where its time went, its request id, and its trace id where it is traced
    (a log line leads to its trace)."""
    ms, request_id = call.timings, call.request_id
    trace_id = call.trace[0].split("-")[1] if call.trace else None
    log.warning(
        "slow request %s -> %s: %.0f ms (in the shards %.0f: tokenize %.1f, queue %.1f, "
        "forward pass %.1f), %d characters, %d tokens; request_id=%s%s",
        what,
        outcome,
        took * 1000,
        ms.get("total_ms", 0.0),
        ms.get("tokenize_ms", 0.0),
        ms.get("queue_ms", 0.0),
        ms.get("inference_ms", 0.0),
        call.characters,
        call.tokens,
        request_id,
        f" trace_id={trace_id}" if trace_id else "",
        extra={"request_id": request_id, **({"trace_id": trace_id} if trace_id else {})},
    )
