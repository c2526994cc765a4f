"""The units' sandbox: which systemd directives each host's units get, and the score they must keep.

Levels (the `hardening` setting): `default` confines everything that does not touch device access or
system calls; `strict` adds a closed device policy with the profile's devices and a system-call
allow-list. templates/systemd/hardening.j2 prints the values with one reason per directive;
`systemd-analyze security` is the measure (tests/test_render.py, and `invoke check` on the host).
Pure: no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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


def unit_values(ctx: Context) -> dict[str, Any]:
    """The sandbox values the unit templates print (templates/systemd/hardening.j2 gives the reasons).

    Device access follows the profile's `devices`: none (the cpu profile) gives a private /dev;
    GPU profiles keep the host's /dev by default and, at the strict level, a closed device policy
    that allows the profile's devices (and RDMA verbs where NCCL uses them) and nothing else.
    """
    level = str(ctx.settings.hardening)
    strict = level == "strict"
    devices = [Allowed(entry, nodes) for entry, nodes in ctx.profile.devices]
    multi = bool(ctx.cluster and ctx.cluster.multi_node)
    if devices and multi and any(link.up for link in ctx.facts.rdma or ()):
        devices.append(Allowed(RDMA_DEVICE, "RDMA verbs (/dev/infiniband/uverbs*) for NCCL over "
                                            "InfiniBand/RoCE"))
    private_devices = not ctx.profile.devices
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
        "device_allow": devices if strict and not private_devices else [],
        "syscalls": [Allowed(name, reason) for name, reason in SYSCALLS_BEYOND_SYSTEM_SERVICE],
    }


def router_values(ctx: Context) -> dict[str, Any]:
    """The endpoints' router (HAProxy) in the same sandbox as the servers, minus what only they need:
    no device at all, and no netlink (it listens where its config says, it asks no interface list)."""
    return {**unit_values(ctx), "private_devices": True, "protect_clock": True, "device_allow": [],
            "address_families": "AF_UNIX AF_INET AF_INET6",
            "address_families_reason": "TCP for the endpoint and its replicas; UNIX for the runtime API and "
                                       "the journal"}
