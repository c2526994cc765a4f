"""The units' sandbox: which systemd directives each host's units get, and the score they must keep.

Levels (the `hardening` setting): `default` confines everything that does not touch device access or
system calls; `strict` adds a closed device policy with the profile's devices and a system-call
allow-list. templates/systemd/hardening.j2 prints the values with one reason per directive;
`systemd-analyze security` is the measure (tests/test_render.py, and `invoke check` on the host).

The strict device allow-list comes from the host: each profile entry (`char-nvidia rw`: the GPUs) is
matched, as systemd matches it when the unit starts, against the character device groups the host's
drivers registered in /proc/devices (the `proc_devices` fact), and the unit allows the groups that
matched, by name. An entry that matches nothing is left out and named (the gate warns); where the
host's groups are unknown (a recording made before that fact), the entries are rendered as written.
Pure: no I/O.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

from provision.parsers import DeviceGroup

if TYPE_CHECKING:  # checks imports this module for the targets
    from provision.context import Context

# The most `systemd-analyze security` may score a rendered unit, per hardening level (from 0.0,
# fully confined, to 10.0). tests/test_render.py holds every golden unit to it; `invoke check` warns
# when an installed unit scores above it (an operator's drop-in that loosens it, say).
EXPOSURE_TARGETS = {"default": 3.5, "strict": 2.0}
# Socket families: the API and Ray/NCCL over TCP (AF_INET, AF_INET6), local IPC and NCCL's cuMem
# handle passing (AF_UNIX), interface lists (AF_NETLINK: glibc getifaddrs for psutil, Ray, NCCL).
ADDRESS_FAMILIES = ("AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK")
# RDMA verbs: NCCL over InfiniBand/RoCE opens /dev/infiniband/uverbs*, the device group the kernel's
# drivers/infiniband/core/uverbs_main.c registers as "infiniband_verbs".
RDMA_DEVICE = "char-infiniband_verbs rw"
# The NVIDIA driver's fixed major (NV_MAJOR_DEVICE_NUMBER, kernel-open/common/inc/nv-chardev-numbers.h):
# the GPUs (minors 0-247, group "nvidia") and /dev/nvidiactl (255, "nvidiactl") since the 545 open
# modules; one "nvidia-frontend" group before them (nv-frontend.c, removed in 545.23.06).
NVIDIA_MAJOR = 195
# strict: what CUDA, NCCL and Ray call beyond systemd's @system-service set, each with its source.
# NCCL passes cuMem handles as file descriptors over AF_UNIX (SCM_RIGHTS: sendmsg/recvmsg, in
# @system-service; nccl src/misc/ipcsocket.cc), so it adds nothing here.
SYSCALLS_BEYOND_SYSTEM_SERVICE = (
    ("pidfd_getfd", ("PyTorch's expandable segments share CUDA memory across processes with it "
                     "(pytorch #130890, #165685); systemd files it under @debug")),
)


@dataclass(frozen=True)
class Allowed:
    """One entry of a strict allow-list (a DeviceAllow= device or a system call) and why it is there."""

    entry: str
    reason: str


@dataclass(frozen=True)
class DeviceEntry:
    """One DeviceAllow= entry the unit is meant to have (the profile's, or RDMA's), what it covers,
    and the host's character device groups it matches: DeviceEntry('char-nvidia rw', 'the GPUs ...',
    (DeviceGroup(195, 'nvidia'),)). `groups` is () where it matches none, None where that cannot be
    told (the host's groups unknown, or an entry that names a /dev path or a block group)."""

    entry: str
    reason: str
    groups: tuple[DeviceGroup, ...] | None

    @property
    def char_group(self) -> tuple[str, str] | None:
        return char_group(self.entry)


def char_group(entry: str) -> tuple[str, str] | None:
    """(group pattern, access) of a `char-PATTERN ACCESS` entry ('char-nvidia*', 'rw'), else None (a
    /dev path, a block group)."""
    device, _, access = entry.partition(" ")
    return (device.removeprefix("char-"), access) if device.startswith("char-") else None


def matching(pattern: str, groups: Sequence[DeviceGroup]) -> tuple[DeviceGroup, ...]:
    """The groups DeviceAllow=char-PATTERN matches: systemd matches the pattern against each group
    name of /proc/devices with fnmatch(3), case-sensitive, no flags, and allows each matched group's
    whole major, every minor (src/core/bpf-devices.c, allow_list_device_pattern with no minor)."""
    return tuple(group for group in groups if fnmatchcase(group.name, pattern))


def device_entries(ctx: Context) -> tuple[DeviceEntry, ...]:
    """The profile's device entries (and RDMA verbs where NCCL uses them), each with the groups of
    the host's /proc/devices it matches. Pure: the gate (unit.devices) and the unit read the same."""
    wanted = list(ctx.profile.devices)
    multi = bool(ctx.cluster and ctx.cluster.multi_node)
    if wanted and multi and any(link.up for link in ctx.facts.rdma or ()):
        wanted.append((RDMA_DEVICE, "RDMA verbs (/dev/infiniband/uverbs*) for NCCL over InfiniBand/RoCE"))
    host = ctx.facts.device_groups
    entries = []
    for entry, reason in wanted:
        char = char_group(entry)
        entries.append(DeviceEntry(entry, reason, None if host is None or char is None else matching(char[0], host)))
    return tuple(entries)


def allowed_devices(entries: Sequence[DeviceEntry]) -> list[Allowed]:
    """The DeviceAllow= lines: each matched group by its own name (a glob's matches spelled out, each
    group once), the host's major and name in the reason; an entry that cannot be matched as written."""
    allowed: list[Allowed] = []
    named: set[str] = set()
    for item in entries:
        char = item.char_group
        if item.groups is None or char is None:
            allowed.append(Allowed(item.entry, item.reason))
            continue
        for name in dict.fromkeys(group.name for group in item.groups):
            if name in named:
                continue
            named.add(name)
            majors = "/".join(str(group.major) for group in item.groups if group.name == name)
            allowed.append(Allowed(f"char-{name} {char[1]}", f"{item.reason}; this host: {majors} {name}"))
    return allowed


def unit_values(ctx: Context) -> dict[str, Any]:
    """The sandbox values the unit templates print (templates/systemd/hardening.j2 gives the reasons).

    Device access follows the profile's `devices`: none (the cpu profile) gives a private /dev;
    GPU profiles keep the host's /dev by default and, at the strict level, a closed device policy
    that allows the groups of the host's /proc/devices the profile's entries match (and RDMA verbs
    where NCCL uses them) and nothing else; closed even where nothing matched (the gate refuses that).
    """
    level = str(ctx.settings.hardening)
    strict = level == "strict"
    private_devices = not ctx.profile.devices
    closed = strict and not private_devices
    entries = device_entries(ctx) if closed else ()
    if ctx.facts.device_groups is None:
        note = ctx.facts.notes.get("proc_devices", "no value")
        source = f"The profile's groups as written: the host's /proc/devices was not read ({note})."
    else:
        source = "The groups the host's drivers registered in /proc/devices when its facts were read."
    return {
        "level": level,
        "target": EXPOSURE_TARGETS[level],
        "private_devices": private_devices,
        # ProtectClock= only where device access is closed anyway: before systemd 252 it implied
        # DeviceAllow=char-rtc, which closes every other device, /dev/nvidia* included (systemd
        # #18142, fixed by #25075). Without it the empty capability set still forbids setting the clock.
        "protect_clock": private_devices or strict,
        "address_families": " ".join(ADDRESS_FAMILIES),
        "address_families_reason": "TCP for the API, Ray and NCCL; UNIX for local IPC; netlink for interface lists",
        "strict": strict,
        "device_closed": closed,
        "device_source": source,
        "device_allow": allowed_devices(entries),
        # Profile entries no group matched: named in the unit, left out of it (unit.devices warns).
        "device_left_out": [Allowed(item.entry, item.reason) for item in entries if item.groups == ()],
        "syscalls": [Allowed(name, reason) for name, reason in SYSCALLS_BEYOND_SYSTEM_SERVICE],
    }


def router_values(ctx: Context) -> dict[str, Any]:
    """The endpoints' router (HAProxy) in the same sandbox as the servers, minus what only they need:
    no device at all, and no netlink (it listens where its config says, it asks no interface list)."""
    return {**unit_values(ctx), "private_devices": True, "protect_clock": True, "device_closed": False,
            "device_allow": [], "device_left_out": [],
            "address_families": "AF_UNIX AF_INET AF_INET6",
            "address_families_reason": "TCP for the endpoint and its replicas; UNIX for the runtime API and "
                                       "the journal"}
