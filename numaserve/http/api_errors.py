"""HTTP errors, each API's shape of them, and what each protocol error code becomes.

TEI's routes answer its `ErrorResponse` (`error`, `error_type`); OpenAI's and the other `/v1/`
routes OpenAI's `{"error": {"message", "type", "param", "code"}}`, which its SDK reads; Cohere's
`/v2/` routes Cohere's `{"message"}`.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from numaserve.http.connection import Response
from numaserve.wire.protocol import ErrorCode

RETRY_AFTER_S = 1  # an overloaded server's Retry-After: the queues turn over well within it


class ApiError(Exception):
    """An answer other than 200: its status, TEI's `error_type` (one of TEI's own: a status
    of numaserve's own, 401 or 404, is a Validation error), and why."""

    def __init__(self, status: int, message: str, kind: str = "Validation"):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


# A shard's error code -> the HTTP status and TEI's error_type.
FROM_CODE = {
    ErrorCode.BAD_REQUEST.value: (422, "Validation"),
    ErrorCode.TOO_LONG.value: (422, "Validation"),
    ErrorCode.OVERLOADED.value: (429, "Overloaded"),
    ErrorCode.DEADLINE_EXCEEDED.value: (504, "Backend"),
    ErrorCode.NO_INSTANCE.value: (503, "Unhealthy"),
    ErrorCode.INTERNAL.value: (424, "Backend"),
}
OPENAI_TYPES = {
    401: "authentication_error",
    404: "not_found_error",
    429: "rate_limit_error",
}


def from_reply(error: dict) -> ApiError:
    status, kind = FROM_CODE.get(error.get("code"), (500, "Backend"))
    return ApiError(status, str(error.get("message", "")), kind)


def headers_for(status: int) -> tuple[tuple[str, str], ...]:
    if status == 429:
        return (("retry-after", str(RETRY_AFTER_S)),)
    if status == 401:
        return (("www-authenticate", 'Bearer realm="numaserve"'),)
    return ()


def tei(error: ApiError) -> Response:
    body = orjson.dumps({"error": error.message, "error_type": error.kind})
    return Response(error.status, body, headers=headers_for(error.status))


def openai(error: ApiError) -> Response:
    kind = OPENAI_TYPES.get(error.status)
    if kind is None:
        kind = "invalid_request_error" if error.status < 500 else "server_error"
    code = {401: "invalid_api_key", 404: "model_not_found"}.get(error.status, error.kind.lower())
    body = {"error": {"message": error.message, "type": kind, "param": None, "code": code}}
    return Response(error.status, orjson.dumps(body), headers=headers_for(error.status))


def cohere(error: ApiError) -> Response:
    body = orjson.dumps({"message": error.message})
    return Response(error.status, body, headers=headers_for(error.status))


def shape_for(path: str) -> Callable[[ApiError], Response]:
    """The error shape of the API a path belongs to: OpenAI's under /v1/, Cohere's under /v2/,
    else TEI's."""
    if path.startswith("/v2/"):
        return cohere
    return openai if path.startswith("/v1/") else tei


def refusal(status: int, message: str, path: str) -> Response:
    """A request refused before any route saw it (malformed HTTP, too big, too slow), in the
    shape of the API its path names ("" before the path is read): the OpenAI SDK shows an
    error's reason only when it comes in OpenAI's shape."""
    return shape_for(path)(ApiError(status, message))
