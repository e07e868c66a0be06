"""numaserve's own routes: named entities (POST /ner), POST / and /invocations (as TEI's: the
served model's own route, by its task), and /openapi.json describing every route."""

from __future__ import annotations

from typing import TYPE_CHECKING

from numaserve.front.errors import ApiError
from numaserve.front.inputs import given
from numaserve.http import api_errors
from numaserve.http.connection import Request, Response
from numaserve.http.routes import tei
from numaserve.http.routing import Route, json_body, ok

if TYPE_CHECKING:
    from numaserve.http.app import App


async def ner(app: App, request: Request) -> Response:
    """{"inputs": text or [texts], "aggregation"?, "truncate"?, "truncation_direction"?} ->
    each text's entities, in the protocol's shape (label, score, start, end, text; with
    aggregation "none", index)."""
    body = json_body(request)
    model = app.model_of(request, body)
    tei.check_task(model, "/ner")
    value = given(body, "inputs")
    single = isinstance(value, str)
    texts = [value] if single else value
    if isinstance(texts, list) and not texts:
        raise ApiError(422, "inputs is an empty list: give at least one text", "Empty")
    if not isinstance(texts, list):
        raise ApiError(422, "inputs must be a text or a non-empty list of texts")
    aggregation = body.get("aggregation")
    results = await app.core.run(
        request, model, "ner", texts, aggregation=aggregation, **tei.cutting(body)
    )
    found = [r["entities"] for r in results]
    return ok(found[0] if single else found)


async def by_task(app: App, request: Request) -> Response:
    """POST / and /invocations (SageMaker's path): the named model's task's own route; for
    an embedder, /similarity where the inputs are a source sentence and sentences (what
    huggingface_hub's InferenceClient.sentence_similarity posts to a model's URL)."""
    body = json_body(request)
    model = app.model_of(request, body)
    path = tei.BY_TASK[model.model.task]
    inputs = body.get("inputs")
    if path == "/embed" and isinstance(inputs, dict) and "source_sentence" in inputs:
        path = "/similarity"
    return await app.routes["POST", path].handler(app, request)


async def openapi(app: App, request: Request) -> Response:
    from numaserve.http.openapi import document

    return ok(document(app))


ROUTES = (
    Route("POST", "/", by_task, api_errors.tei, "The served model's own route, by its task (TEI)"),
    Route("POST", "/invocations", by_task, api_errors.tei, "As POST / (SageMaker's path)"),
    Route(
        "POST", "/ner", ner, api_errors.tei, "Named entities of texts, with their spans (numaserve)"
    ),
    Route("GET", "/openapi.json", openapi, api_errors.tei, "This document", open=True),
)
