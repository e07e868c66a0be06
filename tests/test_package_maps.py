"""Each package's docstring is its map: it names every module in it, so that a reader from
outside finds what each owns without opening them all (docs/architecture.md says how they fit
together)."""

import ast

import pytest

from tests.import_graph import PACKAGE

PACKAGES = sorted(p.parent for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE)


def unnamed_modules(package) -> list[str]:
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    modules = sorted(p.name for p in package.glob("*.py") if p.name != "__init__.py")
    return [m for m in modules if m not in doc]


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_packages_docstring_names_each_of_its_modules(package):
    assert unnamed_modules(package) == []


def test_the_rule_finds_a_module_its_package_does_not_name(tmp_path):
    (tmp_path / "__init__.py").write_text('"""Holds `a.py`."""\n')
    (tmp_path / "a.py").write_text("")
    (tmp_path / "b.py").write_text("")
    assert unnamed_modules(tmp_path) == ["b.py"]
