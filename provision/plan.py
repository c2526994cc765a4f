"""The plan: desired state against the host's inspected state -> the changes, each with its reason. Pure.

An empty plan is a named no-op. Dependent changes follow their causes: a changed unit file brings a
daemon-reload; a changed unit or environment brings a restart, but only of a unit that runs (a stopped,
enabled unit is started instead).
"""
from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from provision import serverfiles, services
from provision.context import HOST_KEY
from provision.errors import ForeignDirectory
from provision.facts import DROP_IN_DIRS, USER_NCCL_CONF, HostFacts, drop_in_dirs
from provision.render import UNIT_DIR, DesiredState, managed_paths, managed_paths_of, service_units
from provision.secrets import mask

MANAGED_FILES = managed_paths()
# The host's record of its generations (host/generations.py): the probe reads it with the managed files
# (a service's: services.Naming.state_file).
GENERATIONS_STATE = services.HOST.state_file
# The host programs' record of the directories they made (provision/host/common.py keeps the same path).
MADE_DIRECTORIES = "/var/lib/provision/made-directories.json"


@dataclass(frozen=True)
class Change:
    """One step of a plan. `kind`: user, directory, file, remove, daemon-reload, enable, start, restart,
    stop."""

    kind: str
    target: str
    reason: str
    data: Mapping[str, Any] = field(default_factory=dict)  # what apply needs (content, mode, owner)
    diff: str = ""  # unified diff of a file, secrets masked

    def describe(self) -> str:
        return f"{self.kind} {self.target}: {self.reason}"


def inspect_spec(state_paths: list[str], user: str, naming: services.Naming = services.HOST) -> dict[str, list[str]]:
    """What the probe must look at for a plan: every managed file (a service's too), its generations
    record, the directories, the user, the managed units' drop-in directories (which unit.dropins
    reports) and the unit directory (the units of services the inventory no longer declares)."""
    own = managed_paths_of(naming)
    drop_ins = drop_in_dirs(service_units(naming)) if naming.service else ()
    return {"files": sorted({*MANAGED_FILES, *own, GENERATIONS_STATE, naming.state_file, HOST_KEY,
                             MADE_DIRECTORIES, *state_paths}),
            "users": [user],
            "home_files": [USER_NCCL_CONF],  # NCCL reads it as the service user (nccl_conf fact)
            "dirs": [*DROP_IN_DIRS, *drop_ins, UNIT_DIR, services.CONFIG_DIR]}


def _present(path: str, facts: HostFacts) -> bool:
    """The file is on the host: read by the probe, or listed in a directory it listed."""
    if facts.files.get(path, {}).get("exists"):
        return True
    folder, _, name = path.rpartition("/")
    return name in (facts.dirs.get(folder) or ())


def _octal(mode: int) -> str:
    return f"{mode:04o}"


def _file_changes(desired: DesiredState, facts: HostFacts) -> list[Change]:
    changes = []
    for wanted in desired.files:
        current = facts.files.get(wanted.path, {"exists": False})
        data = {"content": wanted.content, "mode": wanted.mode, "owner": wanted.owner, "group": wanted.group}
        digest = hashlib.sha256(wanted.content.encode()).hexdigest()
        if not current.get("exists"):
            changes.append(Change("file", wanted.path, "missing", data, diff(wanted.path, "", wanted.content)))
            continue
        reasons = []
        if current.get("sha256") != digest:
            reasons.append(f"content differs (sha256 {str(current.get('sha256'))[:12]} -> {digest[:12]})")
        if current.get("mode") != wanted.mode:
            reasons.append(f"mode {_octal(int(current.get('mode', 0)))} -> {_octal(wanted.mode)}")
        if (current.get("owner"), current.get("group")) != (wanted.owner, wanted.group):
            reasons.append(f"owner {current.get('owner')}:{current.get('group')} -> {wanted.owner}:{wanted.group}")
        if reasons:
            old = str(current.get("content", "")) if "content" in current else ""
            shown = diff(wanted.path, old, wanted.content) if current.get("sha256") != digest else ""
            changes.append(Change("file", wanted.path, "; ".join(reasons), data, shown))
    return changes


def made_directories(facts: HostFacts) -> set[str]:
    """The directories the tool's host programs made on this host (their record, MADE_DIRECTORIES)."""
    content = (facts.files.get(MADE_DIRECTORIES) or {}).get("content")
    try:
        found = json.loads(content) if content else []
    except ValueError:
        return set()
    return {str(path) for path in found} if isinstance(found, list) else set()


