"""/openapi.json: every route, its request and its answers, as OpenAPI 3.0.

The schemas of TEI's routes are TEI's own (its docs/openapi.json), so that a client generated
from either works with both; where numaserve takes more (`model`, for a `models:` server) the
schema says so.
"""

from __future__ import annotations

from numaserve import __version__
from numaserve.tasks.base import MAX_WINDOWS

STRINGS = {"type": "array", "items": {"type": "string"}}
IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}}
INPUT = {"oneOf": [{"type": "string"}, STRINGS, IDS, {"type": "array", "items": IDS}]}
MODEL = {"type": "string", "nullable": True, "description": "The model, where several are served"}
PAIR = {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2}
VECTOR = {"type": "array", "items": {"type": "number", "format": "float"}}
PREDICTION = {
    "type": "object",
    "required": ["label", "score"],
    "properties": {"label": {"type": "string"}, "score": {"type": "number"}},
}
ENTITY = {
    "type": "object",
    "required": ["label", "score", "start", "end", "text"],
    "properties": {
        "label": {"type": "string"},
        "score": {"type": "number"},
        "start": {"type": "integer"},
        "end": {"type": "integer"},
        "text": {"type": "string"},
        "index": {"type": "integer", "nullable": True},
    },
}


DIRECTION = {"type": "string", "enum": ["Left", "Right"], "default": "Right"}  # TEI's


CUTTING = {"truncate": {"type": "boolean", "nullable": True}, "truncation_direction": DIRECTION}
# A long document's windows, at most (1: it is cut); default the model's max_chunks_per_doc.
CHUNKS = {"type": "integer", "minimum": 1, "maximum": MAX_WINDOWS, "nullable": True}


def _object(required: list[str], **properties) -> dict:
    return {"type": "object", "required": required, "properties": properties}


REQUESTS = {
    "/embed": _object(
        ["inputs"],
        inputs=INPUT,
        prompt_name={"type": "string", "nullable": True},
        normalize={"type": "boolean", "default": True},
        dimensions={"type": "integer", "minimum": 1, "nullable": True},
        **CUTTING,
        model=MODEL,
    ),
    "/predict": _object(
        ["inputs"],
        inputs={
            "oneOf": [
                {"type": "string"},
                PAIR,
                {"type": "array", "items": {"oneOf": [{**STRINGS, "maxItems": 1}, PAIR]}},
            ]
        },
        raw_scores={"type": "boolean", "default": False},
        **CUTTING,
        model=MODEL,
    ),
    "/rerank": _object(
        ["query", "texts"],
        query={"type": "string"},
        texts=STRINGS,
        return_text={"type": "boolean", "default": False},
        raw_scores={"type": "boolean", "default": False},
        max_chunks_per_doc=CHUNKS,
        **CUTTING,
        model=MODEL,
    ),
    "/embed_all": _object(
        ["inputs"],
        inputs=INPUT,
        prompt_name={"type": "string", "nullable": True},
        **CUTTING,
        model=MODEL,
    ),
    "/embed_sparse": _object(
        ["inputs"],
        inputs=INPUT,
        **CUTTING,
        model=MODEL,
    ),
    "/similarity": _object(
        ["inputs"],
        inputs=_object(
            ["source_sentence", "sentences"], source_sentence={"type": "string"}, sentences=STRINGS
        ),
        parameters={
            "type": "object",
            "nullable": True,
            "properties": {
                "prompt_name": {"type": "string", "nullable": True},
                "truncate": {"type": "boolean", "nullable": True},
                "truncation_direction": DIRECTION,
            },
        },
        model=MODEL,
    ),
    "/tokenize": _object(
        ["inputs"],
        inputs={"oneOf": [{"type": "string"}, STRINGS]},
        add_special_tokens={"type": "boolean", "default": True},
        model=MODEL,
    ),
    "/decode": _object(
        ["ids"],
        ids={"oneOf": [IDS, {"type": "array", "items": IDS}]},
        skip_special_tokens={"type": "boolean", "default": True},
        model=MODEL,
    ),
    "/ner": _object(
        ["inputs"],
        inputs={"oneOf": [{"type": "string"}, STRINGS]},
        aggregation={"type": "string", "enum": ["none", "simple", "first", "average", "max"]},
        **CUTTING,
        model=MODEL,
    ),
    "/v1/embeddings": _object(
        ["input"],
        input=INPUT,
        model=MODEL,
        encoding_format={"type": "string", "enum": ["float", "base64"], "default": "float"},
        dimensions={"type": "integer", "minimum": 1, "nullable": True},
        truncate_prompt_tokens={"type": "integer", "minimum": -1, "nullable": True},
        user={"type": "string", "nullable": True},
    ),
    "/v1/rerank": _object(
        ["query", "documents"],
        model=MODEL,
        query={"type": "string"},
        documents={
            "type": "array",
            "items": {"oneOf": [{"type": "string"}, _object(["text"], text={"type": "string"})]},
        },
        top_n={"type": "integer", "minimum": 1, "nullable": True},
        return_documents={"type": "boolean", "default": False},
        max_chunks_per_doc=CHUNKS,
    ),
    "/v2/rerank": _object(
        ["query", "documents"],
        model=MODEL,
        query={"type": "string"},
        documents=STRINGS,
        top_n={"type": "integer", "minimum": 1, "nullable": True},
        max_tokens_per_doc={"type": "integer", "minimum": 1, "nullable": True},
        max_chunks_per_doc=CHUNKS,
    ),
    "/v2/embed": _object(
        ["texts"],
        model=MODEL,
        texts=STRINGS,
        input_type={
            "type": "string",
            "enum": ["search_query", "search_document", "classification", "clustering"],
        },
        embedding_types={
            "type": "array",
            "items": {"type": "string", "enum": ["float", "int8", "uint8", "binary", "ubinary"]},
        },
        truncate={"type": "string", "enum": ["END", "START", "NONE"], "default": "END"},
        output_dimension={"type": "integer", "minimum": 1, "nullable": True},
    ),
}
ANSWERS = {
    "/embed": {"type": "array", "items": VECTOR},
    "/similarity": {"type": "array", "items": {"type": "number"}},
    "/embed_all": {"type": "array", "items": {"type": "array", "items": VECTOR}},
    "/embed_sparse": {
        "type": "array",
        "items": {
            "type": "array",
            "items": _object(
                ["index", "value"], index={"type": "integer"}, value={"type": "number"}
            ),
        },
    },
    "/predict": {
        "oneOf": [
            {"type": "array", "items": PREDICTION},
            {"type": "array", "items": {"type": "array", "items": PREDICTION}},
        ]
    },
    "/rerank": {
        "type": "array",
        "items": _object(
            ["index", "score"],
            index={"type": "integer"},
            score={"type": "number"},
            text={"type": "string"},
        ),
    },
    "/tokenize": {
        "type": "array",
        "items": {
            "type": "array",
            "items": _object(
                ["id", "text", "special"],
                id={"type": "integer"},
                text={"type": "string"},
                special={"type": "boolean"},
                start={"type": "integer", "nullable": True},
                stop={"type": "integer", "nullable": True},
            ),
        },
    },
    "/decode": STRINGS,
    "/ner": {
        "oneOf": [
            {"type": "array", "items": ENTITY},
            {"type": "array", "items": {"type": "array", "items": ENTITY}},
        ]
    },
    "/v1/embeddings": _object(
        ["object", "data", "model", "usage"],
        object={"type": "string"},
        data={
            "type": "array",
            "items": _object(
                ["object", "embedding", "index"],
                object={"type": "string"},
                index={"type": "integer"},
                embedding={"oneOf": [VECTOR, {"type": "string", "format": "byte"}]},
            ),
        },
        model={"type": "string"},
        usage=_object(
            ["prompt_tokens", "total_tokens"],
            prompt_tokens={"type": "integer"},
            total_tokens={"type": "integer"},
        ),
    ),
    "/v1/rerank": _object(
        ["results"],
        model={"type": "string"},
        results={
            "type": "array",
            "items": _object(
                ["index", "relevance_score"],
                index={"type": "integer"},
                relevance_score={"type": "number"},
                document=_object(["text"], text={"type": "string"}),
            ),
        },
    ),
}
ERRORS = {
    "tei": _object(
        ["error", "error_type"], error={"type": "string"}, error_type={"type": "string"}
    ),
    "openai": _object(
        ["error"],
        error=_object(
            ["message", "type"],
            message={"type": "string"},
            type={"type": "string"},
            param={"type": "string", "nullable": True},
            code={"type": "string", "nullable": True},
        ),
    ),
    "cohere": _object(["message"], message={"type": "string"}),
}
STATUSES = {
    "400": "Malformed JSON, or no model named where several are served",
    "401": "No API key, or one not accepted (server.http_api_keys_file)",
    "404": "No such model",
    "413": "Too many inputs (server.max_texts), or a body over server.http_max_body_bytes",
    "422": "A request that is not valid, or a text too long (model.truncate: false)",
    "424": "The model failed",
    "429": "Overloaded: retry after Retry-After seconds",
    "503": "No instance can serve now",
}


