"""The router's tokenizer: the checkpoint's tokenizer.json read by the tokenizers library,
giving the ids transformers gives, and the model's length limit applied in one place."""

import shutil

import pytest

from numaserve.corpus import stdlib_sentences
from numaserve.modelpath import ModelLoadError, resolve_model_path
from numaserve.tokenization import Tokenizer, TooLongError

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
    assert (short.truncated, len(long.ids), long.truncated, long.tokens) == (False, 16, True, 42)
    assert long.ids[-1] == tok.raw.token_to_id("[SEP]")


def test_long_text_is_refused_when_truncation_is_off():
    tok = Tokenizer("bundled:minilm", max_length=16, truncate=False)
    with pytest.raises(TooLongError, match="text 1 has 42 tokens; the limit is 16"):
        tok.encode(["fine", "word " * 40])
