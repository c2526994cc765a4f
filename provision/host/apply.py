"""Applies a plan ON the host: sent as source on stdin to `python3 -`, like the fact probe, together
with host/generations.py.

Standard library only, python3 >= 3.7 (see host/__init__.py). The controller appends `main(SPEC_JSON)`:

    {"action": "apply" | "promote" | "reject" | "rollback" | "list", "lock": "/run/lock/provision.lock",
     "wait": 0, "generations": {"root", "files", "units", "venv", "model_root"}, "by": "provision",
     "verify": false, "deadline": 900, "model_changed": false, "secrets": {"VLLM_API_KEY": "..."},
     "changes": [{"kind", "target", "data", "describe"}, ...], "generation": N, "to": N, "forward": false}

It holds an exclusive lock for the whole run, so two runs on one host cannot interleave (the second
fails at once naming the holder, or waits up to `wait` seconds). It also waits out, or refuses naming
it, a deploy of another run that holds the host's roll lock ("roll_lock", roll.py); its own run's
("run", the controller's run id) goes through. Under the lock each step first looks
at the host as it is now: a step already in place (another run applied the same while this one waited)
is skipped, and a restart (or reload) happens only when something it depends on was written by this
run. Files are written to a temporary file in the same directory with owner and mode set, fsynced and renamed. A run
that changed anything records a generation (host/generations.py): `pending` for a deploy until its
readiness verdict (`promote` or `reject`), `applied` for a provision. It prints one JSON document:
{"ok": bool, "done": [...], "skipped": [...], "failed": {"index", "kind", "target", "error", "see"} | null,
 "generation": N | null, "restored": [...], "unfinished": {...} | null, "settled": [N, ...]}; "see" names
the task that shows the way on (the controller spells the hint: provision.hints); a restore adds "to",
"serve" (where the restored generation's server answers, as recorded with it) and "running" (the units it runs); a
rollback adds "left" (the generation it replaced). A rollback with "forward" goes back to the generation
the last rollback replaced, its units as they were then: the way back when the restored one does not
serve.
"""
from __future__ import annotations

import glob
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from provision.host.common import (
    StepFailed,
    ids,
    lock,
    made_directories,
    make_directories,
    of_run,
    roll_holder,
    rolled_by_another,
    sha256_of,
    write_atomically,
)
from provision.host.generations import (
    GenerationError,
    describe,
    load_meta,
    load_state,
    matches,
    model_target,
    restore,
    rollback_target,
    save_state,
    set_state,
    settle_pending,
    snapshot,
    unit_states,
    venv_key,
)

UNIT_DIR = "/etc/systemd/system/"


def _run(argv: list[str]) -> str:
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, check=False,
                          env=dict(os.environ, LC_ALL="C", LANG="C"))
    if done.returncode != 0:
        message = (done.stderr or done.stdout).decode("utf-8", "replace").strip().splitlines()
        raise StepFailed(f"{' '.join(argv)}: exit {done.returncode}: {' | '.join(message[-3:])}")
    return done.stdout.decode("utf-8", "replace")


VERSIONS = """
import importlib, json, sys
found = {}
for name in sys.argv[1:]:
    module = importlib.import_module(name)
    found[name] = getattr(module, "__version__", "unknown")
    if name == "torch":
        found["torch_cuda"] = module.version.cuda
        found["torch_arch_list"] = module.cuda.get_arch_list() if module.version.cuda else []
print(json.dumps(found))
"""


def verify_imports(venv: str, modules: Sequence[str]) -> dict[str, Any]:
    """The new venv must import what it is for (vLLM, torch): a venv that cannot is not kept."""
    if not modules:
        return {}
    done = subprocess.run([os.path.join(venv, "bin", "python"), "-c", VERSIONS] + list(modules),
                          stdin=subprocess.DEVNULL, capture_output=True, check=False,
                          env=dict(os.environ, LC_ALL="C", LANG="C"))
    if done.returncode != 0:
        lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise StepFailed(f"the new venv cannot import {', '.join(modules)}: {' | '.join(lines[-2:])}")
    last_line = done.stdout.decode("utf-8", "replace").strip().splitlines()[-1]
    versions: dict[str, Any] = json.loads(last_line)
    return versions


