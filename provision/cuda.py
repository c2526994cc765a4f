"""Which CUDA a vLLM/torch build was made for, and the driver that CUDA needs. Pure, plus one data file.

The CUDA that counts is the one the server will really run: the wheels about to be installed, else the
venv already there, else the `cuda_version` setting (what the inventory intends). Torch says it in its
version's local part (`2.9.0+cu130`, `2.13.0+cpu`); a torch without one (PyPI's default build) says it
through the CUDA runtime wheel it depends on (`nvidia_cuda_runtime_cu12-12.8.90`).
"""
from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources

from provision import datafiles

DATA_FILE = "cuda_drivers.yaml"
_LOCAL_CUDA = re.compile(r"\+cu(\d+?)(\d)$")  # cu128 -> 12.8, cu130 -> 13.0
_TORCH_WHEEL = re.compile(r"^torch-([^-]+)-")
_VLLM_WHEEL = re.compile(r"^vllm-([^-]+\+cu\d+)-")  # vLLM's per-CUDA wheels (wheels.vllm.ai/VERSION/cu129)
_RUNTIME_WHEEL = re.compile(r"^nvidia_cuda_runtime(?:_cu\d+)?-(\d+)\.(\d+)")


@dataclass(frozen=True)
class MinorCompatibility:
    """NVIDIA's minor-version compatibility for one CUDA major: any build of that major runs, with a
    limited feature set, on a driver of at least `driver`: MinorCompatibility('13', '580', URL)."""

    major: str
    driver: str
    source: str


@dataclass(frozen=True)
class DriverTable:
    """{CUDA release: oldest driver}, e.g. {'13.0': '580.65.06'}, with where each figure comes from
    (`sources`, else the file's `source`), and the minor-version compatibility of each CUDA major."""

    releases: Mapping[str, str]
    source: str
    sources: Mapping[str, str] = field(default_factory=dict)
    minor: Mapping[str, MinorCompatibility] = field(default_factory=dict)

    def source_of(self, cuda: str) -> str:
        return self.sources.get(cuda, self.source)


@functools.lru_cache(maxsize=1)
def driver_table() -> DriverTable:
    text = resources.files("provision").joinpath(DATA_FILE).read_text(encoding="utf-8")
    data = datafiles.load(text)
    releases: dict[str, str] = {}
    sources: dict[str, str] = {}
    for cuda, row in data["releases"].items():
        if isinstance(row, dict):  # {driver, source}: a row read from another page than the file's
            releases[str(cuda)], sources[str(cuda)] = str(row["driver"]), str(row["source"])
        else:
            releases[str(cuda)] = str(row)
    minor = {str(major): MinorCompatibility(str(major), str(row["driver"]), str(row["source"]))
             for major, row in (data.get("minor_version_compatibility") or {}).items()}
    return DriverTable(releases, str(data["source"]), sources, minor)


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text.split("-")[0]))


def minimum_driver(cuda: str) -> str | None:
    """'13.0' -> '580.65.06'; None for a release the table does not hold."""
    return driver_table().releases.get(cuda)


def minor_compatibility(cuda: str) -> MinorCompatibility | None:
    """'13.2' -> the 13.x minor-version compatibility (driver 580 or newer); None for a major NVIDIA's
    table does not hold (or one this file does not record)."""
    return driver_table().minor.get(cuda.split(".")[0])


def newest_cuda_for(driver: str) -> str | None:
    """The newest CUDA release a driver runs: '575.57.08' -> '12.9'."""
    fitting = [cuda for cuda, minimum in driver_table().releases.items()
               if version_tuple(driver) >= version_tuple(minimum)]
    return max(fitting, key=version_tuple) if fitting else None


def cuda_of_torch_version(version: str) -> str | None:
    """'2.9.0+cu130' -> '13.0'; '2.13.0+cpu' and '2.9.0' (no variant in the name) -> None."""
    found = _LOCAL_CUDA.search(version)
    return f"{found.group(1)}.{found.group(2)}" if found else None


def torch_variant(version: str) -> str | None:
    """'2.9.0+cu130' -> 'cu130'; '2.13.0+cpu' -> 'cpu'; '2.9.0' -> None."""
    _, plus, local = version.partition("+")
    return local if plus else None


@dataclass(frozen=True)
class WheelCuda:
    """What a set of wheels says about CUDA: torch's version, its variant and the CUDA it needs."""

    torch: str | None  # '2.9.0+cu130'
    cuda: str | None  # '13.0'; None for a CPU build or where nothing says
    evidence: str  # the file that said it


