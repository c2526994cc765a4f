"""Puts Prometheus's files ON the host the inventory's `prometheus:` names, and has Prometheus read them.
Sent as source on stdin to `python3 -` (provision.programs.ship) after common.py; standard library only.

The controller appends `main(SPEC_JSON)`:

    {"files": [{"path", "content", "owner", "group", "mode", "secret": bool, "then": "reload" | "restart" | ""}],
     "dry": bool, "unit": "prometheus.service" | null, "config": PATH | null, "promtool": PATH,
     "ready": "http://127.0.0.1:9090/-/ready", "wait": 60}

With "dry" it changes nothing and answers what differs: {"event": "result", "differs": [path, ...],
"current": {path: text or null} (never a secret's), "installed": bool, "active": bool}. Otherwise it
writes what differs (atomically: owner and mode set, fsynced, renamed), the configuration only after
`promtool check config` passed on the new text beside the targets it names, then starts the unit where it
does not run, restarts it where a file marked "restart" changed, reloads it (SIGHUP, the unit's own
ExecReload) where one marked "reload" did, and waits until Prometheus answers ready:
{"event": "result", "ok": bool, "written": [...], "action": "started" | "restarted" | "reloaded" | "",
"error": text | null}.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from typing import Any

from provision.host.common import StepFailed, emit, ids, make_directories, write_atomically


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def _differs(entry: dict[str, Any]) -> bool:
    """The file's content, owner or mode is not the entry's."""
    path = entry["path"]
    if _read(path) != entry["content"].encode("utf-8"):
        return True
    found = os.stat(path)
    try:
        uid, gid = ids(entry["owner"], entry["group"])
    except KeyError:
        return True
    return (found.st_mode & 0o7777, found.st_uid, found.st_gid) != (entry["mode"], uid, gid)


def _systemctl(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemctl", *argv], capture_output=True, text=True, check=False)


def _active(unit: str | None) -> bool:
    return bool(unit) and _systemctl("is-active", "--quiet", str(unit)).returncode == 0


def _check_config(spec: dict[str, Any], entry: dict[str, Any]) -> None:
    """promtool's verdict on the new configuration, written beside the old one (the targets and key file
    it names are in place by now)."""
    folder = os.path.dirname(entry["path"])
    handle, scratch = tempfile.mkstemp(dir=folder, prefix=".provision-", suffix=".yml")
    try:
        with os.fdopen(handle, "w") as out:
            out.write(entry["content"])
        done = subprocess.run([spec["promtool"], "check", "config", scratch], capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            lines = (done.stderr or done.stdout).strip().splitlines()
            raise StepFailed(f"promtool check config refused the new configuration: {' | '.join(lines[-3:])}")
    finally:
        os.unlink(scratch)


def _write(entry: dict[str, Any]) -> None:
    try:
        uid, gid = ids(entry["owner"], entry["group"])
    except KeyError:
        raise StepFailed(f"{entry['path']}: no user or group {entry['owner']}:{entry['group']} on this host "
                         "(Prometheus's package makes them)") from None
    make_directories(os.path.dirname(entry["path"]))
    write_atomically(entry["path"], entry["content"].encode("utf-8"), entry["mode"], uid, gid)


def _wait_ready(url: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return True
        except OSError:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)


def _apply(spec: dict[str, Any], differs: list[dict[str, Any]]) -> str:
    config = [entry for entry in differs if entry["path"] == spec.get("config")]
    for entry in differs:
        if entry not in config:
            _write(entry)
    for entry in config:
        _check_config(spec, entry)
        _write(entry)
    unit = spec.get("unit")
    if not unit:
        return ""
    if not _active(unit):
        done = _systemctl("enable", "--now", unit)
        action = "started"
    elif any(entry["then"] == "restart" for entry in differs):
        done = _systemctl("restart", unit)
        action = "restarted"
    elif any(entry["then"] == "reload" for entry in differs):
        done = _systemctl("reload", unit)
        action = "reloaded"
    else:
        return ""
    if done.returncode != 0:
        raise StepFailed(f"systemctl: {unit} not {action}: {(done.stderr or done.stdout).strip()[-300:]} "
                         f"(journalctl -u {unit} says why)")
    return action


def main(spec: dict[str, Any]) -> None:
    differs = [entry for entry in spec["files"] if _differs(entry)]
    unit = spec.get("unit")
    if spec.get("dry"):
        current = {}
        for entry in differs:
            if not entry.get("secret"):
                found = _read(entry["path"])
                current[entry["path"]] = found.decode("utf-8", "replace") if found is not None else None
        emit("result", differs=[entry["path"] for entry in differs], current=current,
             installed=bool(shutil.which(spec["promtool"])) if unit else True,
             active=_active(unit) if unit else True)
        return
    try:
        action = _apply(spec, differs)
        waits = bool(unit) and bool(action or not _active(unit))
        if waits and not _wait_ready(spec["ready"], float(spec.get("wait", 60))):
            raise StepFailed(f"Prometheus did not answer {spec['ready']} within {spec.get('wait', 60)} s "
                             f"(journalctl -u {unit} says why)")
    except StepFailed as exc:
        emit("result", ok=False, written=[], action="", error=str(exc))
        return
    emit("result", ok=True, written=[entry["path"] for entry in differs], action=action, error=None)
