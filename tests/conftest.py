import os
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
SYSFS = FIXTURES / "sysfs"
MAX_WORKERS = 4  # each test's server plans over every CPU: more workers only queue for them


def pytest_xdist_auto_num_workers(config):
    """`pytest -n auto` (the README's command): the fast suite's tests wait on servers and
    sockets much of the time, so two share 2 CPUs well; past 4 they only contend."""
    return max(2, min(MAX_WORKERS, (os.cpu_count() or 1) // 2))


@pytest.fixture(scope="session", autouse=True)
def onnx_cache(tmp_path_factory):
    """One ONNX artifact cache for the whole run, shared by every server and worker the tests
    start (they inherit the environment), and never the user's own ~/.cache. A run split over
    pytest-xdist's workers shares one too, beside their own temporary directories: each
    artifact and choice is built once, not once a worker (builds of one artifact at once wait
    for each other, as two instances' do). NUMASERVE_TEST_CACHE names one that several runs
    share (CI's test steps: the slow ones find what the fast one built and chose)."""
    if named := os.environ.get("NUMASERVE_TEST_CACHE"):
        Path(named).mkdir(parents=True, exist_ok=True)
        yield from _set_for_the_run("NUMASERVE_CACHE", Path(named))
    elif os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "numaserve-cache"
        shared.mkdir(exist_ok=True)
        yield from _set_for_the_run("NUMASERVE_CACHE", shared)
    else:
        yield from _set_for_the_run("NUMASERVE_CACHE", tmp_path_factory.mktemp("numaserve-cache"))


@pytest.fixture(scope="session", autouse=True)
def core_ledger(tmp_path_factory):
    """A core ledger of the run's own (numaserve/host/ledger.py), never the host's
    /run/numaserve: a server the tests start must not plan around, or be refused for, a
    server running beside the tests."""
    yield from _set_for_the_run("NUMASERVE_LEDGER", tmp_path_factory.mktemp("numaserve-ledger"))


def _set_for_the_run(variable: str, root: Path):
    """`variable` is `root` for the tests and every process they start, then as before."""
    previous = os.environ.get(variable)
    os.environ[variable] = str(root)
    yield root
    if previous is None:
        del os.environ[variable]
    else:
        os.environ[variable] = previous


@pytest.fixture
def choice_cache(tmp_path, monkeypatch):
    """A cache of this test's own for `quantize: auto`'s choices (harness/caches.py)."""
    from tests.harness.caches import own_choices

    mine = own_choices(tmp_path / "cache")
    monkeypatch.setenv("NUMASERVE_CACHE", str(mine))
    return mine


@pytest.fixture
def sysfs():
    """Path of a committed sysfs fixture tree, by machine name."""
    return lambda name: SYSFS / name


@pytest.fixture(scope="session")
def classifier_dir(tmp_path_factory):
    """A small BertForSequenceClassification saved with save_pretrained, with a real tokenizer."""
    from tests.harness.checkpoints import save_tiny_classifier

    return save_tiny_classifier(tmp_path_factory.mktemp("classifier"))


@pytest.fixture
def front_router(tmp_path):
    """A real router shard in a thread with stand-in workers, none started yet, with the
    private socket a front connects to (tests/harness/stand_in.py)."""
    from tests.harness.stand_in import InProcessRouter

    made = InProcessRouter(tmp_path, start_workers=False, local=f"ipc://{tmp_path}/local.sock")
    yield made
    made.close()
