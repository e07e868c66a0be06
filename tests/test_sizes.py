"""A function one screen: the one size rule. Classes and modules have none: a ceiling on them
rewarded cutting a class by file rather than by what it owns (the import table in
tests/import_graph.py and docs/architecture.md says who may use what instead)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "numaserve"
MODULES = sorted(PACKAGE.rglob("*.py"))


def test_no_function_is_over_80_lines():
    long = [
        f"{p.relative_to(PACKAGE)}:{node.name} ({node.end_lineno - node.lineno + 1})"
        for p in MODULES
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > 80
    ]
    assert not long
