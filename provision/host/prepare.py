"""Prepares a host ON the host: packages, modprobe files and their commands, as a careful admin would.

Standard library only (see host/__init__.py). The controller appends `survey(SPEC)` or `apply(SPEC)`:

    {"packages": ["linux-generic-hwe-24.04", ...], "files": ["/etc/modprobe.d/...", ...], "update": true,
     "apt_options": ["-o", "Acquire::http::Proxy=http://proxy:3142"], "lock_wait": 120,
     "lock": "/run/lock/provision.lock",
     "install": {"linux-generic-hwe-24.04": "6.14.0-29.29~24.04.1"}, "write": {"/etc/modprobe.d/x.conf": "..."},
     "commands": [["update-initramfs", "-u"]]}

apt runs through argv, non-interactive, keeping configuration files the admin changed
(--force-confdef --force-confold), and waits for dpkg's lock up to `lock_wait` seconds
(DPkg::Lock::Timeout): a lock still held then is reported with apt's own words, naming the holder. Both
print one JSON document. `apply` holds provision's lock throughout; an install that fails is undone where
dpkg allows: packages it added are purged, packages it changed go back to the version they had.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

from provision.host.common import StepFailed, lock, write_atomically

APT_ENV = {"DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C", "LANG": "C", "NEEDRESTART_MODE": "l"}


def _run(argv: list[str], timeout: float = 3600) -> tuple[int, str]:
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              check=False, timeout=timeout, env=dict(os.environ, **APT_ENV))
    except FileNotFoundError:
        return 127, f"{argv[0]}: not installed"
    except subprocess.TimeoutExpired:
        return 124, f"{' '.join(argv)}: no answer within {timeout:g}s"
    return done.returncode, done.stdout.decode("utf-8", "replace")


def _tail(text: str, lines: int = 6) -> str:
    kept = [line for line in text.strip().splitlines() if line.strip()]
    return " | ".join(kept[-lines:])


def _apt_said(text: str) -> str:
    """What apt and dpkg said went wrong (their E: lines, dpkg's errors, a failed maintainer script),
    else the last lines."""
    wanted = [line.strip() for line in text.splitlines()
              if line.startswith(("E: ", "dpkg: error")) or "returned error exit status" in line
              or "Could not get lock" in line]
    return " | ".join(dict.fromkeys(wanted)) if wanted else _tail(text)


def _lock_options(spec: dict[str, Any]) -> list[str]:
    return ["-o", f"DPkg::Lock::Timeout={int(spec.get('lock_wait', 120))}", *spec.get("apt_options", [])]


def installed_versions(names: list[str]) -> dict[str, str | None]:
    """{package: installed version, or None}: dpkg's own record, "install ok installed" only."""
    found: dict[str, str | None] = {name: None for name in names}
    if not names:
        return found
    _, out = _run(["dpkg-query", "-W", "-f", "${Package}\t${Version}\t${db:Status-Abbrev}\n", *names])
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[0] in found and parts[2].strip() == "ii":
            found[parts[0]] = parts[1]
    return found


def candidate_versions(names: list[str]) -> dict[str, str | None]:
    """{package: the version apt would install, or None where no source has it} (apt-cache policy)."""
    if not names:
        return {}
    _, out = _run(["apt-cache", "policy", *names])
    return parse_policy(out, names)


def parse_policy(text: str, names: list[str]) -> dict[str, str | None]:
    """`apt-cache policy NAME...` -> {name: candidate version or None}: a name apt does not know is
    not listed at all; one it knows without a source says "Candidate: (none)"."""
    found: dict[str, str | None] = {name: None for name in names}
    current = None
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            current = line[:-1]
        elif current in found and line.strip().startswith("Candidate:"):
            value = line.split(":", 1)[1].strip()
            found[current] = None if value == "(none)" else value
    return found


def held() -> list[str]:
    _, out = _run(["apt-mark", "showhold"])
    return sorted(line.strip() for line in out.splitlines() if line.strip())


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return None


def survey(spec: dict[str, Any]) -> None:
    """What prepare plans from: package lists refreshed (`apt-get update`: the lists only), the installed
    and candidate versions of the packages it may install, held packages, the files it may write, whether
    a reboot is pending and the boot id."""
    answer: dict[str, Any] = {"update": None}
    if spec.get("update") and spec.get("packages"):
        code, out = _run(["apt-get", *_lock_options(spec), "update"], timeout=float(spec.get("lock_wait", 120)) + 600)
        answer["update"] = {"ok": code == 0, "said": _tail(out)}
    names = list(spec.get("packages", []))
    answer.update(
        installed=installed_versions(names), candidates=candidate_versions(names), held=held(),
        files={path: _read(path) for path in spec.get("files", [])},
        tools={name: shutil.which(name) is not None for name in ("apt-get", "update-initramfs", "modprobe")},
        reboot_required=os.path.exists("/run/reboot-required"),
        reboot_packages=sorted(set((_read("/run/reboot-required.pkgs") or "").split())),
        boot_id=(_read("/proc/sys/kernel/random/boot_id") or "").strip())
    print(json.dumps(answer))


def _undo(before: dict[str, str | None], spec: dict[str, Any]) -> list[str]:
    """After a failed install: purge what it added, put back what it changed (where apt still has it)."""
    now = {name: version for name, version in installed_versions(list(before)).items()}
    states = _package_states(list(before))
    undone = []
    for name, old in before.items():
        if old is None and (now.get(name) or states.get(name)):
            code, out = _run(["dpkg", "--purge", name])
            undone.append(f"purged {name}" if code == 0 else f"could not purge {name}: {_tail(out, 2)}")
        elif old is not None and now.get(name) != old:
            code, out = _run(["apt-get", *_lock_options(spec), "install", "-y", "--allow-downgrades",
                              f"{name}={old}"])
            undone.append(f"{name} back to {old}" if code == 0 else f"could not put back {name} {old}: {_tail(out, 2)}")
    return undone


def _package_states(names: list[str]) -> dict[str, str]:
    """{package: dpkg's status abbreviation} for packages dpkg knows in any state (half-installed too)."""
    _, out = _run(["dpkg-query", "-W", "-f", "${Package}\t${db:Status-Abbrev}\n", *names])
    states = {}
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) == 2 and parts[1].strip() not in ("", "un", "pn"):
            states[parts[0]] = parts[1].strip()
    return states


