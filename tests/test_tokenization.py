"""The router's tokenizer: the checkpoint's tokenizer.json read by the tokenizers library,
giving the ids transformers gives, and the model's length limit applied in one place."""

import re
import shutil
import time

import pytest

from numaserve.backends.tokenizer import Tokenizer, TooLongError
from numaserve.checkpoint.errors import ModelLoadError
from numaserve.checkpoint.paths import resolve_model_path
from numaserve.corpus import stdlib_sentences

SENTENCES = stdlib_sentences(300)


def transformers_ids(path: str, texts: list[str], max_length: int) -> list[tuple[int, ...]]:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(resolve_model_path(path))
    encoded = hf(texts, truncation=True, max_length=max_length)["input_ids"]
    return [tuple(ids) for ids in encoded]


@pytest.mark.parametrize("model", ["bundled:minilm", "classifier"])
def test_the_ids_are_the_ones_transformers_gives(model, classifier_dir):
    path = str(classifier_dir) if model == "classifier" else model
    texts = [*SENTENCES, "word " * 300, "Ünïcödé, CJK 中文 and emoji 🙂"]
    ours = [e.ids for e in Tokenizer(path, max_length=32).encode(texts)]
    assert ours == transformers_ids(path, texts, 32)


def without_tokenizer_json(model_dir: str, destination):
    shutil.copytree(model_dir, destination)
    (destination / "tokenizer.json").unlink()
    return str(destination)


def test_a_checkpoint_without_tokenizer_json_is_converted_from_its_vocabulary(tmp_path):
    slow = without_tokenizer_json(resolve_model_path("bundled:minilm"), tmp_path / "slow")
    ours = [e.ids for e in Tokenizer(slow, max_length=64).encode(SENTENCES)]
    assert ours == transformers_ids("bundled:minilm", SENTENCES, 64)


def test_a_checkpoint_with_no_vocabulary_at_all_is_a_clear_error(classifier_dir, tmp_path):
    # save_pretrained in transformers 5 writes tokenizer.json alone, no vocab.txt.
    bare = without_tokenizer_json(classifier_dir, tmp_path / "bare")
    with pytest.raises(ModelLoadError, match=r"no tokenizer\.json and no vocabulary file"):
        Tokenizer(bare, max_length=64)