def build_venv(data: dict[str, Any]) -> None:
    """Verify the pushed wheels, then build the venv from them with no index; the old one is kept
    as VENV.last-good and comes back if anything fails."""
    wheelhouse, venv = data["wheelhouse"], data["venv"]
    index_path = os.path.join(wheelhouse, "MANIFEST.json")
    verified: dict[str, str]
    try:
        with open(index_path) as handle:
            verified = json.load(handle)
    except (OSError, ValueError):
        verified = {}
    for name, digest in sorted(data["wheels"].items()):
        path = os.path.join(wheelhouse, name)
        if verified.get(name) == digest and os.path.isfile(path):
            continue
        if not os.path.isfile(path):
            raise StepFailed(f"wheel {name} was not pushed")
        found = sha256_of(path)
        if found != digest:
            os.rename(path, path + ".bad")
            raise StepFailed(f"wheel {name}: sha256 {found[:12]}, expected {digest[:12]} "
                             "(set aside as .bad)")
        verified[name] = digest
    write_atomically(index_path, json.dumps(verified, indent=1, sort_keys=True).encode(), 0o644, 0, 0)
    last = venv + ".last-good"
    if os.path.isdir(venv):
        shutil.rmtree(last, ignore_errors=True)
        os.rename(venv, last)
    try:
        pip = make_venv(venv, data.get("base"))
        _in_venv_dir(venv, pip + ["install", "--no-index", "--find-links", wheelhouse,
                                  "--no-cache-dir", "--disable-pip-version-check", "--quiet"] + data["requirements"])
        if data.get("remove"):
            _run(pip + ["uninstall", "--yes", "--quiet"] + data["remove"])
        write_site_files(venv, data.get("site_files", {}))
        versions = verify_imports(venv, data.get("verify", []))
        manifest = {"key": data["key"], "requirements": data["requirements"], "wheels": data["wheels"],
                    "removed": data.get("remove", []), "versions": versions}
        write_atomically(os.path.join(venv, "provision-manifest.json"),
                         json.dumps(manifest, indent=1).encode(), 0o644, 0, 0)
    except BaseException:
        shutil.rmtree(venv, ignore_errors=True)
        if os.path.isdir(last):
            os.rename(last, venv)
        raise


def make_venv(venv: str, base: dict[str, Any] | None) -> list[str]:
    """An empty venv, and the pip that installs into it. Over a base environment (venv_base): made
    with the base's interpreter, its site directories listed in a .pth after the venv's own, and
    the base's pip run by the venv's python, so pip counts what the base holds as installed."""
    if not base:
        _in_venv_dir(venv, [sys.executable, "-m", "venv", venv])
        return [os.path.join(venv, "bin", "pip")]
    _in_venv_dir(venv, [base["python"], "-m", "venv", "--without-pip", venv])
    found = glob.glob(os.path.join(venv, "lib", "python*", "site-packages"))
    if len(found) != 1:
        raise StepFailed(f"the new venv has {len(found)} site-packages directories, not one: {found}")
    listed = "".join(path + "\n" for path in base["site"])
    write_atomically(os.path.join(found[0], base["pth"]), listed.encode(), 0o644, 0, 0)
    return [os.path.join(venv, "bin", "python"), "-m", "pip"]


def write_site_files(venv: str, files: dict[str, str]) -> None:
    """The engine's files for the venv's site-packages (a .pth hook), root's and 0644, before the
    imports are verified: they run in that check's interpreter too."""
    if not files:
        return
    found = glob.glob(os.path.join(venv, "lib", "python*", "site-packages"))
    if len(found) != 1:
        raise StepFailed(f"the new venv has {len(found)} site-packages directories, not one: {found}")
    for name, text in sorted(files.items()):
        write_atomically(os.path.join(found[0], name), text.encode(), 0o644, 0, 0)


