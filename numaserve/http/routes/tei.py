"""text-embeddings-inference's routes, with its request and response shapes (its
docs/openapi.json is the contract; tests/fixtures/tei/ holds the copy the tests validate by).

`truncate` is the request's choice over the server's `model.truncate`, and
`truncation_direction` (Right or Left) which end a cut takes away; `prompt_name` names one of
an embedding model's own prompts; `raw_scores` answers the model's logits as the scores. A
`models:` server takes the model's name in the body's `model` or the query's `?model=`.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING

from numaserve.front import facts, inputs
from numaserve.front.errors import ApiError
from numaserve.http import api_errors
from numaserve.http.connection import Request, Response
from numaserve.http.routing import Route, flag, json_body, ok
from numaserve.processes.specs import FrontModel
from numaserve.tasks import serves
from numaserve.tasks.embed import EMBED
from numaserve.tasks.multivector import MULTIVECTOR
from numaserve.tasks.sparse import weights
from numaserve.wire.protocol import TRUNCATION_DIRECTIONS

if TYPE_CHECKING:
    from numaserve.http.app import App

# Which of the routes below serves each task, for POST / and /invocations.
BY_TASK = {
    "embed": "/embed",
    "classify": "/predict",
    "rerank": "/rerank",
    "ner": "/ner",
    "sparse": "/embed_sparse",
    "multivector": "/embed_all",
}


def check_task(model: FrontModel, route: str) -> None:
    if BY_TASK.get(model.model.task) != route:
        raise ApiError(
            422,
            f"model {model.name!r} serves {model.model.task}, at {BY_TASK[model.model.task]}; "
            f"{route} is for {next(t for t, r in BY_TASK.items() if r == route)} models (POST / "
            "and /invocations go to each model's own route)",
        )


def cutting(body: dict) -> dict:
    """A request's `truncate` and `truncation_direction` (TEI spells it Right or Left), as
    the protocol has them."""
    direction = body.get("truncation_direction")
    if direction is not None:
        if not isinstance(direction, str) or direction.lower() not in TRUNCATION_DIRECTIONS:
            raise ApiError(422, "truncation_direction must be Right or Left")
        direction = direction.lower()
    return {"truncate": body.get("truncate"), "truncation_direction": direction}


async def embed(app: App, request: Request) -> Response:
    body = json_body(request)
    model = app.model_of(request, body)
    check_task(model, "/embed")
    dimensions = inputs.dimensions_of(body)
    texts = inputs.texts(app.core, model, inputs.given(body, "inputs"), "inputs")
    late = body.get("late_chunking")
    results = await app.core.run(
        request,
        model,
        "embed",
        texts,
        prompt_name=body.get("prompt_name"),
        late_chunking=late,
        **cutting(body),
    )
    if late is not None:  # each text's chunks' vectors, late chunking's
        return ok([EMBED.from_wire(r).vectors.tolist() for r in results])
    return ok(inputs.embeddings(results, dimensions, flag(body, "normalize", True)))


async def embed_all(app: App, request: Request) -> Response:
    """Each text's token vectors (TEI): an embedding model's, unpooled; a late-interaction
    model's, one per token that counts, read as a query or a document (`prompt_name`)."""
    body = json_body(request)
    model = app.model_of(request, body)
    if model.model.task == "multivector":
        return await _multi_vectors(app, request, body, model)
    check_task(model, "/embed")
    texts = inputs.texts(app.core, model, inputs.given(body, "inputs"), "inputs")
    results = await app.core.run(
        request,
        model,
        "embed",
        texts,
        prompt_name=body.get("prompt_name"),
        token_vectors=True,
        **cutting(body),
    )
    return ok([EMBED.from_wire(r).vectors.tolist() for r in results])