def _directory_changes(desired: DesiredState, facts: HostFacts) -> list[Change]:
    """Directories to make, and the owner, mode or group of the tool's own to set back. A directory is
    the tool's when it belongs to the owner the tool gives it (the service user, or root for the
    configuration) or the tool's programs made it (a weights fetch makes the model root's parents
    before the apply that gives them their owner); an existing directory of another owner that the
    tool did not make keeps its owner and mode, and the plan stops."""
    changes = []
    made = made_directories(facts)
    for directory in desired.directories:
        current = facts.files.get(directory.path, {"exists": False})
        data = {"mode": directory.mode, "owner": directory.owner, "group": directory.group}
        now = f"{_octal(int(current.get('mode', 0)))} {current.get('owner')}:{current.get('group')}"
        if not current.get("exists"):
            changes.append(Change("directory", directory.path, "missing", data))
        elif current.get("owner") != directory.owner and directory.path not in made:
            raise ForeignDirectory(
                f"directory {directory.path} exists ({now}) and is not the tool's: it keeps its owner and "
                f"mode. Point the setting that names it (model_dir, hf_home) at a directory that does not "
                f"exist yet, or, if it is meant for the service, chown it to {directory.owner} yourself")
        elif (current.get("mode"), current.get("owner"), current.get("group")) != (
                directory.mode, directory.owner, directory.group):
            changes.append(Change("directory", directory.path,
                                  f"{now} -> {_octal(directory.mode)} {directory.owner}:{directory.group}", data))
    return changes


def diff(path: str, old: str, new: str) -> str:
    """A file's unified diff, host against rendered, secrets masked."""
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                 fromfile=f"{path} (host)", tofile=f"{path} (rendered)")
    return mask("".join(lines))


