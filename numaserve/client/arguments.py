"""A call's arguments checked before anything is sent: a TypeError or ValueError that names
the argument, not a traceback from deep inside msgpack or the server's bad_request."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from numaserve.tasks import TASKS
from numaserve.tasks.ner import AGGREGATIONS

Texts = str | tuple[str, str] | Sequence[str | tuple[str, str]]  # one text or pair, or a list


def as_batch(texts: Texts, argument: str = "texts", pairs: bool = True) -> tuple[list, bool]:
    """(the texts as a list, whether one text or pair was given rather than a list); a
    TypeError naming the argument for anything else."""
    single = isinstance(texts, (str, tuple))
    unordered = isinstance(texts, (bytes, bytearray, dict, set, frozenset))
    if not single and (unordered or not isinstance(texts, Iterable)):
        raise TypeError(f"{argument}: expected {_expected(pairs)}; got {_describe(texts)}")
    batch = [texts] if single else list(texts)
    for item in batch:
        if not _is_text(item, pairs):
            raise TypeError(f"{argument}: expected {_expected(pairs)}; got {_describe(item)}")
    return batch, single


def _expected(pairs: bool) -> str:
    return (
        "a string, a (text, text) pair, or a list of them"
        if pairs
        else "a string or a list of strings"
    )


def _is_text(item, pairs: bool) -> bool:
    if isinstance(item, str):
        return True
    return (
        pairs
        and isinstance(item, tuple)
        and len(item) == 2
        and all(isinstance(x, str) for x in item)
    )


def _describe(value) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def check_deadline(deadline_ms) -> None:
    if deadline_ms is not None and (
        isinstance(deadline_ms, bool)
        or not isinstance(deadline_ms, (int, float))
        or not deadline_ms > 0
    ):
        raise ValueError(f"deadline_ms: milliseconds above 0, or None; got {deadline_ms!r}")


def rerank_fields(query, documents, top_k, max_chunks_per_doc=None) -> tuple[list, dict]:
    """A rerank's documents and its fields. `max_chunks_per_doc`: the windows a document
    longer than the model reads is scored in (its best window's score); 1 cuts it; None,
    the server's model.max_chunks_per_doc."""
    if not isinstance(query, str):
        raise TypeError(f"query: expected a string; got {_describe(query)}")
    batch, single = as_batch(documents, "documents", pairs=False)
    if single:
        raise TypeError("documents: expected a list of strings; got one string")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k: a whole number, 1 or more, or None; got {top_k!r}")
    return batch, {"query": query, "top_k": top_k, **chunks_field(max_chunks_per_doc)}


def chunks_field(chunks) -> dict:
    """The request's max_chunks_per_doc where one is given: the windows a text longer than
    the model reads may be read in (1: it is cut); none leaves the server's default."""
    if chunks is None:
        return {}
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise ValueError(f"max_chunks_per_doc: a whole number, 1 or more, or None; got {chunks!r}")
    return {"max_chunks_per_doc": chunks}


def raw_scores_field(raw_scores) -> dict:
    """The request's raw_scores where asked for (results then carry the model's logits)."""
    if not isinstance(raw_scores, bool):
        raise TypeError(f"raw_scores: True or False; got {_describe(raw_scores)}")
    return {"raw_scores": True} if raw_scores else {}


def late_chunking_field(chunk_tokens, spans, single: bool) -> dict:
    """The request's late_chunking: a chunk size in tokens, or each text's spans."""
    if (chunk_tokens is None) == (spans is None):
        raise TypeError("late chunking takes chunk_tokens or spans, one of the two")
    if chunk_tokens is not None:
        return {"tokens": chunk_tokens}
    every = [spans] if single else spans
    return {"spans": [[list(span) for span in text_spans] for text_spans in every]}


def pool_field(pool_factor) -> dict:
    """A multivector request's pool_factor where one is given."""
    if pool_factor is None:
        return {}
    if isinstance(pool_factor, bool) or not isinstance(pool_factor, int | float):
        raise TypeError(
            f"pool_factor: a number of at least 1, or None; got {_describe(pool_factor)}"
        )
    return {"pool_factor": pool_factor}


def prompt_field(prompt_name) -> dict:
    """The request's prompt_name where one is given: none leaves the model's default."""
    if prompt_name is None:
        return {}
    if not isinstance(prompt_name, str) or not prompt_name:
        raise TypeError(f"prompt_name: a prompt's name, or None; got {_describe(prompt_name)}")
    return {"prompt_name": prompt_name}


def check_aggregation(aggregation) -> None:
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation: one of {', '.join(AGGREGATIONS)}; got {aggregation!r}")


def results(op: str, body: dict, single: bool):
    items = [TASKS[op].from_wire(result) for result in body["results"]]
    return items[0] if single else items
