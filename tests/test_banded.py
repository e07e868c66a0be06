"""A pool whose texts run on more than one model path (backends/banded.py): each text goes to
its band's path, a band's share of a micro-batch from its crossover on to its throughput
path, answers come back in order, the pass's time in the heads is theirs together, and the
passes each path ran are counted. The paths here are stand-ins that say which ran (the real
ones: test_prepared.py, test_choice.py)."""

import pytest

from numaserve.backends.banded import Banded, Segment


class Path:
    """A model path that answers with its name and spends `head_s` in its head."""

    def __init__(self, name: str, head_s: float) -> None:
        self.name, self.head_s, self.ran = name, head_s, []

    def run(self, batch, segments=None, whole=()):
        self.ran.append(len(batch))
        return [f"{self.name} {len(ids)}" for ids in batch]


def banded(*segments: Segment) -> Banded:
    models = {id(m): m.name for s in segments for m in (s.alone, s.batched) if m}
    return Banded(segments, models)


def test_each_text_runs_on_its_bands_path_in_order_and_the_heads_times_add_up():
    short, long = Path("short", 0.001), Path("long", 0.004)
    model = banded(Segment(8, short), Segment(None, long))
    answers = model.run([[1] * 3, [1] * 20, [1] * 8])
    assert answers == ["short 3", "long 20", "short 8"]
    assert abs(model.head_s - 0.005) < 1e-12


def test_a_batch_of_one_band_runs_whole_on_its_path():
    short, long = Path("short", 0.001), Path("long", 0.004)
    model = banded(Segment(8, short), Segment(None, long))
    assert model.run([[1] * 3, [1] * 5]) == ["short 3", "short 5"]
    assert short.ran == [2] and long.ran == [] and model.head_s == 0.001


def test_a_micro_batch_from_the_crossover_on_runs_on_the_bands_throughput_path():
    latency, throughput = Path("latency", 0.001), Path("throughput", 0.002)
    model = banded(Segment(None, latency, throughput, from_batch=4))
    assert model.run([[1] * 5] * 3) == ["latency 5"] * 3
    assert model.run([[1] * 5] * 4) == ["throughput 5"] * 4
    assert latency.ran == [3] and throughput.ran == [4]


def test_each_bands_share_of_a_batch_counts_toward_its_own_crossover():
    latency, throughput, long = Path("latency", 0), Path("throughput", 0), Path("long", 0)
    model = banded(Segment(8, latency, throughput, from_batch=3), Segment(None, long))
    mixed = [[1] * 4, [1] * 20, [1] * 4, [1] * 30]  # two short texts: below their crossover
    assert model.run(mixed) == ["latency 4", "long 20", "latency 4", "long 30"]
    assert model.run([*mixed, [1] * 6]) == [
        "throughput 4",
        "long 20",
        "throughput 4",
        "long 30",
        "throughput 6",
    ]


def test_the_passes_each_path_ran_are_counted_by_path():
    short, long = Path("short", 0), Path("long", 0)
    model = banded(Segment(8, short), Segment(None, long))
    model.run([[1] * 3, [1] * 20])
    model.run([[1] * 3])
    assert model.ran == {"short": 2, "long": 1}


def test_the_pools_own_band_comes_last_and_alone_has_no_bound():
    with pytest.raises(ValueError, match="own band comes last"):
        banded(Segment(None, Path("a", 0)), Segment(8, Path("b", 0)))
