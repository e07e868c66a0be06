"""POST /v1/rerank in the shape Cohere's and Jina's rerank APIs share (and infinity, vLLM and
LiteLLM speak): `query`, `documents`, `top_n`, `return_documents`; answered with `results` of
`index` and `relevance_score`, best first."""

from __future__ import annotations

from typing import TYPE_CHECKING

from numaserve.http import errors
from numaserve.http.connection import Request, Response
from numaserve.http.errors import ApiError
from numaserve.http.routing import Route, flag, json_body, ok

if TYPE_CHECKING:
    from numaserve.http.app import App


async def rerank(app: App, request: Request) -> Response:
    body = json_body(request)
    model = app.model(body.get("model") if app.spec.named else None)
    if model.model.task != "rerank":
        raise ApiError(422, f"model {model.name!r} serves {model.model.task}, not rerank")
    documents = [_text(d, i) for i, d in enumerate(_list(body.get("documents")))]
    top_n = body.get("top_n")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise ApiError(422, "top_n must be an integer of at least 1")
    results = await app.run(
        request, model, "rerank", documents, query=body.get("query"), top_k=top_n
    )
    results = sorted(results, key=lambda r: -r["score"])  # top_k answers so already
    with_documents = flag(body, "return_documents", False)
    return ok(
        {
            "model": body.get("model") or model.name,
            "results": [
                {
                    "index": r["index"],
                    "relevance_score": r["score"],
                    **({"document": {"text": documents[r["index"]]}} if with_documents else {}),
                }
                for r in results
            ],
            "usage": {"total_tokens": sum(r["tokens"] for r in results)},
        }
    )


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


ROUTES = (Route("POST", "/v1/rerank", rerank, errors.openai, "Rerank documents (Cohere, Jina)"),)
