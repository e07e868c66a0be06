"""A pool whose shorter texts run on another model path (backends/banded.py): each text goes
to its band's model, answers come back in order, and the pass's time in the heads is theirs
together. The paths here are stand-ins that say which ran (the real ones: test_choice.py)."""

from numaserve.backends.banded import Banded


class Path:
    """A model path that answers with its name and spends `head_s` in its head."""

    def __init__(self, name: str, head_s: float) -> None:
        self.name, self.head_s, self.ran = name, head_s, []

    def run(self, batch, segments=None, whole=()):
        self.ran.append(len(batch))
        return [f"{self.name} {len(ids)}" for ids in batch]


def test_each_text_runs_on_its_bands_path_in_order_and_the_heads_times_add_up():
    short, long = Path("short", 0.001), Path("long", 0.004)
    banded = Banded(long, [(8, short)])
    answers = banded.run([[1] * 3, [1] * 20, [1] * 8])
    assert answers == ["short 3", "long 20", "short 8"]
    assert abs(banded.head_s - 0.005) < 1e-12


def test_a_batch_of_one_band_runs_whole_on_its_path():
    short, long = Path("short", 0.001), Path("long", 0.004)
    banded = Banded(long, [(8, short)])
    assert banded.run([[1] * 3, [1] * 5]) == ["short 3", "short 5"]
    assert short.ran == [2] and long.ran == [] and banded.head_s == 0.001
