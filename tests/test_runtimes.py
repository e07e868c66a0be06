"""The model runtimes as one table (config/runtimes.py): the config's values, what loads
and what builds are read from each runtime's record, and an instance only loads (that it
imports no build code: test_import_graph.py)."""

from typing import get_args

import pytest

from numaserve.backends.base import Model
from numaserve.backends.loading import load_path, named_in_backends
from numaserve.checkpoint.errors import ModelLoadError
from numaserve.config.runtimes import RUNTIMES
from numaserve.config.schema import Backend, ModelConfig, Quantize


def test_model_backend_takes_each_runtime_by_its_records_name_and_auto():
    assert set(get_args(Backend)) == {"auto", *(r.name for r in RUNTIMES)}


def test_model_quantize_takes_each_precision_a_runtime_runs_and_auto():
    assert set(get_args(Quantize)) == {"auto", *(q for r in RUNTIMES for q in r.precisions)}


@pytest.mark.parametrize("record", RUNTIMES, ids=lambda r: r.name)
def test_each_record_names_the_model_class_that_loads_it_and_what_builds_it(record):
    assert issubclass(named_in_backends(record.loads), Model)
    assert record.builds is None or record.builds.endswith(":artifact_for")
    assert record.builds is None or callable(named_in_backends(record.builds))
    assert bool(record.builds) == bool(record.artifact)


@pytest.mark.parametrize("record", [r for r in RUNTIMES if r.builds], ids=lambda r: r.name)
def test_a_path_whose_runtime_builds_refuses_to_load_without_prepares_artifact(record):
    config = ModelConfig(backend=record.name, quantize="none")
    with pytest.raises(ModelLoadError, match="numaserve prepare"):
        load_path(config, (), 1, None)
