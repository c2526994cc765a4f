"""Carry a plan out on a host, and decide or restore its generations, in one remote execution of
host/apply.py (with host/generations.py) each; and hold a host's roll lock for a deploy (host/roll.py)."""
from __future__ import annotations

import json
import os
import queue
import socket
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from provision import hints, programs, services
from provision.errors import ApplyFailed, CommandFailed, ProvisionError, UnreachableHost
from provision.facts import MANAGED_UNITS
from provision.plan import MANAGED_FILES, Change
from provision.runner import Runner

LOCK = "/run/lock/provision.lock"
ROLL_LOCK = "/run/lock/provision.roll.lock"
GENERATIONS = services.HOST_GENERATIONS
# This run's name on the hosts: every apply and verdict carries it, so one that meets the roll lock
# of this same run (its deploy holds it) goes through, and one of any other run waits or is refused.
RUN_ID = uuid.uuid4().hex[:12]


@dataclass(frozen=True)
class Outcome:
    done: tuple[Change, ...]
    restored: tuple[str, ...] = ()
    skipped: tuple[Change, ...] = ()  # already in place when the lock was taken (another run applied them)
    generation: int | None = None  # what this run's changes were recorded as
    to: int | None = None  # the generation a reject or rollback restored
    unfinished: Mapping[str, Any] | None = None  # a deploy's generation left pending by a run that stopped
    generations: Mapping[str, Any] = field(default_factory=dict)  # rollback --list
    # A restore: where the restored generation's server answers, as recorded with it (None when it was
    # recorded before generations kept that), and the units that generation runs.
    serve: Mapping[str, Any] | None = None
    running: tuple[str, ...] = ()
    settled: tuple[int, ...] = ()  # pending generations of stopped runs, now abandoned
    left: int | None = None  # a rollback: the generation it replaced (the one that was running)


@dataclass(frozen=True)
class Scope:
    """What a server's generations cover: its managed files and units, its venv and model root, kept
    under `root` (a host's own, or a service's: services.Naming)."""

    venv: str | None = None
    model_root: str | None = None
    root: str = GENERATIONS
    files: tuple[str, ...] = MANAGED_FILES
    units: tuple[str, ...] = MANAGED_UNITS

    def spec(self) -> dict[str, Any]:
        return {"root": self.root, "files": list(self.files), "units": list(self.units),
                "venv": self.venv, "model_root": self.model_root}


def _program(spec: dict[str, Any]) -> str:
    return programs.ship(("generations", "apply"), "main", spec)


def _execute(runner: Runner, spec: dict[str, Any], changes: Sequence[Change]) -> dict[str, Any]:
    spec = {**spec, "roll_lock": ROLL_LOCK, "run": RUN_ID}
    try:
        result = runner.run(["python3", "-"], stdin=_program(spec), timeout=900)
    except UnreachableHost as exc:  # say which step the connection was lost in
        raise UnreachableHost(runner.host, f"during {spec['action']}: {exc.reason}") from exc
    if not result.ok:
        raise CommandFailed(runner.host, spec["action"], result)
    try:
        answer: dict[str, Any] = json.loads(result.stdout)
    except json.JSONDecodeError as exc:
        raise CommandFailed(runner.host, f"{spec['action']} (no JSON answer)", result) from exc
    failed = answer.get("failed")
    if failed:
        step = (changes[failed["index"]].describe() if 0 <= failed["index"] < len(changes)
                else f"{failed['kind']} {failed['target']}".strip())
        error = str(failed["error"])
        if failed.get("see"):  # the task the host points to, spelled as this run was started
            error = f"{error} (see `{hints.command(failed['see'])}`)"
        raise ApplyFailed(runner.host, step, error, len(answer.get("done", [])))
    return answer


def _secrets(secrets: Mapping[str, str | None]) -> dict[str, str]:
    """The environment names a rendered file holds secrets under, with their values (stdin only)."""
    return {name: value for name, value in secrets.items() if value}


@dataclass(frozen=True)
class Record:
    """What an apply records as a generation (none without a scope), and how: pending until promote or
    reject when `verify` (deploy; the host gives up on it after `deadline` seconds), applied otherwise.
    `changed` names what changed outside the applied changes (a model fetched before them): a
    generation is recorded then too. `serve` (where the host's server answers) and `overrides` (the
    run's --set keys) are kept with it: a rollback judges it by the first, status names the second as
    drift. `secrets` fill the placeholders of rendered files (stdin only)."""

    scope: Scope | None = None
    by: str = "provision"
    verify: bool = False
    deadline: float = 900
    secrets: Mapping[str, str | None] = field(default_factory=dict)
    model_changed: bool = False
    changed: Sequence[str] = ()
    serve: Mapping[str, Any] | None = None
    overrides: Sequence[str] = ()


