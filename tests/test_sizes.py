"""The size limits that keep numaserve readable (issue 32): a module a reader takes in whole, a
function one screen, and the two classes that grew the most under a ceiling."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "numaserve"
MODULES = sorted(PACKAGE.rglob("*.py"))


def test_no_module_is_over_500_lines():
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in MODULES
        if (n := len(p.read_text().splitlines())) > 500
    }
    assert not long


def test_no_function_is_over_80_lines():
    long = [
        f"{p.relative_to(PACKAGE)}:{node.name} ({node.end_lineno - node.lineno + 1})"
        for p in MODULES
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > 80
    ]
    assert not long


@pytest.mark.parametrize(
    ("module", "name"), [("supervisor/arbiter.py", "Supervisor"), ("router/loop.py", "Router")]
)
def test_the_supervisor_and_the_router_shard_stay_under_350_lines(module, name):
    tree = ast.parse((PACKAGE / module).read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    assert cls.end_lineno - cls.lineno + 1 < 350