NEARLY_FULL = 64 * 2**20  # bytes free below which a failed install is put down to the disk


def free_space_note(path: str) -> str:
    """Why a step writing under `path` failed where its own message hides it: `python -m venv` reports
    only "ensurepip returned non-zero exit status 1" when the disk is full. "" when there is room."""
    directory = path
    while directory and not os.path.isdir(directory):
        directory = os.path.dirname(directory.rstrip("/")) or "/"
    try:
        info = os.statvfs(directory)
    except OSError:
        return ""
    free = info.f_bavail * info.f_frsize
    if free >= NEARLY_FULL:
        return ""
    return (f"No space left on device: {free / 2**20:.1f} MiB free on the filesystem of {directory} "
            f"(of {info.f_blocks * info.f_frsize / 2**20:.0f} MiB)")


def _in_venv_dir(venv: str, argv: list[str]) -> str:
    """_run for a command that writes into the venv: a failure says when the disk is full, measured
    before the half-built venv is removed (it holds what filled it)."""
    try:
        return _run(argv)
    except StepFailed as exc:
        text = str(exc)
        note = "" if "No space left on device" in text else free_space_note(venv)
        raise StepFailed(f"{note}; {text}" if note else text) from None


def _already(change: dict[str, Any], written: set[str], venv_built: bool) -> bool:
    """Whether a step is in place on the host as it is now (checked under the lock)."""
    kind, target, data = change["kind"], change["target"], change.get("data", {})
    if kind == "user":
        try:
            entry = pwd.getpwnam(target)
        except KeyError:
            return False
        return not data.get("modify") or entry.pw_shell == data.get("shell")
    if kind == "directory":
        try:
            info = os.stat(target)
            return (info.st_mode & 0o7777, info.st_uid, info.st_gid) == (
                data["mode"], *ids(data["owner"], data["group"]))
        except (OSError, KeyError):
            return False
    if kind == "file":
        try:
            info = os.stat(target)
            with open(target, "rb") as handle:
                same = handle.read() == data["content"].encode("utf-8")
            return same and (info.st_mode & 0o7777, info.st_uid, info.st_gid) == (
                data["mode"], *ids(data["owner"], data["group"]))
        except (OSError, KeyError):
            return False
    if kind == "remove":
        return not os.path.lexists(target)
    if kind == "venv":
        wanted: str | None = data["key"]
        return venv_key(data["venv"]) == wanted
    if kind == "daemon-reload":
        return not any(path.startswith(UNIT_DIR) for path in written)
    if kind == "enable":
        return subprocess.run(["systemctl", "is-enabled", "--quiet", target], check=False).returncode == 0
    if kind == "start":
        return subprocess.run(["systemctl", "is-active", "--quiet", target], check=False).returncode == 0
    if kind in ("restart", "reload"):
        because = data.get("because")
        if because is None:
            return False
        return not any(cause in written or (cause == "venv" and venv_built) or cause == "model"
                       for cause in because)
    if kind == "stop":
        active = subprocess.run(["systemctl", "is-active", "--quiet", target], check=False).returncode == 0
        enabled = subprocess.run(["systemctl", "is-enabled", "--quiet", target], check=False).returncode == 0
        return not active and not enabled
    return False


def _refuse_foreign(target: str, uid: int) -> None:
    """A directory that exists already, belongs to another owner and is not one the tool's programs
    made (MADE_DIRECTORIES) keeps its owner and mode (the plan refuses it first; this holds when the
    host changed since)."""
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):  # chown would follow it to wherever it points
        raise StepFailed(f"{target} is a symbolic link, not a directory the tool made: left as it is")
    if info.st_uid != uid and target not in made_directories():
        raise StepFailed(f"{target} exists, owned by uid {info.st_uid}, and is not the tool's: left as it is")


