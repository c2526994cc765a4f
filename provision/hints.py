"""How a printed hint names the tool, so that it runs where it is printed.

Two doors lead to the same tasks (provision/cli.py): `invoke TASK` in a checkout, where Invoke finds
the root tasks.py, and the installed console script `provision TASK`, which works anywhere. Outside a
checkout `invoke` finds no tasks ("Can't find any collection named 'tasks'"), so a hint (a check's fix,
an error's way out, deploy's next steps) names the door the tool was started through: command() spells
every one of them, and no other module writes a door's name into a hint.

The host programs (provision/host/) cannot know how the controller was started: a host's answer names
the task it points to (`see`: "rollback --list") and the controller spells it (provision/ops.py).
What the tool renders for a host (a unit file's comment) names no door at all that depends on the run:
a comment that changed with the door would change the file's sha256, and a running server would be
restarted for it.

Started as `invoke` unless provision.cli.main(), the console script, says otherwise: Invoke runs the
tasks in a checkout with no hook of ours before them, so the checkout's door is the default.
"""
from __future__ import annotations

from pathlib import Path

DOORS = ("invoke", "provision")

_door = "invoke"  # the one this process was started through


def started_as(door: str) -> None:
    """Declare the door this process came in through (the console script does, before any task)."""
    global _door
    if door not in DOORS:
        raise ValueError(f"not a door of the tool: {door!r} (one of {', '.join(DOORS)})")
    _door = door


def command_name() -> str:
    """`provision` (the installed console script) or `invoke` (a checkout's tasks.py)."""
    return _door


def command(task: str) -> str:
    """A task's command line as typed where the hint is printed: command("facts --host a") is
    "provision facts --host a" from the console script, "invoke facts --host a" in a checkout."""
    return f"{_door} {task}"


def docs_page(name: str) -> str:
    """Where a documentation page is on this machine, for a hint to cite: the project publishes no
    documentation site, so the pages ship with the tool (the wheel holds docs/ as provision/docs/); a
    checkout's own docs/ where the tool runs from one. docs_page("inventory.md") -> ".../docs/inventory.md"."""
    package = Path(__file__).resolve().parent
    for folder in (package / "docs", package.parent / "docs"):
        if (folder / name).is_file():
            return str(folder / name)
    raise FileNotFoundError(f"documentation page {name} is in neither {package / 'docs'} nor {package.parent / 'docs'}")
