"""Every printed hint names the command the user typed: `provision TASK` from the installed console
script, `invoke TASK` in a checkout (provision/hints.py). A hint that names `invoke` after `pipx install`
fails with "Can't find any collection named 'tasks'"."""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from provision import hints, ops, server
from provision.cli import ns
from provision.errors import ApplyFailed
from provision.inventory import Settings
from provision.ops import Scope
from provision.runner import Result, command_line
from tests.conftest import REPO

# A door's name followed by a task: what a hint spells (ask --host…, `recipe.show NAME`, `facts`). A task
# of a collection is reached through its prefix (an f-string's `invoke recipe.` then the name); --help too.
TASKS = sorted({name if "." not in name else name.split(".")[0] + "." for name in ns.task_names} | {"--help"},
               key=len, reverse=True)
DOOR_AND_TASK = re.compile(r"(?<![\w/.-])(invoke|provision)\s+("
                           + "|".join(re.escape(task) + ("" if task.endswith(".") else r"(?![\w.-])") for task in TASKS)
                           + ")")
# docgen writes the documentation (both doors are named there on purpose); hints.py spells the hints.
NOT_HINTS = {"provision/docgen.py", "provision/hints.py"}


def _strings(path: Path) -> list[tuple[int, str]]:
    """The string constants of a module that are not docstrings (f-strings: their literal parts)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_no_module_but_hints_names_a_door_in_what_it_prints() -> None:
    """Hints are spelled by hints.command() alone: a module that wrote `invoke facts` (or `provision
    facts`) itself would print it whichever way the tool was started."""
    written = [f"{path.relative_to(REPO)}:{line}: {text!r}"
               for path in sorted((REPO / "provision").rglob("*.py")) if str(path.relative_to(REPO)) not in NOT_HINTS
               for line, text in _strings(path) if DOOR_AND_TASK.search(text)]
    assert not written, "\n".join(written)


def test_the_pattern_finds_the_hints_it_looks_for() -> None:
    """What the scan above would catch, on the shapes the hints had (an f-string's parts included)."""
    for text in ("(see `invoke facts --host ", "Watch it: invoke status ", "; invoke ask reads it there)",
                 "`invoke recipe.", " first (its help: `invoke --help recipe.", "`provision inventory --json`"):
        assert DOOR_AND_TASK.search(text), text
    for text in ("invoked", "pyinvoke's invoke runs tasks.py", "provision {__version__}", "provision ", "tune: ",
                 "Maintainer: provision lab <lab@provision.invalid>", "exported from a provision recipe ("):
        assert not DOOR_AND_TASK.search(text), text


@pytest.fixture
def door(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as if started through the console script (put back after the test)."""
    monkeypatch.setattr(hints, "_door", hints.command_name())
    hints.started_as("provision")


def test_a_hint_names_the_door_the_tool_was_started_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hints, "_door", hints.command_name())
    assert hints.command("facts --host a") == "invoke facts --host a"  # a checkout: Invoke runs tasks.py
    hints.started_as("provision")
    assert hints.command("facts --host a") == "provision facts --host a"
    with pytest.raises(ValueError, match="not a door"):
        hints.started_as("inv")


def test_deploy_s_next_steps_name_the_installed_command(door: None) -> None:
    """What deploy prints once a host serves: each line a command to paste where it is printed."""
    settings = Settings.of({"model": "org/tiny", "bind_host": "0.0.0.0", "port": 8000})
    lines = server.how_to_query("cpu-1", "10.0.0.5", settings, "the secrets file x.yaml", "--cluster lab-cpu")
    # ask and status (the key is read by the tool's own interpreter: python -m provision.secrets)
    assert [match.group(1) for line in lines for match in DOOR_AND_TASK.finditer(line)] == ["provision"] * 2, lines
    assert lines[1] == "  provision ask --host cpu-1 --prompt 'Hello, my name is'"
    assert lines[-1] == "Watch it: provision status --cluster lab-cpu"
    assert not any("invoke" in line for line in lines)


def _host_program_on_this_machine(argv: list[str], stdin: str | None) -> Result:
    """The shipped host program, run here by this interpreter as a host's python3 runs it."""
    done = subprocess.run([sys.executable, "-"], input=stdin, capture_output=True, text=True, timeout=60, check=False)
    return Result(command_line(argv), done.returncode, done.stdout, done.stderr, 0.01)


class ThisMachine:
    host = "cpu-1"

    def run(self, argv: list[str], *, stdin: str | None = None, timeout: float | None = None,
            env: object = None, on_line: object = None) -> Result:
        return _host_program_on_this_machine(argv, stdin)

    def close(self) -> None:
        return None


@pytest.mark.parametrize("started_as", ["invoke", "provision"])
def test_a_host_s_way_on_is_spelled_by_the_controller_as_it_was_started(
        started_as: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host program cannot know how the controller was started: it names the task (`see`), and the
    controller spells the command. A rollback with no generation kept: the real program, run here."""
    monkeypatch.setattr(hints, "_door", started_as)
    monkeypatch.setattr(ops, "LOCK", str(tmp_path / "lock"))
    scope = Scope(root=str(tmp_path / "generations"), files=(str(tmp_path / "vllm.env"),), units=())
    answer = json.loads(_host_program_on_this_machine(["python3", "-"], ops._program({
        "action": "rollback", "lock": str(tmp_path / "lock"), "wait": 0, "generations": scope.spec(),
        "secrets": {}, "changes": []})).stdout)
    assert answer["failed"]["see"] == "rollback --list"
    assert not DOOR_AND_TASK.search(answer["failed"]["error"])  # the host names no door itself
    with pytest.raises(ApplyFailed) as failed:
        ops.rollback(ThisMachine(), scope)  # type: ignore[arg-type]
    assert str(failed.value).endswith(f"no earlier generation to roll back to (see `{started_as} rollback --list`)")


ENTRY_SCRIPT = """\
#!{python}
import sys
from {module} import {function}
if __name__ == "__main__":
    sys.exit({function}())
"""

INVENTORY = """\
hosts:
  here:
    address: localhost
    connection: local
    profile: rtx5090
    services:
      coder:  # GPU 7 of an RTX 5090 workstation: not on this machine, or no GPU can be read here
        gpus: [7]
        vars: {model: org/tiny, port: 8001}
"""


@pytest.fixture
def console_script(tmp_path: Path) -> Path:
    """The console script as pip writes it from pyproject's [project.scripts] (bin/provision calling the
    entry point), run with this checkout's package: the one installed on a machine may be another's."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    module, _, function = scripts["provision"].partition(":")
    script = tmp_path / "bin" / "provision"
    script.parent.mkdir()
    script.write_text(ENTRY_SCRIPT.format(python=sys.executable, module=module, function=function))
    script.chmod(0o755)
    return script


def test_the_console_script_prints_every_hint_as_provision(console_script: Path, tmp_path: Path) -> None:
    """Run as people run it after `pipx install`: from a directory with no tasks.py, a check whose
    failing rules print fixes, a misused recipe command and a missing inventory. Every hint names
    `provision` (and none widens the table it is printed in: the hint is spelled before rich lays it out)."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "hosts.yaml").write_text(INVENTORY)
    env = {key: value for key, value in os.environ.items() if not key.startswith("PROVISION_")}
    env.update(PYTHONPATH=str(REPO), PROVISION_LAB_DIR=str(tmp_path / "no-lab"))

    def provision(*args: str) -> str:
        done = subprocess.run([str(console_script), *args], cwd=outside, env=env, capture_output=True, text=True,
                              timeout=120, check=False)
        assert done.returncode in (0, 1, 2), done.stderr
        return done.stdout + done.stderr

    checked = provision("check", "--host", "here/coder", "--inventory", "hosts.yaml", "--json")
    document = json.loads(checked[:checked.rindex("}") + 1])
    fixes = [finding["fix"] for finding in document["hosts"]["here/coder"]["findings"] if finding["fix"]]
    hinted = [command for fix in fixes for command in re.findall(r"`([^`]+)`", fix) if DOOR_AND_TASK.match(command)]
    assert hinted and all(command.startswith("provision ") for command in hinted), fixes
    table = provision("check", "--host", "here/coder", "--inventory", "hosts.yaml")
    rows = [line for line in table.splitlines() if line[:1] in "┏┃┡│└"]
    assert rows and len({len(row) for row in rows}) == 1, "\n".join(rows)
    misused = provision("recipe.show", "--x")  # Invoke hands the first word on to NAME
    missing = provision("facts", "--host", "ws-alpha")
    printed = f"{checked}\n{table}\n{misused}\n{missing}"
    spelled = [match.group(0).split()[0] for match in DOOR_AND_TASK.finditer(printed)]
    assert len(spelled) >= 4 and set(spelled) == {"provision"}, printed
    assert "`provision recipe.show NAME` takes the NAME first (its help: `provision --help recipe.show`)" in misused
    assert "`provision init --host local` writes a starter one" in missing
