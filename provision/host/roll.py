"""The roll lock, held ON the host by a deploy for as long as it rolls the host: sent as source on
stdin to `python3 -`, with common.py. The controller appends `hold_main(SPEC_JSON)`:

    {"roll_lock": "/run/lock/provision.roll.lock", "lock": "/run/lock/provision.lock", "wait": 0,
     "run": "ID", "holder": "run ID: deploy from HOST (pid N)", "state_files": [...], "max_s": 43200}

A deploy takes it before it drains a replica or changes anything, and keeps it through its apply,
its readiness wait, its promote or rollback and the replica's return to the router. The host's own
lock (provision.lock) is held only while an apply or a verdict runs, so it alone leaves the roll open
between them: a second deploy would drain the replica again and put it back mid-restart. Every apply
and verdict refuses while another run holds the roll lock (apply.py), so only its own run's go through.

Under both locks it reads the sha256 of each generation state file, which the controller compares
with what its facts read: a host another run changed since this run's plan is refused, not rolled on a
plan of what was there before. It prints {"event": "held", "states": {path: sha256 | null}} and then a
newline each second: when the controller's connection ends (the run is over, or killed), the write
fails and the process ends, and the lock with it. It gives up after max_s seconds regardless.
Standard library only, python3 >= 3.7 (host/__init__.py).
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any

from provision.host.common import StepFailed, emit, lock, of_run, roll_holder, sha256_of


def hold_main(spec: dict[str, Any]) -> None:
    wait = float(spec.get("wait") or 0)
    # This run holds it already (a tune's next trial, another service of the same host): that hold
    # goes on; this one only reads the records.
    ours = of_run(roll_holder(spec["roll_lock"]), spec["run"])
    try:
        if not ours:
            lock(spec["roll_lock"], wait, holder=spec["holder"])
        # The host's own lock too, for the moment of reading: no apply of another run is half-way.
        inner = lock(spec["lock"], wait)
    except StepFailed as exc:
        emit("result", held=False, error=str(exc))
        return
    states = {path: sha256_of(path) if os.path.isfile(path) else None for path in spec["state_files"]}
    os.close(inner)
    emit("held", states=states, pid=os.getpid())
    if ours:
        emit("result", held=True, error=None)
        return
    deadline = time.time() + float(spec.get("max_s") or 43200)
    while time.time() < deadline:
        time.sleep(1)
        try:
            sys.stdout.write("\n")
            sys.stdout.flush()
        except (OSError, ValueError):  # the controller is gone: so is this run's hold
            return
    emit("result", held=False, error=f"held for {spec.get('max_s')} s: let go")