def step(change: dict[str, Any]) -> None:
    kind, target, data = change["kind"], change["target"], change.get("data", {})
    if kind == "user" and data.get("modify"):
        _run(["usermod", "--shell", data.get("shell", "/usr/sbin/nologin"), target])
    elif kind == "user":
        _run(["useradd", "--system", "--user-group", "--home-dir", data["home"], "--no-create-home",
              "--shell", data.get("shell", "/usr/sbin/nologin"), target])
    elif kind == "directory":
        uid, gid = ids(data["owner"], data["group"])
        _refuse_foreign(target, uid)
        make_directories(target, data["mode"])
        os.chown(target, uid, gid)
        os.chmod(target, data["mode"])
    elif kind == "file":
        uid, gid = ids(data["owner"], data["group"])
        os.makedirs(os.path.dirname(target), exist_ok=True)
        write_atomically(target, data["content"].encode("utf-8"), data["mode"], uid, gid)
    elif kind == "remove":
        if os.path.lexists(target):
            os.remove(target)
    elif kind == "venv":
        build_venv(data)
    elif kind == "daemon-reload":
        _run(["systemctl", "daemon-reload"])
    elif kind == "enable":
        _run(["systemctl", "enable", target])
    elif kind == "start":
        # a unit stopped by its start limit must start again
        subprocess.run(["systemctl", "reset-failed", target], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)
        _run(["systemctl", "start", target])
    elif kind == "restart":
        # a crash loop's start limit must not refuse it
        subprocess.run(["systemctl", "reset-failed", target], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)
        _run(["systemctl", "restart", target])
    elif kind == "reload":
        _run(["systemctl", "reload", target])
    elif kind == "stop":
        _run(["systemctl", "disable", "--now", target])
    else:
        raise StepFailed(f"unknown change kind {kind!r}")


def _apply(spec: dict[str, Any], result: dict[str, Any]) -> None:
    generations: dict[str, Any] = spec.get("generations") or {}
    root = generations["root"] if generations else None
    secrets = spec.get("secrets") or {}
    if root:
        state = load_state(root)
        judged_at = _judged_at(spec)
        # Pending generations of runs that stopped (killed, connection lost) are judged no more: never
        # left pending for good. The current one stays for this run (deploy promotes or replaces it).
        result["settled"] = settle_pending(
            root, judged_at, f"its run stopped before the readiness verdict; settled by the "
            f"{spec.get('by', 'provision')} of {time.strftime('%Y-%m-%d %H:%M:%S')}", keep=state["current"])
        if state["current"] is not None:
            meta = load_meta(root, state["current"])
            if meta["state"] == "pending" and (meta.get("deadline") or 0) < judged_at:
                result["unfinished"] = {"id": meta["id"], "created": meta["created"], "by": meta["by"]}
    changes = spec.get("changes", [])
    written: set[str] = set()
    venv_built = False
    baseline: int | None = None
    # How each unit was before this run: a rejected deploy puts back exactly this, not what some
    # earlier generation recorded (a unit stopped by hand stays stopped, an enabled one enabled).
    units_before = unit_states(generations["units"]) if root else {}
    for index, change in enumerate(changes):
        if _already(change, written, venv_built):
            result["skipped"].append(index)
            continue
        if root and baseline is None and load_state(root)["current"] is None:
            # The host's state before its first tracked run: what a rollback can go back to.
            model_from = (model_target(generations.get("model_root"), "previous") if spec.get("model_changed")
                          else None)
            baseline = snapshot(root, generations, "found", "found on the host", [], secrets,
                                note="what the host had before its first tracked run", model_from=model_from)
        step(change)
        result["done"].append(index)
        if change["kind"] in ("file", "remove"):  # a removed unit file needs the reload too
            written.add(change["target"])
        venv_built = venv_built or change["kind"] == "venv"
    if root and spec.get("record") and not result["done"] and load_state(root)["current"] is None:
        snapshot(root, generations, "found", "found on the host", [], secrets,
                 note="what the host had before its first tracked run",
                 model_from=model_target(generations.get("model_root"), "previous"))
    if root and (result["done"] or spec.get("record")):
        previous = load_state(root)["current"]
        if result["unfinished"] and result["unfinished"]["id"] == previous:
            set_state(root, previous, "abandoned", note="its deploy stopped before readiness; replaced")
        verify = bool(spec.get("verify"))
        described = [changes[index].get("describe") or f"{changes[index]['kind']} {changes[index]['target']}"
                     for index in result["done"]] + list(spec.get("record") or [])
        result["generation"] = snapshot(
            root, generations, "pending" if verify else "applied", spec.get("by", "provision"), described,
            secrets,
            previous=previous, deadline=time.time() + spec.get("deadline", 900) if verify else None,
            units_before=units_before, serve=spec.get("serve"), overrides=spec.get("overrides") or ())
        result["previous"] = previous


