from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
SYSFS = FIXTURES / "sysfs"


@pytest.fixture
def sysfs():
    """Path of a committed sysfs fixture tree, by machine name."""
    return lambda name: SYSFS / name
