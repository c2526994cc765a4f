"""The command line: every task collection in one namespace.

Two doors to the same tasks: `invoke` in a checkout (the root tasks.py hands it `ns`) and the
installed `provision` command (main(), the console script of pyproject.toml).
"""
from __future__ import annotations

import os
import sys
from importlib import metadata
from typing import Any, TextIO

from invoke.collection import Collection
from invoke.program import Program

from provision import (
    cluster_tasks,
    init_tasks,
    prepare_tasks,
    recipe_tasks,
    tasks,
    tune_tasks,
    verify_tasks,
)

ns = Collection(tasks.facts_, tasks.check, tasks.plan_, tasks.provision_, tasks.venv_, tasks.weights_,
                cluster_tasks.deploy, cluster_tasks.status_, cluster_tasks.bench, cluster_tasks.ask, cluster_tasks.logs,
                tasks.rollback_, tasks.show_inventory, tasks.lab_tasks, verify_tasks.verify, prepare_tasks.prepare,
                tune_tasks.tune_, init_tasks.init, recipe_tasks.recipe_tasks)


class AsTyped:
    """A stream that prints the tasks' hints as the installed command spells them. The hints are
    written once, as `invoke TASK ...` (the checkout's door), in modules and on hosts alike; from the
    wheel there is no tasks.py for `invoke` to find, so a hint must read `provision TASK ...` to run
    where it is printed. Only the backquoted form is a hint; everything else passes as written."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(text.replace("`invoke ", "`provision "))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def main() -> None:
    """`provision`: Invoke's own parser, help and --list over `ns`; --version from the installed
    distribution's metadata (the version the wheel was built with)."""
    sys.stdout = AsTyped(sys.stdout)
    sys.stderr = AsTyped(sys.stderr)
    try:
        Program(namespace=ns, version=metadata.version("provision"), name="provision",
                binary="provision", binary_names=["provision"]).run()
    except BrokenPipeError:
        # The reader went away (`provision check -h | head -3`): stop quietly. What is still buffered
        # for stdout goes nowhere, so the interpreter's own flush at exit cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        sys.exit(1)