async def _multi_vectors(app: App, request: Request, body: dict, model: FrontModel) -> Response:
    """A late-interaction model's vectors of each text, in the type a vector store keeps
    (`embedding_type`: float, float16, int8, uint8, binary, ubinary), as JSON's numbers or
    (`encoding_format: base64`) each vector's little-endian bytes in base64."""
    kind = body.get("embedding_type") or "float"
    if kind not in inputs.STORED_TYPES:
        raise ApiError(422, f"embedding_type must be one of {', '.join(inputs.STORED_TYPES)}")
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise ApiError(422, "encoding_format must be float (numbers) or base64 (bytes)")
    texts = inputs.texts(app.core, model, inputs.given(body, "inputs"), "inputs")
    options = {"prompt_name": body.get("prompt_name"), "pool_factor": body.get("pool_factor")}
    results = await app.core.run(request, model, "multivector", texts, **options, **cutting(body))
    rows = [inputs.stored(MULTIVECTOR.from_wire(r).vectors, kind) for r in results]
    if encoding == "base64":
        return ok([[base64.b64encode(row.tobytes()).decode() for row in m] for m in rows])
    return ok([m.tolist() for m in rows])


async def embed_sparse(app: App, request: Request) -> Response:
    """A SPLADE model's non-zero weights of each text, by vocabulary index (TEI)."""
    body = json_body(request)
    model = app.model_of(request, body)
    check_task(model, "/embed_sparse")
    texts = inputs.texts(app.core, model, inputs.given(body, "inputs"), "inputs")
    results = await app.core.run(request, model, "sparse", texts, **cutting(body))
    return ok([_sparse_values(*weights(r)) for r in results])


def _sparse_values(indices, values) -> list[dict]:
    """TEI's SparseValue list."""
    return [
        {"index": i, "value": v} for i, v in zip(indices.tolist(), values.tolist(), strict=True)
    ]


async def similarity(app: App, request: Request) -> Response:
    """Each sentence's cosine to the source sentence, from their embeddings (TEI)."""
    body = json_body(request)
    model = app.model_of(request, body)
    if model.model.task != "embed":
        raise ApiError(
            424,
            f"model {model.name!r} serves {model.model.task}; /similarity compares "
            "embeddings, which an embed model makes",
        )
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise ApiError(422, "parameters must be an object")
    given = body.get("inputs")
    if not isinstance(given, dict):
        raise ApiError(422, 'inputs must be {"source_sentence": text, "sentences": [texts]}')
    source, sentences = given.get("source_sentence"), given.get("sentences")
    if not isinstance(source, str):
        raise ApiError(422, "inputs.source_sentence must be a text")
    if not isinstance(sentences, list) or not sentences:
        raise ApiError(422, "inputs.sentences must be a non-empty list of texts", "Empty")
    texts = inputs.texts(app.core, model, [source, *sentences], "inputs.sentences")
    prompt = parameters.get("prompt_name")
    results = await app.core.run(
        request, model, "embed", texts, prompt_name=prompt, **cutting(parameters)
    )
    first, *others = inputs.embeddings(results, None, True)
    return ok([float(first @ vector) for vector in others])


async def predict(app: App, request: Request) -> Response:
    body = json_body(request)
    model = app.model_of(request, body)
    check_task(model, "/predict")
    texts, single = predict_inputs(inputs.given(body, "inputs"))
    raw = body.get("raw_scores")
    results = await app.core.run(request, model, "classify", texts, raw_scores=raw, **cutting(body))
    scores = "logits" if raw else "probs"
    ranked = [
        [
            {"label": label, "score": p}
            for label, p in facts.predictions(model.model.path, r[scores])
        ]
        for r in results
    ]
    return ok(ranked[0] if single else ranked)


def predict_inputs(value: object) -> tuple[list, bool]:
    """TEI's PredictInput: a text, a pair [a, b], or a batch of [a] and [a, b]; and whether it
    was one (answered with one list of predictions, not a list of them)."""
    if isinstance(value, str):
        return [value], True
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        if len(value) > 2:  # as TEI: a list of strings is one text or one pair
            raise ApiError(422, "inputs: a list of strings is a text [a] or a pair [a, b]")
        return [value[0] if len(value) == 1 else value], True
    if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        batch = []
        for i, item in enumerate(value):
            if len(item) == 1 and isinstance(item[0], str):
                batch.append(item[0])
            elif len(item) == 2 and all(isinstance(v, str) for v in item):
                batch.append(item)
            else:
                raise ApiError(422, f"inputs[{i}] must be [text] or a pair [text, text]")
        return batch, False
    raise ApiError(
        422, "inputs must be a text, a pair [text, text], or a batch of [text] and [text, text]"
    )


