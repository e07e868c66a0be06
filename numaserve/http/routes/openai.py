"""OpenAI's embeddings API: POST /v1/embeddings and GET /v1/models, in its shapes and with its
errors, as its SDK and the frameworks built on it (LangChain, LlamaIndex) call them; and
vLLM's `truncate_prompt_tokens` on it, for clients written against vLLM."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING

from numaserve.front import inputs
from numaserve.front.errors import ApiError
from numaserve.http import api_errors
from numaserve.http.connection import Request, Response
from numaserve.http.routing import Route, json_body, ok

if TYPE_CHECKING:
    from numaserve.http.app import App

ENCODINGS = ("float", "base64")


async def embeddings(app: App, request: Request) -> Response:
    body = json_body(request)
    model = app.core.model(body.get("model") if app.spec.named else None)
    if model.model.task != "embed":
        raise ApiError(422, f"model {model.name!r} serves {model.model.task}, not embeddings")
    encoding = body.get("encoding_format") or "float"
    if encoding not in ENCODINGS:
        raise ApiError(422, f"encoding_format must be one of {', '.join(ENCODINGS)}")
    dimensions = inputs.dimensions_of(body)
    texts = inputs.texts(app.core, model, inputs.given(body, "input"), "input")
    texts, cutting = _last_prompt_tokens(app, model, texts, body.get("truncate_prompt_tokens"))
    results = await app.core.run(request, model, "embed", texts, **cutting)
    vectors = inputs.embeddings(results, dimensions, normalize=dimensions is not None)
    if encoding == "base64":  # the little-endian float32 bytes, as the SDK decodes them
        vectors = [base64.b64encode(v.astype("<f4").tobytes()).decode() for v in vectors]
    tokens = inputs.prompt_tokens(results)
    return ok(
        {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)
            ],
            "model": body.get("model") or model.name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )


def _last_prompt_tokens(app: App, model, texts: list[str], most: object) -> tuple[list, dict]:
    """vLLM's `truncate_prompt_tokens`: each text's last `most` tokens, special tokens
    counted (-1: as many as the model takes), cut on the left."""
    if most is None:
        return texts, {}
    limit = model.model.max_length
    special = app.core.tokenizer(model).num_special_tokens_to_add(False)
    if (
        isinstance(most, bool)
        or not isinstance(most, int)
        or not (most == -1 or special < most <= limit)
    ):
        raise ApiError(
            422,
            f"truncate_prompt_tokens must be -1 (the model's limit, {limit} tokens) or a number "
            f"of tokens from {special + 1} to {limit} ({special} of them the model's special "
            "tokens)",
        )
    if most != -1:
        texts = [
            inputs.kept_tokens(app.core, model, text, most - special, left=True) for text in texts
        ]
    return texts, {"truncate": True, "truncation_direction": "left"}


async def models(app: App, request: Request) -> Response:
    return ok(
        {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": app.core.started,
                    "owned_by": "numaserve",
                }
                for name in app.core.models
            ],
        }
    )


ROUTES = (
    Route("POST", "/v1/embeddings", embeddings, api_errors.openai, "Embeddings (OpenAI)"),
    Route("GET", "/v1/models", models, api_errors.openai, "The models served (OpenAI)"),
)