def _decide(spec: dict[str, Any], result: dict[str, Any]) -> None:
    """promote, reject, rollback or list, on the generations under spec["generations"]["root"]."""
    generations = spec["generations"]
    root, action, secrets = generations["root"], spec["action"], spec.get("secrets") or {}
    if action == "list":
        result["generations"] = describe(root)
        return
    if action == "promote":
        number, current = spec["generation"], load_state(root)["current"]
        if current != number:
            raise StepFailed(f"another run changed the host while this one waited for readiness: generation "
                             f"{current} is current, not {number} (what answered is not what this run "
                             "applied)")
        if not matches(root, number, generations):
            raise StepFailed(f"the managed files changed since generation {number} was applied")
        set_state(root, number, "good", units=unit_states(generations["units"]),
                  verified=time.strftime("%Y-%m-%d %H:%M:%S"), restart_s=spec.get("restart_s"))
        result["generation"] = number
        result["settled"] = settle_pending(root, _judged_at(spec), f"its run stopped before the readiness "
                                           f"verdict; settled when generation {number} passed", keep=number)
        return
    if action == "reject":
        number = spec["generation"]
        set_state(root, number, "rejected", note=spec.get("why"))
        result["generation"] = number
        if load_state(root)["current"] != number:
            return  # superseded by another run: that one is what the host holds now
        # The newest good generation before it; else what a provision applied; else what the host had
        # before its first tracked run (a first deploy that fails leaves the host as it found it).
        target = (rollback_target(root, before=number, good_only=True) or rollback_target(root, before=number)
                  or rollback_target(root, before=number, states=("found",)))
        if target is None:
            raise StepFailed(f"generation {number} was rejected and no earlier generation is kept to go "
                             "back to")
        units = load_meta(root, number).get("units_before")
        result["restored"] = restore(root, target, generations, secrets, write_atomically, _run, units=units)
        _restored(result, root, target, units)
        return
    if action == "rollback" and spec.get("forward"):
        _forward(root, spec["to"], generations, secrets, result)
        return
    if action == "rollback":
        target = spec.get("to") or rollback_target(root, past_trials=True)
        if target is None:
            raise StepFailed("no earlier generation to roll back to", see="rollback --list")
        state = load_state(root)
        left = state["current"]
        # What the host runs now, recorded before anything changes: if the restored generation does not
        # serve, the controller comes back to exactly this (`forward`).
        if left is not None and left != target:
            was = load_meta(root, left)
            state["left"] = {"id": left, "for": target, "state": was["state"], "note": was.get("note"),
                             "units": unit_states(generations["units"])}
            save_state(root, state)
        result["restored"] = restore(root, target, generations, secrets, write_atomically, _run)
        if left is not None and left != target and load_meta(root, left)["state"] == "pending":
            set_state(root, left, "abandoned", note=f"rolled back to generation {target} before its readiness "
                                                    "verdict")
        result["left"] = left
        _restored(result, root, target, None)
        return
    raise StepFailed(f"unknown action {action!r}")


