"""The wire protocol shared by client, router and workers (docs/protocol.md is its spec).

Every message is two ZeroMQ frames: the protocol version, then one msgpack map. Never pickle:
a peer in another language must be able to speak it from the doc alone.
"""

from __future__ import annotations

from enum import Enum

import msgpack
import numpy as np

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


def pack(body: dict) -> list[bytes]:
    return [VERSION, msgpack.packb(body, use_bin_type=True)]


def unpack(frames: list[bytes]) -> dict:
    if len(frames) != 2:
        raise ProtocolError(f"expected 2 frames (version, body), got {len(frames)}")
    if frames[0] != VERSION:
        raise ProtocolError(f"unsupported protocol version {frames[0][:16]!r}; this is {VERSION!r}")
    try:
        body = msgpack.unpackb(frames[1], raw=False)
    except Exception as e:  # msgpack raises several types, including for invalid UTF-8
        raise ProtocolError(f"body is not valid msgpack: {e}") from None
    if not isinstance(body, dict):
        raise ProtocolError("body must be a msgpack map")
    return body


def error_body(code: ErrorCode, message: str) -> dict:
    return {"code": code.value, "message": message}


def embedding_to_wire(vector: np.ndarray) -> bytes:
    """An embedding travels as little-endian float32 bytes: compact, and exact."""
    return np.asarray(vector, dtype="<f4").tobytes()


def embedding_from_wire(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<f4")
