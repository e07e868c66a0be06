"""Texts to token ids, with the model's length limit applied the same way everywhere."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer as FastTokenizer

from numaserve.modelpath import ModelLoadError, resolve_model_path


class TooLongError(ValueError):
    def __init__(self, index: int, tokens: int, limit: int):
        super().__init__(
            f"text {index} has {tokens} tokens; the limit is {limit} (truncation is off)"
        )
        self.index, self.tokens, self.limit = index, tokens, limit


def load_fast_tokenizer(model_path: str) -> FastTokenizer:
    directory = resolve_model_path(model_path)
    path = Path(directory) / "tokenizer.json"
    if path.is_file():
        try:
            return FastTokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception for a malformed file
            raise ModelLoadError(
                f"cannot load the tokenizer of {model_path}: {path}: {e}"
            ) from None
    from transformers import AutoTokenizer

    try:
        hf = AutoTokenizer.from_pretrained(directory, use_fast=True)
    except Exception as e:  # transformers raises many types for a bad or missing tokenizer
        raise ModelLoadError(f"cannot load the tokenizer of {model_path}: {e}") from None
    if not hf.is_fast:
        raise ModelLoadError(f"{model_path}: no fast tokenizer (tokenizer.json) found")
    if hf.vocab_size <= len(set(hf.all_special_ids)):  # transformers 5 builds one from nothing
        raise ModelLoadError(
            f"cannot load the tokenizer of {model_path}: it has no tokenizer.json and no "
            "vocabulary file (vocab.txt, vocab.json, *.model)"
        )
    return FastTokenizer.from_str(hf.backend_tokenizer.to_str())


@dataclass(frozen=True)
class Encoded:
    ids: tuple[int, ...]
    truncated: bool  # the text was cut to max_length
    tokens: int  # its length before any cut


class Tokenizer:
    """The model's fast tokenizer; special tokens included in every count.

    Loads the checkpoint's tokenizer.json with the `tokenizers` library alone: transformers'
    AutoTokenizer imports torch, which cost the router 250 MB. Only a checkpoint without
    tokenizer.json (a slow tokenizer's vocab.txt) goes through transformers, to convert it.
    Encodes with truncation set to max_length, so special tokens survive a cut.
    """

    def __init__(self, model_path: str, max_length: int, truncate: bool = True, recent: int = 0):
        self.raw = load_fast_tokenizer(model_path)
        self.raw.no_padding()
        self.raw.enable_truncation(max_length)
        self.full = FastTokenizer.from_str(self.raw.to_str())
        self.full.no_truncation()
        self.max_length = max_length
        self.truncate = truncate
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
