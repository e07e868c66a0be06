"""Texts to token ids, with the model's length limit applied the same way everywhere."""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer as FastTokenizer

from numaserve.backends.wordpiece_memo import WordPieceMemo
from numaserve.checkpoint.errors import ModelLoadError
from numaserve.checkpoint.files import prefix_tokens
from numaserve.checkpoint.paths import resolve_model_path
from numaserve.tasks.tokens import Tokens


class TooLongError(ValueError):
    def __init__(self, index: int, tokens: int, limit: int, read: int | None = None):
        """`read`: where only the text's first `read` characters were tokenized (a long
        text is not read whole to be refused), `tokens` is theirs: a lower bound."""
        count = str(tokens) if read is None else f"at least {tokens}"
        where = "" if read is None else f" (in its first {read:,} characters; not read further)"
        super().__init__(
            f"text {index} has {count} tokens{where}; the limit is {limit} (truncation is off)"
        )
        self.index, self.tokens, self.limit = index, tokens, limit


def load_fast_tokenizer(model_path: str) -> FastTokenizer:
    """The checkpoint's fast tokenizer, with an older late-interaction save's markers read as
    one token each (`with_prefix_tokens`)."""
    return with_prefix_tokens(_load_fast_tokenizer(model_path), prefix_tokens(model_path))


def with_prefix_tokens(tokenizer: FastTokenizer, prefixes: tuple[str, ...]) -> FastTokenizer:
    """`tokenizer` reading each marker (or its first word) that it knows but splits into
    pieces as one special token, as sentence-transformers' MultiVectorEncoder registers a
    legacy checkpoint's: "[unused0]" in BERT's vocabulary is otherwise "[", "unused", "##0",
    "]"."""
    from tokenizers import AddedToken

    vocabulary = tokenizer.get_vocab(with_added_tokens=True)
    added = []
    for value in prefixes:
        for prefix in (value, value.split(None, 1)[0]):
            if prefix not in vocabulary:
                continue
            if tokenizer.encode(prefix, add_special_tokens=False).tokens != [prefix]:
                added.append(AddedToken(prefix, normalized=False, special=True))
            break
    if added:
        tokenizer.add_special_tokens(added)
    return tokenizer


def _load_fast_tokenizer(model_path: str) -> FastTokenizer:
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
    # Of a pair (a, b): where b's tokens begin (its token type ids are 1 from there); 0 for
    # a single text, and for a pair whose tokenizer gives both texts the same type.
    second: int = 0
    tokens: Tokens | None = None  # from encode_tagged only
    # A pair read in windows (encode_windows): each further window's ids, the first text
    # repeated in each; `truncated` then says that max_windows cut the second text.
    more: tuple[tuple[int, ...], ...] = ()

    @property
    def windows(self) -> tuple[tuple[int, ...], ...]:
        return (self.ids, *self.more)

    @property
    def tokens_read(self) -> int:
        """The tokens the model reads of it: every window's."""
        return len(self.ids) + sum(map(len, self.more))


Text = str | tuple[str, str]  # a text, or a pair of them (premise and hypothesis, query and
# document) that the model reads as one input


# Texts are cut to this many characters per token of max_length before tokenizing (at a
# space where one is near), and cut further only if that was not enough: a 4 MiB text
# would otherwise cost seconds of the router's time for tokens that are thrown away.
CHARS_PER_TOKEN = 16
MEMO_ENTRY_OVERHEAD = 200  # bytes a memo entry costs beyond its text and ids (dict, objects)
# Windows over a long second text overlap by this share of a window: a passage cut at a
# window's edge is read whole in the next.
WINDOW_OVERLAP = 4  # a quarter


