"""The command line: every task collection in one namespace.

Two doors to the same tasks: `invoke` in a checkout (the root tasks.py hands it `ns`) and the
installed `provision` command (main(), the console script of pyproject.toml).
"""
from __future__ import annotations

import os
import sys
from importlib import metadata

from invoke.collection import Collection
from invoke.program import Program

from provision import (
    cluster_tasks,
    hints,
    init_tasks,
    prepare_tasks,
    recipe_tasks,
    tasks,
    tune_tasks,
    verify_tasks,
)

ns = Collection(tasks.facts_, tasks.check, tasks.plan_, tasks.provision_, tasks.venv_, tasks.weights_,
                cluster_tasks.deploy, cluster_tasks.status_, cluster_tasks.bench, cluster_tasks.ask, cluster_tasks.logs,
                tasks.rollback_, tasks.generations_, tasks.show_inventory, tasks.lab_tasks, verify_tasks.verify, prepare_tasks.prepare,
                tune_tasks.tune_, init_tasks.init, recipe_tasks.recipe_tasks,
                recipe_tasks.registry_tasks)


def main() -> None:
    """`provision`: Invoke's own parser, help and --list over `ns`; --version from the installed
    distribution's metadata (the version the wheel was built with). Its hints name `provision`
    (provision.hints): outside a checkout `invoke` has no tasks.py to find."""
    hints.started_as("provision")
    try:
        _run_flushed()
    except BrokenPipeError:
        # The reader went away (`provision check -h | head -3`): stop quietly. What is still buffered
        # for stdout goes nowhere, so the interpreter's own flush at exit cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        sys.exit(1)


def _run_flushed() -> None:
    """Invoke's Program over `ns`, stdout flushed before it returns or exits. Piped, stdout is block
    buffered: a short output (a task's help) is still all in the buffer when Program.run() exits, and a
    reader gone would only be met at the interpreter's own flush at exit, past every handler
    ("Exception ignored ... BrokenPipeError", exit status 120). Flushed here, it is met in main()."""
    try:
        Program(namespace=ns, version=metadata.version("provision"), name="provision",
                binary="provision", binary_names=["provision"]).run()
    finally:
        sys.stdout.flush()
