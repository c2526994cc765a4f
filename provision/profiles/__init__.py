"""Hardware profiles: data files (one YAML per profile) describing what a kind of host must have.

Profiles are data, not code branches: checks, rendering and the planner read these fields and never
test a profile's name. A site can add its own profile file without touching the package.
"""
from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any

from provision import datafiles
from provision.errors import ProfileError

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

PROFILE_DIR = resources.files("provision.profiles")  # package data: the shipped profiles


@dataclass(frozen=True)
class GpuExpectation:
    compute_capability: str  # "12.0"
    name_contains: str  # substring of nvidia-smi's name column, e.g. "RTX 5090"
    unified_memory: bool  # GB10: nvidia-smi memory is [N/A]; budget from /proc/meminfo
    dmabuf: bool  # NCCL may use dma-buf (GB10: DMA_BUF_SUPPORTED=0)
    gpudirect_rdma: bool  # nvidia_peermem has a use (GB10 and GeForce: no)
    pcie_gen: int | None  # the PCIe generation the GPU links at (None: not PCIe-attached, e.g. GB10)


@dataclass(frozen=True)
class KernelExpectation:
    minimum: str  # "6.14"
    also_accepted: tuple[str, ...] = ()  # regexes of vendor kernels accepted below the minimum


@dataclass(frozen=True)
class DriverExpectation:
    flavour: str  # "open", "proprietary" or "any"
    minimum: str  # "570.26"


@dataclass(frozen=True)
class CudaExpectation:
    minimum: str  # "12.8"
    torch_cuda_arch_list: str  # "12.0", "12.1a", "9.0"
    # CMake's CUDA_ARCHITECTURES for native builds (llama.cpp's ggml): "120a", "121a", "90a"
    cmake_cuda_architectures: str = ""


@dataclass(frozen=True)
class Profile:
    """One hardware profile, e.g. Profile(name='rtx5090', arch='x86_64', gpu=GpuExpectation('12.0', ...))."""

    name: str
    description: str
    arch: str  # "x86_64", "aarch64" or "any"
    gpu: GpuExpectation | None
    kernel: KernelExpectation
    driver: DriverExpectation | None
    cuda: CudaExpectation | None
    nccl_minimum: str | None
    environment: Mapping[str, str]
    affinity: str
    defaults: Mapping[str, Any]
    venv_gib: float = 12.0
    venv_remove: tuple[str, ...] = ()  # packages uninstalled after the venv install
    # PyTorch builds that fit (its per-CUDA wheel indexes: cu128, cu129, cu130; cpu): the one taken
    # follows cuda_version ("13.0" -> cu130), or is cpu on a profile without CUDA.
    torch_variants: tuple[str, ...] = ()
    # The device nodes the server opens: systemd DeviceAllow= entries and the nodes each covers,
    # (("char-nvidia-uvm rw", "/dev/nvidia-uvm, /dev/nvidia-uvm-tools"), ...). Strict hardening
    # allows these and closes the rest; none at all gives the units a private /dev.
    devices: tuple[tuple[str, str], ...] = ()
    aliases: tuple[str, ...] = field(default=())
    source: str = field(default="", compare=False)  # the file it was read from, for errors


_TOP_KEYS = {
    "name", "aliases", "description", "arch", "gpu", "kernel", "driver", "cuda", "nccl",
    "environment", "affinity", "defaults", "venv_gib", "venv_remove", "torch_variants", "devices",
}


# Fields a profile may leave out: no vendor kernels; no native (CMake) CUDA builds on that hardware.
OPTIONAL_FIELDS = {"also_accepted", "cmake_cuda_architectures"}


def _section(data: Mapping[str, Any], key: str, source: str, fields: set[str]) -> Mapping[str, Any] | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ProfileError(f"{source}: '{key}' must be a mapping or null")
    unknown = set(value) - fields
    if unknown:
        raise ProfileError(f"{source}: '{key}' has unknown keys: {', '.join(sorted(unknown))}")
    missing = fields - set(value) - OPTIONAL_FIELDS
    if missing:
        raise ProfileError(f"{source}: '{key}' lacks: {', '.join(sorted(missing))}")
    return value


