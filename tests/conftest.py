import os
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
SYSFS = FIXTURES / "sysfs"


@pytest.fixture(scope="session", autouse=True)
def onnx_cache(tmp_path_factory):
    """One ONNX artifact cache for the whole run, shared by every server and worker the tests
    start (they inherit the environment), and never the user's own ~/.cache."""
    root = tmp_path_factory.mktemp("numaserve-cache")
    previous = os.environ.get("NUMASERVE_CACHE")
    os.environ["NUMASERVE_CACHE"] = str(root)
    yield root
    if previous is None:
        del os.environ["NUMASERVE_CACHE"]
    else:
        os.environ["NUMASERVE_CACHE"] = previous


@pytest.fixture
def sysfs():
    """Path of a committed sysfs fixture tree, by machine name."""
    return lambda name: SYSFS / name


@pytest.fixture(scope="session")
def classifier_dir(tmp_path_factory):
    """A small BertForSequenceClassification saved with save_pretrained, with a real tokenizer."""
    from tests.harness.checkpoints import save_tiny_classifier

    return save_tiny_classifier(tmp_path_factory.mktemp("classifier"))
