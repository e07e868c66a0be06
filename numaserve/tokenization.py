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
    """The model's fast tokenizer; special tokens included in every count.

    Encodes with the raw `tokenizers` backend (half the cost of transformers' call), with
    truncation set to max_length so special tokens survive a cut.
    """

    def __init__(self, model_path: str, max_length: int, truncate: bool = True, recent: int = 0):
        from tokenizers import Tokenizer as RawTokenizer
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
        self.raw = RawTokenizer.from_str(self.hf.backend_tokenizer.to_str())
        self.raw.no_padding()
        self.raw.enable_truncation(max_length)
        self.full = RawTokenizer.from_str(self.hf.backend_tokenizer.to_str())
        self.full.no_padding()
        self.full.no_truncation()
        # Repeated texts (real traffic repeats: that is why there is a cache) skip the tokenizer.
        self.recent: dict[str, Encoded] = {}
        self.recent_size = recent

    def encode(self, texts: list[str]) -> list[Encoded]:
        """Encodings of `texts`; a text seen recently is not tokenized again."""
        if len(texts) == 1 and (known := self.recent.get(texts[0])) is not None:
            return [known]
        out = self._encode(texts)
        if self.recent_size:
            for text, enc in zip(texts, out, strict=True):
                self.recent[text] = enc
                if len(self.recent) > self.recent_size:
                    del self.recent[next(iter(self.recent))]  # the oldest: dicts keep order
        return out

    def _encode(self, texts: list[str]) -> list[Encoded]:
        out = []
        for i, enc in enumerate(
            self.raw.encode_batch(texts) if len(texts) > 1 else [self.raw.encode(texts[0])]
        ):
            if not enc.overflowing:
                out.append(Encoded(tuple(enc.ids), False, len(enc.ids)))
                continue
            tokens = len(self.full.encode(texts[i]).ids)
            if not self.truncate:
                raise TooLongError(i, tokens, self.max_length)
            out.append(Encoded(tuple(enc.ids), True, tokens))
        return out
