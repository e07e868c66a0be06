"""`quantize: auto` chooses each band's paths for the loads it runs (backends/choice.py's
race_pools): one text at a time and, apart, at the pool's micro-batches, keeping a second
path only where it is clearly ahead there, from the batch size where it takes the lead.
The paths are stand-ins whose time a pass is made up (sleeps, so a busy neighbour cannot
change the answer): what is tested is the rule; the real paths race in test_choice.py."""

import re
import time
from dataclasses import dataclass

import pytest

from numaserve.backends.choice import (
    Band,
    Batching,
    Passed,
    covered_without_fp32,
    race_pools,
    within,
)
from numaserve.backends.gate import Judgement, Span
from numaserve.config.paths import BandPath, BatchedPath, ModelPath, PoolPath
from numaserve.tasks.agreement import Verdict

PATHS = {"latency": ModelPath("ctranslate2", "int16"), "throughput": ModelPath("openvino", "bf16")}


@dataclass(frozen=True)
class Text:
    ids: tuple[int, ...]
    second: int | None = None


class Timed:
    """A path that takes `per_pass` ms a forward pass and `per_text` ms more a text in it."""

    def __init__(self, per_pass: float, per_text: float) -> None:
        self.per_pass, self.per_text = per_pass, per_text

    def run(self, batch, segments=None, whole=()):
        time.sleep((self.per_pass + self.per_text * len(batch)) / 1e3)
        return [None] * len(batch)


def choose(models: dict, batching: Batching, max_paths: int = 3):
    texts = [Text(tuple(range(n))) for n in range(1, 17) for _ in range(3)]
    judged = {
        name: Judgement({span: Verdict(True, f"{name}'s") for span in (Span(1, 8), Span(9, 16))})
        for name in models
    }
    trials = [{"path": name} for name in models]
    pools = (Band("main", 0, 16),)
    chosen = race_pools(pools, batching, texts, Passed(models, judged), trials, PATHS, max_paths)
    return chosen["main"], trials


def test_a_band_keeps_a_throughput_path_from_the_batch_size_where_it_takes_the_lead():
    # one text: 3 ms against 4.2; two: 2 ms a text against 2.2; four: 1.5 against 1.2
    models = {"latency": Timed(2, 1), "throughput": Timed(4, 0.2)}
    choice, trials = choose(models, Batching(max_batch=8, max_batch_tokens=128))
    assert str(choice.path) == "ctranslate2 int16"
    assert choice.batched is not None and str(choice.batched.path) == "openvino bf16"
    assert choice.batched.from_batch == 4
    assert "x latency's speed 8 at a time, ahead from 4 texts a pass (2: " in choice.batched.why
    assert choice.shorter == ()  # both bands run the same paths: one run
    assert re.fullmatch(  # why, in words a user reads once
        r"texts of 1-16 tokens, each band raced; 9-16 tokens: one at a time, \d\.\d\dx "
        r"throughput's speed; 8 at a time throughput is faster: its micro-batches' path",
        choice.why,
    )
    timed = {key for t in trials for key in t["pools"]}
    assert {"main 9-16 tokens", "main 9-16 tokens x8", "main 9-16 tokens x2"} <= timed


def test_each_path_a_pool_holds_has_the_gates_figures_in_every_band_it_runs():
    models = {"latency": Timed(2, 1), "throughput": Timed(4, 0.2)}
    choice, _ = choose(models, Batching(max_batch=8, max_batch_tokens=128))
    assert choice.accuracy == "1-8 tokens: latency's; 9-16 tokens: latency's"
    assert choice.batched.accuracy == "1-8 tokens: throughput's; 9-16 tokens: throughput's"


def test_a_throughput_path_is_held_only_within_the_pools_max_paths(caplog):
    models = {"latency": Timed(2, 1), "throughput": Timed(4, 0.2)}
    caplog.set_level("INFO", logger="numaserve.backends")
    choice, _ = choose(models, Batching(max_batch=8, max_batch_tokens=128), max_paths=1)
    assert str(choice.path) == "ctranslate2 int16" and choice.batched is None
    assert "does not hold openvino bf16 for its micro-batches" in caplog.text
    assert "model.max_paths 1" in caplog.text


def test_a_path_no_faster_at_the_pools_micro_batches_is_not_held_beside_the_latency_path():
    models = {"latency": Timed(2, 1), "throughput": Timed(2.5, 1)}
    choice, _ = choose(models, Batching(max_batch=8, max_batch_tokens=128))
    assert str(choice.path) == "ctranslate2 int16" and choice.batched is None


