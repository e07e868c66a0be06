"""The wire protocol shared by client, router and workers (docs/protocol.md is its spec).

Every message is two ZeroMQ frames: the protocol version, then one msgpack map. Never pickle:
a peer in another language must be able to speak it from the doc alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import msgpack

VERSION = b"NS1"


class ProtocolError(ValueError):
    """A message that cannot be understood; its sender gets `bad_request` where it can be told."""


class ErrorCode(str, Enum):
    BAD_REQUEST = "bad_request"
    TOO_LONG = "too_long"
    OVERLOADED = "overloaded"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    NO_INSTANCE = "no_instance"
    INTERNAL = "internal"


# Router <-> worker message types (the `type` key).
READY = "ready"  # worker: I can take work; here is what I am
HEARTBEAT = "heartbeat"  # both ways, every heartbeat interval, busy or not
RUN = "run"  # router: run these inputs in one forward pass
RESULT = "result"  # worker: the results of a run, or its error
BYE = "bye"  # worker: I am stopping; send me nothing more
SUPERVISOR = "supervisor"  # supervisor: my slot table; answer with your status
STATUS = "status"  # router: the status, in answer to SUPERVISOR


def pack(body: dict) -> list[bytes]:
    return [VERSION, msgpack.packb(body, use_bin_type=True)]


def unpack(frames: list[bytes]) -> dict:
    if len(frames) != 2:
        raise ProtocolError(f"expected 2 frames (version, body), got {len(frames)}")
    if frames[0] != VERSION:
        raise ProtocolError(f"unsupported protocol version {frames[0][:16]!r}; this is {VERSION!r}")
    try:
        # Invalid UTF-8 becomes lone surrogates instead of failing the whole message, so the
        # sender can be told which text was bad (see parse_request).
        body = msgpack.unpackb(frames[1], raw=False, unicode_errors="surrogateescape")
    except Exception as e:  # msgpack raises several types, including for invalid UTF-8
        raise ProtocolError(f"body is not valid msgpack: {e}") from None
    if not isinstance(body, dict):
        raise ProtocolError("body must be a msgpack map")
    return body


def error_body(code: ErrorCode, message: str) -> dict:
    return {"code": code.value, "message": message}


# numpy is imported where it is used: importing it starts OpenBLAS's thread pool, and a
# worker imports this module before it pins itself; a thread started then would keep the
# whole machine's CPUs and no memory binding (seen where numactl is not installed).


def embedding_to_wire(vector) -> bytes:
    """An embedding travels as little-endian float32 bytes: compact, and exact."""
    import numpy as np

    return np.asarray(vector, dtype="<f4").tobytes()


def embedding_from_wire(data: bytes):
    import numpy as np

    return np.frombuffer(data, dtype="<f4")


# Client requests (the `op` key).
TEXT_OPS = ("classify", "embed", "rerank", "ner")
OPS = (*TEXT_OPS, "status", "ping")
REQUEST_KEYS = ("id", "op", "model", "texts", "query", "top_k", "aggregation", "deadline_ms")
MAX_MODEL_NAME = 64  # a longer `model` names no model a config can have
# ner: how tokens become entities, as transformers' token-classification pipeline names them.
AGGREGATIONS = ("none", "simple", "first", "average", "max")
DEFAULT_AGGREGATION = "simple"
# A deadline longer than this is a mistake (or an attack on the deadline heap): refused.
MAX_DEADLINE_MS = 3_600_000


class RequestError(ValueError):
    """A request we can answer only with an error: its id (if known), a code and why."""

    def __init__(self, code: ErrorCode, message: str, request_id=None):
        super().__init__(message)
        self.code, self.message, self.request_id = code, message, request_id


@dataclass(frozen=True)
class Request:
    id: int | str
    op: str
    texts: tuple[str | tuple[str, str], ...] = ()  # classify: a text or a pair (a, b)
    deadline_ms: float | None = None
    query: str | None = None  # rerank: the query each of `texts` (the documents) is scored for
    top_k: int | None = None  # rerank: answer the best k only, best first
    aggregation: str = DEFAULT_AGGREGATION  # ner: AGGREGATIONS
    model: str | None = None  # the model asked for; None: the server's only one

    def inputs(self) -> list[str | tuple[str, str]]:
        """What the model reads: the texts, or for rerank each (query, document)."""
        if self.op == "rerank":
            return [(self.query, document) for document in self.texts]
        return list(self.texts)

    def to_body(self) -> dict:
        """The request as a client sends it (a router passing it on sends this)."""
        body = {
            "id": self.id,
            "op": self.op,
            "texts": [list(t) if isinstance(t, tuple) else t for t in self.texts],
        }
        if self.query is not None:
            body["query"] = self.query
        if self.top_k is not None:
            body["top_k"] = self.top_k
        if self.op == "ner":
            body["aggregation"] = self.aggregation
        if self.deadline_ms is not None:
            body["deadline_ms"] = self.deadline_ms
        if self.model is not None:
            body["model"] = self.model
        return body


def is_valid_utf8(text: str) -> bool:
    """unpack() turns invalid UTF-8 into lone surrogates, which cannot be packed again."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def reply_id(value):
    """`value` if a reply can echo it as the request's id, else None (the reply's `id: null`)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if -(1 << 63) <= value < (1 << 64) else None
    if isinstance(value, str) and is_valid_utf8(value):
        return value
    return None


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
    if op not in TEXT_OPS:
        return Request(request_id, op, (), deadline, model=model)
    texts = _texts(body.get("texts"), op, max_texts, bad)
    query, top_k, aggregation = _task_fields(body, op, bad)
    return Request(request_id, op, texts, deadline, query, top_k, aggregation, model)


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


def _texts(texts: object, op: str, max_texts: int, bad) -> tuple[str | tuple[str, str], ...]:
    """A text op's texts (rerank's documents); classify's may be pairs [a, b]."""
    if isinstance(texts, str):
        texts = [texts]
    what = "documents" if op == "rerank" else "texts"
    if not isinstance(texts, list) or not texts:
        raise bad(f"{op} needs texts ({what}): a string or a non-empty list of strings")
    if len(texts) > max_texts:
        raise bad(f"{len(texts)} texts in one request; the limit is {max_texts} (server.max_texts)")
    checked = []
    for i, text in enumerate(texts):
        if op == "classify" and isinstance(text, list):  # a pair: [a, b]
            if len(text) != 2:
                raise bad(f"text {i} is a list of {len(text)}; a pair is a list of two texts")
            for j, part in enumerate(text):
                _check_text(part, f"text {i}[{j}]", bad)
            checked.append((text[0], text[1]))
        else:
            pairs = "; pairs [a, b] are for classify" if isinstance(text, list) else ""
            _check_text(text, f"text {i}", bad, pairs)
            checked.append(text)
    return tuple(checked)