def profile_from_mapping(data: Any, source: str) -> Profile:
    """Validate one profile's parsed YAML and build the Profile (ProfileError names the file)."""
    if not isinstance(data, dict):
        raise ProfileError(f"{source}: a profile must be a mapping")
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise ProfileError(f"{source}: unknown keys: {', '.join(sorted(unknown))}")
    for required in ("name", "description", "arch", "kernel", "affinity"):
        if required not in data:
            raise ProfileError(f"{source}: missing '{required}'")
    gpu = _section(data, "gpu", source, {"compute_capability", "name_contains", "unified_memory",
                                         "dmabuf", "gpudirect_rdma", "pcie_gen"})
    kernel = _section(data, "kernel", source, {"minimum", "also_accepted"})
    driver = _section(data, "driver", source, {"flavour", "minimum"})
    cuda = _section(data, "cuda", source, {"minimum", "torch_cuda_arch_list", "cmake_cuda_architectures"})
    nccl = _section(data, "nccl", source, {"minimum"})
    assert kernel is not None  # required above
    accepted = tuple(str(p) for p in kernel.get("also_accepted") or ())
    for pattern in accepted:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ProfileError(f"{source}: kernel.also_accepted: bad pattern {pattern!r}: {exc}") from exc
    if driver is not None and driver["flavour"] not in ("open", "proprietary", "any"):
        raise ProfileError(f"{source}: driver.flavour must be open, proprietary or any")
    environment = data.get("environment") or {}
    defaults = data.get("defaults") or {}
    if not isinstance(environment, dict) or not isinstance(defaults, dict):
        raise ProfileError(f"{source}: 'environment' and 'defaults' must be mappings")
    return Profile(
        name=str(data["name"]),
        aliases=tuple(str(a) for a in data.get("aliases") or ()),
        description=str(data["description"]),
        arch=str(data["arch"]),
        gpu=GpuExpectation(
            compute_capability=str(gpu["compute_capability"]),
            name_contains=str(gpu["name_contains"]),
            unified_memory=bool(gpu["unified_memory"]),
            dmabuf=bool(gpu["dmabuf"]),
            gpudirect_rdma=bool(gpu["gpudirect_rdma"]),
            pcie_gen=int(gpu["pcie_gen"]) if gpu["pcie_gen"] is not None else None,
        ) if gpu else None,
        kernel=KernelExpectation(minimum=str(kernel["minimum"]), also_accepted=accepted),
        driver=DriverExpectation(flavour=str(driver["flavour"]), minimum=str(driver["minimum"]))
        if driver else None,
        cuda=CudaExpectation(
            minimum=str(cuda["minimum"]), torch_cuda_arch_list=str(cuda["torch_cuda_arch_list"]),
            cmake_cuda_architectures=str(cuda.get("cmake_cuda_architectures") or ""),
        ) if cuda else None,
        nccl_minimum=str(nccl["minimum"]) if nccl else None,
        environment={str(k): str(v) for k, v in environment.items()},
        affinity=str(data["affinity"]),
        defaults=dict(defaults),
        venv_gib=float(data.get("venv_gib", 12)),
        venv_remove=tuple(str(name) for name in data.get("venv_remove") or ()),
        torch_variants=_torch_variants(data.get("torch_variants"), source),
        devices=_devices(data, source),
        source=source,
    )


def _torch_variants(value: Any, source: str) -> tuple[str, ...]:
    variants = tuple(str(v) for v in value or ())
    bad = [v for v in variants if not re.fullmatch(r"cu\d{3}|cpu|rocm[\d.]+", v)]
    if bad:
        raise ProfileError(f"{source}: torch_variants: not a PyTorch variant: {', '.join(bad)} (cu128, cpu, ...)")
    return variants


# DeviceAllow=: a device group of /proc/devices (char-NAME, globs allowed) or a /dev path, then its
# access (r, w, m). systemd.resource-control(5): globs work on group names only, never on paths.
_DEVICE = re.compile(r"^(?:(?:char|block)-[A-Za-z0-9_*?.-]+|/dev/[A-Za-z0-9_./-]+) [rwm]{1,3}$")


def _devices(data: Mapping[str, Any], source: str) -> tuple[tuple[str, str], ...]:
    if "devices" not in data:
        if data.get("gpu") is not None:
            # A GPU profile without the list would get a private /dev, which hides /dev/nvidia*.
            raise ProfileError(f"{source}: a GPU profile must list the device nodes its server opens "
                               "(devices: {char-nvidiactl rw: /dev/nvidiactl, ...})")
        return ()
    devices = data.get("devices") or {}
    if not isinstance(devices, dict):
        raise ProfileError(f"{source}: 'devices' must map DeviceAllow= entries to the nodes they cover")
    bad = [str(entry) for entry, nodes in devices.items()
           if not isinstance(entry, str) or not _DEVICE.match(entry) or not isinstance(nodes, str)]
    if bad:
        raise ProfileError(f"{source}: devices: not a DeviceAllow= entry with the nodes it covers: "
                           f"{', '.join(bad)} (char-GROUP or /dev/PATH, then r, w, m: /dev/...)")
    return tuple((entry, nodes) for entry, nodes in devices.items())


@functools.cache
def load_profiles(directory: Traversable = PROFILE_DIR) -> Mapping[str, Profile]:
    """All profiles of a directory by name and alias: {'rtx5090': Profile(...), 'h200': Profile(...)}."""
    profiles: dict[str, Profile] = {}
    files = [entry for entry in directory.iterdir() if entry.name.endswith(".yaml") and entry.is_file()]
    for path in sorted(files, key=lambda entry: entry.name):
        profile = profile_from_mapping(datafiles.load(path.read_text(encoding="utf-8")), str(path))
        for name in (profile.name, *profile.aliases):
            if name in profiles:
                raise ProfileError(f"{path}: profile name '{name}' is defined twice")
            profiles[name] = profile
    return profiles