def cuda_of_wheels(names: Iterable[str]) -> WheelCuda | None:
    """From wheel file names: None when no torch wheel is among them. A vLLM wheel built for a newer
    CUDA than its torch (`vllm-0.25.1+cu130` beside `torch+cu129`, vllm #44335) needs that newer CUDA."""
    names = sorted(names)
    found = _torch_cuda(names)
    vllm = next((m for m in map(_VLLM_WHEEL.match, names) if m), None)
    vllm_cuda = cuda_of_torch_version(vllm.group(1)) if vllm else None
    if found and vllm and vllm_cuda and version_tuple(vllm_cuda) > version_tuple(found.cuda or "0"):
        return WheelCuda(found.torch, vllm_cuda, vllm.string)
    return found


def _torch_cuda(names: list[str]) -> WheelCuda | None:
    torch = next((m.group(1) for m in map(_TORCH_WHEEL.match, names) if m), None)
    if torch is None:
        return None
    torch_file = next(name for name in names if name.startswith(f"torch-{torch}-"))
    if torch_variant(torch) is not None:
        return WheelCuda(torch, cuda_of_torch_version(torch), torch_file)
    runtime = next(((m.group(0), f"{m.group(1)}.{m.group(2)}")
                    for m in map(_RUNTIME_WHEEL.match, names) if m), None)
    if runtime:
        return WheelCuda(torch, runtime[1], f"{torch_file} with {runtime[0]}")
    return WheelCuda(torch, None, torch_file)


# Distributions that say which CUDA major they were built for: a local version label (`torch
# 2.11.0+cu129`, `flashinfer_jit_cache 0.6.14+cu130`, vLLM's per-CUDA wheels) or NVIDIA's runtime,
# suffixed for CUDA 12 (`nvidia_cuda_runtime_cu12 12.9.79`) and plain from CUDA 13 on
# (`nvidia_cuda_runtime 13.3.29`).
_LOCAL_LABEL = re.compile(r"\+cu(\d+?)\d$")
_RUNTIME_DIST = re.compile(r"nvidia_cuda_runtime(?:_cu(\d+))?")


def cuda_major(name: str, version: str) -> str | None:
    """The CUDA major a distribution (canonical name, version) needs, or None where it does not say:
    ('torch', '2.11.0+cu129') -> '12'; ('nvidia_cuda_runtime', '13.3.29') -> '13'."""
    local = _LOCAL_LABEL.search(version)
    if local:
        return local.group(1)
    runtime = _RUNTIME_DIST.fullmatch(name.lower())
    if runtime:
        return runtime.group(1) or version.split(".")[0]
    return None


def cuda_majors(names: Iterable[str]) -> dict[str, list[str]]:
    """{CUDA major: the wheel files that need it}, from wheel file names; {} where none says."""
    found: dict[str, list[str]] = {}
    for name in sorted(names):
        parts = name.split("-")
        major = cuda_major(parts[0], parts[1]) if len(parts) >= 3 else None
        if major is not None:
            found.setdefault(major, []).append(name)
    return found


def _mixed(majors: Mapping[str, list[str]]) -> str | None:
    if len(majors) < 2:
        return None
    return "; ".join(f"CUDA {major}: {', '.join(files[:3])}" + (f" and {len(files) - 3} more" if len(files) > 3 else "")
                     for major, files in sorted(majors.items(), key=lambda item: int(item[0])))


def mixed_cuda(names: Iterable[str]) -> str | None:
    """Why a set of wheels mixes CUDA majors, naming one wheel of each, or None where they agree.
    A vLLM built for CUDA 13 beside a CUDA 12.9 torch installs, then fails at import on
    `libcudart.so.13` (vllm #44335: torch 2.11.0+cu129 with nvidia-cuda-runtime 13.3.29 beside
    nvidia-cuda-runtime-cu12 12.9.79)."""
    return _mixed(cuda_majors(names))


def mixed_cuda_installed(dists: Mapping[str, str]) -> str | None:
    """The same for a venv's installed distributions ({canonical name: version}, torch's version as
    torch/version.py says it, local label included): 'CUDA 12: nvidia_cuda_runtime_cu12 12.9.79,
    torch 2.11.0+cu129; CUDA 13: nvidia_cuda_runtime 13.3.29'."""
    majors: dict[str, list[str]] = {}
    for name, version in sorted(dists.items()):
        major = cuda_major(name, version)
        if major is not None:
            majors.setdefault(major, []).append(f"{name} {version}")
    return _mixed(majors)
