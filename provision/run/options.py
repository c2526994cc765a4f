"""What one run was asked to do (Options, from the command line) and where its progress lines go."""
from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from provision.profiles import Profile


@dataclass(frozen=True)
class Options:
    """What one run was asked to do, from the command line (every field has the tasks' default)."""

    overrides: Mapping[str, Any] = field(default_factory=dict)  # --set KEY=VALUE, highest precedence
    profile: Profile | None = None  # --profile: assumed instead of the inventory's
    accept_new_host_keys: bool = False
    force: tuple[str, ...] = ()  # --force ID: blockers overridden, kept in the report
    wait: float = 0  # seconds to wait for another run's lock on a host
    quiet: bool = False  # --json: no progress bars
    only: str | None = None  # "weights" or "venv": that part of the plan alone
    verify: bool = False  # hash every weights file again
    may_build: bool = False  # build a venv source on a host while planning (provision, venv, deploy)
    # Resolve the venv's wheels on the controller to judge the torch they bring (off only where many
    # settings are judged at once and saying so: `recipe.list --fits`).
    resolve_wheels: bool = True


def progress_line(line: str) -> None:
    """A step's progress on stderr (stdout is the report's, JSON included)."""
    print(line, file=sys.stderr)