class Tokenizer:
    """The model's fast tokenizer; special tokens included in every count.

    Loads the checkpoint's tokenizer.json with the `tokenizers` library alone: transformers'
    AutoTokenizer imports torch, which cost the router 250 MB. Only a checkpoint without
    tokenizer.json (a slow tokenizer's vocab.txt) goes through transformers, to convert it.
    Encodes with truncation set to max_length, so special tokens survive a cut. Plain-ASCII
    texts for a BERT WordPiece tokenizer skip the library (wordpiece_memo.py): 4x faster.
    """

    def __init__(
        self, model_path: str, max_length: int, truncate: bool = True, memo_bytes: int = 0
    ):
        self.path = model_path
        self.raw = load_fast_tokenizer(model_path)
        self.raw.no_padding()
        self.raw.enable_truncation(max_length)
        self.full = FastTokenizer.from_str(self.raw.to_str())
        self.full.no_truncation()
        self.left = FastTokenizer.from_str(self.raw.to_str())  # keeps a text's end
        self.left.enable_truncation(max_length, direction="left")
        self.windowed = FastTokenizer.from_str(self.raw.to_str())  # encode_windows's
        self.specials = {pair: self.raw.num_special_tokens_to_add(pair) for pair in (False, True)}
        self.words = WordPieceMemo.of(self.raw, max_length)
        unknown = getattr(self.raw.model, "unk_token", None)
        self.unknown_id = self.raw.token_to_id(unknown) if unknown else None
        # WordPiece marks a word's continuation pieces ("##"): entities can follow words.
        self.word_aware = bool(getattr(self.raw.model, "continuing_subword_prefix", None))
        self.max_length = max_length
        self.truncate = truncate
        self.prefix_chars = CHARS_PER_TOKEN * max_length
        # Repeated texts (real traffic repeats: that is why there is a cache) skip the
        # tokenizer. Bounded in bytes, not entries: texts may be megabytes each.
        self.memo: dict[str, Encoded] = {}
        self.memo_bytes = 0
        self.memo_limit = memo_bytes

    def encode(
        self, texts: list[Text], truncate: bool | None = None, left: bool = False
    ) -> list[Encoded]:
        """Encodings of `texts`; a text seen recently is not tokenized again. A pair is
        encoded as transformers encodes `tokenizer(a, b, truncation=True)`: both texts
        between the model's special tokens, the longer cut first. `truncate`: a request's
        own choice, over the model's (cut a text over the limit, or refuse it); `left`: a
        cut keeps the text's end (transformers' `truncation_side="left"`), which neither
        the memo nor the WordPiece shortcut knows."""
        strict = not (self.truncate if truncate is None else truncate)
        if left:
            return [self._encode_alone(i, text, strict, left) for i, text in enumerate(texts)]
        known = self.memo.get(texts[0]) if len(texts) == 1 else None
        if known is not None and not (strict and known.truncated):  # a refusal is not kept
            return [known]
        singles = [i for i, text in enumerate(texts) if isinstance(text, str)]
        if len(singles) == len(texts):
            out = self._encode(texts, strict)
        else:
            out = [None] * len(texts)
            for i, enc in zip(
                singles, self._encode([texts[i] for i in singles], strict), strict=True
            ):
                out[i] = enc
            for i, text in enumerate(texts):
                if out[i] is None:
                    out[i] = self._encode_alone(i, text, strict)
        if self.memo_limit:
            for text, enc in zip(texts, out, strict=True):
                if isinstance(text, str):
                    self._remember(text, enc)
        return out

    def encode_tagged(
        self, texts: list[str], truncate: bool | None = None, left: bool = False
    ) -> list[Encoded]:
        """Encodings with each token's character span (in the whole text) and spelling, for
        entities (ner)."""
        strict = not (self.truncate if truncate is None else truncate)
        out = []
        for i, text in enumerate(texts):
            part = self._whole_enough(text, left)
            enc = (self.left if left else self.raw).encode(part)
            if enc.overflowing and strict:
                read = len(part) if part != text else None
                raise TooLongError(i, len(self.full.encode(part).ids), self.max_length, read)
            special = tuple(bool(s) for s in enc.special_tokens_mask)
            base = len(text) - len(part) if left else 0  # a tail's offsets start at its start
            tokens = Tokens(
                tuple(
                    span if is_special else (span[0] + base, span[1] + base)
                    for span, is_special in zip(enc.offsets, special, strict=True)
                ),
                special,
                tuple(enc.tokens),
                tuple(t == self.unknown_id for t in enc.ids),
            )
            out.append(Encoded(tuple(enc.ids), bool(enc.overflowing), 0, tokens))
        return out

    def encode_windows(
        self, inputs: list[Text], max_windows: int, prompt: str = ""
    ) -> list[Encoded]:
        """Texts, or pairs (query, document), that may be longer than the model reads: each
        text (a pair's document) read in up to `max_windows` windows, a pair's query repeated
        in each, a window overlapping the next by WINDOW_OVERLAP of its tokens. `prompt`
        (a text's, never a pair's) begins every window of a text, as it begins the text. An
        input that fits, or a query or prompt that leaves a window no room, is one input as
        `encode` makes it."""
        out = []
        for i, text in enumerate(inputs):
            pair = not isinstance(text, str)
            alone = self._encode_alone(i, text if pair else prompt + text, strict=False)
            if not alone.truncated or max_windows == 1:
                out.append(alone)
            elif pair:
                out.append(self._pair_windows(text, max_windows) or alone)
            else:
                out.append(self._text_windows(text, prompt, max_windows) or alone)
        return out

    def _pair_windows(self, pair: tuple[str, str], max_windows: int) -> Encoded | None:
        """A long pair's windows over its second text, by the library's overflow (each
        window repeats the first text); None where the first leaves no room."""
        first, long = pair
        room = self.max_length - self.specials[True]
        room -= len(self.full.encode(first, add_special_tokens=False).ids)
        if room < 2 * WINDOW_OVERLAP:
            return None
        self.windowed.enable_truncation(
            self.max_length, stride=room // WINDOW_OVERLAP, strategy="only_second"
        )
        span = room - room // WINDOW_OVERLAP  # new tokens a window adds
        limit = CHARS_PER_TOKEN * (room + span * max_windows)
        while True:  # a head of the text that fills max_windows + 1 windows, or all of it
            part = self._head(long, limit)
            enc = self.windowed.encode(first, part)
            windows = [enc, *enc.overflowing]
            if len(windows) > max_windows or len(part) == len(long):
                break
            limit *= 4  # rare: a head of few tokens (long runs of spaces)
        kept = windows[:max_windows]
        types = enc.type_ids
        second = types.index(1) if 1 in types else 0
        more = tuple(tuple(w.ids) for w in kept[1:])
        return Encoded(tuple(enc.ids), len(windows) > max_windows, second, more=more)

    def _text_windows(self, text: str, prompt: str, max_windows: int) -> Encoded | None:
        """A long text's windows, each framed as the text is: its leading special tokens,
        the prompt's tokens, a slice of the text's, its closing special tokens. None where
        the prompt leaves no room."""
        lead, close = self._frame
        head = (*lead, *self.full.encode(prompt, add_special_tokens=False).ids)
        room = self.max_length - len(head) - len(close)
        if room < 2 * WINDOW_OVERLAP:
            return None
        span = room - room // WINDOW_OVERLAP  # new tokens a window adds
        limit = CHARS_PER_TOKEN * (room + span * max_windows)
        while True:  # a head of the text that fills max_windows + 1 windows, or all of it
            part = self._head(text, limit)
            body = self.full.encode(part, add_special_tokens=False).ids
            needed = 1 + -(-max(len(body) - room, 0) // span)
            if needed > max_windows or len(part) == len(text):
                break
            limit *= 4  # rare: a head of few tokens (long runs of spaces)
        windows = [
            (*head, *body[s : s + room], *close)
            for s in range(0, span * min(needed, max_windows), span)
        ]
        return Encoded(windows[0], needed > max_windows, more=tuple(windows[1:]))

    @functools.cached_property
    def _frame(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The special tokens the tokenizer puts before a single text, and after it."""
        enc = self.full.encode("a")
        mask = enc.special_tokens_mask
        first = mask.index(0)
        last = len(mask) - mask[::-1].index(0)
        return tuple(enc.ids[:first]), tuple(enc.ids[last:])

    def _encode_alone(self, index: int, text: Text, strict: bool, left: bool = False) -> Encoded:
        """One text or pair, by the library alone: a pair, or any text cut on the left."""
        texts = (text,) if isinstance(text, str) else text
        parts = tuple(self._whole_enough(t, left) for t in texts)
        enc = (self.left if left else self.raw).encode(*parts)
        if enc.overflowing and strict:
            read = sum(map(len, parts)) if parts != tuple(texts) else None
            raise TooLongError(index, len(self.full.encode(*parts).ids), self.max_length, read)
        types = enc.type_ids
        second = types.index(1) if len(parts) == 2 and 1 in types else 0
        return Encoded(tuple(enc.ids), bool(enc.overflowing), second)

    def _whole_enough(self, text: str, left: bool = False) -> str:
        """A head of `text` (its tail, cutting on the left) with at least max_length tokens
        of its own, or all of it: a cut then keeps what it would keep of the whole text (a
        pair's truncation, longest first, looks only at whether each text has more tokens
        than fit)."""
        cut = self._tail if left else self._head
        limit = self.prefix_chars
        part = cut(text, limit)
        while (
            len(part) < len(text)
            and len(self.full.encode(part, add_special_tokens=False).ids) < self.max_length
        ):
            limit *= 4
            part = cut(text, limit)
        return part

    def _remember(self, text: str, enc: Encoded) -> None:
        cost = _memo_cost(text, enc)
        if cost > self.memo_limit // 64 or text in self.memo:
            return  # one huge text may not push out every other
        self.memo[text] = enc
        self.memo_bytes += cost
        while self.memo_bytes > self.memo_limit:
            oldest = next(iter(self.memo))  # dicts keep insertion order
            self.memo_bytes -= _memo_cost(oldest, self.memo.pop(oldest))

    def _encode(self, texts: list[str], strict: bool) -> list[Encoded]:
        heads = [self._head(text, self.prefix_chars) for text in texts]
        found = [self.words.encode(head) for head in heads] if self.words else [None] * len(heads)
        rest = [i for i, f in enumerate(found) if f is None]
        if rest:  # the _fast form skips character offsets, which nothing here reads
            encodings = self.raw.encode_batch_fast([heads[i] for i in rest])
            for i, enc in zip(rest, encodings, strict=True):
                found[i] = enc.ids, bool(enc.overflowing)
        out = []
        for i, (text, head, (ids, cut)) in enumerate(zip(texts, heads, found, strict=True)):
            if not cut and len(head) < len(text):
                # Rare: a head without enough tokens (long runs of spaces): a longer head.
                head = self._whole_enough(text)
                ids, cut = self._encode_one(head)
            if cut and strict:
                read = len(head) if len(head) < len(text) else None
                raise TooLongError(i, len(self.full.encode(head).ids), self.max_length, read)
            out.append(Encoded(tuple(ids), cut))
        return out

    def _encode_one(self, text: str) -> tuple[list[int], bool]:
        if self.words and (found := self.words.encode(text)) is not None:
            return found
        enc = self.raw.encode(text)
        return enc.ids, bool(enc.overflowing)

    @staticmethod
    def _head(text: str, limit: int) -> str:
        """At most `limit` characters of `text`, cut at a space in its last quarter where
        there is one, so that no word is split (the kept tokens are the text's own)."""
        if len(text) <= limit:
            return text
        space = text.rfind(" ", limit - limit // 4, limit)
        return text[: space if space > 0 else limit]

    @staticmethod
    def _tail(text: str, limit: int) -> str:
        """At most `limit` characters of the end of `text`, cut at a space in its first
        quarter where there is one."""
        if len(text) <= limit:
            return text
        start = len(text) - limit
        space = text.find(" ", start, start + limit // 4)
        return text[space + 1 if space >= 0 else start :]


def _memo_cost(text: str, enc: Encoded) -> int:
    return sys.getsizeof(text) + 8 * len(enc.ids) + MEMO_ENTRY_OVERHEAD
