"""Which way of running is fastest on a shared machine (backends/race.py): turns taken round
after round, and a lead that counts only beyond the rounds' spread. Made-up times: what is
tested is the rule, not this machine's speed."""

import time

from numaserve.backends.race import Standing, ahead, in_turn, race, winner


def test_a_lead_in_every_round_larger_than_the_spread_counts():
    fast, slow = Standing("a", (1.0, 1.1, 0.9)), Standing("b", (1.5, 1.6, 1.4))
    assert ahead(fast, slow)


def test_a_lead_smaller_than_the_rounds_spread_does_not_count():
    # b is 5% slower in the median, but one round had it 10% faster: noise.
    fast, rival = Standing("a", (1.0, 1.0, 1.0)), Standing("b", (1.05, 0.9, 1.08))
    assert not ahead(fast, rival)


def test_the_fastest_wins_where_it_is_clearly_ahead():
    small, fast = Standing("less memory", (2.0, 2.2, 2.1)), Standing("fast", (1.0, 1.1, 1.0))
    assert winner([small, fast]) == (fast, fast)


def test_within_the_noise_the_runner_listed_first_wins():
    small = Standing("less memory", (1.04, 0.97, 1.03))
    fast = Standing("more memory", (1.0, 1.0, 1.0))
    assert winner([small, fast]) == (small, fast)


def test_a_runner_another_is_clearly_ahead_of_never_wins_even_within_the_fastests_noise():
    # "less memory" is within the noise of the fastest (a noisy one), but "steady" beats it
    # by 20% in every round: "steady", listed next and beaten by no one, wins.
    small = Standing("less memory", (1.2, 1.2, 1.2, 1.2, 1.2))
    steady = Standing("steady", (1.0, 1.0, 1.0, 1.0, 1.0))
    noisy = Standing("noisy", (0.6, 1.4, 0.6, 1.4, 0.9))
    assert ahead(steady, small) and not ahead(noisy, small) and not ahead(noisy, steady)
    assert winner([small, steady, noisy]) == (steady, noisy)


def test_every_runner_runs_every_round_on_the_same_inputs_starting_one_later_each_round():
    calls = []
    runners = {name: (lambda part, name=name: calls.append((name, tuple(part)))) for name in "xyz"}
    standings = race(runners, list(range(12)), rounds=3)
    assert [s.name for s in standings] == ["x", "y", "z"]
    assert all(len(s.ms) == 3 for s in standings)
    calls = calls[9:]  # each runner's uncounted warm-up first (the next test)
    assert [name for name, _ in calls] == list("xyzyzxzxy")
    rounds = [calls[i : i + 3] for i in (0, 3, 6)]
    assert all(len({part for _, part in r}) == 1 for r in rounds)  # one round, one input set
    assert [r[0][1] for r in rounds] == [(0, 3, 6, 9), (1, 4, 7, 10), (2, 5, 8, 11)]


def test_each_runners_first_passes_run_uncounted_on_inputs_of_every_length():
    """A runtime's first pass at a new shape (OpenVINO compiles one) is not its speed."""
    slow_first = {"x": True}

    def x(part):
        if slow_first["x"]:
            slow_first["x"] = False
            time.sleep(0.05)

    calls = []
    standings = race({"x": x, "y": calls.append}, list(range(8)), rounds=2)
    assert calls[:2] == [[0, 2, 4, 6], [1, 3, 5, 7]]  # every round's inputs, uncounted
    assert max(standings[0].ms) < 0.05 * 1e3 / 4  # the slow first pass counted in no round


def test_only_the_runners_named_warm_up_on_every_rounds_inputs():
    calls = {"x": [], "y": []}
    race({n: calls[n].append for n in "xy"}, list(range(8)), rounds=2, warm_every_shape={"x"})
    assert calls["x"][:2] == [[0, 2, 4, 6], [1, 3, 5, 7]]  # then its two counted rounds
    assert calls["y"][:1] == [[0, 2, 4, 6]] and len(calls["y"]) == 3


def test_each_round_starts_one_later_and_wraps_around():
    assert [in_turn("abc", r) for r in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]
