"""Cohere's API: POST /v1/rerank in the shape Cohere's and Jina's rerank APIs share (and
infinity, vLLM and LiteLLM speak): `query`, `documents`, `top_n`, `return_documents`; answered
with `results` of `index` and `relevance_score`, best first. Its current API, /v2/rerank (with
`max_tokens_per_doc`) and /v2/embed (with `embedding_types`: float, int8, uint8, binary,
ubinary; `input_type`; `truncate`), in the shapes its SDK reads."""

from __future__ import annotations

import uuid
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from numaserve.checkpoint.paths import resolve_model_path
from numaserve.front import inputs
from numaserve.front.errors import ApiError
from numaserve.http import api_errors
from numaserve.http.connection import Request, Response
from numaserve.http.routing import Route, flag, json_body, ok
from numaserve.tasks import serves
from numaserve.tasks.prompts import Prompts

if TYPE_CHECKING:
    from numaserve.http.app import App


async def ranked(app: App, request: Request, body: dict, documents: list[str]) -> list[dict]:
    """The reranker's results for `documents`, best first (top_n of them, where given)."""
    model = _model(app, body)
    if not serves(model.model.task, "rerank"):
        raise ApiError(422, f"model {model.name!r} serves {model.model.task}, not rerank")
    top_n = body.get("top_n")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise ApiError(422, "top_n must be an integer of at least 1")
    results = await app.core.run(
        request,
        model,
        "rerank",
        documents,
        query=body.get("query"),
        top_k=top_n,
        max_chunks_per_doc=body.get("max_chunks_per_doc"),
    )
    return sorted(results, key=lambda r: -r["score"])  # top_k answers so already


async def rerank(app: App, request: Request) -> Response:
    body = json_body(request)
    documents = [_text(d, i) for i, d in enumerate(_list(body.get("documents")))]
    results = await ranked(app, request, body, documents)
    with_documents = flag(body, "return_documents", False)
    return ok(
        {
            "model": body.get("model") or _model(app, body).name,
            "results": [
                {
                    "index": r["index"],
                    "relevance_score": r["score"],
                    **({"document": {"text": documents[r["index"]]}} if with_documents else {}),
                    **inputs.chunks(r),
                }
                for r in results
            ],
            "usage": {"total_tokens": sum(r["tokens"] for r in results)},
        }
    )


async def rerank_v2(app: App, request: Request) -> Response:
    """Cohere's /v2/rerank: documents are texts; `max_tokens_per_doc` cuts each first."""
    body = json_body(request)
    documents = [_text(d, i) for i, d in enumerate(_list(body.get("documents")))]
    most = body.get("max_tokens_per_doc")
    if most is not None:
        if isinstance(most, bool) or not isinstance(most, int) or most < 1:
            raise ApiError(422, "max_tokens_per_doc must be an integer of at least 1")
        documents = [inputs.kept_tokens(app.core, _model(app, body), d, most) for d in documents]
    results = await ranked(app, request, body, documents)
    return ok(
        {
            "id": str(uuid.uuid4()),
            "results": [
                {"index": r["index"], "relevance_score": r["score"], **inputs.chunks(r)}
                for r in results
            ],
            "meta": _meta(search_units=1),
        }
    )


EMBEDDING_TYPES = ("float", "int8", "uint8", "binary", "ubinary")
# input_type -> the name of the model's own prompt for it, where the model has one
INPUT_PROMPTS = {
    "search_query": ("query",),
    "search_document": ("document", "passage"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}
# Cohere's truncate -> the protocol's: END cuts a text's end, START its start, NONE refuses.
TRUNCATE = {
    "END": {"truncate": True, "truncation_direction": "right"},
    "START": {"truncate": True, "truncation_direction": "left"},
    "NONE": {"truncate": False},
}


async def embed_v2(app: App, request: Request) -> Response:
    """Cohere's /v2/embed: each text's embedding in every type asked for."""
    body = json_body(request)
    model = _model(app, body)
    if model.model.task != "embed":
        raise ApiError(422, f"model {model.name!r} serves {model.model.task}, not embed")
    texts = body.get("texts")
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise ApiError(422, "texts must be a non-empty list of strings", "Empty")
    types = body.get("embedding_types") or ["float"]
    if not isinstance(types, list) or not all(t in EMBEDDING_TYPES for t in types):
        raise ApiError(422, f"embedding_types must be a list of {', '.join(EMBEDDING_TYPES)}")
    truncate = str(body.get("truncate") or "END").upper()
    if truncate not in TRUNCATE:
        raise ApiError(422, f"truncate must be one of {', '.join(TRUNCATE)}")
    input_type = body.get("input_type")
    if input_type is not None and input_type not in INPUT_PROMPTS:
        raise ApiError(422, f"input_type must be one of {', '.join(INPUT_PROMPTS)}")
    prompt = _prompt_for(model.model.path, input_type)
    results = await app.core.run(
        request, model, "embed", texts, prompt_name=prompt, **TRUNCATE[truncate]
    )
    vectors = inputs.embeddings(results, inputs.dimensions_of(body, "output_dimension"), True)
    return ok(
        {
            "id": str(uuid.uuid4()),
            "embeddings": {kind: inputs.quantized(vectors, kind) for kind in dict.fromkeys(types)},
            "texts": texts,
            "meta": _meta(input_tokens=inputs.prompt_tokens(results)),
            "response_type": "embeddings_by_type",
        }
    )


def _model(app: App, body: dict):
    """The model a body names where the server serves several; else its only one."""
    return app.core.model(body.get("model") if app.spec.named else None)


def _meta(**billed) -> dict:
    return {"api_version": {"version": "2"}, "billed_units": billed}


@cache
def _prompts(path: str) -> Prompts:
    return Prompts.read(Path(resolve_model_path(path)))


def _prompt_for(path: str, input_type: str | None) -> str | None:
    """The model's own prompt for Cohere's input_type, where it has one; else its default."""
    table = _prompts(path).table
    return next((n for n in INPUT_PROMPTS.get(input_type, ()) if n in table), None)


def _list(value: object) -> list:
    if not isinstance(value, list) or not value:
        raise ApiError(422, "documents must be a non-empty list of texts", "Empty")
    return value


def _text(document: object, i: int) -> str:
    """A document: its text, or Cohere's {"text": ...}."""
    if isinstance(document, dict):
        document = document.get("text")
    if not isinstance(document, str):
        raise ApiError(422, f'documents[{i}] must be a string or {{"text": string}}')
    return document


ROUTES = (
    Route("POST", "/v1/rerank", rerank, api_errors.openai, "Rerank documents (Cohere, Jina)"),
    Route("POST", "/v2/rerank", rerank_v2, api_errors.cohere, "Rerank documents (Cohere v2)"),
    Route("POST", "/v2/embed", embed_v2, api_errors.cohere, "Embeddings by type (Cohere v2)"),
)
