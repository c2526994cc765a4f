"""An unchanged host costs one cheap round trip: the probe answers the unit scores and the venv's
versions from the host's own cache, and what holds for a boot (lscpu) from the same cache, and starts
neither systemd-analyze, nor the venv's python, nor lscpu.

What ran is seen from outside the host, not taken from the probe's own account: the lab host's root
is a directory of this machine, so inotify here sees every program the host executes (an exec opens
its file) and every start of the venv's python (it opens pyvenv.cfg first). A stat, which is all the
probe does to those files when it answers from its cache, opens nothing."""
from __future__ import annotations

import ctypes
import json
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from provision import lab
from tests.lab.conftest import invoke_json, run_invoke

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("served_cpu")]

IN_OPEN = 0x20
EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then len bytes of name)


class Opened:
    """How often each watched file was opened while the watch was on."""

    def __init__(self, paths: dict[str, Path]) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0, os.strerror(ctypes.get_errno())
        self.names: dict[int, str] = {}
        for name, path in paths.items():
            assert path.exists(), path
            wd = self.libc.inotify_add_watch(self.fd, str(path).encode(), IN_OPEN)
            assert wd >= 0, f"{path}: {os.strerror(ctypes.get_errno())}"
            self.names[wd] = name

    def counts(self) -> dict[str, int]:
        found = dict.fromkeys(self.names.values(), 0)
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return found
            offset = 0
            while offset < len(data):
                wd, mask, _, length = EVENT.unpack_from(data, offset)
                if mask & IN_OPEN and wd in self.names:
                    found[self.names[wd]] += 1
                offset += EVENT.size + length


@contextmanager
def watching(root: Path) -> Iterator[Opened]:
    # Not uname: every SSH session runs it on a Debian host (pam_motd's update-motd.d/10-uname).
    opened = Opened({"systemd-analyze": root / "usr/bin/systemd-analyze",
                     "the venv's python": root / "opt/vllm/venv/pyvenv.cfg", "lscpu": root / "usr/bin/lscpu"})
    try:
        yield opened
    finally:
        os.close(opened.fd)


@pytest.fixture(scope="module")
def served_cpu(the_lab: lab.Lab) -> None:
    """cpu-1 as the lab inventory declares it, served (a no-op from here on)."""
    done = run_invoke("deploy", "--cluster", "lab-cpu", "--timeout", "420")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def host_root(the_lab: lab.Lab) -> Path:
    return the_lab.dir / "hosts" / "cpu-1" / "root"


def test_a_noop_provision_runs_neither_systemd_analyze_nor_the_venvs_python_nor_lscpu(the_lab: lab.Lab) -> None:
    root = host_root(the_lab)
    run_invoke("facts", "--host", "cpu-1", "--json")  # whatever ran before, the cache is filled now
    with watching(root) as opened:
        code, planned, text = invoke_json("provision", "--host", "cpu-1")
        seen = opened.counts()
    assert code == 0 and planned["hosts"]["cpu-1"]["changes"] == [], text
    assert seen == {"systemd-analyze": 0, "the venv's python": 0, "lscpu": 0}, seen
    # The same watch sees them all once the cache cannot answer (no cache file: every command runs).
    cache = root / "var/cache/provision/probe-cache.json"
    cache.unlink()
    with watching(root) as opened:
        code, found, text = invoke_json("facts", "--host", "cpu-1")
        seen = opened.counts()
    assert code == 0 and seen["systemd-analyze"] >= 1 and seen["the venv's python"] >= 1, (seen, text)
    # Its three forms ran (the summary, -e, the models' columns); inotify merges identical events that
    # follow each other unread, so three opens in a row may read as one.
    assert seen["lscpu"] >= 1, seen
    assert cache.exists() and (cache.stat().st_mode & 0o777) == 0o600
    ran = {step["fact"]: step["how"] for step in found["hosts"]["cpu-1"]["probe"]["steps"]}
    assert ran["unit_security"] == ran["venv"] == ran["lscpu"] == "ran", ran


def test_a_drop_in_scores_the_units_again_and_leaves_the_venvs_answer_cached(the_lab: lab.Lab) -> None:
    root = host_root(the_lab)
    run_invoke("facts", "--host", "cpu-1", "--json")
    drop_in = root / "etc/systemd/system/vllm.service.d/zz-lab-test.conf"
    drop_in.parent.mkdir(exist_ok=True)
    try:
        drop_in.write_text("[Service]\nPrivateNetwork=no\n")
        with watching(root) as opened:
            code, found, text = invoke_json("facts", "--host", "cpu-1", "--verbose")
            seen = opened.counts()
        assert code == 0, text
        assert seen == {"systemd-analyze": 1, "the venv's python": 0, "lscpu": 0}, seen
        ran = {step["fact"]: step["how"] for step in found["hosts"]["cpu-1"]["probe"]["steps"]}
        assert (ran["unit_security"], ran["venv"]) == ("ran", "cached"), ran
    finally:
        drop_in.unlink(missing_ok=True)
        if not any(drop_in.parent.iterdir()):
            drop_in.parent.rmdir()
    planned = run_invoke("plan", "--cluster", "lab-cpu", "--json")
    assert json.loads(planned.stdout)["hosts"]["cpu-1"]["changes"] == [], planned.stdout


def test_a_changed_torch_version_file_asks_the_venv_again_and_not_systemd_analyze(the_lab: lab.Lab) -> None:
    root = host_root(the_lab)
    run_invoke("facts", "--host", "cpu-1", "--json")
    (version,) = (root / "opt/vllm/venv/lib").glob("python*/site-packages/torch/version.py")
    before = version.stat()
    os.utime(version, ns=(before.st_atime_ns, before.st_mtime_ns + 1))  # the same bytes, touched
    try:
        with watching(root) as opened:
            code, found, text = invoke_json("facts", "--host", "cpu-1")
            seen = opened.counts()
        assert code == 0, text
        assert seen == {"systemd-analyze": 0, "the venv's python": 1, "lscpu": 0}, seen
        assert found["hosts"]["cpu-1"]["venv"]["torch"] == "2.13.0+cpu", found["hosts"]["cpu-1"]["venv"]
    finally:
        os.utime(version, ns=(before.st_atime_ns, before.st_mtime_ns))
