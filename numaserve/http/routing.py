"""What every route is made of: its record (method, path, handler, its API's error shape),
and the reading and writing of JSON bodies that all of them share."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson

from numaserve.front.errors import ApiError
from numaserve.http.connection import Request, Response

if TYPE_CHECKING:
    from numaserve.http.app import App

Handler = Callable[["App", Request], Awaitable[Response]]


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Handler
    error: Callable[[ApiError], Response]  # its API's error shape
    summary: str  # for /openapi.json
    open: bool = False  # answered without an API key (probes)
    described: bool = True  # in /openapi.json (the API page's own files are not)


def json_body(request: Request) -> dict:
    """The request's JSON object: malformed JSON is 400, anything but an object 422. Any
    Content-Type is read as JSON: `curl -d` sends form-urlencoded unless told otherwise. Read
    once: POST / reads it for the model, then the model's route for the rest."""
    if request.json is not None:
        return request.json
    try:
        body = orjson.loads(request.body)
    except orjson.JSONDecodeError as e:
        raise ApiError(400, f"the body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise ApiError(422, "the body must be a JSON object")
    request.json = body
    return body


def ok(value, status: int = 200) -> Response:
    return Response(status, orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY))


def flag(body: dict, key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(422, f"{key} must be true or false")
    return value
