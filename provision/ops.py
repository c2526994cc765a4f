"""Carry a plan out on a host (or roll it back) in one remote execution of hostapply.py."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from provision.errors import CommandFailed, ProvisionError, UnreachableHost
from provision.plan import Change
from provision.remote import Runner

APPLY_SOURCE = Path(__file__).with_name("hostapply.py")
LOCK = "/run/lock/provision.lock"
KEEP = "/var/lib/provision/last-good"


@dataclass(frozen=True)
class Outcome:
    done: tuple[Change, ...]
    restored: tuple[str, ...] = ()


class ApplyFailed(ProvisionError):
    """A step failed on the host; the steps before it stay applied, the rest did not run."""

    def __init__(self, host: str, step: str, error: str, done: int) -> None:
        self.host, self.step, self.error, self.done = host, step, error, done
        super().__init__(f"{host}: {step} failed after {done} step(s): {error}")


def _program(spec: dict[str, Any]) -> str:
    return APPLY_SOURCE.read_text(encoding="utf-8") + f"\nmain(json.loads({json.dumps(spec)!r}))\n"


def _execute(runner: Runner, spec: dict[str, Any], changes: Sequence[Change]) -> dict[str, Any]:
    try:
        result = runner.run(["python3", "-"], stdin=_program(spec), timeout=900)
    except UnreachableHost as exc:  # say which step the connection was lost in
        raise UnreachableHost(runner.host, f"during {spec['action']}: {exc.reason}") from None
    if not result.ok:
        raise CommandFailed(runner.host, spec["action"], result)
    try:
        answer: dict[str, Any] = json.loads(result.stdout)
    except json.JSONDecodeError:
        raise CommandFailed(runner.host, f"{spec['action']} (no JSON answer)", result) from None
    failed = answer.get("failed")
    if failed:
        step = (changes[failed["index"]].describe() if 0 <= failed["index"] < len(changes)
                else f"{failed['kind']} {failed['target']}")
        raise ApplyFailed(runner.host, step, failed["error"], len(answer.get("done", [])))
    return answer


def apply(runner: Runner, changes: Sequence[Change], wait: float = 0) -> Outcome:
    """Run the changes in order under the host's lock; ApplyFailed names the step that failed."""
    spec = {"action": "apply", "lock": LOCK, "wait": wait, "keep": KEEP,
            "changes": [{"kind": c.kind, "target": c.target, "data": dict(c.data)} for c in changes]}
    answer = _execute(runner, spec, changes)
    return Outcome(done=tuple(changes[index] for index in answer["done"]))


def rollback(runner: Runner, wait: float = 0, venvs: Sequence[str] = (), models: Sequence[str] = (),
             only: Sequence[str] | None = None) -> Outcome:
    """Swap the last-known-good files back in (all of them, or `only` those a failed deploy wrote; and
    the kept venv and model revision, where there are), reload systemd, restart what runs."""
    spec = {"action": "rollback", "lock": LOCK, "wait": wait, "keep": KEEP, "changes": [],
            "venvs": list(venvs), "models": list(models), "only": list(only) if only is not None else None}
    answer = _execute(runner, spec, [])
    return Outcome(done=(), restored=tuple(answer["restored"]))
