"""`quantize: auto` (backends/choice.py): real candidates built, judged and timed on a small
saved classifier, the choice kept and read back, and made again where it must be."""

import json
import re
from dataclasses import replace

import pytest

from numaserve.backends import load_model
from numaserve.backends.choice import (
    ALONE,
    CANDIDATES,
    FASTER_THAN_FP32,
    Band,
    Batching,
    ModelPath,
    bands,
    choice_key,
    choose,
    concrete,
    ensure_choice,
)
from numaserve.backends.gate import Judgement, Span, gate_texts
from numaserve.checkpoint.errors import ModelLoadError
from numaserve.config.schema import ModelConfig
from numaserve.corpus import stdlib_passages
from tests.harness.router_side import ISA

TEXTS = gate_texts(stdlib_passages(), 48)


class CountingLoads:
    """load_model itself, counting its calls: how a test sees whether a choice was made."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, config, isa):
        self.calls += 1
        return load_model(config, isa)


@pytest.fixture(scope="module")
def classifier_choice(classifier_dir, tmp_path_factory):
    config = ModelConfig(path=str(classifier_dir), task="classify")
    return choose(config, ISA, load_model, TEXTS)


def kept_choices(cache) -> list:
    """The kept choices (beside them, gate-*.json: the gate's verdicts, kept for any pools)."""
    return [p for p in (cache / "choice").glob("*.json") if not p.name.startswith("gate-")]


def longest_band(choice, pool: str) -> str:
    """The key of a pool's longest band in the trials' times ("POOL FIRST-LAST tokens")."""
    keys = {  # one text at a time (its micro-batches' keys end " xN")
        k
        for t in choice.trials
        for k in t.get("pools", {})
        if k.split()[0] == pool and " x" not in k
    }
    return max(keys, key=lambda k: Span.parse(k.split(" ", 1)[1]).last)


def raced(choice, pool: str = "default") -> list[dict]:
    """The trials that raced in a pool's longest band, which decides the pool's own path,
    each with its per-round times there."""
    key = longest_band(choice, pool)
    return [t | t["pools"][key] for t in choice.trials if key in t.get("pools", {})]


def test_auto_chooses_a_candidate_that_passes_the_gate_and_no_faster_one_is_clearly_ahead(
    classifier_choice,
):
    trials = raced(classifier_choice)
    path = str(classifier_choice.for_pool().path)
    chosen = next(t for t in trials if t["path"] == path)
    span = Span.parse(longest_band(classifier_choice, "default").split(" ", 1)[1])
    # only the paths that pass in the band race there
    assert all(Judgement.from_json(t["bands"]).passes(span) for t in trials)
    for rival in trials:
        # Against a rival faster in the median, the chosen path lost no round by more than
        # the rounds' spread: a lead within the noise goes to the path listed first.
        ratios = [a / b for a, b in zip(chosen["rounds"], rival["rounds"], strict=True)]
        lead = sorted(ratios)[len(ratios) // 2] - 1
        assert lead <= max(ratios) - min(ratios) or rival is chosen, (chosen, rival)


def test_auto_races_the_paths_that_pass_in_alternating_rounds(classifier_choice):
    trials = raced(classifier_choice)
    assert len(trials) >= 2 and all(len(t["rounds"]) == 5 for t in trials)
    assert all(t["ms"] == sorted(t["rounds"])[2] for t in trials)  # the median round
    why = classifier_choice.for_pool().why  # in short: the lead, or that it ran alone
    assert re.search(r"one at a time, (\d\.\d\dx .+'s speed|the only path|as fast as)", why)


def test_each_pool_races_on_texts_of_its_own_lengths_and_gets_its_own_choice(classifier_dir):
    config = ModelConfig(path=str(classifier_dir), task="classify")
    pools = (Band("short", 0, 24), Band("long", 24, 256))
    choice = choose(config, ISA, load_model, TEXTS, pools, Batching(8, 128))
    assert set(choice.pools) == {"short", "long"}
    batch = {}
    for pool, band in (("short", "17-24"), ("long", "65-256")):
        assert f"{band} tokens: one at a time, " in choice.pools[pool].why
        found = re.search(r"; (\d+) at a time ", choice.pools[pool].why)
        batch[pool] = int(found.group(1)) if found else 1
    assert batch["short"] > batch["long"]  # 128 tokens of micro-batch hold more short texts
    # the short pool's micro-batches raced apart from its texts one at a time
    timed = {key for t in choice.trials for key in t.get("pools", {})}
    assert f"short 17-24 tokens x{batch['short']}" in timed and "short 17-24 tokens" in timed
    for pool in ("short", "long"):
        assert len(raced(choice, pool)) >= 2


def test_auto_tries_every_ctranslate2_onnxruntime_and_openvino_path_and_says_why_it_skips_one(
    classifier_choice,
):
    expected = [
        str(c) for c in CANDIDATES if c.backend in ("ctranslate2", "onnxruntime", "openvino")
    ]
    assert [t["path"] for t in classifier_choice.trials] == expected
    fp32 = next(t for t in classifier_choice.trials if t["path"] == "onnxruntime none")
    if "skipped" in fp32:  # int16 (Intel's MKL) or bf16 (AMX) passes in every band here
        assert re.fullmatch(
            r"not needed: .* passes the gate in every band, faster", fp32["skipped"]
        )
        faster = [t for t in classifier_choice.trials if t["path"] in FASTER_THAN_FP32]
        assert any(t.get("passed") for t in faster)
    else:
        assert fp32["passed"] and all(
            re.fullmatch(r"the same as fp32 for (\d+) of \1 texts: 100.0% .*", band["figure"])
            for band in fp32["bands"].values()
        )
    for trial in classifier_choice.trials:
        assert "figure" in trial or trial["skipped"]  # bf16 on a CPU without it, for one


def test_a_kept_choice_is_read_back_without_loading_anything(
    classifier_dir, choice_cache, monkeypatch
):
    config = ModelConfig(path=str(classifier_dir), task="classify")
    monkeypatch.setattr("numaserve.backends.gate.GATE_TEXTS", 24)  # a quicker gate
    first, again = CountingLoads(), CountingLoads()
    made = ensure_choice(config, ISA, first)
    assert first.calls >= 4 and ensure_choice(config, ISA, again) == made and again.calls == 0
    (kept,) = kept_choices(choice_cache)
    kept_path = json.loads(kept.read_text())["pools"]["default"]["path"]
    assert kept_path["backend"] == made.for_pool().path.backend


def test_a_damaged_kept_choice_is_made_again(classifier_dir, choice_cache, monkeypatch):
    config = ModelConfig(path=str(classifier_dir), task="classify")
    monkeypatch.setattr("numaserve.backends.gate.GATE_TEXTS", 24)
    ensure_choice(config, ISA, load_model)
    (kept,) = kept_choices(choice_cache)
    kept.write_text('{"pools": ')
    loads = CountingLoads()
    ensure_choice(config, ISA, loads)
    assert loads.calls >= 4 and json.loads(kept.read_text())["pools"]


def test_another_pool_layout_races_again_on_the_gates_kept_verdicts(
    classifier_dir, choice_cache, monkeypatch
):
    config = ModelConfig(path=str(classifier_dir), task="classify")
    monkeypatch.setattr("numaserve.backends.gate.GATE_TEXTS", 24)
    first = ensure_choice(config, ISA, load_model, (Band("all", 0, 256),))
    passing = [t["path"] for t in first.trials if t.get("passed")]
    loads = CountingLoads()
    two = (Band("short", 0, 16), Band("long", 16, 256))
    again = ensure_choice(config, ISA, loads, two)
    assert loads.calls == len(passing)  # no fp32 reference, no failing path: only the race
    assert set(again.pools) == {"short", "long"}
    assert [t["path"] for t in again.trials if t.get("passed")] == passing


def test_a_kept_choice_serves_the_same_bands_under_other_pool_names(
    classifier_dir, choice_cache, monkeypatch
):
    config = ModelConfig(path=str(classifier_dir), task="classify")
    monkeypatch.setattr("numaserve.backends.gate.GATE_TEXTS", 24)
    made = ensure_choice(config, ISA, load_model, (Band("main", 0, 256),))
    loads = CountingLoads()
    again = ensure_choice(config, ISA, loads, (Band("default", 0, 256),))
    assert loads.calls == 0 and list(again.pools) == ["default"]
    assert again.for_pool("default") == made.for_pool("main")


ONE = (Band("default", 0, 256),)


def test_another_cpu_model_scope_or_pool_layout_chooses_again():
    config = ModelConfig(task="classify")
    key = choice_key("digest", config, ("avx2", "avx512_vnni"), ONE, ALONE)
    assert key == choice_key("digest", config, ("avx512_vnni", "avx2"), ONE, ALONE)
    assert key != choice_key("digest", config, ("avx2",), ONE, ALONE)
    assert key != choice_key("other", config, ("avx2", "avx512_vnni"), ONE, ALONE)
    assert key != choice_key(
        "digest", replace(config, backend="onnxruntime"), ("avx2",), ONE, ALONE
    )
    assert key != choice_key("digest", replace(config, task="embed"), ("avx2",), ONE, ALONE)
    two = (Band("short", 0, 32), Band("long", 32, 256))
    assert key != choice_key("digest", config, ("avx2", "avx512_vnni"), two, ALONE)
    assert key != choice_key("digest", config, ("avx2", "avx512_vnni"), ONE, Batching(8, 128))


def test_one_choice_serves_every_padding_and_truncation():
    config = ModelConfig(task="classify")
    other = replace(config, padding="max_length", truncate=False)
    assert choice_key("d", config, ("avx2",), ONE, ALONE) == choice_key(
        "d", other, ("avx2",), ONE, ALONE
    )


def test_pools_bands_run_from_the_next_shorter_pools_max_tokens():
    from numaserve.config.schema import PoolConfig

    pools = (PoolConfig("long", 512), PoolConfig("short", 32), PoolConfig("mid", 128))
    assert bands(pools, 256) == (
        Band("short", 0, 32),
        Band("mid", 32, 128),
        Band("long", 128, 256),  # no text is longer than model.max_length
    )


def test_a_pool_micro_batches_as_many_texts_as_its_token_budget_allows():
    batching = Batching(max_batch=8, max_batch_tokens=128)
    assert [batching.size(n) for n in (10, 16, 40, 118, 300)] == [8, 8, 3, 1, 1]
    assert ALONE.size(10) == 1


@pytest.mark.parametrize(
    "quantize, backend", [("int8", "onnxruntime"), ("bf16", "openvino"), ("none", "onnxruntime")]
)
def test_backend_auto_runs_a_named_precision_on_its_first_backend(quantize, backend):
    def no_loads(config, isa):
        raise AssertionError("a named precision needs no choice")

    config, choice = concrete(ModelConfig(quantize=quantize), ISA, no_loads)
    assert (config.backend, config.quantize, choice) == (backend, quantize, None)


def test_a_named_backend_with_auto_chooses_among_its_own_paths(classifier_dir):
    config = ModelConfig(path=str(classifier_dir), task="classify", backend="torch")
    choice = choose(config, ISA, load_model, TEXTS[:16])
    assert [t["path"] for t in choice.trials] == ["torch int8", "torch none"]
    assert choice.for_pool().path.backend == "torch"


def test_no_path_that_passes_is_a_clear_error_with_each_ones_figure():
    # Every candidate is replaced by one real model made worse on purpose (MiniLM under
    # torch's default dynamic int8: mean cosine 0.95 in docs/accuracy.md), so none can pass.
    import copy

    import torch

    worse = load_model(ModelConfig(backend="torch", quantize="none"))
    worse.module = torch.ao.quantization.quantize_dynamic(
        copy.deepcopy(worse.module), {torch.nn.Linear}, dtype=torch.qint8
    )

    loads = []

    def worse_model(config, isa):  # the first load is the fp32 reference: real
        loads.append(config)
        return load_model(config, isa) if len(loads) == 1 else worse

    config = ModelConfig(backend="torch")
    with pytest.raises(ModelLoadError) as refused:
        choose(config, ISA, worse_model, TEXTS[-16:])
    message = str(refused.value)
    assert message.startswith("quantize: auto: no model path of bundled:minilm passes")
    assert re.search(
        r"torch int8: 17-64 tokens: cosine to fp32 >= 0.99 on \S+ of \d+ texts", message
    )


def test_auto_says_which_candidate_it_builds_before_building_it(caplog):
    """A first start spends up to half a minute on one candidate: the log says which, and
    how many are left, before it starts, not only after."""
    said_before_load = []

    def load(config, isa):
        said_before_load.append(caplog.text)
        return load_model(config, isa)

    caplog.set_level("INFO", logger="numaserve.backends")
    choose(ModelConfig(backend="torch"), ISA, load, TEXTS[-8:])
    reference, first, second = said_before_load[:3]
    assert "judging and timing each model path" in first and "candidate" not in reference
    # before the fp32 reference loads, the first line says what is coming and how to skip it
    assert "once (kept for later starts)" in reference and "--quantize" in reference
    assert "candidate 1 of 2, torch int8: building and judging it" in first
    assert "candidate 2 of 2, torch " in second and "s left" in second


def test_a_checkpoint_without_the_tasks_head_is_refused_before_any_path_is_judged():
    # bundled MiniLM holds no classification head (tests/test_missing_head.py has the rest).
    loads = CountingLoads()
    config = ModelConfig(task="classify", backend="torch")
    with pytest.raises(ModelLoadError, match=r"task: classify needs a sequence classification"):
        choose(config, ISA, loads, TEXTS[:16])
    assert loads.calls == 1  # the fp32 reference, refused: no candidate was loaded


def test_model_paths_read_as_the_config_writes_them():
    assert str(ModelPath("onnxruntime", "int8", ("*.output.dense",))) == (
        "onnxruntime int8 keep_fp32 *.output.dense"
    )


def test_the_time_left_goes_by_the_candidates_judged_not_one_skipped_at_once(caplog):
    """A candidate that cannot be built is skipped in a moment: no estimate from its pace
    (seen: "about 0 s left" after a skipped CTranslate2 before minutes of builds)."""
    said_before_load = []

    def load(config, isa):
        said_before_load.append(caplog.text)
        if config.quantize == "int8":
            raise ModelLoadError("this path cannot be built here")
        return load_model(config, isa)

    caplog.set_level("INFO", logger="numaserve.backends")
    choose(ModelConfig(backend="torch"), ISA, load, TEXTS[-6:])
    second = said_before_load[2].splitlines()[-1]
    assert "candidate 2 of 2, torch none: building and judging it" in second
    assert "s left" not in second
