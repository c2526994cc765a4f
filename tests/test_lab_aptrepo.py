"""The lab's apt repository without booting the lab: the real Debian packages it carries for HAProxy,
fetched once with `apt-get download` (a fake one here, on PATH, that hands out a recorded .deb), and their
control fields in the Packages index."""
from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

import pytest

from provision.errors import LabError
from provision.lab import aptrepo

DEB = Path(__file__).parent / "fixtures" / "debs" / "libopentracing-c-wrapper0_1.1.3-3+b1_amd64.deb"
NAME = "libopentracing-c-wrapper0"

FAKE_APT_GET = '''#!{python}
import json, os, shutil, sys
with open({calls!r}, "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
if {fail!r}:
    sys.stderr.write({fail!r} + "\\n")
    sys.exit(100)
for name in sys.argv[2:]:
    shutil.copy({deb!r}, os.getcwd())
'''


def fake_apt_get(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: str = "") -> Path:
    """An `apt-get` first on PATH; returns the file where each of its runs writes its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.jsonl"
    script = bin_dir / "apt-get"
    script.write_text(FAKE_APT_GET.format(python=sys.executable, calls=str(calls), fail=fail, deb=str(DEB)))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return calls


def runs(calls: Path) -> list[list[str]]:
    return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


def test_haproxy_prometheus_and_their_missing_dependencies_are_carried() -> None:
    assert aptrepo.REAL_PACKAGES[:4] == ("haproxy", "liblua5.3-0", "libopentracing-c-wrapper0", "libopentracing1")
    assert {"prometheus", "prometheus-node-exporter", "libjs-rickshaw"} <= set(aptrepo.REAL_PACKAGES)


def test_the_lab_base_holds_what_prometheus_needs_beside_the_carried_packages() -> None:
    """Debian 12's prometheus and its dependencies as its index says (the package's Depends line,
    recorded): each one the base lacks is carried."""
    depends = ("adduser, fonts-glyphicons-halflings, libjs-bootstrap4, libjs-eonasdan-bootstrap-datetimepicker, "
               "libjs-jquery, libjs-jquery-hotkeys, libjs-moment, libjs-moment-timezone, libjs-mustache, "
               "libjs-popper.js, libjs-rickshaw, libc6 (>= 2.34)")
    base = {"adduser", "libjs-jquery", "libc6"}  # in debootstrap's minbase with the lab's packages
    wanted = {item.split(" ")[0] for item in depends.split(", ")}
    assert wanted - base <= set(aptrepo.REAL_PACKAGES), wanted - base - set(aptrepo.REAL_PACKAGES)


def test_the_index_carries_a_real_debs_control_fields(tmp_path: Path) -> None:
    pool = tmp_path / "pool"
    pool.mkdir()
    deb = pool / DEB.name
    shutil.copyfile(DEB, deb)
    index = aptrepo.packages_index([deb], tmp_path)
    data = DEB.read_bytes()
    for line in (f"Package: {NAME}", "Source: opentracing-c-wrapper (1.1.3-3)", "Version: 1.1.3-3+b1",
                 "Architecture: amd64", "Multi-Arch: same",
                 "Depends: libc6 (>= 2.34), libgcc-s1 (>= 3.0), libopentracing1 (>= 1.6.0), libstdc++6 (>= 11)",
                 "Description: C wrapper for the C++ impl of the OpenTracing API",
                 " C++ library.", f"Filename: ./pool/{DEB.name}", f"Size: {len(data)}",
                 f"SHA256: {hashlib.sha256(data).hexdigest()}"):
        assert line in index.splitlines(), line


def test_a_package_is_fetched_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_apt_get(tmp_path, monkeypatch)
    cache = tmp_path / "apt-debs"
    assert aptrepo.download_real(cache, [NAME]) == [cache / DEB.name]
    assert aptrepo.download_real(cache, [NAME]) == [cache / DEB.name]  # a second lab.up: from the cache
    assert runs(calls) == [["download", NAME]]
    assert sorted(path.name for path in cache.iterdir()) == [DEB.name]  # no scratch left


def test_a_failed_download_names_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_apt_get(tmp_path, monkeypatch, fail="E: Unable to locate package haproxy")
    with pytest.raises(LabError) as failed:
        aptrepo.download_real(tmp_path / "apt-debs", ["haproxy", NAME])
    assert str(failed.value) == (f"`apt-get download haproxy {NAME}` failed (exit 100, in {tmp_path / 'apt-debs'}): "
                                 "E: Unable to locate package haproxy; `apt-get update` may be what it needs")


def test_no_apt_get_is_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LabError, match=r"^`apt-get download haproxy` cannot run: this machine has no apt-get"):
        aptrepo.download_real(tmp_path / "apt-debs", ["haproxy"])


def test_a_download_that_gives_nothing_is_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_apt_get(tmp_path, monkeypatch)
    with pytest.raises(LabError, match=r"^`apt-get download` gave no \.deb of haproxy "):
        aptrepo.download_real(tmp_path / "apt-debs", ["haproxy"])  # the fake hands out another package


def test_the_repository_holds_the_stand_ins_and_the_real_packages(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which("gpg") is None or shutil.which("dpkg-deb") is None:
        pytest.fail("gpg and dpkg-deb are needed (the lab's preflight wants them too): apt-get install gnupg dpkg")
    root = tmp_path / "hub" / "apt"
    assert not aptrepo.holds(root, [NAME])
    calls = fake_apt_get(tmp_path, monkeypatch)
    aptrepo.build(root, tmp_path / "gnupg", tmp_path / "hub" / "apt-debs", [NAME])
    index = (root / "Packages").read_text()
    assert [line for line in index.splitlines() if line.startswith("Package: ")] == [
        f"Package: {NAME}", *[f"Package: {package.name}" for package in sorted(
            aptrepo.STAND_INS, key=lambda package: f"{package.name}_{package.version}_all.deb")]]
    assert (root / "pool" / DEB.name).read_bytes() == DEB.read_bytes()
    assert aptrepo.holds(root, [NAME])
    assert not aptrepo.holds(root, ["haproxy", NAME])  # one built before haproxy was carried: built again
    aptrepo.build(root, tmp_path / "gnupg", tmp_path / "hub" / "apt-debs", [NAME])
    assert len(runs(calls)) == 1


def agents_of(home: Path) -> list[int]:
    """gpg-agent processes serving `home` (by their --homedir argument)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"gpg-agent") and str(home).encode() in argv:
            found.append(int(entry.name))
    return found


def test_signing_the_repository_leaves_no_gpg_agent_running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gpg starts an agent to make the key and to sign, and the agent outlives gpg: build stops it, and
    so does lab.down (aptrepo.stop_agent) for one that an older build left."""
    if shutil.which("gpg") is None or shutil.which("gpgconf") is None:
        pytest.fail("gpg and gpgconf are needed (the lab's preflight wants gpg too): apt-get install gnupg")
    fake_apt_get(tmp_path, monkeypatch)
    home = tmp_path / "gnupg"
    aptrepo.build(tmp_path / "apt", home, tmp_path / "apt-debs", [NAME])
    assert (tmp_path / "apt" / "InRelease").read_text().startswith("-----BEGIN PGP SIGNED MESSAGE-----")
    deadline = time.monotonic() + 5  # the agent exits once told to; allow it a moment
    while agents_of(home) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert agents_of(home) == []
    aptrepo.ensure_key(home)  # an agent left running, as builds did before they stopped it
    assert agents_of(home), "gpg started no agent: this test proves nothing here"
    aptrepo.stop_agent(home)
    deadline = time.monotonic() + 5
    while agents_of(home) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert agents_of(home) == []