def apply(runner: Runner, changes: Sequence[Change], wait: float = 0, record: Record | None = None) -> Outcome:
    """Run the changes in order under the host's lock (a step already in place is skipped);
    ApplyFailed names the step that failed. What changed is recorded as `record` says (Record)."""
    kept = record or Record()
    spec = {"action": "apply", "lock": LOCK, "wait": wait, "by": kept.by, "verify": kept.verify,
            "deadline": kept.deadline, "generations": kept.scope.spec() if kept.scope else None,
            "secrets": _secrets(kept.secrets), "model_changed": kept.model_changed, "record": list(kept.changed),
            "serve": dict(kept.serve) if kept.serve else None, "overrides": sorted(kept.overrides),
            "changes": [{"kind": c.kind, "target": c.target, "data": dict(c.data), "describe": c.describe()}
                        for c in changes]}
    answer = _execute(runner, spec, changes)
    return Outcome(done=tuple(changes[index] for index in answer["done"]),
                   skipped=tuple(changes[index] for index in answer.get("skipped", [])),
                   generation=answer.get("generation"), unfinished=answer.get("unfinished"),
                   settled=tuple(answer.get("settled") or ()))


def _decide(runner: Runner, action: str, scope: Scope, wait: float, secrets: Mapping[str, str | None] | None,
            **extra: Any) -> Outcome:
    spec = {"action": action, "lock": LOCK, "wait": wait, "generations": scope.spec(),
            "secrets": _secrets(secrets or {}), "changes": [], **extra}
    answer = _execute(runner, spec, [])
    return Outcome(done=(), restored=tuple(answer.get("restored", [])), generation=answer.get("generation"),
                   to=answer.get("to"), generations=answer.get("generations") or {},
                   serve=answer.get("serve"), running=tuple(answer.get("running") or ()),
                   left=answer.get("left"), settled=tuple(answer.get("settled") or ()))


def promote(runner: Runner, generation: int, scope: Scope, wait: float = 0,
            restart_s: float | None = None) -> Outcome:
    """The generation passed readiness: last-known-good. Refused when another run has changed the host
    since (then what answered is not what this run applied). `restart_s`: how long its apply and the
    readiness after it took, kept with it (tune reads it as this hardware's restart)."""
    return _decide(runner, "promote", scope, wait, None, generation=generation, restart_s=restart_s)


def reject(runner: Runner, generation: int, scope: Scope, why: str, wait: float = 0,
           secrets: Mapping[str, str | None] | None = None) -> Outcome:
    """The generation failed readiness: never a rollback target again; the host gets back the newest
    good generation before it (files, venv, model, each unit's enablement and activity)."""
    return _decide(runner, "reject", scope, wait, secrets, generation=generation, why=why)


def rollback(runner: Runner, scope: Scope, to: int | None = None, wait: float = 0,
             secrets: Mapping[str, str | None] | None = None, forward: bool = False) -> Outcome:
    """Restore generation `to`, or by default the latest one that ran before the current and may be
    restored (never a rejected or abandoned one). With `forward`, `to` is the generation the last
    rollback replaced: back to it, each unit as it was then (refused if another run changed the host
    since)."""
    return _decide(runner, "rollback", scope, wait, secrets, to=to, forward=forward)


def generations(runner: Runner, scope: Scope) -> Mapping[str, Any]:
    """{"current": N, "generations": [{"id", "state", "created", "by", "changes", "current", "target"}...]}"""
    return _decide(runner, "list", scope, 0, None).generations


HOLD_MAX_S = 12 * 3600  # a hold whose run never ended lets go by then regardless


def hold_roll(runner: Runner, state_files: Sequence[str], wait: float, by: str) -> dict[str, str | None]:
    """Take the host's roll lock for the rest of this run (host/roll.py), waiting up to `wait` seconds
    for another run's; returns the sha256 of each of `state_files` (None: absent) as read under it. The
    hold is one command left running on the host, in a thread of its own: it ends when this run's
    connection to the host does (the run is over, or killed). ProvisionError names the holder when
    another run keeps it past `wait`."""
    holder = f"run {RUN_ID}: {by} from {socket.gethostname()} (pid {os.getpid()})"
    program = programs.ship(("roll",), "hold_main", {"roll_lock": ROLL_LOCK, "lock": LOCK, "wait": wait,
                                                     "run": RUN_ID, "holder": holder,
                                                     "state_files": list(state_files),
                                                     "max_s": HOLD_MAX_S})
    said: queue.Queue[dict[str, Any]] = queue.Queue()

    def keep() -> None:
        try:
            answer, done = programs.run(runner, program, HOLD_MAX_S + 60,
                                        lambda event: said.put(event) if event.get("event") == "held" else None)
            said.put({"event": "ended", "error": answer.get("error") or f"exit {done.exited}: {programs.tail(done)}"})
        except ProvisionError as exc:
            said.put({"event": "ended", "error": str(exc)})

    threading.Thread(target=keep, name=f"roll lock of {runner.host}", daemon=True).start()
    try:
        first = said.get(timeout=wait + 120)
    except queue.Empty:
        raise ProvisionError(f"{runner.host}: the roll lock {ROLL_LOCK} was not taken in {wait + 120:.0f} s") from None
    if first["event"] != "held":
        raise ProvisionError(f"{runner.host}: {first['error']}: nothing drained or changed")
    return dict(first.get("states") or {})
