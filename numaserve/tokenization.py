"""Texts to token ids, with the model's length limit applied the same way everywhere."""

from __future__ import annotations

from dataclasses import dataclass

from numaserve.modelpath import ModelLoadError, resolve_model_path


class TooLongError(ValueError):
    def __init__(self, index: int, tokens: int, limit: int):
        super().__init__(
            f"text {index} has {tokens} tokens; the limit is {limit} (truncation is off)"
        )
        self.index, self.tokens, self.limit = index, tokens, limit


@dataclass(frozen=True)
class Encoded:
    ids: tuple[int, ...]
    truncated: bool  # the text was cut to max_length
    tokens: int  # its length before any cut


class Tokenizer:
    """The model's fast tokenizer; special tokens included in every count."""

    def __init__(self, model_path: str, max_length: int, truncate: bool = True):
        from transformers import AutoTokenizer

        directory = resolve_model_path(model_path)
        try:
            self.hf = AutoTokenizer.from_pretrained(directory, use_fast=True)
        except Exception as e:  # transformers raises many types for a bad or missing tokenizer
            raise ModelLoadError(f"cannot load the tokenizer of {model_path}: {e}") from None
        if not self.hf.is_fast:
            raise ModelLoadError(f"{model_path}: no fast tokenizer (tokenizer.json) found")
        self.max_length = max_length
        self.truncate = truncate
        self.pad_id = self.hf.pad_token_id or 0

    def encode(self, texts: list[str]) -> list[Encoded]:
        full = self.hf(texts, add_special_tokens=True, truncation=False, verbose=False)["input_ids"]
        out = []
        for i, ids in enumerate(full):
            if len(ids) <= self.max_length:
                out.append(Encoded(tuple(ids), False, len(ids)))
            elif not self.truncate:
                raise TooLongError(i, len(ids), self.max_length)
            else:
                cut = self.hf(texts[i], truncation=True, max_length=self.max_length)["input_ids"]
                out.append(Encoded(tuple(cut), True, len(ids)))
        return out
