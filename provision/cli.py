"""The command line: every task collection in one namespace.

Two doors to the same tasks: `invoke` in a checkout (the root tasks.py hands it `ns`) and the
installed `provision` command (main(), the console script of pyproject.toml).
"""
from __future__ import annotations

import os
import sys
from importlib import metadata

from invoke.collection import Collection
from invoke.exceptions import Exit
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
from provision.taskargs import UNHONOURED_CORE_OPTIONS, core_option_refused

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


class Tool(Program):
    """Invoke's Program without the core options that only shape Invoke's own run() (--dry, --echo,
    --warn-only, ...): no task runs a command through it. They are left out of `provision -h` and
    refused (exit 2) before any task runs, or the sudo password prompt of one of them asks."""

    def print_help(self) -> None:
        print(f"Usage: {self.binary} [--core-opts] <subcommand> [--subcommand-opts] ...")
        print()
        print("Core options:")
        print()
        hidden = {f"--{option}" for option, _ in UNHONOURED_CORE_OPTIONS}
        self.print_columns([row for row in self.initial_context.help_tuples()
                            if not hidden & {word.split("=")[0].rstrip(",") for word in row[0].split()}])
        print(f"Dry runs: `{hints.command('plan --all')}` shows what a deploy would change, "
              f"`{hints.command('check --all')}` runs the gate; prepare and recipe.apply take --dry-run.")
        print()
        if self.namespace is not None:
            self.list_tasks()

    def update_config(self, merge: bool = True) -> None:
        for option, _ in UNHONOURED_CORE_OPTIONS:
            if self.args[option].value:
                raise Exit(core_option_refused(option), code=2)
        super().update_config(merge)


def _run_flushed() -> None:
    """Invoke's Program over `ns`, stdout flushed before it returns or exits. Piped, stdout is block
    buffered: a short output (a task's help) is still all in the buffer when Program.run() exits, and a
    reader gone would only be met at the interpreter's own flush at exit, past every handler
    ("Exception ignored ... BrokenPipeError", exit status 120). Flushed here, it is met in main()."""
    try:
        Tool(namespace=ns, version=metadata.version("provision"), name="provision",
                binary="provision", binary_names=["provision"]).run()
    finally:
        sys.stdout.flush()
