"""The package's shape holds: no import cycle, each part imports only what
docs/architecture.md allows, and the processes import only what they need."""

import json
import subprocess
import sys

import pytest

from numaserve.config.runtimes import RUNTIMES as RUNTIME_RECORDS
from tests import import_graph

RUNTIMES = ("torch", "onnxruntime", "onnx", "transformers", "tokenizers", "numpy")


def loaded_by(module: str) -> set[str]:
    """The modules a fresh interpreter holds after importing `module`."""
    code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout))


def roots(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


def test_numaserve_has_no_import_cycle():
    assert import_graph.cycles(import_graph.graph()) == []


def test_every_import_follows_the_architecture():
    assert import_graph.forbidden(import_graph.graph()) == []


def test_the_checks_find_a_cycle_and_an_import_across_the_lines():
    g = {
        "numaserve.backends": {"numaserve.backends.onnx"},
        "numaserve.backends.onnx": {"numaserve.backends.base"},
        "numaserve.backends.base": {"numaserve.backends"},
        "numaserve.supervisor.arbiter": {"numaserve.router.loop"},
        "numaserve.router.loop": {"numaserve.backends"},
    }
    assert import_graph.cycles(g) == [
        ["numaserve.backends", "numaserve.backends.base", "numaserve.backends.onnx"]
    ]
    assert import_graph.forbidden(g) == [
        "numaserve.router.loop imports numaserve.backends (router -> backends)",
        "numaserve.supervisor.arbiter imports numaserve.router.loop (supervisor -> router)",
    ]


def test_the_base_imports_only_down_its_layers_so_its_old_circle_is_forbidden():
    # config -> tasks -> config (the checkpoint's paths lived in config/) and wire -> tasks
    # (a request's checks lived in wire/) made a circle; each arrow is now an error.
    old_arrows = {
        "numaserve.tasks.embed": {"numaserve.config.schema"},
        "numaserve.wire.protocol": {"numaserve.tasks"},
        "numaserve.checkpoint.paths": {"numaserve.config.schema"},
    }
    assert import_graph.forbidden(old_arrows) == [
        "numaserve.checkpoint.paths imports numaserve.config.schema (checkpoint -> config)",
        "numaserve.tasks.embed imports numaserve.config.schema (tasks -> config)",
        "numaserve.wire.protocol imports numaserve.tasks (wire -> tasks)",
    ]
    for i, layer in enumerate(import_graph.BASE_LAYERS):
        assert import_graph.ALLOWED[layer] == set(import_graph.BASE_LAYERS[: i + 1])


def test_an_import_for_type_checking_only_counts_as_an_import(tmp_path):
    """A type named across a circle is a circle: each side is needed to read the other."""
    module = tmp_path / "helper.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from numaserve.supervisor.arbiter import Supervisor\n"
    )
    known = {"numaserve.supervisor.arbiter"}
    assert import_graph.imports_of(module, known) == known


def test_the_script_prints_the_graph_and_passes():
    out = subprocess.run(
        [sys.executable, "-m", "tests.import_graph"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    arbiter = next(
        line for line in out.stdout.splitlines() if line.startswith("numaserve.supervisor.arbiter:")
    )
    assert "numaserve.config.schema," in arbiter


def test_importing_the_supervisor_loads_neither_the_router_nor_a_model_runtime():
    loaded = loaded_by("numaserve.supervisor.arbiter")
    assert not {m for m in loaded if m.startswith(("numaserve.router", "numaserve.backends"))}
    assert not roots(loaded) & set(RUNTIMES)


@pytest.mark.parametrize(
    "module", ["numaserve.router.loop", "numaserve.worker", "numaserve.fronts"]
)
def test_the_router_worker_and_front_load_no_runtime_before_they_pin_themselves(module):
    # A runtime's thread pool started before pinning keeps the old affinity (docs/worker.md);
    # the router only tokenizes, so `tokenizers` is the one it may load; a front loads
    # a tokenizer (and numpy) only once a route needs it, long after it pinned itself.
    allowed = {"tokenizers"} if module == "numaserve.router.loop" else set()
    assert roots(loaded_by(module)) & set(RUNTIMES) == allowed


def test_a_front_loads_grpcio_only_where_the_grpc_api_is_on():
    # The image leaves grpcio out (deploy/container/runtime.txt): its fronts serve HTTP.
    assert not {m for m in loaded_by("numaserve.fronts") if m == "grpc" or m.startswith("grpc.")}


@pytest.mark.parametrize(
    "module",
    [
        "numaserve.router.loop",
        "numaserve.fronts",
        "numaserve.backends.loading",
        *(f"numaserve.backends.{r.loads.split(':')[0]}" for r in RUNTIME_RECORDS),
    ],
)
def test_no_serving_process_loads_the_code_that_chooses_a_model_path_or_builds_one(module):
    # An instance loads what `numaserve prepare` resolved and built (backends/loading.py,
    # what worker.py imports once pinned, and its runtime's module); a shard and a front
    # tokenize. None of them chooses or builds.
    choosing = {"numaserve.backends.choice", "numaserve.backends.gate", "numaserve.backends.race"}
    building = {"numaserve.backends.building"} | {
        f"numaserve.backends.{r.builds.split(':')[0]}" for r in RUNTIME_RECORDS if r.builds
    }
    assert loaded_by(module) & (choosing | building) == set()
