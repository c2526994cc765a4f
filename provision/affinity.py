"""CPU affinity for the server, from the host's topology. Pure.

Policies (the `cpu_affinity` setting):
- `all`: no pinning.
- `ccd:N`: the CPUs of the N-th L3 domain (a Zen CCD), SMT siblings included.
- a CPU list (`0-5,24-29`): exactly those.
- `auto` on a host with several NUMA nodes (two sockets; EPYC NPS2/NPS4; Xeon SNC): the CPUs of
  the node the server's GPUs sit on, whole L3 domains of it with SMT siblings, CPU 0's L3 domain
  left out only where that node holds it and has others; memory bound to that node (NUMAMask=).
  GPUs on several nodes (tensor parallel across sockets): the union, which the gate warns about.
  A GPU's node is the kernel's (sysfs numa_node of its PCI device), else the driver's (nvidia-smi
  topo -m "NUMA Affinity"): the scope at which NVIDIA defines a GPU's ideal CPU and memory
  affinity (NVML's CPU/memory affinity). Where neither says, the rules below decide, as on one node.
- `auto` otherwise: the big cores of a CPU with several core types, else one whole CCD that is not
  CPU 0's on a CPU with several L3 domains (CPU 0 takes the interrupts and the rest of the system),
  else no pinning. The first source that tells decides:

  1. the Arm part of each CPU (/proc/cpuinfo `CPU part`: 0xd85 Cortex-X925 big, 0xd87 A725 little);
  2. lscpu's MODELNAME column (the same core names, where util-linux prints them);
  3. the kernel's x86 hybrid lists (/sys/devices/cpu_core/cpus: P-cores, cpu_atom: E-cores);
  4. a frequency class: CPUs whose maximum frequency is clearly above all others (a gap, see
     FREQUENCY_GAP), never "the CPUs at exactly the highest maximum";
  5. the L3 domains (above).

Core type comes before frequency because per-core maxima differ inside one core type: GB10 units
report their X925 cores at 3.9 GHz on one cluster and 4.0 GHz on the other, or at one value; Intel
Turbo Boost Max 3.0 and AMD's CPPC "preferred cores" give single cores a higher maximum. The CPUs
at the exact top frequency can be two cores of twenty, or half a CCD. Index ranges are never used:
GB10 numbers its A725 cores first within each cluster (X925 = 5-9,15-19).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from provision.errors import AffinityError
from provision.parsers import CpuTopology, Gpu

# Arm cores by MIDR part (Linux arch/arm64/include/asm/cputype.h, util-linux lscpu-arm.c) with a
# tier: X cores 3, A7xx 2, A5xx 1. The highest tier present is "big"; a part not listed here makes
# the ranking unknown, and the next source decides.
ARM_CORES: dict[str, tuple[str, int]] = {
    "0xd85": ("Cortex-X925", 3), "0xd82": ("Cortex-X4", 3), "0xd4e": ("Cortex-X3", 3),
    "0xd48": ("Cortex-X2", 3), "0xd44": ("Cortex-X1", 3),
    "0xd87": ("Cortex-A725", 2), "0xd81": ("Cortex-A720", 2), "0xd4d": ("Cortex-A715", 2),
    "0xd47": ("Cortex-A710", 2), "0xd41": ("Cortex-A78", 2),
    "0xd80": ("Cortex-A520", 1), "0xd46": ("Cortex-A510", 1), "0xd05": ("Cortex-A55", 1),
}
_TIER_BY_NAME = {name: tier for name, tier in ARM_CORES.values()}

# Two groups of CPUs are separate frequency classes only where the lower group's highest maximum
# is below FREQUENCY_GAP times the upper group's lowest, i.e. there is a gap of more than 15%
# between neighbouring maxima. Why 0.85: inside one core type, neighbouring maxima sit within 3-6%
# of each other (GB10 X925 3900/4004 = 0.97; Intel TBM 3.0 5500/5800 = 0.95; CPPC steps of about
# 160 MHz, 5352 ... 6482 on a Threadripper PRO 7975WX, 0.97 each), while different core types sit
# 22% and more apart (GB10 A725/X925 2860/4004 = 0.71, 2808/3900 = 0.72; i9-13900K E/P 4300/5500
# = 0.78; Zen 5c/Zen 5 3506/5090 = 0.69). Classes chain by neighbours, so a CPPC spread of 17% in
# 3% steps stays one class.
FREQUENCY_GAP = 0.85

# The facts a choice is made from. Where one of them answered but could not be read (garbage, a
# timeout), `auto` cannot tell what it would choose: the gate's cpu.affinity blocks ("could not be
# checked") rather than let the unit lose its CPUAffinity line, which the next apply would restart
# the server without. Blocking, not keeping the installed unit's line: a first install has none, and
# a line kept from an unread topology would be a guess that the plan then calls "as rendered".
SOURCES = ("lscpu", "lscpu_cpus", "cpuinfo", "lscpu_models", "cpu_core_cpus", "cpu_atom_cpus")


@dataclass(frozen=True)
class Affinity:
    cpus: tuple[int, ...] | None  # None: no pinning
    numa_nodes: tuple[int, ...] | None  # set only where the host has several NUMA nodes
    reason: str

    @property
    def cpu_list(self) -> str | None:
        return compress(self.cpus) if self.cpus else None


def compress(cpus: tuple[int, ...]) -> str:
    """(0, 1, 2, 5, 24, 25) -> '0-2,5,24-25' (systemd's CPUAffinity= syntax)."""
    ranges: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def expand(text: str) -> tuple[int, ...]:
    cpus: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return tuple(sorted(set(cpus)))


def choose(policy: str, topology: CpuTopology | None, unreadable: Iterable[str] = (),
           gpus: Sequence[Gpu] = ()) -> Affinity:
    """The CPUs for `policy`. `unreadable` names the SOURCES whose answers could not be read: only a
    forced cpu.affinity gets this far with any, and then `auto` pins nothing and says why. `gpus` are
    the GPUs the server runs on (Context.server_gpus), whose NUMA node `auto` pins to."""
    if policy == "all":
        return Affinity(None, None, "policy all: no pinning")
    unread = sorted(set(unreadable) & set(SOURCES))
    if unread and policy == "auto":
        return Affinity(None, None, f"the CPU topology did not read ({', '.join(unread)}): no pinning")
    if topology is None or not (topology.cpus or topology.parts or topology.models or topology.numa_cpus):
        if policy == "auto":
            return Affinity(None, None, "no per-CPU topology (lscpu -e) on this host: no pinning")
        raise AffinityError(f"cpu_affinity {policy} needs the per-CPU topology, which this host did not give")
    online = ({cpu.cpu for cpu in topology.cpus if cpu.online} or set(topology.parts) or set(topology.models)
              or {cpu for cpus in topology.numa_cpus.values() for cpu in cpus})
    if policy == "auto":
        cpus, reason = _auto(topology, gpus)
    elif policy.startswith("ccd:"):
        domains = list(topology.l3_domains.values())
        index = int(policy.split(":", 1)[1])
        if index >= len(domains):
            raise AffinityError(f"{policy}: this CPU has {len(domains)} L3 domain(s)")
        cpus, reason = domains[index], f"{policy}: L3 domain {index}"
    else:
        cpus, reason = expand(policy), "explicit CPU list"
        missing = sorted(set(cpus) - online)
        if missing:
            raise AffinityError(f"cpu_affinity lists CPUs this host does not have online: {compress(tuple(missing))}")
    if cpus is None:
        return Affinity(None, None, reason)
    nodes = topology.numa_nodes
    chosen_nodes = tuple(sorted(node for node in nodes
                                if any(cpu.cpu in cpus for cpu in topology.cpus_of_node(node))))
    return Affinity(tuple(sorted(cpus)), chosen_nodes if len(nodes) > 1 else None, reason)


Choice = tuple[tuple[int, ...], str]


def _auto(topology: CpuTopology, gpus: Sequence[Gpu]) -> tuple[tuple[int, ...] | None, str]:
    if len(topology.numa_nodes) > 1 and gpus:
        near = near_gpus(topology, gpus)
        if near:
            return near
    for rule in (_by_arm_part, _by_model_name, _by_kernel_core_type, _by_frequency_class):
        found = rule(topology)
        if found:
            return found
    domains = topology.l3_domains
    if len(domains) > 1:
        first = next(cpus for cpus in domains.values() if 0 not in cpus)
        index = list(domains.values()).index(first)
        return first, f"one whole CCD (L3 domain {index}, SMT siblings included), not CPU 0's"
    return None, "one core type and at most one L3 domain: no pinning"


def _online(topology: CpuTopology) -> set[int]:
    return {cpu.cpu for cpu in topology.cpus if cpu.online}


def _describes_this_host(topology: CpuTopology, listed: Iterable[int]) -> bool:
    """A per-CPU source counts only if it covers every online CPU that `lscpu -e` lists and no CPU
    it does not: two outputs of one host agree; a stale or foreign one is ignored."""
    if not topology.cpus:
        return True
    listed = set(listed)
    return _online(topology) <= listed <= {cpu.cpu for cpu in topology.cpus}


def _usable(topology: CpuTopology, cpus: Iterable[int]) -> tuple[int, ...]:
    online = _online(topology)
    return tuple(sorted(cpu for cpu in cpus if not online or cpu in online))


def _biggest_tier(topology: CpuTopology, tiers: Mapping[int, int | None]) -> tuple[int, ...] | None:
    """The CPUs of the highest tier, where every CPU's tier is known and there are at least two."""
    if not tiers or None in tiers.values() or len(set(tiers.values())) < 2:
        return None
    if not _describes_this_host(topology, tiers):
        return None
    top = max(tier for tier in tiers.values() if tier is not None)
    return _usable(topology, (cpu for cpu, tier in tiers.items() if tier == top))


def _by_arm_part(topology: CpuTopology) -> Choice | None:
    tiers = {cpu: ARM_CORES[part][1] if part in ARM_CORES else None
             for cpu, part in topology.parts.items()}
    big = _biggest_tier(topology, tiers)
    if not big:
        return None
    names = sorted({ARM_CORES[topology.parts[cpu]][0] for cpu in big})
    parts = sorted({topology.parts[cpu] for cpu in big})
    return big, f"big cores by CPU part ({', '.join(names)}: {', '.join(parts)} in /proc/cpuinfo)"


def _by_model_name(topology: CpuTopology) -> Choice | None:
    big = _biggest_tier(topology, {cpu: _TIER_BY_NAME.get(name) for cpu, name in topology.models.items()})
    if not big:
        return None
    names = sorted({topology.models[cpu] for cpu in big})
    return big, f"big cores by MODELNAME ({', '.join(names)} in lscpu -e)"


def _by_kernel_core_type(topology: CpuTopology) -> Choice | None:
    """Intel P-cores: the kernel's cpu_core list, only where E-cores exist too. Never E-cores alone."""
    hybrid = topology.hybrid
    if hybrid is None or not hybrid.core or not hybrid.atom or set(hybrid.core) & set(hybrid.atom):
        return None
    if not _describes_this_host(topology, (*hybrid.core, *hybrid.atom)):
        return None
    p_cores = _usable(topology, hybrid.core)
    if not p_cores:
        return None
    return p_cores, ("P-cores by the kernel's core type (/sys/devices/cpu_core/cpus; "
                     f"{len(hybrid.atom)} E-core CPUs in cpu_atom left to the system)")


def frequency_classes(maxima: Mapping[int, float]) -> list[tuple[int, ...]]:
    """{cpu: max MHz} -> CPU groups, fastest first, split only at gaps (FREQUENCY_GAP)."""
    classes: list[list[float]] = []
    for mhz in sorted(set(maxima.values()), reverse=True):
        if classes and mhz >= FREQUENCY_GAP * classes[-1][-1]:
            classes[-1].append(mhz)
        else:
            classes.append([mhz])
    return [tuple(sorted(cpu for cpu, mhz in maxima.items() if mhz in group)) for group in classes]


def _by_frequency_class(topology: CpuTopology) -> Choice | None:
    online = [cpu for cpu in topology.cpus if cpu.online]
    if not online or any(cpu.max_mhz is None for cpu in online):
        return None
    maxima = {cpu.cpu: float(cpu.max_mhz or 0) for cpu in online}
    classes = frequency_classes(maxima)
    if len(classes) < 2:
        return None
    fastest = classes[0]
    # On x86 an L3 domain is a CCD of one core type: a gap inside one is not a core type, so a
    # class that splits a CCD is refused. On Arm one cluster (one L3) holds both types (GB10: five
    # X925 and five A725 each), so there the split is the point.
    if topology.architecture != "aarch64" and not topology.parts:
        domains = topology.l3_domains.values()
        if len(domains) > 1 and any(0 < len(set(d) & set(fastest)) < len(d) for d in domains):
            return None
    top = [maxima[cpu] for cpu in fastest]
    below = max(maxima[cpu] for cpu in classes[1])
    span = f"{min(top):g}-{max(top):g}" if min(top) != max(top) else f"{max(top):g}"
    return fastest, (f"the fastest frequency class ({span} MHz; the next tops out at {below:g} MHz), "
                     "no core type reported")


def gpu_nodes(gpus: Sequence[Gpu]) -> tuple[int, ...] | None:
    """The NUMA nodes of `gpus`, or None where one of them has none known."""
    nodes = [gpu.node for gpu in gpus]
    if not nodes or None in nodes:
        return None
    return tuple(sorted({node for node in nodes if node is not None}))


def near_gpus(topology: CpuTopology, gpus: Sequence[Gpu]) -> Choice | None:
    """The CPUs of the GPUs' NUMA node(s) as whole L3 domains, or None where a GPU's node is not
    known or holds no online CPU (a memory-only node)."""
    nodes = gpu_nodes(gpus)
    if not nodes:
        return None
    chosen: list[int] = []
    spared = []
    for node in nodes:
        cpus = topology.cpus_of_node(node)
        if not cpus:
            return None
        domains: dict[int | None, list[int]] = {}
        for cpu in cpus:
            domains.setdefault(cpu.l3, []).append(cpu.cpu)
        # CPU 0 takes the interrupts and the rest of the system: its L3 domain stays free where the
        # node has another (never on a one-L3 socket, where it is all the node has).
        kept = [members for members in domains.values() if 0 not in members or len(domains) == 1]
        if len(kept) < len(domains):
            spared.append(node)
        chosen.extend(cpu for members in kept for cpu in members)
    indices = ",".join(str(gpu.index) for gpu in gpus)
    where = f"NUMA node {nodes[0]}" if len(nodes) == 1 else f"NUMA nodes {', '.join(map(str, nodes))}"
    which = f"GPU {indices} sits" if len(gpus) == 1 else f"GPUs {indices} sit"
    whole = "whole L3 domains, " if any(cpu.l3 is not None for cpu in topology.cpus) else ""
    spare = "; CPU 0's L3 domain left to the system" if spared else ""
    return tuple(sorted(chosen)), f"the CPUs of {where}, where {which} ({whole}SMT siblings included{spare})"


def placement_concerns(topology: CpuTopology | None, gpus: Sequence[Gpu], chosen: Affinity) -> list[tuple[str, str]]:
    """What the gate should warn about where the server's CPUs and its GPUs meet: (what, fix) pairs."""
    concerns = []
    for gpu in gpus:
        if gpu.numa_node is not None and gpu.topo_numa_node is not None and gpu.numa_node != gpu.topo_numa_node:
            what = (f"GPU {gpu.index}: the kernel puts it on NUMA node {gpu.numa_node}, nvidia-smi topo -m "
                    f"on node {gpu.topo_numa_node}")
            fix = "the kernel's node is used; check the firmware's NUMA tables (ACPI SRAT/_PXM) and the driver"
            concerns.append((what, fix))
    if topology is None or len(topology.numa_nodes) < 2 or not gpus:
        return concerns
    nodes = gpu_nodes(gpus)
    if nodes is None:
        what = (f"this host has NUMA nodes {', '.join(map(str, topology.numa_nodes))} but the node of the server's "
                "GPUs is not known (sysfs numa_node -1, no NUMA Affinity in nvidia-smi topo -m): the CPUs pinned "
                "may sit on the other socket")
        fix = ("enable NUMA reporting in the firmware (ACPI SRAT; NPS/SNC settings), or set cpu_affinity to the "
               "CPUs of the GPUs' socket")
        return [*concerns, (what, fix)]
    if len(nodes) > 1:
        what = (f"the server's GPUs ({', '.join(str(gpu.index) for gpu in gpus)}) span NUMA nodes "
                f"{', '.join(map(str, nodes))}: tensor parallel crosses the inter-socket link, and the server is "
                "pinned to the union")
        fix = ("where the model fits, keep one server's GPUs on one node (CUDA_VISIBLE_DEVICES in environment, "
               "or a smaller tensor_parallel_size)")
        concerns.append((what, fix))
    if chosen.numa_nodes and not set(chosen.numa_nodes) <= set(nodes):
        away = sorted(set(chosen.numa_nodes) - set(nodes))
        what = (f"the CPUs pinned sit on NUMA node {', '.join(map(str, away))}, away from the GPUs' node "
                f"{', '.join(map(str, nodes))}")
        concerns.append((what, "use cpu_affinity auto, or a CPU list of the GPUs' node"))
    return concerns
