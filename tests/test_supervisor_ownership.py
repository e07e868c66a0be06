"""Who writes the supervisor's state, read from the source: the arbiter alone holds and writes
the server's (its roster of children, its phase, config and plan), and alone changes which
children run; each Child alone writes its own fields; no function outside the arbiter takes
the Supervisor; and a rollout keeps no progress of its own. The other modules decide and return actions (tests/test_supervisor_decisions.py)."""

import ast
import dataclasses
from pathlib import Path

from numaserve.supervisor.children import Child
from numaserve.supervisor.rollout import Running, Wanted
from tests.import_graph import PACKAGE

SUPERVISOR = PACKAGE / "supervisor"
ARBITER = SUPERVISOR / "arbiter.py"
ROSTER = SUPERVISOR / "roster.py"
ROSTER_CHANGES = {"join", "replace", "retire", "reaped"}  # Roster's methods that change it


def functions(tree: ast.AST):
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def names_in(annotation: ast.AST | None) -> set[str]:
    """Every name an annotation mentions, in a string annotation too."""
    if annotation is None:
        return set()
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return names_in(ast.parse(annotation.value, mode="eval").body)
    return {n.id for n in ast.walk(annotation) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(annotation) if isinstance(n, ast.Attribute)
    }


def parameters_typed_supervisor(path: Path) -> list[str]:
    """`function(parameter)` for each parameter annotated Supervisor, or named `sup`."""
    found = []
    for function in functions(ast.parse(path.read_text())):
        args = function.args
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
            if arg is not None and ("Supervisor" in names_in(arg.annotation) or arg.arg == "sup"):
                found.append(f"{function.name}({arg.arg})")
    return found


def assigned(target: ast.AST):
    """The attributes an assignment's target writes (not those its subscripts read)."""
    if isinstance(target, ast.Attribute):
        yield target
    elif isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from assigned(element)
    elif isinstance(target, ast.Starred):
        yield from assigned(target.value)


def attributes_written(path: Path) -> list[tuple[str, str, int]]:
    """(object, attribute, line) of each `object.attribute = ...` (augmented too) but `self`'s."""
    written = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, (ast.AugAssign, ast.AnnAssign))
            else []
        )
        for target in targets:
            for t in assigned(target):
                if not (isinstance(t.value, ast.Name) and t.value.id == "self"):
                    written.append((ast.unparse(t.value), t.attr, node.lineno))
    return written


def supervisor_attributes() -> set[str]:
    tree = ast.parse(ARBITER.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Supervisor")
    return {
        t.attr
        for node in ast.walk(cls)
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        for t in assigned(target)
        if isinstance(t.value, ast.Name) and t.value.id == "self"
    }


def test_no_function_outside_the_arbiter_takes_the_supervisor():
    found = [
        f"{path.relative_to(PACKAGE)}: {where}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != ARBITER
        for where in parameters_typed_supervisor(path)
    ]
    assert found == []


def test_only_a_child_writes_its_own_fields():
    fields = {f.name for f in dataclasses.fields(Child)}
    found = [
        f"{path.name}:{line}: {obj}.{attr}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != SUPERVISOR / "children.py"
        for obj, attr, line in attributes_written(path)
        if attr in fields and path.is_relative_to(SUPERVISOR)
    ]
    assert found == []


def test_only_the_arbiter_writes_the_server_s_state():
    state = supervisor_attributes()
    assert {"roster", "phase", "shape"} <= state  # what runs, one value
    found = [
        f"{path.relative_to(PACKAGE)}:{line}: {obj}.{attr}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != ARBITER
        for obj, attr, line in attributes_written(path)
        if attr in state and path.is_relative_to(SUPERVISOR)
    ]
    assert found == []


def roster_changes(path: Path) -> list[str]:
    """`object.method(...)` for each call of a roster's changing method (`roster.join`)."""
    return [
        f"{ast.unparse(node.func)}:{node.lineno}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ROSTER_CHANGES
        and ast.unparse(node.func.value).endswith("roster")
    ]


def test_which_children_run_changes_only_in_the_arbiter_through_the_roster():
    """The roster's lists are written by its own methods alone, and only the arbiter calls
    those: a rollout or a stop asks, by the actions it returns."""
    called = [
        f"{path.relative_to(PACKAGE)}: {call}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != ARBITER
        for call in roster_changes(path)
    ]
    assert called == []
    assert roster_changes(ARBITER)  # it does call them
    written = [
        f"{path.relative_to(PACKAGE)}:{line}: {obj}.{attr}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != ROSTER
        for obj, attr, line in attributes_written(path)
        if attr in ("running", "retired")
    ]
    assert written == []


def test_the_server_s_phase_changes_only_through_enter():
    """One value, written in two places: made in __init__, changed by `enter` (phase.NEXT)."""
    tree = ast.parse(ARBITER.read_text())
    writers = {
        function.name
        for function in functions(tree)
        for node in ast.walk(function)
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        for t in assigned(target)
        if t.attr == "phase"
    }
    assert writers == {"__init__", "enter"}


def every_attribute_written(path: Path) -> list[str]:
    """`object.attribute` of each attribute assignment, `self`'s included."""
    return [
        ast.unparse(t)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        for t in assigned(target)
    ]


def test_a_rollout_keeps_no_progress_of_its_own():
    """A start's or a reload's progress is read from what runs: rollout.py writes no
    attribute at all, and what it reads is frozen."""
    assert every_attribute_written(SUPERVISOR / "rollout.py") == []
    assert Wanted.__dataclass_params__.frozen and Running.__dataclass_params__.frozen


def test_the_checks_find_a_supervisor_parameter_and_a_write_from_outside(tmp_path):
    """The rules above would fail on the shapes they forbid."""
    module = tmp_path / "helper.py"
    module.write_text(
        "def check(sup: 'Supervisor', now):\n"
        "    sup.mood = 1\n"
        "    child.state = 2\n"
        "    self.fine = 3\n"
        "    table[child.name] = child\n"
        "def report(owner: Supervisor):\n"
        "    running.roster.retire(child)\n"
        "    ', '.join(names)\n"
    )
    assert parameters_typed_supervisor(module) == ["check(sup)", "report(owner)"]
    assert roster_changes(module) == ["running.roster.retire:7"]
    written = [(o, a) for o, a, _ in attributes_written(module)]
    assert written == [("sup", "mood"), ("child", "state")]