def _forward(root: str, number: int, generations: dict[str, Any], secrets: dict[str, Any],
             result: dict[str, Any]) -> None:
    """Back to generation `number`, the one that was running before a rollback whose restored
    generation did not serve: only while the host still holds what that rollback restored (no other
    run since), with each unit as it was before that rollback, and `number` in the state it had
    (a deploy's generation still waiting for its verdict is pending again, not abandoned)."""
    state = load_state(root)
    was = state.get("left") or {}
    if was.get("id") != number or was.get("for") != state["current"]:
        raise StepFailed(f"generation {number} is not the one the last rollback left: the host holds "
                         f"generation {state['current']} now (another run changed it since, or the way back "
                         "was taken already)")
    if load_meta(root, number)["state"] != was["state"]:
        set_state(root, number, was["state"], note=was.get("note"))
    result["restored"] = restore(root, number, generations, secrets, write_atomically, _run, units=was["units"],
                                 allow=("pending",))
    state = load_state(root)
    state.pop("left", None)
    save_state(root, state)
    result["left"] = was["for"]
    _restored(result, root, number, was["units"])


def _restored(result: dict[str, Any], root: str, target: int, units: dict[str, Any] | None) -> None:
    """What the controller needs to judge the restored generation: where its server answers (as
    recorded with it; None for a generation recorded before that was kept) and the units it runs."""
    meta = load_meta(root, target)
    wanted = units or meta["units"]
    result["to"] = target
    result["serve"] = meta.get("serve")
    result["running"] = sorted(unit for unit, was in wanted.items() if was.get("installed") and was.get("active"))


def _judged_at(spec: dict[str, Any]) -> float:
    """When pending generations are judged: now, against each one's readiness deadline; or, while this
    run's own deploy holds the roll lock, past every deadline: no other deploy is waiting for a verdict
    here, so each pending generation is one whose run stopped."""
    return float("inf") if of_run(roll_holder(spec.get("roll_lock")), spec.get("run")) else time.time()


def _lock_outside_rolls(spec: dict[str, Any]) -> None:
    """The host's lock, taken when no other run's deploy is rolling the host (roll.py: it holds the roll
    lock from its drain to the replica's return). While one is, the host's lock is let go again so that
    deploy can apply and decide, and taken again, for up to `wait` seconds in all."""
    wait = float(spec.get("wait", 0))
    deadline = time.time() + wait
    while True:
        fd = lock(spec["lock"], max(0.0, deadline - time.time()))
        rolling = None if spec["action"] == "list" else rolled_by_another(spec.get("roll_lock"), spec.get("run"))
        if rolling is None:
            return
        if time.time() >= deadline:
            raise StepFailed(f"a deploy is rolling this host ({rolling}): nothing done; run again when it "
                             "has ended, or with --wait SECONDS")
        os.close(fd)
        time.sleep(0.2)


def main(spec: dict[str, Any]) -> None:
    result: dict[str, Any] = {"ok": True, "done": [], "skipped": [], "failed": None, "restored": [],
                              "generation": None, "unfinished": None}
    try:
        _lock_outside_rolls(spec)
    except StepFailed as exc:
        result.update(ok=False, failed={"index": -1, "kind": "lock", "target": spec["lock"],
                                        "error": str(exc)})
        sys.stdout.write(json.dumps(result) + "\n")
        return
    try:
        if spec["action"] == "apply":
            _apply(spec, result)
        else:
            _decide(spec, result)
    except (StepFailed, GenerationError, OSError, KeyError) as exc:
        index = len(result["done"]) + len(result["skipped"])
        changes = spec.get("changes") or []
        change = changes[index] if spec["action"] == "apply" and index < len(changes) else {}
        result.update(ok=False, failed={"index": index if change else -1,
                                        "kind": change.get("kind", spec["action"]),
                                        "target": change.get("target", ""), "error": str(exc),
                                        "see": getattr(exc, "see", None)})
    sys.stdout.write(json.dumps(result) + "\n")
