"""What every module that asks a host for something may know of running commands, without SSH.

`Result` (what one execution gave back), the `Runner` protocol (what runs argv lists on one host) and
`command_line` (an argv list quoted once, with LC_ALL=C). The runners themselves, over SSH or on this
machine, live in provision/remote.py with paramiko and Fabric; this module imports neither, so errors,
facts, parsers and the fact recorder (which runs on bare GPU hosts) take these names at no cost.
"""
from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

BASE_ENV = {"LC_ALL": "C", "LANG": "C"}


@dataclass(frozen=True)
class Result:
    """What one remote execution gave back. `command` is the masked display form."""

    command: str
    exited: int
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exited == 0 and not self.timed_out


class Runner(Protocol):
    """Runs argv lists on one host. `executions` counts remote executions (round trips).

    `on_line` receives each line of stdout as it arrives (progress of a long step); stdout is still
    returned whole in the Result.
    """

    host: str
    executions: int

    def run(self, argv: Sequence[str], *, stdin: str | None = None, timeout: float | None = None,
            env: Mapping[str, str] | None = None, on_line: Callable[[str], None] | None = None) -> Result: ...

    def put(self, local: Path, remote: str, progress: Callable[[int, int], None] | None = None) -> None: ...

    def get(self, remote: str, local: Path) -> None: ...

    def close(self) -> None: ...


def command_line(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """`env LC_ALL=C LANG=C [K=V ...] argv...`, each part quoted once."""
    if not argv:
        raise ValueError("empty command")
    assignments = [f"{key}={value}" for key, value in {**BASE_ENV, **(env or {})}.items()]
    return shlex.join(["env", *assignments, *argv])