def _task_fields(body: dict, op: str, bad) -> tuple[str | None, int | None, str]:
    """rerank's query and top_k, ner's aggregation: refused on the other ops."""
    query, top_k = body.get("query"), body.get("top_k")
    if op == "rerank":
        _check_text(query, "query", bad)
        if top_k is not None and (
            isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1
        ):
            raise bad("top_k must be an integer of at least 1")
    elif query is not None or top_k is not None:
        raise bad(f"query and top_k are for rerank, not {op}")
    aggregation = body.get("aggregation", DEFAULT_AGGREGATION)
    if op != "ner" and "aggregation" in body:
        raise bad(f"aggregation is for ner, not {op}")
    if aggregation not in AGGREGATIONS:
        raise bad(f"aggregation must be one of {', '.join(AGGREGATIONS)}")
    return query, top_k, aggregation


def _check_text(text, name: str, bad, hint: str = "") -> None:
    if not isinstance(text, str):
        raise bad(f"{name} is not a string{hint}")
    if not is_valid_utf8(text):
        raise bad(f"{name} is not valid UTF-8")
    if not text.strip():
        raise bad(f"{name} is empty")


def ok_reply(request_id, **fields) -> dict:
    return {"id": request_id, "status": "ok", **fields}


def error_reply(request_id, code: ErrorCode, message: str) -> dict:
    return {"id": request_id, "status": "error", "error": error_body(code, message)}
