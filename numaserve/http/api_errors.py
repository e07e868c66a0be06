"""HTTP errors in each API's shape (front/errors.py: what each protocol error code becomes).

TEI's routes answer its `ErrorResponse` (`error`, `error_type`); OpenAI's and the other `/v1/`
routes OpenAI's `{"error": {"message", "type", "param", "code"}}`, which its SDK reads; Cohere's
`/v2/` routes Cohere's `{"message"}`.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from numaserve.front.errors import ApiError
from numaserve.http.connection import Response

RETRY_AFTER_S = 1  # an overloaded server's Retry-After: the queues turn over well within it


OPENAI_TYPES = {
    401: "authentication_error",
    404: "not_found_error",
    429: "rate_limit_error",
}


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
