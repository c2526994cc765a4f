"""No import circle inside the package, counting the imports made for type checking too.

The graph holds module-level imports: `import` and `from ... import` statements in a module's body,
also inside its module-level `if`/`try`/`with` blocks, `if TYPE_CHECKING:` included (a name a module
needs only for its annotations still ties it to the other module's design; a circle through such an
import is the same tangle, only deferred), but not inside functions or classes (run late, on purpose, to
keep startup light). An edge goes to the module named, to the packages above it (their __init__ runs
first; not the importer's own, which are already running) and, for `from package import name`, to
`package.name` when that is a module of the package. A circle in this graph is two modules that each
need the other: at run time, one may run while the other is half made.
"""
from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "provision"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    for statement in body:
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            yield statement
        elif isinstance(statement, ast.If):  # `if TYPE_CHECKING:` as well
            yield from _module_imports(statement.body)
            yield from _module_imports(statement.orelse)
        elif isinstance(statement, ast.Try):
            for block in (statement.body, statement.orelse, statement.finalbody,
                          *(handler.body for handler in statement.handlers)):
                yield from _module_imports(block)
        elif isinstance(statement, ast.With):
            yield from _module_imports(statement.body)


def import_graph() -> dict[str, set[str]]:
    """{module: the package's modules it imports at module level when it runs}."""
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(path): path for path in paths}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        here = name if is_package else name.rpartition(".")[0]
        targets: set[str] = set()
        for statement in _module_imports(ast.parse(path.read_text(encoding="utf-8")).body):
            if isinstance(statement, ast.Import):
                targets.update(alias.name for alias in statement.names)
                continue
            base = statement.module or ""
            if statement.level:
                anchor = here.split(".")[:len(here.split(".")) - statement.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets.add(base)
            targets.update(f"{base}.{alias.name}" for alias in statement.names)
        own = {".".join(name.split(".")[:depth]) for depth in range(1, name.count(".") + 1)}
        above = {".".join(target.split(".")[:depth]) for target in targets
                 for depth in range(1, target.count(".") + 1)}
        graph[name] = {target for target in targets | (above - own) if target in modules and target != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module, each as one circle through it
    (Tarjan's algorithm, then a path that goes round)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_circle(graph, group) for group in groups]


def _circle(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest path from the group's first module back to itself, inside the group."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node] & group):
                if target == start:
                    return [*paths[node], start]
                if target not in paths:
                    paths[target] = [*paths[node], target]
                    following.append(target)
        frontier = following
    return [start]


def test_the_finder_sees_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_package_imports_no_circle() -> None:
    found = cycles(import_graph())
    assert not found, "import circles: " + "; ".join(" -> ".join(circle) for circle in found)


def test_an_import_for_type_checking_counts_and_one_inside_a_function_does_not() -> None:
    source = ("from typing import TYPE_CHECKING\nimport json\nif TYPE_CHECKING:\n    from provision.tune import Slo\n"
              "def later() -> None:\n    from provision import report\n")
    names = [statement.module if isinstance(statement, ast.ImportFrom) else statement.names[0].name
             for statement in _module_imports(ast.parse(source).body)]
    assert names == ["typing", "json", "provision.tune"]
