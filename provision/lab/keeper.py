"""Keeps one lab host running across its reboots, as systemd-nspawn@.service does (RestartForceExitStatus=133).

    python3 -m provision.lab.keeper ROOT -- systemd-nspawn -D ROOT --boot ...

systemd-nspawn exits with status 133 when the container's systemd reboots; the keeper then applies what
the host's stand-in packages left for its next boot (INSIDE/pending.json: files it replays, such as
/proc/driver/nvidia/version, and recorded command outputs, such as `uname -r -m`) and starts it again.
Any other exit (a power-off, the lab stopping it) ends the keeper. A root holding INSIDE/stay-down does not
come back from its reboot: a host that never returns.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from provision.errors import ParseError
from provision.parsers import parse_nvidia_version

REBOOT_STATUS = 133
INSIDE = "usr/local/lib/provision-lab"


def apply_pending(root: Path) -> list[str]:
    """What the stand-ins recorded, put where the host replays it; returns what changed."""
    inside = root / INSIDE
    pending_path = inside / "pending.json"
    if not pending_path.exists():
        return []
    pending = json.loads(pending_path.read_text())
    old_driver = _driver_of(inside)  # before the new version file replaces the old one
    changed = []
    for path, content in (pending.get("files") or {}).items():
        target = inside / "proc" / Path(path).relative_to("/proc") if path.startswith("/proc/") else root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        changed.append(path)
    recording_path = inside / "recording.json"
    recording = json.loads(recording_path.read_text()) if recording_path.exists() else []
    for command, stdout in (pending.get("commands") or {}).items():
        argv = command.split()
        for entry in recording:
            if Path(entry["argv"][0]).name == argv[0] and entry["argv"][1:] == argv[1:]:
                entry["stdout"] = stdout
        changed.append(command)
    new_driver = pending.get("driver")
    if new_driver and old_driver:  # nvidia-smi reports the loaded driver's version too
        for entry in recording:
            if Path(entry["argv"][0]).name == "nvidia-smi":
                entry["stdout"] = entry["stdout"].replace(old_driver, str(new_driver))
    (inside / "driver").write_text(str(new_driver or old_driver or ""))
    recording_path.write_text(json.dumps(recording))
    pending_path.unlink()
    return changed


def _driver_of(inside: Path) -> str | None:
    kept = inside / "driver"
    if kept.exists() and kept.read_text().strip():
        return kept.read_text().strip()
    version = inside / "proc" / "driver" / "nvidia" / "version"
    if not version.exists():
        return None
    try:
        return parse_nvidia_version(version.read_text()).version
    except ParseError:
        return None


def main(argv: list[str]) -> int:
    root = Path(argv[0])
    command = argv[argv.index("--") + 1:]
    while True:
        status = subprocess.run(command, stdin=subprocess.DEVNULL, check=False).returncode
        if status != REBOOT_STATUS:
            return status
        if (root / INSIDE / "stay-down").exists():
            print(f"{time.strftime('%H:%M:%S')} keeper: the host rebooted and stays down (stay-down)", flush=True)
            return 0
        changed = apply_pending(root)
        print(f"{time.strftime('%H:%M:%S')} keeper: reboot; replayed now: {', '.join(changed) or 'nothing new'}",
              flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
