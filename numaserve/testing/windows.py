"""A long document's windows cut by hand, as a reranker's reference scores them one by one:
for tests and benchmarks that check the router's windows (tokenizer.encode_windows) against
sentence-transformers' CrossEncoder.

The document is made of words that are one token each, so that each window decodes to a text
that tokenizes back to the same tokens, and CrossEncoder can score it as a text of its own.
"""

from __future__ import annotations

WORDS = [
    "foxes",
    "live",
    "in",
    "holes",
    "and",
    "forests",
    "where",
    "they",
    "hunt",
    "small",
    "animals",
    "at",
    "night",
]


def document(words: int) -> str:
    """`words` one-token words."""
    return " ".join(WORDS[i % len(WORDS)] for i in range(words))


def windows_by_hand(tokenizer, query: str, text: str, max_length: int) -> list[str]:
    """`text`'s windows beside `query`, each decoded to a text: max_length less the query and
    the pair's three special tokens, each overlapping the next by a quarter of that.
    `tokenizer`: transformers' tokenizer of the model."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    room = max_length - 3 - len(tokenizer(query, add_special_tokens=False)["input_ids"])
    step = room - room // 4
    starts = range(0, max(1, len(ids) - room + step), step)
    return [tokenizer.decode(ids[s : s + room]) for s in starts]
