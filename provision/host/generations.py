"""Generations: what a run applied, kept whole on the host. Runs ON the host, sent with host/apply.py.

A generation is a complete, consistent set of what the tool manages on a host after one run: every
managed file (its content, mode and owner, or its absence), each managed unit's enablement and activity,
the venv's key and the model revision `current` points at. Layout under ROOT (root only, 0700):

    ROOT/state.json          {"current": N, "generations": [{"id", "state", "created", "by", ...}, ...]}
    ROOT/N/meta.json         the generation's record (files with mode, owner, sha256; units; venv; model)
    ROOT/N/files/etc/...     the managed files' contents, secrets replaced by placeholders

States: `found` (what the host had before its first tracked run), `applied` (a provision wrote it;
never checked), `pending` (a deploy wrote it and is waiting for readiness), `good` (it passed
readiness: last-known-good), `rejected` (it failed readiness: never a rollback target), `abandoned`
(a deploy stopped before its verdict and a later run replaced it: never a target either).

Secrets never rest here: each secret value in a file is stored as a placeholder (@@secret:NAME@@) and
filled in from the secrets the controller sends on stdin when a generation is restored.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

GENERATION_STATES = ("found", "applied", "pending", "good", "rejected", "abandoned")
KEEP_GENERATIONS = 10  # older ones are pruned, never the current or the newest good one
PLACEHOLDER = "@@secret:%s@@"


class GenerationError(Exception):
    """`see`: the task that shows the way on, named for the controller to spell (as StepFailed's)."""

    def __init__(self, message: str, see: str | None = None) -> None:
        super().__init__(message)
        self.see = see


def _read_json(path: str, default: Any) -> Any:
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return default


def _write_json(path: str, data: Any) -> None:
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    temporary = path + ".tmp"
    with open(temporary, "w") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.rename(temporary, path)


def load_state(root: str) -> dict[str, Any]:
    state: dict[str, Any] = _read_json(os.path.join(root, "state.json"), {"current": None, "generations": []})
    return state


def save_state(root: str, state: dict[str, Any]) -> None:
    _write_json(os.path.join(root, "state.json"), state)


def load_meta(root: str, number: int) -> dict[str, Any]:
    meta: dict[str, Any] | None = _read_json(os.path.join(root, str(number), "meta.json"), None)
    if meta is None:
        raise GenerationError(f"generation {number} is not kept on this host")
    return meta


def _summary(meta: dict[str, Any]) -> dict[str, Any]:
    return {key: meta.get(key) for key in ("id", "state", "created", "by", "changes", "previous", "deadline",
                                            "note", "models", "venv", "overrides", "restart_s")}


def _store(root: str, meta: dict[str, Any]) -> None:
    _write_json(os.path.join(root, str(meta["id"]), "meta.json"), meta)
    state = load_state(root)
    state["generations"] = [g for g in state["generations"] if g["id"] != meta["id"]] + [_summary(meta)]
    state["generations"].sort(key=lambda g: g["id"])
    save_state(root, state)


# What `systemctl is-enabled` and `is-active` answer 0 for, by the UnitFileState and ActiveState they
# read (systemctl(1): is-enabled's table; is-active counts a reloading or refreshing unit as active).
ENABLED_STATES = ("enabled", "enabled-runtime", "static", "alias", "indirect", "generated", "transient")
ACTIVE_STATES = ("active", "reloading", "refreshing")


def parse_unit_states(text: str, units: Sequence[str]) -> dict[str, dict[str, bool]]:
    """`systemctl show --property=LoadState,UnitFileState,ActiveState UNIT...`: one block of KEY=VALUE
    lines per unit, in the order asked, blocks apart by an empty line."""
    blocks = [dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
              for block in text.strip("\n").split("\n\n")] if text.strip() else []
    found = {}
    for index, unit in enumerate(units):
        shown = blocks[index] if index < len(blocks) else {}
        found[unit] = {"installed": shown.get("LoadState") == "loaded",
                       "enabled": shown.get("UnitFileState") in ENABLED_STATES,
                       "active": shown.get("ActiveState") in ACTIVE_STATES}
    return found


def unit_states(units: Iterable[str]) -> dict[str, dict[str, bool]]:
    """Each unit installed, enabled and active: one systemctl for all of them (three per unit took
    half a second of a first apply, which asks three times)."""
    asked = list(units)
    if not asked:
        return {}
    shown = subprocess.run(["systemctl", "show", "--property=LoadState,UnitFileState,ActiveState", "--", *asked],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=False).stdout.decode()
    return parse_unit_states(shown, asked)


def venv_key(venv: str | None) -> str | None:
    if not venv:
        return None
    key: str | None = _read_json(os.path.join(venv, "provision-manifest.json"), {}).get("key")
    return key


def model_target(root: str | None, which: str = "current") -> str | None:
    if not root:
        return None
    link = os.path.join(root, which)
    return os.readlink(link) if os.path.islink(link) else None


def _hide_secrets(data: bytes, secrets: Mapping[str, str | None]) -> bytes:
    for name, value in sorted(secrets.items()):
        if value:
            data = data.replace(value.encode(), (PLACEHOLDER % name).encode())
    return data


def _fill_secrets(data: bytes, secrets: Mapping[str, str | None], number: int, path: str) -> bytes:
    for name, value in secrets.items():
        data = data.replace((PLACEHOLDER % name).encode(), (value or "").encode())
    if b"@@secret:" in data:
        missing = data.split(b"@@secret:", 1)[1].split(b"@@", 1)[0].decode("utf-8", "replace")
        raise GenerationError(f"generation {number}'s {path} needs the secret {missing}, which this run "
                              "does not hold")
    return data


def snapshot(root: str, spec: dict[str, Any], state: str, by: str, changes: Iterable[str],
             secrets: Mapping[str, str | None], previous: int | None = None, deadline: float | None = None,
             note: str | None = None, model_from: str | None = None,
             units_before: Mapping[str, Mapping[str, bool]] | None = None,
             serve: Mapping[str, Any] | None = None, overrides: Sequence[str] = ()) -> int:
    """Record what the host holds now as a new generation; returns its number. `serve` is where its
    server answers (base URL, served model, unit): a restored generation is judged there, not by the
    settings of whatever run restores it; a run that renders no server files (weights or venv only)
    sends none, and the generation keeps where the current one's server answers. `overrides` names the
    run's --set keys: settings the inventory does not declare. Thirteen parameters: this runs on the
    host, standard library only, and is called by host/apply.py from its JSON spec, each field a
    parameter with its default; the package's dataclasses cannot travel here, and a dict would hide
    which fields a generation records."""
    current = load_state(root)
    number: int = max([g["id"] for g in current["generations"]] + [0]) + 1
    folder = os.path.join(root, str(number))
    shutil.rmtree(folder, ignore_errors=True)
    files: dict[str, dict[str, Any] | None] = {}
    for path in spec["files"]:
        if not os.path.isfile(path):
            files[path] = None
            continue
        with open(path, "rb") as handle:
            data = handle.read()
        info = os.stat(path)
        kept = os.path.join(folder, "files", path.lstrip("/"))
        os.makedirs(os.path.dirname(kept), mode=0o700, exist_ok=True)
        with open(kept, "wb") as handle:
            handle.write(_hide_secrets(data, secrets))
        os.chmod(kept, 0o600)
        files[path] = {"mode": info.st_mode & 0o7777, "uid": info.st_uid, "gid": info.st_gid,
                       "sha256": hashlib.sha256(data).hexdigest()}
    kept_meta: dict[str, Any] = {}
    if current["current"] is not None:
        kept_meta = _read_json(os.path.join(root, str(current["current"]), "meta.json"), {})
    # Every model root the host's runs have served from, each at the revision it pointed at then.
    models: dict[str, str] = dict(kept_meta.get("models") or {})
    if spec.get("model_root"):
        target = model_from if model_from is not None else model_target(spec["model_root"])
        if target:
            models[spec["model_root"]] = target
    meta = {"id": number, "state": state, "by": by, "created": time.strftime("%Y-%m-%d %H:%M:%S"),
            "changes": list(changes), "previous": previous, "deadline": deadline, "note": note,
            "files": files, "units": unit_states(spec["units"]), "units_before": units_before,
            "venv": ({"dir": spec.get("venv"), "key": venv_key(spec.get("venv"))} if spec.get("venv")
                     else None),
            "models": models, "serve": dict(serve) if serve else kept_meta.get("serve"), "overrides": list(overrides)}
    _store(root, meta)
    state_now = load_state(root)
    state_now["current"] = number
    save_state(root, state_now)
    _prune(root)
    return number


def _prune(root: str) -> None:
    state = load_state(root)
    good = [g["id"] for g in state["generations"] if g["state"] == "good"]
    keep = {state["current"], max(good) if good else None}
    ids = [g["id"] for g in state["generations"]]
    for number in ids[:-KEEP_GENERATIONS]:
        if number not in keep:
            shutil.rmtree(os.path.join(root, str(number)), ignore_errors=True)
            state["generations"] = [g for g in state["generations"] if g["id"] != number]
    save_state(root, state)


def matches(root: str, number: int, spec: dict[str, Any]) -> bool:
    """Whether the managed files on the host are exactly generation `number`'s."""
    meta = load_meta(root, number)
    for path in spec["files"]:
        recorded = meta["files"].get(path)
        if recorded is None:
            if os.path.isfile(path):
                return False
            continue
        if not os.path.isfile(path):
            return False
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            digest.update(handle.read())
        if digest.hexdigest() != recorded["sha256"]:
            return False
    return True


def set_state(root: str, number: int, state: str, **extra: Any) -> None:
    meta = load_meta(root, number)
    meta["state"] = state
    meta.update(extra)
    _store(root, meta)


def settle_pending(root: str, now: float, why: str, keep: int | None = None) -> list[int]:
    """Every `pending` generation whose readiness deadline passed (its run stopped before the verdict)
    becomes `abandoned` with the reason; `keep` (the current one, which the next deploy may still
    judge) stays. Returns the settled numbers."""
    settled = []
    for summary in load_state(root)["generations"]:
        if summary["state"] == "pending" and summary["id"] != keep and (summary.get("deadline") or 0) < now:
            set_state(root, summary["id"], "abandoned", note=why)
            settled.append(summary["id"])
    return settled


ROLLBACK_STATES = ("good", "applied")  # what a rollback offers; `found` only when named with --to
TRIAL = "tune trial"  # the `by` of a generation tune made for one trial (provision/tune.py)


def ran_before(root: str, number: int) -> list[int]:
    """The kept generations that ran before generation `number`, the latest first, following each
    one's `previous` (the generation that was current when its run recorded it). Numbers are not that
    order: a rollback makes an older generation current again, so the next run's `previous` is the
    restored one, and the generations numbered in between (another engine's, a test's) never ran
    before it. Where a record has no `previous` although something ran before it (a record older
    than the field), or its `previous` is no longer kept (pruned), the rest of the chain is the kept
    generations numbered below that point, the newest first: the only order those records leave."""
    kept = {g["id"]: g for g in load_state(root)["generations"]}
    chain: list[int] = []
    at = number
    while True:
        summary = kept.get(at)
        link = summary.get("previous") if summary else None
        if summary is not None and link is None and summary["state"] == "found":
            return chain  # what the host had before its first tracked run: nothing ran before it
        if summary is None or link is None or link not in kept or link >= at:
            below = at if link is None or link >= at else link
            return chain + [n for n in sorted(kept, reverse=True) if n < below and n not in chain]
        chain.append(link)
        at = link


def rollback_target(root: str, before: int | None = None, good_only: bool = False,
                    states: Sequence[str] | None = None, past_trials: bool = False) -> int | None:
    """The latest generation that ran before `before` (default: the current one) that may be
    restored, following `ran_before`: one that passed readiness or that a provision applied, never a
    rejected or abandoned one (those are skipped, and the chain goes on before them); with good_only,
    only one that passed readiness; with `states`, one in those states. With past_trials, a tune
    trial's generation is skipped too: a user's rollback after `tune` means what ran before the
    tuning, not the last settings tune happened to try (`--to` still restores a trial by number)."""
    state = load_state(root)
    start = before if before is not None else state["current"]
    if start is None:
        return None
    allowed = states or (("good",) if good_only else ROLLBACK_STATES)
    kept = {g["id"]: g for g in state["generations"]}
    return next((number for number in ran_before(root, start) if kept[number]["state"] in allowed
                 and not (past_trials and kept[number].get("by") == TRIAL)), None)


def restore(root: str, number: int, spec: dict[str, Any], secrets: Mapping[str, str | None],
            write: Callable[[str, bytes, int, int, int], None], run: Callable[[list[str]], str],
            units: Mapping[str, Mapping[str, bool]] | None = None, allow: Sequence[str] = ()) -> list[str]:
    """Make the host hold generation `number` again: its files (written with `write`, removed where it
    had none), systemd reloaded, its venv and model revision where they are still kept, and each unit
    enabled and running exactly as it was then (or as `units` says: a rejected run's units before it).
    `allow`: states restored although never a rollback target (the way back to the generation that was
    running before a rollback whose restored generation did not serve). Returns what it restored, in
    words."""
    meta = load_meta(root, number)
    if meta["state"] in ("rejected", "abandoned", "pending") and meta["state"] not in allow:
        raise GenerationError(f"generation {number} is {meta['state']}: not a rollback target",
                              see="rollback --list")
    # Every kept file with its secrets filled in before anything is touched: a secret this run does
    # not hold fails the restore with the host as it was, not half restored.
    filled: dict[str, bytes] = {}
    for path, recorded in meta["files"].items():
        if recorded is not None:
            with open(os.path.join(root, str(number), "files", path.lstrip("/")), "rb") as handle:
                filled[path] = _fill_secrets(handle.read(), secrets, number, path)
    said: list[str] = []
    units_changed = False
    for path, recorded in sorted(meta["files"].items()):
        if recorded is None:
            if os.path.isfile(path):
                os.remove(path)
                said.append(f"removed {path}")
                units_changed = units_changed or path.endswith((".service", ".conf"))
            continue
        data = filled[path]
        current: bytes | None = None
        if os.path.isfile(path):
            with open(path, "rb") as handle:
                current = handle.read()
        if current != data:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write(path, data, recorded["mode"], recorded["uid"], recorded["gid"])
            said.append(path)
            units_changed = units_changed or path.endswith(".service")
    venv = meta.get("venv") or {}
    if venv.get("dir") and venv.get("key") and venv_key(venv["dir"]) != venv["key"]:
        kept = venv["dir"] + ".last-good"
        if venv_key(kept) == venv["key"]:
            aside = venv["dir"] + ".rollback-tmp"
            shutil.rmtree(aside, ignore_errors=True)
            if os.path.isdir(venv["dir"]):
                os.rename(venv["dir"], aside)
            os.rename(kept, venv["dir"])
            if os.path.isdir(aside):
                os.rename(aside, kept)
            said.append(venv["dir"])
        else:
            said.append(f"{venv['dir']} left as it is (generation {number}'s venv is no longer kept)")
    for model_root, target in sorted((meta.get("models") or {}).items()):
        if model_target(model_root) == target:
            continue
        if os.path.isdir(os.path.join(model_root, target)):
            was = model_target(model_root)
            for name, pointed in (("current", target), ("previous", was)):
                if pointed is None:
                    continue
                temporary = os.path.join(model_root, f".{name}.tmp")
                if os.path.lexists(temporary):
                    os.remove(temporary)
                os.symlink(pointed, temporary)
                os.rename(temporary, os.path.join(model_root, name))
            said.append(f"{model_root} -> {target}")
        else:
            said.append(f"{model_root} left as it is ({target} is no longer kept)")
    if units_changed:
        run(["systemctl", "daemon-reload"])
    restored = [line for line in said if " left as it is" not in line]
    for unit, wanted in sorted((units or meta["units"]).items()):
        shown = subprocess.run(["systemctl", "show", "--property=LoadState,UnitFileState,ActiveState", "--", unit],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=False).stdout.decode()
        now = parse_unit_states(shown, [unit])[unit]
        # A server that crashed at start waits out RestartSec as "activating", not active: left alone
        # it starts again by itself, whatever the generation restored says.
        restarting = "ActiveState=activating" in shown.splitlines()
        if not wanted["installed"] or not wanted["enabled"]:
            if now["enabled"]:
                subprocess.run(["systemctl", "disable", unit], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, check=False)
        elif not now["enabled"]:
            run(["systemctl", "enable", unit])
        if wanted["installed"] and wanted["active"]:
            subprocess.run(["systemctl", "reset-failed", unit], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=False)
            if restarting:
                run(["systemctl", "restart", unit])  # now, with what was restored
            elif not now["active"]:
                run(["systemctl", "start", unit])
            elif must_restart(unit, restored, set(meta.get("models") or {})):
                run(["systemctl", "restart", unit])  # it must run what was just restored
        elif now["active"] or restarting:
            subprocess.run(["systemctl", "stop", unit], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           check=False)
    state = load_state(root)
    state["current"] = number
    save_state(root, state)
    return said


# Units that never read the weights: a model revision restored is nothing to them.
MODEL_FREE_UNITS = ("vllm-ray-head.service", "vllm-ray-worker.service")


def must_restart(unit: str, restored: Sequence[str], model_roots: Iterable[str]) -> bool:
    """Whether a running unit must restart to run what a restore put back (`restored`: what restore
    said it did). Its own unit file, a shared file (the environment file, a configuration file) or
    the venv: yes; a model revision: only for a unit that reads the weights; another unit's file: no.
    A Ray head restarted for nothing loses its workers: `ray start --block` on a worker does not join
    the new head's session, and the worker's unit stays active without a node in the cluster."""
    roots = set(model_roots)
    for item in restored:
        path = item.split(" -> ")[0]
        path = path[len("removed "):] if path.startswith("removed ") else path
        if path.endswith(".service") or (path.endswith(".conf") and ".service.d/" in path):
            if os.path.basename(path) == unit or os.path.basename(os.path.dirname(path)) == unit + ".d":
                return True
        elif path in roots:
            if unit not in MODEL_FREE_UNITS:
                return True
        else:  # the environment file, a configuration file, the venv
            return True
    return False


def describe(root: str) -> dict[str, Any]:
    """Every kept generation, oldest first: which is current (what the host runs), which others may be
    restored (`target`), which one `rollback` restores by default, and which a tune trial made."""
    state = load_state(root)
    default = rollback_target(root, past_trials=True)
    rows = []
    for summary in state["generations"]:
        row = dict(summary)
        row["current"] = summary["id"] == state["current"]
        row["target"] = summary["state"] in ROLLBACK_STATES and not row["current"]
        row["default"] = summary["id"] == default
        row["trial"] = summary.get("by") == TRIAL
        rows.append(row)
    return {"current": state["current"], "default": default, "generations": rows}