PRIORITY = {
    "name": "X-Priority",
    "in": "header",
    "required": False,
    "description": "interactive (the default: the API key's, else interactive) or bulk: "
    "served after interactive requests, and shed first under load",
    "schema": {"type": "string", "enum": ["interactive", "bulk"]},
}
TRUNCATED = {
    "description": "The indexes of the inputs cut to the model's length, comma-separated; "
    "absent where every input was read whole",
    "schema": {"type": "string"},
}


def document(app) -> dict:
    paths: dict[str, dict] = {}
    for route in app.routes.values():
        if not route.described:
            continue
        shape = route.error.__name__  # api_errors.openai or api_errors.tei
        error = {"application/json": {"schema": {"$ref": f"#/components/schemas/{shape}_error"}}}
        operation: dict = {"summary": route.summary, "responses": {"200": {"description": "OK"}}}
        answer = ANSWERS.get(route.path)
        if answer is not None:
            operation["responses"]["200"]["content"] = {"application/json": {"schema": answer}}
        request = REQUESTS.get(route.path)
        if request is not None:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": request}},
            }
        if route.method == "POST":
            operation["responses"] |= {
                code: {"description": why, "content": error} for code, why in STATUSES.items()
            }
            if request is not None:  # a route that runs the model
                operation["parameters"] = [PRIORITY]
                operation["responses"]["200"]["headers"] = {"X-Truncated-Inputs": TRUNCATED}
        if not route.open:
            operation["security"] = [{"bearer": []}] if app.core.keys.path else []
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "numaserve",
            "version": __version__,
            "description": "TEI's routes, OpenAI's embeddings, a Cohere/Jina-style rerank, "
            "and numaserve's own; served models: " + ", ".join(app.core.models),
        },
        "paths": paths,
        "components": {
            "schemas": {f"{k}_error": v for k, v in ERRORS.items()},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
