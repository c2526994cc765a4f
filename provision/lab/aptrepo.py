"""The lab's apt repository: stand-in packages under the real names `prepare` installs, built when the lab
comes up, and real Debian packages (HAProxy and what the lab's base root filesystem lacks of its
dependencies, fetched once with this machine's own `apt-get download`), in a flat repository the hub serves
at /apt/, signed with a key made then and trusted by the lab hosts (the way a site's own mirror is).

A stand-in installs no driver and no kernel: its maintainer script records what the host will replay after
its next boot (INSIDE/pending.json: a new /proc/driver/nvidia/version, a new `uname -r`) and asks for a
reboot (/run/reboot-required, as Ubuntu's packages do). The lab's keeper applies the record when the host
reboots. A host whose root holds /etc/provision-lab/fail-install fails every stand-in's install.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from provision.errors import LabError

INSIDE = "/usr/local/lib/provision-lab"
FAIL_MARKER = "/etc/provision-lab/fail-install"
KEY_NAME = "provision-lab apt <lab@provision.invalid>"
HOST_KEYRING = "/etc/apt/keyrings/provision-lab.asc"


@dataclass(frozen=True)
class StandIn:
    name: str
    version: str
    description: str
    replays: dict[str, object]  # what the host replays after its next boot (pending.json's shape)


# Names and versions as Ubuntu 24.04 (noble) publishes them: the HWE kernel metapackage of 24.04.3
# (Linux 6.14) and the open driver packages of the 570 and 580 branches.
STAND_INS = (
    StandIn("linux-generic-hwe-24.04", "6.14.0-29.29~24.04.1", "stand-in: the 24.04 HWE kernel (6.14)",
            {"commands": {"uname -r -m": "6.14.0-29-generic\nx86_64\n"}}),
    StandIn("nvidia-driver-570-open", "570.172.08-0ubuntu0.24.04.1", "stand-in: NVIDIA driver 570, open modules",
            {"files": {"/proc/driver/nvidia/version":
                       "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.172.08  Release Build  "
                       "(dvs-builder@U22-I3-AE18-23-3)  Wed Jun 25 22:44:45 UTC 2025\n"
                       "GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n"},
             "driver": "570.172.08"}),
    StandIn("nvidia-driver-580-open", "580.65.06-0ubuntu0.24.04.1", "stand-in: NVIDIA driver 580, open modules",
            {"files": {"/proc/driver/nvidia/version":
                       "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  "
                       "(dvs-builder@U22-I3-H04-01-5)  Sun Jul 27 06:54:38 UTC 2025\n"
                       "GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n"},
             "driver": "580.65.06"}),
)

# Real packages, as the Debian release of the lab's hosts (and of this machine, whose apt sources fetch them)
# publishes them: haproxy (an endpoint's router, which `prepare` installs) and those of its dependencies
# that the lab's base root filesystem (debootstrap's minbase with lab.BASE_PACKAGES) does not hold:
# liblua5.3-0, libopentracing-c-wrapper0 and the libopentracing1 that one needs. Its others (libc6,
# libcrypt1, libpcre2-8-0, libssl3, libsystemd0, adduser, init-system-helpers, lsb-base) are there.
HAPROXY_PACKAGES = ("haproxy", "liblua5.3-0", "libopentracing-c-wrapper0", "libopentracing1")
# prometheus (the inventory's Prometheus, which `prepare` installs) and what its web interface's
# dependencies add to the base (`apt-get install -s --no-install-recommends prometheus` against the base's
# dpkg status lists these), and prometheus-node-exporter (a host's exporter, whose facts the metrics read).
PROMETHEUS_PACKAGES = ("prometheus", "prometheus-node-exporter", "libjs-jquery-hotkeys", "fonts-glyphicons-halflings",
                       "javascript-common", "libjs-popper.js", "libjs-bootstrap4", "libjs-bootstrap", "libjs-moment",
                       "libjs-eonasdan-bootstrap-datetimepicker", "libjs-moment-timezone", "libjs-mustache",
                       "libjs-d3", "libjs-rickshaw")
REAL_PACKAGES = (*HAPROXY_PACKAGES, *PROMETHEUS_PACKAGES)
DOWNLOAD_TIMEOUT = 600


# Runs on the lab host as the package's postinst (python3 is on every lab host).
POSTINST = '''#!/usr/bin/python3
import json, os, sys
if sys.argv[1:2] != ["configure"]:
    sys.exit(0)
if os.path.exists({fail!r}):
    sys.stderr.write("{name}: the lab makes this install fail ({fail} exists)\\n")
    sys.exit(1)
path = {pending!r}
pending = {{}}
if os.path.exists(path):
    with open(path) as handle:
        pending = json.load(handle)
for key, value in {replays!r}.items():
    if isinstance(value, dict):
        pending.setdefault(key, {{}}).update(value)
    else:
        pending[key] = value
os.makedirs(os.path.dirname(path), exist_ok=True)
with open(path, "w") as handle:
    json.dump(pending, handle)
with open("/run/reboot-required", "a") as handle:
    handle.write("*** System restart required ***\\n")
with open("/run/reboot-required.pkgs", "a") as handle:
    handle.write("{name}\\n")
'''


def build_deb(package: StandIn, out: Path) -> Path:
    with tempfile.TemporaryDirectory() as scratch:
        tree = Path(scratch) / package.name
        debian = tree / "DEBIAN"
        debian.mkdir(parents=True)
        (debian / "control").write_text(
            f"Package: {package.name}\nVersion: {package.version}\nArchitecture: all\n"
            f"Maintainer: provision lab <lab@provision.invalid>\nPriority: optional\nSection: misc\n"
            f"Description: {package.description}\n")
        postinst = debian / "postinst"
        postinst.write_text(POSTINST.format(fail=FAIL_MARKER, name=package.name, pending=f"{INSIDE}/pending.json",
                                            replays=json.loads(json.dumps(package.replays))))
        postinst.chmod(0o755)
        docs = tree / "usr" / "share" / "doc" / package.name
        docs.mkdir(parents=True)
        (docs / "README").write_text(package.description + "\n")
        target = out / f"{package.name}_{package.version}_all.deb"
        subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(tree), str(target)], check=True,
                       capture_output=True)
        return target


def _cached(cache: Path, name: str) -> list[Path]:
    return sorted(cache.glob(f"{name}_*.deb"))


def download_real(cache: Path, names: Sequence[str] = REAL_PACKAGES) -> list[Path]:
    """The real .debs of `names`, fetched with `apt-get download` (this machine's apt sources) into `cache`
    the first time; a package already there is not fetched again."""
    cache.mkdir(parents=True, exist_ok=True)
    missing = [name for name in names if not _cached(cache, name)]
    if missing:
        command = ["apt-get", "download", *missing]
        shown = " ".join(command)
        with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as scratch:
            os.chmod(scratch, 0o755)  # apt's _apt user writes there (else apt warns and downloads as root)
            try:
                done = subprocess.run(command, cwd=scratch, capture_output=True, text=True,
                                      timeout=DOWNLOAD_TIMEOUT, check=False)
            except FileNotFoundError:
                raise LabError(f"`{shown}` cannot run: this machine has no apt-get (the lab's apt repository "
                               f"carries these real Debian packages)") from None
            except subprocess.TimeoutExpired:
                raise LabError(f"`{shown}` ran past {DOWNLOAD_TIMEOUT} s (in {cache})") from None
            if done.returncode != 0:
                said = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
                raise LabError(f"`{shown}` failed (exit {done.returncode}, in {cache}): {said}; "
                               f"`apt-get update` may be what it needs")
            for deb in Path(scratch).glob("*.deb"):
                deb.rename(cache / deb.name)
    absent = [name for name in names if not _cached(cache, name)]
    if absent:
        raise LabError(f"`apt-get download` gave no .deb of {', '.join(absent)} (in {cache})")
    return [_cached(cache, name)[-1] for name in names]


def _control_of(deb: Path) -> str:
    return subprocess.run(["dpkg-deb", "--field", str(deb)], check=True, capture_output=True,
                          text=True).stdout.strip()


def packages_index(debs: list[Path], root: Path) -> str:
    stanzas = []
    for deb in sorted(debs):
        data = deb.read_bytes()
        stanzas.append(f"{_control_of(deb)}\nFilename: ./{deb.relative_to(root)}\nSize: {len(data)}\n"
                       f"SHA256: {hashlib.sha256(data).hexdigest()}\n")
    return "\n".join(stanzas)


def release(root: Path, names: list[str]) -> str:
    lines = ["Origin: provision-lab", "Label: provision-lab", "Suite: lab", "Codename: lab",
             "Date: Thu, 01 Jan 2026 00:00:00 UTC", "SHA256:"]
    for name in names:
        data = (root / name).read_bytes()
        lines.append(f" {hashlib.sha256(data).hexdigest()} {len(data)} {name}")
    return "\n".join(lines) + "\n"


def _gpg(home: Path, *args: str, stdin: bytes | None = None) -> bytes:
    return subprocess.run(["gpg", "--batch", "--homedir", str(home), *args], input=stdin, check=True,
                          capture_output=True).stdout


def stop_agent(home: Path) -> None:
    """gpg starts an agent for the secret key's operations (making the key, signing), and the agent
    outlives gpg: stop every daemon of `home` (none running is fine)."""
    if home.is_dir():
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"], capture_output=True, check=False)


def ensure_key(home: Path) -> bytes:
    """The lab's signing key (made once, no passphrase); its public half, armoured. Its caller stops
    the agent this starts (stop_agent)."""
    home.mkdir(parents=True, exist_ok=True)
    os.chmod(home, 0o700)
    if not _gpg(home, "--list-secret-keys", "--with-colons").strip():
        _gpg(home, "--passphrase", "", "--quick-gen-key", KEY_NAME, "ed25519", "sign", "never")
    return _gpg(home, "--armor", "--export", KEY_NAME)


def holds(root: Path, names: Sequence[str] = REAL_PACKAGES) -> bool:
    """Whether the signed repository in `root` is built and its index names every one of `names` (a
    repository built before the lab carried a real package is built again)."""
    try:
        index = (root / "Packages").read_text()
    except OSError:
        return False
    listed = {line.split(":", 1)[1].strip() for line in index.splitlines() if line.startswith("Package:")}
    return (root / "InRelease").exists() and set(names) <= listed


def build(root: Path, home: Path, downloads: Path, real: Sequence[str] = REAL_PACKAGES) -> bytes:
    """Build the stand-ins, bring the real packages (fetched into `downloads` once) and the signed flat
    repository in `root`; the public key the hosts trust. No gpg-agent is left running."""
    try:
        return _build(root, home, downloads, real)
    finally:
        stop_agent(home)


def _build(root: Path, home: Path, downloads: Path, real: Sequence[str]) -> bytes:
    public = ensure_key(home)
    fetched = download_real(downloads, real)
    root.mkdir(parents=True, exist_ok=True)
    pool = root / "pool"
    pool.mkdir(exist_ok=True)
    debs = [build_deb(package, pool) for package in STAND_INS]
    for deb in fetched:
        shutil.copyfile(deb, pool / deb.name)
        debs.append(pool / deb.name)
    index = packages_index(debs, root)
    (root / "Packages").write_text(index)
    (root / "Packages.gz").write_bytes(gzip.compress(index.encode(), mtime=0))
    (root / "Release").write_text(release(root, ["Packages", "Packages.gz"]))
    signed = _gpg(home, "--local-user", KEY_NAME, "--clearsign", "--output", "-",
                  stdin=(root / "Release").read_bytes())
    (root / "InRelease").write_bytes(signed)
    (root / "key.asc").write_bytes(public)
    return public
