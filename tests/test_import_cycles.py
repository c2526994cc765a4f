"""No import circle inside the package, counting every import a module makes: at module level (inside
its `if`/`try`/`with` blocks, `if TYPE_CHECKING:` included: a name a module needs only for its annotations
still ties it to the other module's design) and inside its functions and classes (run late, to keep
startup light; a circle through such an import is the same tangle, only deferred to the call). An edge
goes to the module named, to the packages above it (their __init__ runs first; not the importer's own,
which are already running) and, for `from package import name`, to `package.name` when that is a module
of the package. A circle in this graph is two modules that each need the other.

The engine catalog (provision/catalog.py) is the ground floor: it imports nothing of the package.
"""
from __future__ import annotations

import ast
from pathlib import Path

from provision import catalog
from provision.docgen import import_graph, module_imports


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
    found = cycles(import_graph(late=True))
    assert not found, "import circles: " + "; ".join(" -> ".join(circle) for circle in found)


def test_the_graph_counts_imports_made_inside_functions() -> None:
    """recipe_tasks imports datafiles inside the function that writes a file: that edge is in the late
    graph and not in the module-level one."""
    late, early = import_graph(late=True), import_graph()
    assert any(late[name] - early[name] for name in late), "no function-level import was seen"
    assert "provision.datafiles" in late["provision.recipe_tasks"] - early["provision.recipe_tasks"]


def test_the_catalog_imports_nothing_of_the_package() -> None:
    assert import_graph(late=True)["provision.catalog"] == set()
    tree = ast.parse(Path(catalog.__file__).read_text(encoding="utf-8"))
    imported = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)] + [
        alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    assert imported and not [name for name in imported if name.split(".")[0] == "provision"], imported


def test_an_import_for_type_checking_counts_and_one_inside_a_function_does_not() -> None:
    source = ("from typing import TYPE_CHECKING\nimport json\nif TYPE_CHECKING:\n    from provision.tune import Slo\n"
              "def later() -> None:\n    from provision import report\n")
    names = [statement.module if isinstance(statement, ast.ImportFrom) else statement.names[0].name
             for statement in module_imports(ast.parse(source).body)]
    assert names == ["typing", "json", "provision.tune"]
