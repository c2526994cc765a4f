"""The exception tree drawn in provision/errors.py's docstring is the tree of its classes, and every
exception class of the package is one of them (the host programs' own excepted: they run on hosts,
without this package)."""
from __future__ import annotations

import ast
import logging
import re
from pathlib import Path

import pytest

from provision import errors
from provision.fanout import for_each_host

PACKAGE = Path(errors.__file__).resolve().parent
# "    │   ├── HostKeyError (also ValueError)   why": the connector's column is the depth.
DRAWN = re.compile(r"^(?P<indent>[ │]*)(?:├── |└── )(?P<name>\w+)(?: \(also (?P<also>[\w, ]+)\))?")


def drawn_tree() -> dict[str, tuple[str, tuple[str, ...]]]:
    """{class: (its parent, its other bases)} as the docstring draws them."""
    lines = (errors.__doc__ or "").splitlines()
    root = next(index for index, line in enumerate(lines) if line.strip() == "ProvisionError")
    parents = ["ProvisionError"]
    tree: dict[str, tuple[str, tuple[str, ...]]] = {}
    for line in lines[root + 1:]:
        found = DRAWN.match(line.removeprefix("    "))
        if not found:
            break
        depth = len(found["indent"]) // 4
        also = tuple(name.strip() for name in (found["also"] or "").split(",") if name.strip())
        tree[found["name"]] = (parents[depth], also)
        del parents[depth + 1:]
        parents.append(found["name"])
    return tree


def real_tree() -> dict[str, tuple[str, tuple[str, ...]]]:
    tree: dict[str, tuple[str, tuple[str, ...]]] = {}

    def walk(parent: type[BaseException]) -> None:
        for child in parent.__subclasses__():
            others = tuple(base.__name__ for base in child.__bases__ if base is not parent)
            tree[child.__name__] = (parent.__name__, others)
            walk(child)

    walk(errors.ProvisionError)
    return tree


def test_the_drawing_is_the_tree_of_the_classes() -> None:
    drawn, real = drawn_tree(), real_tree()
    assert len(drawn) > 20
    assert drawn == real, {name: (drawn.get(name), real.get(name))
                           for name in drawn.keys() | real.keys() if drawn.get(name) != real.get(name)}


def test_every_exception_class_of_the_package_is_in_errors_py() -> None:
    tree = set(real_tree()) | {"ProvisionError"}
    elsewhere = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "errors.py" and path.parent == PACKAGE or path.parent.name == "host":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = {base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
                         for base in node.bases}
                if bases & (tree | {"Exception", "BaseException", "ValueError", "RuntimeError", "OSError"}):
                    elsewhere.append(f"{path.relative_to(PACKAGE.parent)}: {node.name}")
    assert not elsewhere, elsewhere


def test_a_kept_cause_shows_under_verbose_only(caplog: pytest.LogCaptureFixture) -> None:
    """The report's line for a host is the error's own; what it was raised from is a debug line
    (the console shows debug lines under --verbose alone)."""
    def work(name: str) -> None:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except OSError as exc:
            raise errors.UnreachableHost(name, "cannot connect to root@10.0.0.5:22: connection refused") from exc

    with caplog.at_level(logging.DEBUG, logger="provision"):
        results = for_each_host(["cpu-1"], lambda name: name, work)
    said = errors.error_text(results.errors["cpu-1"])
    assert said == "cpu-1: unreachable: cannot connect to root@10.0.0.5:22: connection refused"
    assert errors.causes(results.errors["cpu-1"]) == ["ConnectionRefusedError: [Errno 111] Connection refused"]
    debug = [record.getMessage() for record in caplog.records if record.levelno == logging.DEBUG]
    assert debug == [f"cpu-1: {said} (caused by ConnectionRefusedError: [Errno 111] Connection refused)"]
    assert not [record for record in caplog.records if record.levelno > logging.DEBUG]
