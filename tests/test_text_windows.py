"""A long single text read in windows (Tokenizer.encode_windows): windows of max_length
tokens, each overlapping the next by a quarter of the text's room, each framed as the whole
text is, its prompt (an embedder's, a late-interaction model's documents') included."""

import pytest
from tokenizers import Tokenizer as FastTokenizer

from numaserve.backends.tokenizer import Tokenizer
from numaserve.testing.windows import document

MAX_LENGTH = 32
PROMPT = "passage: "


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer("bundled:minilm", max_length=MAX_LENGTH)


def test_a_texts_windows_are_those_the_tokenizers_overflow_makes(tokenizer):
    text = document(100)  # one token a word
    (read,) = tokenizer.encode_windows([text], max_windows=16)
    library = FastTokenizer.from_str(tokenizer.raw.to_str())
    library.enable_truncation(MAX_LENGTH, stride=(MAX_LENGTH - 2) // 4)
    enc = library.encode(text)
    assert read.windows == tuple(tuple(w.ids) for w in [enc, *enc.overflowing])
    assert not read.truncated and len(read.windows) == 5


def test_each_window_of_a_prompted_text_begins_with_the_prompt_as_the_text_does(tokenizer):
    (read,) = tokenizer.encode_windows([document(100)], max_windows=16, prompt=PROMPT)
    prompt = tokenizer.full.encode(PROMPT).ids[:-1]  # [CLS] passage :
    assert len(read.windows) > 2
    for window in read.windows:
        assert window[: len(prompt)] == tuple(prompt) and len(window) <= MAX_LENGTH
        assert window[-1] == tokenizer.full.encode("").ids[-1]  # [SEP]
    room = MAX_LENGTH - len(prompt) - 1
    first, second = (w[len(prompt) : -1] for w in read.windows[:2])
    assert first[-(room // 4) :] == second[: room // 4]  # a quarter of the room overlaps


def test_windows_past_max_windows_are_left_out_and_the_text_said_cut(tokenizer):
    (read,) = tokenizer.encode_windows([document(100)], max_windows=2, prompt=PROMPT)
    assert len(read.windows) == 2 and read.truncated


def test_a_prompted_text_that_fits_is_one_input_as_encode_reads_it(tokenizer):
    (read,) = tokenizer.encode_windows(["a short text"], max_windows=4, prompt=PROMPT)
    assert read.windows == (tuple(tokenizer.encode([PROMPT + "a short text"])[0].ids),)