def test_a_malformed_tokenizer_json_is_a_clear_error(classifier_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(classifier_dir, broken)
    (broken / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match=r"cannot load the tokenizer of .*tokenizer\.json"):
        Tokenizer(str(broken), max_length=64)


def test_long_text_is_truncated_and_says_so():
    tok = Tokenizer("bundled:minilm", max_length=16)
    (short, long) = tok.encode(["short text", "word " * 40])
    assert (short.truncated, len(long.ids), long.truncated) == (False, 16, True)
    assert long.ids[-1] == tok.raw.token_to_id("[SEP]")


def test_long_text_is_refused_when_truncation_is_off():
    tok = Tokenizer("bundled:minilm", max_length=16, truncate=False)
    with pytest.raises(TooLongError, match="text 1 has 42 tokens; the limit is 16"):
        tok.encode(["fine", "word " * 40])


def test_a_request_chooses_truncation_over_the_models_setting_either_way():
    cutting = Tokenizer("bundled:minilm", max_length=16, memo_bytes=1 << 20)
    refusing = Tokenizer("bundled:minilm", max_length=16, truncate=False)
    (cut,) = refusing.encode(["word " * 40], truncate=True)
    assert (len(cut.ids), cut.truncated) == (16, True)
    cutting.encode(["word " * 40])  # remembered, cut
    with pytest.raises(TooLongError, match="text 0 has 42 tokens"):
        cutting.encode(["word " * 40], truncate=False)  # not answered from the memo
    with pytest.raises(TooLongError):
        cutting.encode([("word " * 20, "word " * 20)], truncate=False)
    with pytest.raises(TooLongError):
        cutting.encode_tagged(["word " * 40], truncate=False)


def test_a_text_of_4_mib_is_cut_before_tokenizing_and_costs_little():
    tok = Tokenizer("bundled:minilm", max_length=256)
    huge = "All work and no play makes a dull model. " * (4 * 2**20 // 41)
    started = time.process_time()
    (enc,) = tok.encode([huge])
    assert time.process_time() - started < 0.5
    assert (len(enc.ids), enc.truncated) == (256, True)


@pytest.mark.parametrize(
    "text",
    [
        "word " * 20_000,
        "super,cali.fragilistic;" * 5_000,  # no space to cut at: a word split mid-way
        "supercalifragilistic" * 5_000,  # one word too long for the vocabulary: one [UNK]
        "x" + " " * 50_000 + "word " * 2_000,  # the first cut holds too few tokens
        "中文" * 20_000,
        "a " * 2_040 + "extraordinarily " * 100,  # a cut just past the limit
    ],
)
def test_cutting_before_tokenizing_keeps_the_ids_a_whole_text_gives(text):
    tok = Tokenizer("bundled:minilm", max_length=256)
    (enc,) = tok.encode([text])
    whole = tok.raw.encode(text)
    assert (enc.ids, enc.truncated) == (tuple(whole.ids), bool(whole.overflowing))


def test_a_huge_text_over_the_limit_is_refused_without_counting_all_of_it():
    tok = Tokenizer("bundled:minilm", max_length=16, truncate=False)
    with pytest.raises(TooLongError) as refused:
        tok.encode(["word " * 100_000])
    assert re.fullmatch(
        r"text 0 has at least \d+ tokens \(in its first [0-9,]+ characters; not read further\); "
        r"the limit is 16 \(truncation is off\)",
        str(refused.value),
    )


def test_the_memo_of_recent_texts_is_bounded_in_bytes():
    tok = Tokenizer("bundled:minilm", max_length=32, memo_bytes=1 << 20)
    for i in range(200):
        tok.encode([f"text {i} " + "padding " * 1_000])  # about 8 KB each
    assert 0 < tok.memo_bytes <= 1 << 20
    assert len(tok.memo) < 200


def test_one_huge_text_does_not_push_the_others_out_of_the_memo():
    tok = Tokenizer("bundled:minilm", max_length=32, memo_bytes=1 << 20)
    tok.encode(["a text worth remembering"])
    tok.encode(["huge " * 200_000])
    assert list(tok.memo) == ["a text worth remembering"]


# -- a cut on the left (truncation_direction: left) ------------------------------------------


def transformers_left_ids(path: str, texts: list, max_length: int) -> list[tuple[int, ...]]:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(resolve_model_path(path), truncation_side="left")
    return [tuple(hf(*t, truncation=True, max_length=max_length)["input_ids"]) for t in texts]


def test_a_left_cut_keeps_each_texts_end_as_transformers_truncation_side_left_does():
    texts = [(s,) for s in SENTENCES[:40]] + [("word " * 300,), ("first " * 50 + "last words",)]
    texts += [(SENTENCES[0], "two " * 40), ("one " * 40 + "end", SENTENCES[1])]  # pairs
    tok = Tokenizer("bundled:minilm", max_length=32)
    ours = tok.encode([t[0] if len(t) == 1 else t for t in texts], left=True)
    assert [e.ids for e in ours] == transformers_left_ids("bundled:minilm", texts, 32)
    assert ours[-4].truncated and tok.raw.decode(ours[-3].ids).endswith("first last words")


@pytest.mark.parametrize(
    "text",
    [
        "word " * 20_000 + "the end",
        "super,cali.fragilistic;" * 5_000,
        "word " * 2_000 + " " * 50_000 + "x",  # the first cut holds too few tokens
        "中文" * 20_000,
    ],
)
def test_a_left_cut_of_a_huge_text_keeps_the_ids_the_whole_text_gives(text):
    tok = Tokenizer("bundled:minilm", max_length=256)
    (enc,) = tok.encode([text], left=True)
    whole = tok.left.encode(text)
    assert (enc.ids, enc.truncated) == (tuple(whole.ids), True)


def test_a_left_cut_is_not_answered_from_the_memo_of_right_cuts_nor_refused_texts_kept():
    tok = Tokenizer("bundled:minilm", max_length=16, memo_bytes=1 << 20)
    text = "start " + "word " * 40 + "end"
    (right,) = tok.encode([text])
    (left,) = tok.encode([text], left=True)
    assert right.ids != left.ids and tok.raw.decode(left.ids).endswith("end")
    with pytest.raises(TooLongError, match="text 0 has 44 tokens"):
        tok.encode([text], truncate=False, left=True)


def test_a_left_cut_gives_entities_offsets_in_the_whole_text():
    tok = Tokenizer("bundled:minilm", max_length=8)
    text = "alpha beta gamma delta epsilon zeta eta theta"
    (enc,) = tok.encode_tagged([text], left=True)
    spans = [
        span
        for span, special in zip(enc.tokens.offsets, enc.tokens.special, strict=True)
        if not special
    ]
    assert [text[a:b] for a, b in spans] == ["gamma", "delta", "epsilon", "zeta", "eta", "theta"]