def _install(spec: dict[str, Any], result: dict[str, Any]) -> None:
    wanted = spec.get("install") or {}
    if not wanted:
        return
    before = installed_versions(list(wanted))
    argv = ["apt-get", *_lock_options(spec), "install", "-y", "--no-install-recommends",
            "-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold",
            *(f"{name}={version}" for name, version in sorted(wanted.items()))]
    code, out = _run(argv)
    if code != 0:
        result["undone"] = _undo(before, spec)
        raise StepFailed(f"apt-get install failed (exit {code}): {_apt_said(out)}")
    result["done"].append("installed " + ", ".join(f"{name} {version}" for name, version in sorted(wanted.items())))


def _write_files(spec: dict[str, Any], result: dict[str, Any]) -> None:
    for path, content in sorted((spec.get("write") or {}).items()):
        if _read(path) == content:
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomically(path, content.encode("utf-8"), 0o644, 0, 0)
        result["done"].append(f"wrote {path}")


def _commands(spec: dict[str, Any], result: dict[str, Any]) -> None:
    for argv in spec.get("commands") or []:
        if shutil.which(argv[0]) is None:
            result["skipped"].append(f"{' '.join(argv)}: {argv[0]} is not installed on this host")
            continue
        code, out = _run(argv)
        if code != 0 and argv[:2] == ["modprobe", "-r"]:
            result["skipped"].append(f"{' '.join(argv)}: {_tail(out, 1) or 'not loaded'}")
            continue
        if code != 0:
            raise StepFailed(f"{' '.join(argv)}: exit {code}: {_tail(out)}")
        result["done"].append(" ".join(argv))


def apply(spec: dict[str, Any]) -> None:
    """Under provision's lock: install, write, run; then say whether the host asks for a reboot."""
    result: dict[str, Any] = {"ok": False, "done": [], "skipped": [], "failed": None, "undone": []}
    try:
        held_fd = lock(spec["lock"], float(spec.get("wait", 0)))
        try:
            _install(spec, result)
            _write_files(spec, result)
            _commands(spec, result)
            result["ok"] = True
        finally:
            os.close(held_fd)
    except StepFailed as exc:
        result["failed"] = str(exc)
    result["reboot_required"] = os.path.exists("/run/reboot-required")
    result["reboot_packages"] = sorted(set((_read("/run/reboot-required.pkgs") or "").split()))
    print(json.dumps(result))
    sys.stdout.flush()
