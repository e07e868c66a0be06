"""The router's per-word path for BERT tokenizers gives the ids the tokenizers library gives,
on every text, and handles the plain ones itself."""

import json
import random
import string

import pytest
from tokenizers import Tokenizer as FastTokenizer
from tokenizers import models, pre_tokenizers

from numaserve.backends.tokenizer import Tokenizer
from numaserve.backends.wordpiece_memo import WordPieceMemo

# Pieces a text is made of: plain ASCII mostly, and now and then something the memo must
# hand back to the library (control characters, non-ASCII, special tokens' text).
PLAIN = [*string.ascii_letters, *string.digits, *string.punctuation, " ", "  ", "\t", "\n", "\r"]
WORDS = ["the", "Quick", "BROWN", "fox's", "jumps", "unaffable", "e-mail", "##ing", "a" * 120]
AWKWARD = ["\x00", "\x0b", "\x0c", "\x7f", "\x1f", "é", "中文", "🙂", "[MASK]", "[mask]", "[CLS]"]


def random_texts(count: int, seed: int = 0) -> list[str]:
    rnd = random.Random(seed)
    texts = []
    for _ in range(count):
        parts = []
        for _ in range(rnd.randint(0, 40)):
            roll = rnd.random()
            pool = AWKWARD if roll < 0.02 else WORDS if roll < 0.5 else PLAIN
            parts.append(rnd.choice(pool))
            if rnd.random() < 0.4:
                parts.append(" ")
        texts.append("".join(parts))
    return texts


def cased(raw: FastTokenizer) -> FastTokenizer:
    spec = json.loads(raw.to_str())
    spec["normalizer"]["lowercase"] = False
    return FastTokenizer.from_str(json.dumps(spec))


@pytest.mark.parametrize("lowercase", [True, False], ids=["uncased", "cased"])
@pytest.mark.parametrize("max_length", [16, 512])
def test_the_ids_are_the_librarys_on_random_texts(lowercase, max_length):
    tok = Tokenizer("bundled:minilm", max_length=max_length)
    raw = tok.raw if lowercase else cased(tok.raw)
    raw.enable_truncation(max_length)
    memo = WordPieceMemo.of(raw, max_length)
    handled = 0
    for text in random_texts(3000):
        expected = raw.encode(text)
        found = memo.encode(text)
        if found is not None:
            handled += 1
            assert found == (expected.ids, bool(expected.overflowing)), repr(text)
    assert handled > 2000  # the plain texts did not all fall back to the library


def test_texts_the_memo_cannot_vouch_for_go_to_the_library():
    memo = Tokenizer("bundled:minilm", max_length=64).words
    for text in ["a\x0bb", "caf\u00e9", "say [MASK] now", "say [mask] now", "tab\x00nul"]:
        assert memo.encode(text) is None


def test_the_router_tokenizer_uses_the_memo_and_agrees_with_the_library():
    tok = Tokenizer("bundled:minilm", max_length=32)
    texts = random_texts(500, seed=1)
    ours = [(e.ids, e.truncated) for e in tok.encode(texts)]
    theirs = [(tuple(e.ids), bool(e.overflowing)) for e in tok.raw.encode_batch(texts)]
    assert ours == theirs
    assert tok.words.chunks  # the plain texts went through the memo


def test_a_tokenizer_that_is_not_bert_wordpiece_gets_no_memo():
    bpe = FastTokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel()
    assert WordPieceMemo.of(bpe, 64) is None


def test_the_memo_is_bounded(monkeypatch):
    monkeypatch.setattr("numaserve.backends.wordpiece_memo.CHUNK_LIMIT", 50)
    memo = Tokenizer("bundled:minilm", max_length=64).words
    for i in range(500):
        memo.encode(f"text number {i}")
    assert len(memo.chunks) <= 50


def test_long_chunks_are_not_remembered():
    memo = Tokenizer("bundled:minilm", max_length=512).words
    memo.encode("x" * 5000 + " short")
    assert list(memo.chunks) == ["short"]
