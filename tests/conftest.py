from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
SYSFS = FIXTURES / "sysfs"


@pytest.fixture
def sysfs():
    """Path of a committed sysfs fixture tree, by machine name."""
    return lambda name: SYSFS / name


@pytest.fixture(scope="session")
def classifier_dir(tmp_path_factory):
    """A small BertForSequenceClassification saved with save_pretrained, with a real tokenizer."""
    from tests.checkpoints import save_tiny_classifier

    return save_tiny_classifier(tmp_path_factory.mktemp("classifier"))
