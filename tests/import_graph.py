"""numaserve's import graph, read from the source: which module imports which.

`python -m tests.import_graph` prints it, one module per line with what it imports, and exits
1 on an import cycle or an import that docs/architecture.md does not allow (the rules are
`ALLOWED` below); tests/test_import_graph.py runs the same checks. Every import counts: one
inside a function (a lazy import is still a dependency) and one under `if TYPE_CHECKING:` (a
type named across a circle is still a circle: each side must be read to understand the other).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "numaserve"

# Each part of the pipeline, and the parts it may import (docs/architecture.md). A part is a
# subpackage, or one of the top-level modules ("root" is the package itself: its version).
# The shared base is in layers, each importing only those before it (BASE_LAYERS): what reads
# a checkpoint, what crosses a socket, the tasks (with a request's checks), the configuration;
# status/ (which alone of the base reads host/: cpulists) and corpus.py stand apart.
# processes/ (how every child process begins, and what it is told) sits on the base and host/.
BASE_LAYERS = ("root", "checkpoint", "wire", "tasks", "config")
SHARED = {*BASE_LAYERS, "status", "corpus"}
ALLOWED = {
    **{layer: set(BASE_LAYERS[: i + 1]) for i, layer in enumerate(BASE_LAYERS)},
    # format.py: cpulists, how memory is bound; report.py: what runs (config/paths.py)
    "status": {"root", "status", "wire", "host", "config"},
    "corpus": {"root", "corpus"},
    "host": {"root", "config", "host"},
    "processes": SHARED | {"host", "processes"},
    "backends": SHARED | {"processes", "backends"},
    "router": SHARED | {"host", "processes", "backends", "router"},
    "worker": SHARED | {"host", "processes", "backends"},
    # The front's core, which knows no transport: it shares a router-side process's context
    # and send (router/process.py), counts as a shard does (router/metrics.py), and tokenizes
    # only for tokenizing, decoding and token ids.
    "front": SHARED | {"processes", "backends", "router", "front"},
    # The APIs on it, which know only the core of what runs them; and the process that
    # serves them (fronts.py), which makes its ZeroMQ context as a router-side process does.
    "http": SHARED | {"processes", "front", "http"},
    "grpc_api": SHARED | {"processes", "front", "grpc_api"},
    "fronts": SHARED | {"processes", "router", "front", "http", "grpc_api"},
    "monitoring": SHARED | {"host", "monitoring"},
    "supervisor": SHARED | {"host", "processes", "monitoring", "supervisor"},
    "client": SHARED | {"client"},
    "loadgen": SHARED | {"client", "loadgen"},
    "testing": SHARED | {"host", "processes", "client", "testing"},
    # tune measures the model (backends) and verifies real servers (testing, loadgen).
    "tune": SHARED | {"host", "processes", "backends", "client", "loadgen", "testing", "tune"},
    "cli": SHARED
    | {
        "cli",
        "host",
        "front",
        "processes",
        "backends",
        "router",
        "monitoring",
        "supervisor",
        "client",
        "loadgen",
        "tune",
    },
}
# The router tokenizes; it never loads a model. The front's core, the same; and of the
# router, it uses a router-side process's context and send, and what a shard counts.
ROUTER_MAY_USE_FROM_BACKENDS = {"numaserve.backends.tokenizer"}
FRONT_MAY_USE_FROM_ROUTER = {"numaserve.router.process", "numaserve.router.metrics"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The numaserve modules `path` imports, anywhere in it."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:  # `from numaserve.router import status`: a module
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if candidate in known else node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return {m for m in found if m in known}


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(path, known) - {name} for name, path in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(g):
        if v not in index:
            connect(v)
    return sorted(found)


def part(module: str) -> str:
    """`numaserve.router.loop` -> router; `numaserve.corpus` -> corpus; `numaserve` -> root."""
    parts = module.split(".")
    return "root" if len(parts) == 1 else parts[1]


def forbidden(g: dict[str, set[str]]) -> list[str]:
    """Each import that crosses the architecture's lines, as 'a imports b (part x -> y)'."""
    wrong = []
    for module, imported in sorted(g.items()):
        source = part(module)
        for target in sorted(imported):
            allowed = part(target) in ALLOWED[source]
            if source in ("router", "front") and part(target) == "backends":
                allowed = target in ROUTER_MAY_USE_FROM_BACKENDS
            if source in ("front", "fronts") and part(target) == "router":
                allowed = target in FRONT_MAY_USE_FROM_ROUTER
            if not allowed:
                wrong.append(f"{module} imports {target} ({source} -> {part(target)})")
    return wrong


def main() -> int:
    g = graph()
    for module, imported in sorted(g.items()):
        print(f"{module}: {', '.join(sorted(imported)) or '-'}")
    problems = [f"cycle: {' <-> '.join(c)}" for c in cycles(g)] + forbidden(g)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
