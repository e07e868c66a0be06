"""The accuracy gate's bars (tasks/agreement.py), on constructed answers, and its run on real
models: fp32 passes, and a model made worse on purpose fails with its figure."""

import numpy as np
import pytest

from numaserve.backends import load_model
from numaserve.backends.gate import Gate, Judgement, Span, gate_corpus, gate_texts, length_bands
from numaserve.backends.tokenizer import Tokenizer
from numaserve.config.schema import ModelConfig
from numaserve.corpus import passages, short_texts, stdlib_passages
from numaserve.tasks.agreement import agreement_verdict, cosine_verdict, f1_verdict


def unit_rows(n: int, seed: int = 0) -> np.ndarray:
    rows = np.random.default_rng(seed).normal(size=(n, 16))
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def tilted(rows: np.ndarray, cosine: float, seed: int = 1) -> np.ndarray:
    """Rows at exactly `cosine` to `rows`."""
    noise = np.random.default_rng(seed).normal(size=rows.shape)
    noise -= (noise * rows).sum(1, keepdims=True) * rows
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    return cosine * rows + np.sqrt(1 - cosine**2) * noise


def test_embeddings_pass_with_one_text_in_a_hundred_under_0_99_but_above_0_98():
    reference = unit_rows(100)
    candidate = tilted(reference, 0.995)
    candidate[7] = tilted(reference[7:8], 0.985)[0]
    assert cosine_verdict(candidate, reference).passed


def test_embeddings_fail_with_two_texts_in_a_hundred_under_0_99():
    reference = unit_rows(100)
    candidate = tilted(reference, 0.995)
    candidate[:2] = tilted(reference[:2], 0.985)
    verdict = cosine_verdict(candidate, reference)
    assert not verdict.passed and "on 98.0% of 100 texts (bar 99%)" in verdict.figure


def test_embeddings_fail_with_one_text_under_0_98():
    reference = unit_rows(1000)
    candidate = tilted(reference, 0.999)
    candidate[3] = tilted(reference[3:4], 0.97)[0]
    verdict = cosine_verdict(candidate, reference)
    assert not verdict.passed and "lowest 0.9700 (bar 0.98)" in verdict.figure


def test_labels_pass_at_98_in_100_and_fail_at_97():
    reference = ["a"] * 100
    assert agreement_verdict(["b"] * 2 + ["a"] * 98, reference, "texts").passed
    verdict = agreement_verdict(["b"] * 3 + ["a"] * 97, reference, "texts")
    assert not verdict.passed and verdict.figure.startswith("the same as fp32 for 97 of 100 texts")


def test_entity_f1_counts_missed_and_invented_entities():
    reference = [{(0, 5, "PER")}] * 50
    assert f1_verdict([{(0, 5, "PER")}] * 50, reference).passed
    # one missed, one invented: F1 = 2*49 / (50 + 50) = 98%
    assert f1_verdict(
        [set()] + [{(0, 5, "PER")}] * 48 + [{(0, 5, "PER"), (6, 9, "LOC")}], reference
    ).passed
    wrong = [{(0, 5, "LOC")}] * 2 + [{(0, 5, "PER")}] * 48  # two mislabelled: 96%
    assert not f1_verdict(wrong, reference).passed


def test_no_entities_on_either_side_is_full_agreement():
    assert f1_verdict([set(), set()], [set(), set()]).passed


def test_passages_keep_prose_paragraphs_and_drop_code():
    doc = "Return the sum.\n\n    >>> add(1, 2) == [3]\n\nThe values are added in order."
    assert passages(doc)[:2] == [
        "Return the sum.",
        "Return the sum. The values are added in order.",
    ]
    assert all(">>>" not in p for p in passages(doc))


def test_gate_texts_span_every_length_of_the_shipped_prose():
    texts = gate_texts(stdlib_passages())
    words = sorted(len(t.split()) for t in texts)
    assert len(texts) == 320 and words[0] <= 3 and words[-1] >= 150


def test_a_pool_is_judged_in_each_band_of_lengths_it_spans():
    assert length_bands(1, 256) == [Span(1, 8), Span(9, 16), Span(17, 64), Span(65, 256)]
    assert length_bands(17, 32) == [Span(17, 32)]
    assert length_bands(5, 16) == [Span(5, 8), Span(9, 16)]


def test_a_path_that_fails_the_short_band_fails_however_well_the_others_pass():
    from numaserve.tasks.agreement import Verdict

    judgement = Judgement(
        {
            Span(1, 8): Verdict(False, "short: 95%"),
            Span(9, 16): Verdict(True, "queries: 100%"),
            Span(17, 512): Verdict(True, "passages: 100%"),
        }
    )
    assert not judgement.passed
    assert not judgement.passes(Span(1, 256)) and not judgement.passes(Span(5, 12))
    assert judgement.passes(Span(9, 256))
    assert Judgement.from_json(judgement.to_json()) == judgement


def test_the_gate_holds_short_texts_as_users_send_them_beside_passages():
    tokenizer = Tokenizer("bundled:minilm", 512)
    lengths = [len(e.ids) for e in tokenizer.encode(gate_corpus())]
    short = [n for n in lengths if n <= 20]
    assert len(short_texts()) >= 200 and len(short) >= 250
    assert sum(n <= 8 for n in lengths) >= 100 and max(lengths) > 256


@pytest.fixture(scope="module")
def minilm_gate():
    reference = load_model(ModelConfig(backend="torch", quantize="none"))
    return Gate(
        "embed", Tokenizer("bundled:minilm", 256), gate_texts(stdlib_passages(), 96), reference
    )


def test_fp32_onnx_passes_the_embedding_gate(minilm_gate, tmp_path, monkeypatch):
    monkeypatch.setenv("NUMASERVE_CACHE", str(tmp_path))
    verdict = minilm_gate.judge(load_model(ModelConfig(quantize="none")))
    assert verdict.passed
    assert all("on 100.0% of" in v.figure for v in verdict.bands.values())
    assert sum(int(v.figure.split(" of ")[1].split()[0]) for v in verdict.bands.values()) == 96


def test_a_model_made_worse_fails_the_embedding_gate(minilm_gate):
    # torch's default dynamic int8 (per-tensor scales, 7-bit activations): mean cosine 0.95
    # in docs/accuracy.md, on any CPU.
    import copy

    import torch

    worse = load_model(ModelConfig(backend="torch", quantize="none"))
    worse.module = torch.ao.quantization.quantize_dynamic(
        copy.deepcopy(worse.module), {torch.nn.Linear}, dtype=torch.qint8
    )
    verdict = minilm_gate.judge(worse)
    assert not verdict.passed and "lowest 0." in verdict.figure
