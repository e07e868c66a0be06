"""The wire protocol shared by client, router and workers (docs/protocol.md is its spec).

Every message is two ZeroMQ frames: the protocol version, then one msgpack map. Never pickle:
a peer in another language must be able to speak it from the doc alone.
"""

from __future__ import annotations

from enum import Enum

import msgpack

VERSION = b"NS1"
# The least server.max_message_bytes may be: a request no larger always gets through, so a
# client asks the server's limit (in its `ping` reply) only for a larger one.
SMALLEST_MESSAGE_LIMIT = 1024


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
# router: a client asks for the whole server's status; supervisor: here it is, as my control
# socket answers it, once every serving shard has sent a fresh report (STATUS_WAIT_S at most)
WHOLE = "whole"
STATUS_WAIT_S = 2.0


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


MAX_MODEL_NAME = 64  # a longer `model` names no model a config can have
TRUNCATION_DIRECTIONS = ("right", "left")  # which end of a text a cut takes away


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


def check_text(text, name: str, bad, hint: str = "") -> None:
    """A text of a request: a string, valid UTF-8, not blank; else `bad(why)` is raised."""
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
