"""Every benchmark in benchmarks/ imports: a benchmark is run by hand, seldom, so a name it
imports that the package renamed would otherwise be found only by the next person who runs it
(benchmarks/sts.py imported a status helper for a week after it was gone)."""

import importlib
from pathlib import Path

import pytest

BENCHMARKS = sorted(
    p.stem for p in (Path(__file__).parents[1] / "benchmarks").glob("*.py") if p.stem != "__init__"
)


@pytest.mark.parametrize("name", BENCHMARKS)
def test_the_benchmark_imports(name):
    try:
        importlib.import_module(f"benchmarks.{name}")
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] in ("numaserve", "benchmarks"):
            raise
        pytest.skip(f"needs {e.name}, which the bench extra installs")