async def rerank(app: App, request: Request) -> Response:
    body = json_body(request)
    model = app.model_of(request, body)
    if not serves(model.model.task, "rerank"):  # a cross-encoder, or late interaction's MaxSim
        check_task(model, "/rerank")
    documents, raw = body.get("texts"), body.get("raw_scores")
    results = await app.core.run(
        request,
        model,
        "rerank",
        documents,
        query=body.get("query"),
        raw_scores=raw,
        max_chunks_per_doc=body.get("max_chunks_per_doc"),
        **cutting(body),
    )
    with_text = flag(body, "return_text", False)
    ranks = sorted(results, key=lambda r: -r["score"])
    return ok(
        [
            {
                "index": r["index"],
                "score": r["logit" if raw else "score"],
                **({"text": documents[r["index"]]} if with_text else {}),
                **inputs.chunks(r),
            }
            for r in ranks
        ]
    )


async def tokenize(app: App, request: Request) -> Response:
    body = json_body(request)
    model = app.model_of(request, body)
    value = inputs.given(body, "inputs")
    texts = [value] if isinstance(value, str) else value
    if isinstance(texts, list) and not texts:
        raise ApiError(422, "inputs is an empty list: give at least one text", "Empty")
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise ApiError(422, "inputs must be a string or a non-empty list of strings")
    app.core.check_count(texts)
    special = flag(body, "add_special_tokens", True)
    tokenizer = app.core.tokenizer(model)
    return ok([inputs.tokens(tokenizer.encode(t, add_special_tokens=special), t) for t in texts])


async def decode(app: App, request: Request) -> Response:
    body = json_body(request)
    model = app.model_of(request, body)
    ids = body.get("ids")
    batch = (
        ids if isinstance(ids, list) and ids and all(isinstance(i, list) for i in ids) else [ids]
    )
    skip = flag(body, "skip_special_tokens", True)
    return ok([inputs.decode(app.core, model, one, "ids", skip) for one in batch])


async def info(app: App, request: Request) -> Response:
    return ok(facts.info(app.core, app.model_of(request, {})))


async def health(app: App, request: Request) -> Response:
    """200 while some instance of every model can serve; 503 (TEI's Unhealthy) when not.
    Asked by `ping`, which a shard answers from what it knows (its ready instances and its
    ready peers'), not by `status`, which builds the whole server's report."""
    try:
        down = [m.name for m in app.core.models.values() if not await app.core.serving(m)]
    except ApiError as e:
        return api_errors.tei(ApiError(503, e.message, "Unhealthy"))
    if down:
        return api_errors.tei(
            ApiError(503, f"no instance ready for {', '.join(down)}", "Unhealthy")
        )
    return Response(200, b"", content_type="text/plain")


def _post(path: str, handler, summary: str) -> Route:
    return Route("POST", path, handler, api_errors.tei, summary)


ROUTES = (
    _post("/embed", embed, "Embeddings of texts (TEI)"),
    _post("/predict", predict, "A classifier's labels and scores for texts or pairs (TEI)"),
    _post("/rerank", rerank, "A cross-encoder's scores for a query and texts, best first (TEI)"),
    _post(
        "/embed_all",
        embed_all,
        "Each text's token vectors (TEI): unpooled, or a late-interaction model's",
    ),
    _post("/embed_sparse", embed_sparse, "A SPLADE model's sparse embeddings of texts (TEI)"),
    _post("/similarity", similarity, "Each sentence's cosine to a source sentence (TEI)"),
    _post("/tokenize", tokenize, "The model's tokens of texts (TEI)"),
    _post("/decode", decode, "Token ids back to text (TEI)"),
    Route("GET", "/info", info, api_errors.tei, "The served model and the server's limits (TEI)"),
    Route(
        "GET", "/health", health, api_errors.tei, "200 while every model can serve (TEI)", open=True
    ),
)
