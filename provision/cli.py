"""The command line: every task collection in one namespace.

Two doors to the same tasks and the same program (Tool): `invoke` in a checkout (the root tasks.py hands
the command line over, take_over_invoke()) and the installed `provision` command (main(), the console
script of pyproject.toml).
"""
from __future__ import annotations

import contextlib
import difflib
import os
import re
import sys
from collections.abc import Iterator
from importlib import metadata

from invoke.collection import Collection
from invoke.exceptions import Exit, ParseError
from invoke.parser.context import ParserContext
from invoke.program import Program

from provision import (
    cluster_tasks,
    hints,
    init_tasks,
    metrics_tasks,
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
                recipe_tasks.registry_tasks, metrics_tasks.metrics_)


def main() -> None:
    """`provision`: Invoke's own parser, help and --list over `ns`; --version from the installed
    distribution's metadata (the version the wheel was built with). Its hints name `provision`
    (provision.hints): outside a checkout `invoke` has no tasks.py to find."""
    hints.started_as("provision")
    _run(Tool(namespace=ns, version=metadata.version("provision"), name="provision",
              binary="provision", binary_names=["provision"]))


def take_over_invoke() -> None:
    """`invoke` in a checkout: Invoke's own program (invoke.main, its console script and `python -m
    invoke`) parses its core options, then imports the root tasks.py, which calls this. From there the
    tool's program runs the whole command line, as `provision` does: the same usage errors (exit 2, the
    nearest names), help and refusals. Invoke's program would exit 1 on its parser's errors, the status
    of a host that failed, and it offers no hook between loading the tasks and parsing them. Never
    returns under Invoke's program: were the import to finish, Invoke's would run the tasks again.
    Anything else importing tasks.py (no invoke.main loaded) gets `ns` alone."""
    if "invoke.main" not in sys.modules:
        return
    _run(CheckoutTool(namespace=ns, binary="invoke", binary_names=["invoke", "inv"]))
    sys.exit(0)


def _run(tool: Program) -> None:
    try:
        _run_flushed(tool)
    except BrokenPipeError:
        # The reader went away (`provision check -h | head -3`): stop quietly. What is still buffered
        # for stdout goes nowhere, so the interpreter's own flush at exit cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        sys.exit(1)


# Invoke's own task listings (Program.list_flat, list_nested, list_json)
LIST_FORMATS = ("flat", "nested", "json")


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
        print(f"Documentation (it comes with the tool): {hints.docs_page('index.md')}")
        print()
        if self.namespace is not None:
            self.list_tasks()

    def parse_core(self, argv: list[str] | None) -> None:
        with self._usage_errors():
            super().parse_core(argv)

    def parse_tasks(self) -> None:
        with self._usage_errors():
            super().parse_tasks()

    def parse_cleanup(self) -> None:
        """--help TASK, --list [NAMESPACE] and --list-format, each misnamed a usage error (exit 2): Invoke
        exits 1 for an unknown namespace and fails with a traceback for an unknown list format."""
        if self.args.list.value and self.args["list-format"].value not in LIST_FORMATS:
            raise Exit(f"error: --list-format is one of {', '.join(LIST_FORMATS)}, not "
                       f"{self.args['list-format'].value!r}", code=2)
        with self._usage_errors():
            try:
                super().parse_cleanup()
            except Exit as exc:
                if exc.code != 1 or not str(exc.message or "").startswith("Sub-collection"):
                    raise
                spaces = sorted(self.collection.collections) if self.collection else []
                near = difflib.get_close_matches(str(self.args.list.value), spaces, n=3, cutoff=0.6)
                raise Exit(f"error: {exc.message}{' Did you mean ' + ' or '.join(near) + '?' if near else ''} "
                           f"(namespaces: {', '.join(spaces)})", code=2) from exc

    @contextlib.contextmanager
    def _usage_errors(self) -> Iterator[None]:
        """Invoke's parser errors ("No idea what 'chek' is!") exit 1 in Program.run, where every other
        usage error of the tool exits 2: they leave as Exit(2), with the nearest names where a word
        was mistyped (a task, or a flag of the task it was given to)."""
        try:
            yield
        except ParseError as exc:
            raise Exit(f"error: {self._second_value(exc) or _said(exc) + self._nearest(exc)}", code=2) from exc

    def _nearest(self, error: ParseError) -> str:
        found = re.fullmatch(r"No idea what '(.+)' is!", str(error))
        if found is None:
            return ""
        word = found.group(1)
        if word.startswith("-"):
            known = [*(error.context.flags if error.context else ()), *self.initial_context.flags]
        else:
            known = [*self.collection.task_names, *(alias for aliases in self.collection.task_names.values()
                                                    for alias in aliases)] if self.collection else []
        refused = {f"--{option}" for option, _ in UNHONOURED_CORE_OPTIONS}
        near = difflib.get_close_matches(word, sorted(set(known) - refused), n=3, cutoff=0.6)
        return f" Did you mean {' or '.join(near)}?" if near else ""

    def _second_value(self, error: ParseError) -> str:
        """"bench takes one --host: it was given twice ('b' the second)" where Invoke could not place a
        word because it is the value of a one-value flag given again (bench, ask and logs act on one
        host): Invoke keeps the first value and reads the second as a task's name. "" otherwise."""
        found = re.fullmatch(r"No idea what '(.+)' is!", str(error))
        context = error.context
        if found is None or context is None:
            return ""
        word = found.group(1)
        argv = list(self.argv)
        for index in range(len(argv) - 1, 0, -1):
            flag = argv[index - 1]
            if argv[index] == word and flag in context.flags:
                argument = context.flags[flag]
                if argument.takes_value and argument.kind is not list and argv[:index - 1].count(flag):
                    return f"{context.name} takes one {flag}: it was given twice ({word!r} the second)"
        return ""

    def update_config(self, merge: bool = True) -> None:
        for option, _ in UNHONOURED_CORE_OPTIONS:
            if self.args[option].value:
                raise Exit(core_option_refused(option), code=2)
        super().update_config(merge)


class CheckoutTool(Tool):
    """The tool's program as `invoke` in a checkout: it also accepts the core options with which
    Invoke's own program found this checkout's tasks.py (-c/--collection, -r/--search-root,
    --no-dedupe), given on the same command line."""

    @property
    def initial_context(self) -> ParserContext:
        return ParserContext(args=[*self.core_args(), *self.task_args()])


def _said(error: ParseError) -> str:
    """Invoke's message, a flag named as typed ("Flag <Argument: profile> needed value" reads
    "--profile needs a value")."""
    found = re.fullmatch(r"Flag <Argument: ([^>]+)> needed value and was not given one!", str(error))
    if found is not None:
        return f"--{found.group(1).split(' ')[0].replace('_', '-')} needs a value"
    return str(error)


def _run_flushed(tool: Program) -> None:
    """Invoke's Program over `ns`, stdout flushed before it returns or exits. Piped, stdout is block
    buffered: a short output (a task's help) is still all in the buffer when Program.run() exits, and a
    reader gone would only be met at the interpreter's own flush at exit, past every handler
    ("Exception ignored ... BrokenPipeError", exit status 120). Flushed here, it is met in _run()."""
    try:
        tool.run()
    finally:
        sys.stdout.flush()
