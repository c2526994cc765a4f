"""What every host program uses: JSON-line events on stdout, file hashes, atomic writes, the host lock.

Sent first, ahead of the program itself (provision.programs.ship). Standard library only, and
runnable by python3 >= 3.6 like the probe it goes with: typing's names, not PEP 585/604 annotations."""
import errno
import fcntl
import grp
import hashlib
import json
import os
import pwd
import sys
import threading
import time
from typing import Any, List, Optional, Tuple


def emit(event: str, **fields: Any) -> None:
    """One JSON line on stdout: progress events while a program works, {"event": "result"} at the end."""
    fields["event"] = event
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def ids(owner: str, group: str) -> Tuple[int, int]:
    """The uid and gid of a user and group by name (KeyError for one the host lacks)."""
    return pwd.getpwnam(owner).pw_uid, grp.getgrnam(group).gr_gid


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: str, data: bytes, mode: int, uid: int, gid: int) -> None:
    """A temporary file beside `path` with its owner and mode, fsynced, renamed over it."""
    directory = os.path.dirname(path)
    temporary = os.path.join(directory, f".{os.path.basename(path)}.provision-tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(temporary, path)
    fsync_dir(directory)


class StepFailed(Exception):
    """A step that cannot be done. `see`: the task (with its options) that shows the way on, for the
    controller to spell as its hint (provision.hints): the host cannot know whether the tool was
    started as `provision` or as `invoke` in a checkout, so it names the task, never the command."""

    def __init__(self, message: str, see: Optional[str] = None) -> None:
        super().__init__(message)
        self.see = see


# Every directory the tool's host programs created, so that apply takes over (chowns to the service
# user) only what the tool made: a weights fetch makes the model root's parents as root before the
# apply that gives them their owner, and an existing directory of someone else's is never taken.
MADE_DIRECTORIES = "/var/lib/provision/made-directories.json"


def made_directories() -> List[str]:
    try:
        with open(MADE_DIRECTORIES, encoding="utf-8") as handle:
            found = json.load(handle)
    except (OSError, ValueError):
        return []
    return [str(path) for path in found] if isinstance(found, list) else []


_RECORDING = threading.Lock()  # a weights fetch makes directories from several threads


def make_directories(path: str, mode: int = 0o755) -> None:
    """os.makedirs, recording each directory it creates in MADE_DIRECTORIES."""
    with _RECORDING:
        _make_directories(path, mode)


def _make_directories(path: str, mode: int) -> None:
    missing = []
    current = os.path.abspath(path)
    while not os.path.isdir(current) and current != os.path.dirname(current):
        missing.append(current)
        current = os.path.dirname(current)
    os.makedirs(path, mode=mode, exist_ok=True)
    if missing:
        known = [directory for directory in made_directories() if os.path.isdir(directory)]  # the gone ones leave
        fresh = [directory for directory in reversed(missing) if directory not in known]
        if fresh:
            os.makedirs(os.path.dirname(MADE_DIRECTORIES), mode=0o700, exist_ok=True)
            write_atomically(MADE_DIRECTORIES, json.dumps(known + fresh).encode("utf-8"), 0o600, 0, 0)


def lock(path: str, wait: float, holder: Optional[str] = None) -> int:
    """An exclusive flock on `path`, waited for up to `wait` seconds; the file then names its holder
    (`holder`, then this process and since when), which a run refused at it reads. It ends with the
    process (or when the descriptor is closed): a killed run leaves a file that blocks nobody."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.time() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            if time.time() >= deadline:
                holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another run"
                raise StepFailed(f"another provision holds {path} ({holder})")
            time.sleep(0.2)
    os.ftruncate(fd, 0)
    said = f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}"
    os.pwrite(fd, (f"{holder}, {said}" if holder else said).encode(), 0)
    return fd


def roll_holder(path: Optional[str]) -> Optional[str]:
    """Who holds the roll lock at `path` (a deploy rolling this host: drained, applied, waiting for
    readiness), as its file names them; None when nobody does."""
    if not path or not os.path.exists(path):
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return None
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
        return os.pread(fd, 300, 0).decode("utf-8", "replace").strip() or "another run"
    finally:
        os.close(fd)


def of_run(holder: Optional[str], run: Optional[str]) -> bool:
    """Whether the roll lock's holder (roll_holder) is the run `run` (its file opens "run ID: ...")."""
    return bool(holder and run and holder.startswith(f"run {run}:"))


def rolled_by_another(path: Optional[str], run: Optional[str]) -> Optional[str]:
    """The holder of the roll lock at `path` when that is not the run `run`; else None."""
    holder = roll_holder(path)
    return None if holder is None or of_run(holder, run) else holder
