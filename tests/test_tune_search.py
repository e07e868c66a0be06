"""`numaserve tune`'s search, on made-up measurements: it finds the known best, keeps to the p99
target and never plans more cores than it has. No model runs here (tests/test_tune.py runs one)."""

from __future__ import annotations

from dataclasses import astuple

import pytest

from numaserve.tune.curves import Cell, Curves
from numaserve.tune.search import (
    Pool,
    Predictor,
    band_sets,
    search,
    to_verify,
    warm_share,
)
from numaserve.tune.workload import Workload

LENGTHS = (16, 32, 64, 128, 256, 512)
BATCHES = (1, 2, 4, 8, 16)


def made_up(fixed_s: float, per_token_s: float, speedup, cores=(1, 2, 4)) -> Curves:
    """A pass costs `fixed_s` plus `per_token_s` a padded token, divided by speedup(k, length)."""
    return Curves(
        [
            Cell("p", k, length, b, t := fixed_s + per_token_s * length * b / speedup(k, length), t)
            for k in cores
            for length in LENGTHS
            for b in BATCHES
        ]
    )


def short_texts() -> Workload:
    return Workload.of([14, 15, 16] * 100, 512)


def test_batches_as_much_as_it_may_when_each_pass_has_a_fixed_cost():
    curves = made_up(0.005, 1e-6, lambda k, length: k**0.5)  # cores scale badly
    best = search(Predictor(short_texts(), curves), cores=4, p99_ms=1000)[0]
    assert best.candidate.pools == (Pool(512, 1, 4),)
    assert best.candidate.max_batch == 16


def test_keeps_to_the_p99_target():
    curves = made_up(0.002, 1e-4, lambda k, length: k**0.5)  # batching pays, but slowly
    unbounded = search(Predictor(short_texts(), curves), cores=4, p99_ms=1000)[0]
    target = unbounded.p99_ms * 0.6
    ranked = search(Predictor(short_texts(), curves), cores=4, p99_ms=target)
    best = ranked[0]
    assert best.p99_ms <= target
    assert best.candidate.max_batch < 16
    assert best.texts_per_s < unbounded.texts_per_s


def test_says_when_nothing_meets_the_target_by_ranking_the_lowest_p99_first():
    curves = made_up(0.005, 1e-6, lambda k, length: 1.0)
    ranked = search(Predictor(short_texts(), curves), cores=2, p99_ms=0.001)
    assert ranked[0].p99_ms > 0.001
    assert ranked[0].p99_ms == min(p.p99_ms for p in ranked)


@pytest.mark.parametrize("cores", [1, 2, 3, 16])
def test_never_plans_more_cores_than_it_has(cores):
    curves = made_up(0.001, 1e-5, lambda k, length: k, cores=(1, 2, 4, 8))
    ranked = search(
        Predictor(Workload.of([10, 50, 200, 400] * 50, 512), curves), cores, p99_ms=1000
    )
    assert ranked
    assert all(p.candidate.cores <= cores for p in ranked)
    assert ranked[0].candidate.cores == cores  # an idle core serves nothing


def test_gives_long_texts_more_cores_when_one_would_miss_the_target():
    # Short passes gain nothing from more cores; long ones scale with them.
    curves = made_up(0.001, 1e-4, lambda k, length: k if length >= 128 else 1)
    workload = Workload.of([16] * 900 + [400] * 100, 512)
    one_core_long_ms = 2 * (0.001 + 1e-4 * 400) * 1000  # QUEUEING x the long pass on 1 core
    best = search(Predictor(workload, curves), cores=8, p99_ms=one_core_long_ms * 0.7)[0].candidate
    short, long = best.pools[0], best.pools[-1]
    assert 16 <= short.max_tokens < 400 and short.cores == 1
    assert long.max_tokens == 512 and long.cores >= 2


def test_predicts_more_throughput_from_more_instances():
    curves = made_up(0.001, 1e-5, lambda k, length: k)
    predictor = Predictor(short_texts(), curves)
    ranked = search(Predictor(short_texts(), curves), cores=4, p99_ms=1000)
    c = ranked[0].candidate
    fewer = type(c)(c.path, tuple(Pool(p.max_tokens, p.cores, 1) for p in c.pools), 16, 1024)
    assert predictor.predict(c).texts_per_s > predictor.predict(fewer).texts_per_s