def build(desired: DesiredState, facts: HostFacts, venv: Mapping[str, Any] | None = None,
          weights: Mapping[str, Any] | None = None, hub_venv: Mapping[str, Any] | None = None) -> list[Change]:
    """Every change the host needs, in the order apply runs them; [] means nothing to do.

    `venv` (venv.venv_change_data) is the virtualenv the host should have; None leaves it alone.
    `weights` ({"reason", "data"}) is a model fetch the host needs; `hub_venv` the helper venv that
    fetches it, built first where missing.
    """
    changes: list[Change] = []
    account = facts.users.get(desired.user, {})
    if not account.get("exists"):
        changes.append(Change("user", desired.user, "missing", {"home": desired.home, "shell": desired.shell}))
    elif account.get("shell") not in (None, desired.shell):  # None: a probe that did not say
        changes.append(Change("user", desired.user, f"shell {account.get('shell')} -> {desired.shell}",
                              {"home": desired.home, "shell": desired.shell, "modify": True}))
    changes += _directory_changes(desired, facts)
    venv_changed = False
    if venv is not None:
        from provision.venv import installed_key  # plan stays importable without the venv machinery

        installed = installed_key(facts, str(venv["venv"]))
        if installed != venv["key"]:
            venv_changed = True
            reason = ("missing" if installed is None
                      else f"wheels differ (key {installed[:12]} -> {str(venv['key'])[:12]})")
            if venv.get("base"):  # venv_base: say what the venv is made over, in the plan shown first
                base_python = str(venv["base"]["python"])
                reason += f"; made over {base_python.rsplit('/bin/', 1)[0]} (venv_base: its torch and CUDA libraries)"
            changes.append(Change("venv", str(venv["venv"]), reason, venv))
    if weights is not None:
        from provision.venv import installed_key

        if hub_venv is not None and installed_key(facts, str(hub_venv["venv"])) != hub_venv["key"]:
            changes.append(Change("venv", str(hub_venv["venv"]), "huggingface_hub for the model fetch", hub_venv))
        changes.append(Change("weights", str(weights["data"]["root"]), str(weights["reason"]), weights["data"]))
    file_changes = _file_changes(desired, facts)
    changes.extend(file_changes)
    changed = {change.target for change in file_changes}
    renamed_from = {}
    for unit in desired.absent_units:
        state = (facts.units or {}).get(unit)
        if state and state.load_state == "loaded" and (state.active_state in ("active", "activating")
                                                       or state.unit_file_state == "enabled"):
            new = desired.renamed.get(unit)
            if new and new in desired.units:
                renamed_from[new] = unit
                changes.append(Change("stop", unit, f"renamed {unit} -> {new}: the host declares services now "
                                                    "(systemd cannot rename a running unit: this server restarts)"))
            else:
                changes.append(Change("stop", unit, "not part of this host's role or engine any more"))
        elif state is None and _present(f"{UNIT_DIR}/{unit}", facts):
            # a unit the probe did not ask about (a service the inventory no longer declares)
            changes.append(Change("stop", unit, "a service the inventory no longer declares"))
    removed = [path for path in desired.absent_files if _present(path, facts)]
    for path in removed:
        known = facts.files.get(path, {})
        old = str(known.get("content", "")) if "content" in known else ""
        why = ("a file server_files no longer gives" if path.startswith(serverfiles.FILES_DIR + "/")
               else "not rendered for this host's role or engine")
        changes.append(Change("remove", path, why, diff=diff(path, old, "")))
    if any(wanted.unit and wanted.path in changed for wanted in desired.files):
        changes.append(Change("daemon-reload", "systemd", "a unit file changed"))
    elif any(path.startswith(UNIT_DIR + "/") for path in removed):
        changes.append(Change("daemon-reload", "systemd", "a unit file was removed"))
    restart_due = {unit for wanted in desired.files if wanted.path in changed for unit in wanted.restarts}
    if venv_changed:
        restart_due |= set(desired.units)  # new code for every unit
    server = desired.server_unit
    if weights is not None and server in desired.units:
        restart_due.add(str(server))  # a new revision is read at start
    reload_due = {unit for wanted in desired.files if wanted.path in changed for unit in wanted.reloads} - restart_due
    for unit in desired.units:
        state = (facts.units or {}).get(unit)
        if state is None or state.unit_file_state != "enabled":
            changes.append(Change("enable", unit, "not enabled"))
        running = state is not None and state.active_state in ("active", "activating", "reloading")
        if not running:
            changes.append(Change("start", unit, f"renamed from {renamed_from[unit]}" if unit in renamed_from
                                  else "not running" if state and state.load_state == "loaded" else "new unit"))
        elif unit in restart_due:
            because = sorted(w.path for w in desired.files if w.path in changed and unit in w.restarts)
            causes = because + (["venv"] if venv_changed else []) + (
                ["model"] if weights is not None and unit == server else [])
            because += ["the venv"] if venv_changed else []
            because += ["the model"] if weights is not None and unit == server else []
            # apply restarts only when one of these was really written in its run (see hostapply)
            changes.append(Change("restart", unit, f"{', '.join(because)} changed", {"because": causes}))
        elif unit in reload_due:
            because = sorted(w.path for w in desired.files if w.path in changed and unit in w.reloads)
            changes.append(Change("reload", unit, f"{', '.join(because)} changed (a reload: what the unit holds "
                                                  "is finished, not cut)", {"because": because}))
    return changes


def together(changes: Mapping[str, list[Change]], units: Mapping[str, str]) -> dict[str, list[Change]]:
    """Pure: the nodes of a server that restarts only whole (`units`: each node's unit of it), their plans
    with the rest of the server restarted wherever one node's unit starts or restarts: a node restarted
    alone cannot rejoin the others. A node whose plan already starts or restarts its unit keeps that."""
    moving = sorted(name for name, unit in units.items()
                    if any(c.kind in ("start", "restart") and c.target == unit for c in changes.get(name, ())))
    if not moving:
        return {name: list(found) for name, found in changes.items()}
    cause = ", ".join(f"{name}'s {units[name]}" for name in moving)
    result = {}
    for name, found in changes.items():
        unit = units.get(name)
        result[name] = list(found)
        if unit is not None and name not in moving:
            result[name].append(Change("restart", unit, f"restarts with {cause}: the nodes serve as one, and "
                                                        "a node restarted alone cannot rejoin the others"))
    return result


NO_CHANGES = {None: "files, user, directories and units are as rendered",
              "weights": "the weights are as verified", "venv": "the venv is as resolved"}


def summary(changes: list[Change], only: str | None = None) -> str:
    """One line per host; `only` is what a weights or venv run looked at (and all it vouches for)."""
    if not changes:
        return f"no changes: {NO_CHANGES.get(only, NO_CHANGES[None])}"
    return f"{len(changes)} change(s)"