def test_a_pool_that_runs_one_text_at_a_time_races_one_text_at_a_time_alone():
    models = {"latency": Timed(2, 1), "throughput": Timed(4, 0.2)}
    choice, trials = choose(models, Batching(max_batch=1, max_batch_tokens=128))
    assert str(choice.path) == "ctranslate2 int16" and choice.batched is None
    assert all(" x" not in key for t in trials for key in t["pools"])


def judged(**passes: tuple[bool, bool]) -> dict:
    """Made-up judgements, by path: whether each passes in 1-8 and in 9-16 tokens."""
    spans = (Span(1, 8), Span(9, 16))
    return {
        name.replace("_", " "): Judgement(
            {span: Verdict(ok, "") for span, ok in zip(spans, oks, strict=True)}
        )
        for name, oks in passes.items()
    }


BANDS = (Span(1, 8), Span(9, 16))


def test_fp32_is_not_judged_where_int16_or_amx_bf16_passes_in_every_band():
    int16 = judged(ctranslate2_int16=(True, True))
    assert covered_without_fp32(int16, BANDS, ()) == "ctranslate2 int16"
    split = judged(ctranslate2_int16=(False, True), openvino_bf16=(True, False))
    assert covered_without_fp32(split, BANDS, ("amx_bf16",)) == "ctranslate2 int16 or openvino bf16"


def test_fp32_is_judged_where_a_band_has_no_path_known_faster():
    assert covered_without_fp32(judged(ctranslate2_int16=(False, True)), BANDS, ()) is None
    # bf16 on AVX512_BF16 without AMX is not known to beat fp32: fp32 is judged and raced
    assert covered_without_fp32(judged(openvino_bf16=(True, True)), BANDS, ("avx512_bf16",)) is None
    assert covered_without_fp32(judged(ctranslate2_int8=(True, True)), BANDS, ()) is None


class ByTokens(Timed):
    """A path that takes `per_pass` ms a forward pass and `per_token` ms more a token in it,
    as an encoder does."""

    def run(self, batch, segments=None, whole=()):
        time.sleep((self.per_pass + self.per_text * sum(map(len, batch))) / 1e3)
        return [None] * len(batch)


def test_every_race_says_how_long_the_races_have_left_and_the_estimate_holds(caplog):
    caplog.set_level("INFO", logger="numaserve.backends")
    models = {"latency": ByTokens(1.5, 0.1), "throughput": ByTokens(3, 0.02)}
    choose(models, Batching(max_batch=8, max_batch_tokens=128))
    end = time.time()
    lines = [r for r in caplog.records if "timing" in r.getMessage()]
    said = [
        r.getMessage().partition("; about ")[2].partition(" s left for the races")[0] for r in lines
    ]
    assert said[0] == ""  # no pace yet: the stand-ins ran no gate
    assert all(said[1:])  # every race after the first says it
    # from the first race in micro-batches on, a pass's cost is fitted (a + b x its tokens)
    for record, seconds in list(zip(lines, said, strict=True))[2:]:
        assert float(seconds) == pytest.approx(end - record.created, abs=0.6, rel=0.25)


def test_bands_that_run_alike_once_a_throughput_path_is_dropped_run_as_one():
    # 1-8 tokens: latency alone; 9-16: latency, and throughput from 4 texts (max_paths 2)
    latency, throughput = PATHS["latency"], PATHS["throughput"]
    switch = BatchedPath(4, throughput, "8 a batch: 1.5x")
    choice = PoolPath(
        ModelPath("ctranslate2", "int8"),
        "17-64",
        (BandPath(8, latency, "1-8", None, "a"), BandPath(16, latency, "9-16", switch, "b")),
        None,
        "c",
    )
    assert within(choice, 3, "main") == choice
    (band,) = within(choice, 2, "main").shorter
    assert (band.last, band.path, band.batched) == (16, latency, None)
    assert (band.why, band.accuracy) == ("1-8; 9-16", "a; b")


def test_a_pools_pass_runs_on_its_bands_path_and_from_the_crossover_on_its_throughput_path():
    latency, throughput = PATHS["latency"], PATHS["throughput"]
    own = ModelPath("ctranslate2", "int8")
    switch = BatchedPath(4, throughput, "")
    choice = PoolPath(own, "", (BandPath(16, latency, "", switch),))
    assert [choice.runs(12, texts) for texts in (1, 3, 4, 8)] == [latency] * 2 + [throughput] * 2
    assert choice.runs(16, 1) == latency and choice.runs(17, 8) == own
    assert choice.held == (own, latency, throughput)
