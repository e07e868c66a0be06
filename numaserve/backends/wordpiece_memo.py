"""BERT WordPiece tokenizing with a per-word memo, for the plain-ASCII texts most traffic is.

The router tokenizes every request on its own core, and the `tokenizers` library spends about
27 us on an 18-token text there: mostly normalizing, splitting and building its Encoding,
not looking words up. Real traffic repeats words far more than texts. For a BERT-style
tokenizer (BertNormalizer, BertPreTokenizer, WordPiece) and a text of printable ASCII, the
normalizer only maps tab and newlines to spaces and lowercases, and the pre-tokenizer splits
at spaces and isolates each punctuation character. So a text is split at spaces here, and each
chunk ("fox,") is split into words and punctuation by a regular expression and its pieces
taken from the library's own WordPiece model once, then from the memo.

Any text that could differ goes to the library instead: non-ASCII, control characters (the
normalizer deletes them), and any text holding an added token's content ("[MASK]" is one
token, not three). tests/test_wordpiece_memo.py checks the equality against the library on
random texts.
"""

from __future__ import annotations

import json
import re

from tokenizers import Tokenizer as FastTokenizer

# Printable ASCII, space, tab, CR and LF: the texts whose BertNormalizer output is known here.
_NOT_PLAIN = re.compile(r"[^\x20-\x7e\t\n\r]")
# BertPreTokenizer on printable ASCII: runs of letters and digits, and each other character
# that is not a space on its own (every one of them is ASCII punctuation).
_WORDS = re.compile(r"[A-Za-z0-9]+|[^A-Za-z0-9\s]")
CHUNK_LIMIT = 100_000  # chunks remembered before the memo starts again (about 25 MB at most)
LONGEST_CHUNK = 48  # longer ones are rare and would let a hostile text fill memory


class WordPieceMemo:
    """A text's ids as the library's `encode` gives them (special tokens added, cut to
    `max_length` as its right-side truncation cuts), or None where the library must
    tokenize it."""

    def __init__(self, raw: FastTokenizer, max_length: int, lowercase: bool, added: list[str]):
        self.model = raw.model
        # The special tokens the post-processor puts around a single text.
        inner = raw.encode("a", add_special_tokens=False).ids
        outer = raw.encode("a").ids
        start = next(i for i in range(len(outer)) if outer[i : i + len(inner)] == inner)
        self.prefix, self.suffix = outer[:start], outer[start + len(inner) :]
        self.room = max_length - len(self.prefix) - len(self.suffix)
        self.lowercase = lowercase
        self.added = (
            re.compile("|".join(re.escape(a) for a in added), re.IGNORECASE) if added else None
        )
        self.chunks: dict[str, tuple[int, ...]] = {}  # "fox," -> the ids of "fox" and ","

    @classmethod
    def of(cls, raw: FastTokenizer, max_length: int) -> WordPieceMemo | None:
        """A memo for `raw`, or None when it is not a BERT WordPiece tokenizer."""
        spec = json.loads(raw.to_str())
        norm, pre, model = (
            spec.get("normalizer") or {},
            spec.get("pre_tokenizer") or {},
            spec["model"],
        )
        if (
            norm.get("type") != "BertNormalizer"
            or not norm.get("clean_text")
            or pre.get("type") != "BertPreTokenizer"
            or model.get("type") != "WordPiece"
        ):
            return None
        added = [token["content"] for token in spec.get("added_tokens") or []]
        return cls(raw, max_length, bool(norm.get("lowercase")), added)

    def encode(self, text: str) -> tuple[list[int], bool] | None:
        """(ids, whether they were cut), or None for a text this cannot encode."""
        if _NOT_PLAIN.search(text) or (self.added and self.added.search(text)):
            return None
        if self.lowercase:
            text = text.lower()
        out: list[int] = []
        chunks = self.chunks
        for chunk in text.split():
            pieces = chunks.get(chunk)
            if pieces is None:
                pieces = self._pieces(chunk)
                if len(chunk) <= LONGEST_CHUNK:
                    if len(chunks) >= CHUNK_LIMIT:
                        chunks.clear()
                    chunks[chunk] = pieces
            out += pieces
        if len(out) > self.room:
            return self.prefix + out[: self.room] + self.suffix, True
        return self.prefix + out + self.suffix, False

    def _pieces(self, chunk: str) -> tuple[int, ...]:
        """The WordPiece ids of a run of non-space characters: each word and each
        punctuation character in it, through the library's own model."""
        return tuple(
            token.id for word in _WORDS.findall(chunk) for token in self.model.tokenize(word)
        )
