"""The traffic to tune for: how many tokens each text of the corpus has, with the model's own
tokenizer (special tokens counted, cut at model.max_length as the router cuts)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class Workload:
    lengths: tuple[tuple[int, int], ...]  # (tokens, texts with that many), shortest first
    max_length: int  # the model's: no pool needs more

    @classmethod
    def of(cls, token_counts: list[int], max_length: int) -> Workload:
        if not token_counts:
            raise ValueError("the corpus has no text")
        counts = Counter(min(n, max_length) for n in token_counts)
        return cls(tuple(sorted(counts.items())), max_length)

    @property
    def texts(self) -> int:
        return sum(n for _, n in self.lengths)

    def quantile(self, q: float) -> int:
        """The smallest length with at least a fraction `q` of the texts at or below it."""
        wanted, seen = math.ceil(q * self.texts), 0
        for length, n in self.lengths:
            seen += n
            if seen >= wanted:
                return length
        return self.lengths[-1][0]

    def within(self, low: int, high: int) -> tuple[tuple[int, int], ...]:
        """The lengths in (low, high]: the texts a pool of max_tokens `high` gets after one of
        max_tokens `low`."""
        return tuple((length, n) for length, n in self.lengths if low < length <= high)

    def describe(self) -> str:
        return (
            f"{self.texts} texts, tokens: median {self.quantile(0.5)}, p90 {self.quantile(0.9)}, "
            f"p99 {self.quantile(0.99)}, max {self.lengths[-1][0]} (max_length {self.max_length})"
        )


def read_workload(texts: list[str], model_path: str, max_length: int) -> Workload:
    from numaserve.backends.tokenizer import Tokenizer

    tokenizer = Tokenizer(model_path, max_length)
    return Workload.of([len(e.ids) for e in tokenizer.encode(list(texts))], max_length)