def test_splits_pools_at_the_workloads_quantiles_and_covers_max_length():
    workload = Workload.of(list(range(1, 201)), 256)
    sets = band_sets(workload)
    assert (256,) in sets
    assert all(s[-1] == 256 and list(s) == sorted(set(s)) for s in sets)
    assert all(edge % 8 == 0 for s in sets for edge in s[:-1])
    assert max(len(s) for s in sets) == 3


def test_traffic_of_more_lengths_than_the_runtime_keeps_runs_mostly_at_the_cold_figure():
    warm = made_up(0.001, 1e-5, lambda k, length: 1.0)
    cells = [Cell(c.path, c.cores, c.length, c.batch, c.seconds, 2 * c.seconds) for c in warm.cells]
    curves = Curves(cells)
    many = Workload.of(list(range(1, 201)), 512)  # 200 lengths
    c = search(Predictor(many, curves), cores=1, p99_ms=1000)[0].candidate
    keeps_all = Predictor(many, curves).predict(c).texts_per_s
    keeps_few = Predictor(many, curves, {"p": 20}).predict(c).texts_per_s
    assert keeps_all / keeps_few == pytest.approx(2, rel=0.15)  # 180 of 200 lengths run cold
    few = Workload.of(list(range(1, 21)) * 10, 512)  # 20 lengths, each at every batch size
    kept_all = {"p": 20 * c.max_batch}
    assert Predictor(few, curves, kept_all).predict(c).texts_per_s == pytest.approx(
        Predictor(few, curves).predict(c).texts_per_s
    )


def test_the_most_frequent_shapes_are_the_ones_kept():
    # 100 texts at batch 1 (one shape); 10 texts at batches of up to 4 (four shapes, rarer)
    assert warm_share([(10, 4), (100, 1)], kept=3) == [0.5, 1.0]
    assert warm_share([(10, 4), (100, 1)], kept=None) == [1.0, 1.0]
    assert warm_share([(10, 4), (100, 1)], kept=0) == [0.0, 0.0]


def test_verifies_the_best_of_each_model_path_then_the_next_best():
    fast, slow = made_up(0.001, 1e-5, lambda k, length: k), made_up(0.002, 2e-5, lambda k, n: k)
    curves = Curves(fast.cells + [Cell("q", *astuple(c)[1:]) for c in slow.cells])
    ranked = search(Predictor(short_texts(), curves), cores=2, p99_ms=1000)
    assert ranked[0].candidate.path == "p" and ranked[1].candidate.path == "p"
    two = to_verify(ranked, 2, lambda c: True)
    assert [p.candidate.path for p in two] == ["p", "q"]
    three = to_verify(ranked, 3, lambda c: True)
    assert three == sorted([*two, ranked[1]], key=ranked.index)
    assert to_verify(ranked, 2, lambda c: c.max_batch == 1)[0].candidate.max_batch == 1


def test_auto_is_ranked_on_each_pass_timed_on_the_path_it_runs_on():
    from numaserve.tune.curves import composed

    latency = made_up(0.002, 1e-5, lambda k, n: k)  # a fixed cost a pass: fast alone
    throughput = made_up(0.006, 2e-6, lambda k, n: k)  # wide products: fast in batches
    curves = Curves(
        [*(Cell("int16", *astuple(c)[1:]) for c in latency.cells)]
        + [Cell("bf16", *astuple(c)[1:]) for c in throughput.cells]
    )

    def runs(length, batch):
        return "bf16" if length <= 32 and batch >= 4 else "int16"

    auto = composed(curves, "auto", runs)
    assert auto.paths() == ("auto",)
    for source in ("int16", "bf16"):
        for cell in (
            c for c in curves.cells if c.path == source and runs(c.length, c.batch) == source
        ):
            assert auto.seconds("auto", cell.cores, cell.length, cell.batch) == cell.seconds
