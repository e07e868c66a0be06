"""Late chunking (Jina's): a long document runs once through the encoder at its full length,
and each chunk's vector is pooled from its own tokens' vectors of that one pass, so that every
chunk's vector has read the whole document around it. A request says where its chunks are: a
chunk size in tokens (`{"tokens": N}`: each text's tokens, special tokens aside, N at a time)
or each text's chunks as character spans (`{"spans": [[[start, end], ...], ...]}`, a list of
spans per text, `end` excluded). A chunk's vector is the mean of its tokens' vectors, then the
model's Dense modules and Normalize, as its pooling runs them after the mean.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from numaserve.tasks.base import Bad

if TYPE_CHECKING:
    import numpy as np

    from numaserve.tasks.pooling import Pooling

MAX_CHUNKS = 512  # a text's chunks, at most: each is a vector in the reply


def late_chunking_option(body: dict, bad: Bad) -> dict | None:
    """The request's late_chunking, checked: {"tokens": N} or {"spans": one list a text}."""
    option = body.get("late_chunking")
    if option is None:
        return None
    texts = body.get("texts")
    count = len(texts) if isinstance(texts, list) else 1
    if isinstance(option, dict) and set(option) == {"tokens"}:
        size = option["tokens"]
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise bad("late_chunking.tokens must be an integer of at least 1")
        return {"tokens": size}
    if isinstance(option, dict) and set(option) == {"spans"}:
        spans = option["spans"]
        if not isinstance(spans, list) or len(spans) != count:
            raise bad(
                f"late_chunking.spans must hold a list of spans for each of the {count} texts"
            )
        for i, text_spans in enumerate(spans):
            if not isinstance(text_spans, list) or not 0 < len(text_spans) <= MAX_CHUNKS:
                raise bad(f"late_chunking.spans[{i}] must be a list of 1-{MAX_CHUNKS} spans")
            for span in text_spans:
                if not (
                    isinstance(span, list)
                    and len(span) == 2
                    and all(type(x) is int for x in span)
                    and 0 <= span[0] < span[1]
                ):
                    raise bad(
                        f"late_chunking.spans[{i}]: each span is [start, end], character "
                        "offsets with 0 <= start < end"
                    )
        return {"spans": [[tuple(s) for s in text_spans] for text_spans in spans]}
    raise bad('late_chunking must be {"tokens": N} or {"spans": [[[start, end], ...], ...]}')


def chunk_tokens(option: dict, index: int, tokens, shift: int) -> list[list[int]]:
    """Each chunk's token positions in text `index`, from the tokenizer's `tokens`
    (tasks/tokens.py); `shift`: the characters a prompt put before the text."""
    content = [i for i, special in enumerate(tokens.special) if not special]
    if "tokens" in option:
        size = option["tokens"]
        return [content[i : i + size] for i in range(0, len(content), size)][:MAX_CHUNKS]
    chunks = []
    for start, end in option["spans"][index]:
        start, end = start + shift, end + shift
        chunks.append(
            [i for i in content if tokens.offsets[i][0] < end and tokens.offsets[i][1] > start]
        )
    return chunks


def chunk_vectors(rows: np.ndarray, chunks: list[list[int]], pooling: Pooling) -> np.ndarray:
    """Each chunk's vector from the text's token vectors `rows`: its tokens' mean, then the
    model's Dense modules and Normalize. A chunk with no token (a span past a text's cut) is
    a zero vector."""
    import numpy as np

    means = np.stack(
        [rows[c].mean(axis=0) if c else np.zeros(rows.shape[1], np.float32) for c in chunks]
    ).astype(np.float32)
    for layer in pooling.dense:
        means = layer(means)
    if pooling.normalize:
        norms = np.linalg.norm(means, axis=1, keepdims=True)
        means = np.where(norms > 0, means / np.maximum(norms, 1e-12), means)
    return means.astype(np.float32)
