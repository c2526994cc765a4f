"""CPU affinity for the server, from the host's topology. Pure.

Policies (the `cpu_affinity` setting):
- `all`: no pinning.
- `ccd:N`: the CPUs of the N-th L3 domain (a Zen CCD), SMT siblings included.
- a CPU list (`0-5,24-29`): exactly those.
- `auto`: on a CPU with several L3 domains, one whole CCD that is not CPU 0's (CPU 0 takes the
  interrupts and the rest of the system); on a heterogeneous Arm CPU (GB10) its big cores, told apart
  by maximum frequency or by core part (X925 = 0xd85), never by index ranges; otherwise no pinning.
"""
from __future__ import annotations

from dataclasses import dataclass

from provision.parsers import CpuTopology

# Arm MIDR parts of big cores (GB10: Cortex-X925 big, Cortex-A725 little).
BIG_ARM_PARTS = {"0xd85": "Cortex-X925", "0xd82": "Cortex-X4", "0xd4e": "Cortex-X3"}


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


class AffinityError(ValueError):
    """The policy cannot be met on this topology (e.g. ccd:5 on a 2-CCD part)."""


def choose(policy: str, topology: CpuTopology | None) -> Affinity:
    if policy == "all":
        return Affinity(None, None, "policy all: no pinning")
    if topology is None or not (topology.cpus or topology.parts):
        if policy == "auto":
            return Affinity(None, None, "no per-CPU topology (lscpu -e) on this host: no pinning")
        raise AffinityError(f"cpu_affinity {policy} needs the per-CPU topology, which this host did not give")
    online = {cpu.cpu for cpu in topology.cpus if cpu.online} or set(topology.parts)
    if policy == "auto":
        cpus, reason = _auto(topology)
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
    chosen_nodes = tuple(sorted({c.node for c in topology.cpus if c.cpu in cpus and c.node is not None}))
    return Affinity(tuple(sorted(cpus)), chosen_nodes if len(nodes) > 1 else None, reason)


def _auto(topology: CpuTopology) -> tuple[tuple[int, ...] | None, str]:
    speeds = {cpu.max_mhz for cpu in topology.cpus if cpu.max_mhz}
    if len(speeds) > 1 and topology.architecture in ("aarch64", None) and topology.parts:
        fastest = max(speeds)
        return (tuple(cpu.cpu for cpu in topology.cpus if cpu.max_mhz == fastest),
                f"big cores: the CPUs at the highest maximum frequency ({fastest:g} MHz)")
    big = tuple(cpu for cpu, part in sorted(topology.parts.items()) if part in BIG_ARM_PARTS)
    if big and len(big) < len(topology.parts):
        names = sorted({BIG_ARM_PARTS[topology.parts[cpu]] for cpu in big})
        return big, f"big cores by part ({', '.join(names)})"
    if len(speeds) > 1 and not topology.l3_domains:
        fastest = max(speeds)
        return (tuple(cpu.cpu for cpu in topology.cpus if cpu.max_mhz == fastest),
                f"the CPUs at the highest maximum frequency ({fastest:g} MHz)")
    domains = topology.l3_domains
    if len(domains) > 1:
        first = next(cpus for cpus in domains.values() if 0 not in cpus)
        index = list(domains.values()).index(first)
        return first, f"one whole CCD (L3 domain {index}, SMT siblings included), not CPU 0's"
    return None, "one L3 domain: no pinning"
