"""Recipes: known-good settings for a model on a kind of machine, as data (one YAML file per recipe).

A recipe names the model (a hub id, pinnable to a commit), the engine and its version, the inventory
settings and server flags, the hardware it was measured on (profile, GPUs, GPU memory, nodes) and its
figures. A figure is either measured (how: the benchmark profile, date and tool version) or cited
(where); a recipe without figures says "not measured here". Nothing here is a guess.

    name: lab-cpu-tiny-llama
    description: ...
    model: {id: lab/tiny-llama, revision: main}
    engine: {name: vllm, version: 0.32.0}
    settings: {max_model_len: 256, ...}      # inventory settings: held to VAR_SPECS (validate_vars)
    hardware: {profile: cpu, gpus: 0, gpu_memory_gib: null, nodes: 1}
    figures: not measured here             # or a list of {metric, value, unit, kind: measured|cited, ...}
    source: where the recipe comes from
    notes: [what a reader must know that the fields do not say]
    upstream: {format: spark-arena-v2, container: ..., mods: [...], build_args: [...], min_nodes: 2}

`upstream` (optional) keeps what an imported recipe's own format held that has no bare-metal meaning
(Spark Arena's container, mods, build arguments, node bounds, files inside the image, its metadata and
the fields the reader does not know), so that writing
the recipe back to that format gives them as they were. Nothing here reads it to serve.

The shipped recipes are this package's *.yaml files; `load_file` reads one of a user's. Pure: reading
files is the only I/O (provision/recipes/sparkarena.py reads Spark Arena's registry files).
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from provision import catalog, datafiles
from provision.errors import InventoryError, RecipeError, clip

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

    from provision import contracts

RECIPE_DIR = resources.files("provision.recipes")  # package data: the shipped recipes
NOT_MEASURED = "not measured here"
FIGURE_KINDS = ("measured", "cited")
MAX_RECIPE_BYTES = 256 * 1024  # a recipe file is a page of YAML; a bigger one is refused unread
# The settings a recipe states in its own fields (model, engine), never again under `settings`.
OWN_FIELDS = ("engine", "model", "model_revision")
# The pip package each engine's version pins in engine_spec (llama.cpp is built from a source instead).

_KEYS = {"name", "description", "model", "engine", "settings", "hardware", "figures", "source", "notes",
         "upstream"}
_REQUIRED = {"name", "model", "engine", "settings", "hardware", "figures", "source"}
_MODEL_KEYS = {"id", "revision"}
_ENGINE_KEYS = {"name", "version"}
_HARDWARE_KEYS = {"profile", "gpus", "gpu_memory_gib", "nodes"}
_FIGURE_KEYS = {"metric", "value", "unit", "kind", "how", "where", "benchmark", "date", "tool"}
# The formats a recipe is imported from, and what its `upstream` keeps of each (by kind): Spark Arena's
# v2 files (recipes/sparkarena.py) keep the container, the mods and build arguments that make it, the
# node bounds and the files inside the image that its command names ({flag: path}); and, as the file has
# them, its metadata besides the description and the fields of sparkrun's that the reader does not know
# (executor_config, pre_exec, distribution_config...): `unread`.
UPSTREAM_FIELDS: Mapping[str, Mapping[str, str]] = {
    "spark-arena-v2": {"container": "text", "mods": "texts", "build_args": "texts", "min_nodes": "count",
                       "max_nodes": "count", "files": "files", "metadata": "mapping", "unread": "mapping"}}
UPSTREAM_KINDS = {"text": "a non-empty string", "texts": "a string or a list of strings",
                  "count": "a positive integer", "files": "a mapping of --flag: path",
                  "mapping": "a mapping of field names to their values"}


@dataclass(frozen=True)
class Hardware:
    """What the figures were measured on: Hardware(profile='rtx5090', gpus=2, gpu_memory_gib=32, nodes=1)."""

    profile: str
    gpus: int  # per node
    gpu_memory_gib: float | None  # per GPU; None: unified memory or not a GPU
    nodes: int = 1


@dataclass(frozen=True)
class Figure:
    """One figure: Figure('decode', 58.6, 'tok/s', 'cited', where='https://github.com/OWNER/REPO, README,
    commit ... of 2026-01-17: ...'). A measured one says how (the benchmark profile, date and tool
    version); a cited one says where it was read: a public address a user can follow, and when."""

    metric: str
    value: float
    unit: str
    kind: str  # "measured" or "cited"
    how: str = ""
    where: str = ""
    benchmark: str = ""
    date: str = ""
    tool: str = ""


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    model: str
    revision: str
    engine: str
    engine_version: str | None  # None: its source does not say
    settings: Mapping[str, Any]  # inventory settings besides engine and model (validated)
    hardware: Hardware
    figures: tuple[Figure, ...]  # empty: not measured here
    source: str
    notes: tuple[str, ...] = ()
    file: str = field(default="", compare=False)
    # What the format it was imported from held with no bare-metal meaning, to write it back there:
    # {format: spark-arena-v2, container, mods, build_args, min_nodes, max_nodes, files} (sparkarena.py).
    upstream: Mapping[str, Any] = field(default_factory=dict)

    def inventory_vars(self) -> dict[str, Any]:
        """The recipe as one host's (or cluster's) `vars:`, held to the settings table: the engine, the
        model and its revision, the settings; the engine's version as its engine_spec pin where the
        settings give none."""
        raw: dict[str, Any] = {"engine": self.engine, "model": self.model, "model_revision": self.revision,
                               **self.settings}
        engine = catalog.ENGINES.get(self.engine)
        # A release pins the engine's package where its version is that package's (llama.cpp's is a build).
        if self.engine_version and engine and engine.version_source == "venv" and "engine_spec" not in raw:
            raw["engine_spec"] = f"{engine.package}=={self.engine_version}"
        return validate_settings(raw, source=self.file or self.name, entity=f"recipe {self.name}")


def contract_notes(engine: str, values: Mapping[str, Any], version: str | None = None) -> list[str]:
    """Every flag of these settings (server_flags, extra_args) judged by the engine contract table
    (provision/engine_contracts.yaml) at the release their engine_spec pins (no pin: the release the
    recipe names, `version`, as the table reads it: llama.cpp's v0.6.0 is build 11429; neither: the
    table's target release), and the value of each flag the table's `choices` name (--load-format X is the row
    --load-format=X). A flag or value a source shows that release without (the row's `lacks`) is a
    RecipeError (exit 2) naming it, the release pinned, the range that has it and its source: the
    server would refuse it at its start. A flag or value without a row, or outside its row's range
    but in no release read, is a note ("not judged"), and so is a variable the release does not
    read (it is ignored, not refused). Nothing passes without a word."""
    from provision import contracts

    table = contracts.load()
    if engine not in table.engines:
        return []
    spec = values.get("engine_spec")
    try:
        pinned = table.pin(engine, spec)
    except InventoryError as exc:
        raise RecipeError(exc.message, file="engine_spec", key="engine_spec") from exc
    # A release the recipe names counts where engine_spec cannot carry it (llama.cpp: a build, not a
    # package's version); elsewhere inventory_vars made it the engine_spec pin, which a host may replace.
    entry = catalog.ENGINES.get(engine)
    if entry is None or entry.version_source == "venv":
        version = None
    try:
        named = table.build(engine, version) if pinned is None and version else None
    except InventoryError as exc:
        raise RecipeError(exc.message, file="engine.version", key="engine.version") from exc
    release = pinned or (named if named and contracts.is_version(named) else table.target(engine))
    judged = release if pinned or release != table.target(engine) or spec else \
        f"{release} (the table's target: no version pinned)"
    if pinned is None and named and release == named and named != version:
        judged = f"{release} (the recipe's {version})"
    choices = table.engines[engine].choices
    refused: list[str] = []
    notes: list[str] = []
    for flag, value in _flags_of(values):
        name = spelt(engine, flag)
        has = table.accepts(engine, "flag", name, release)
        if has is None:
            shown = f"{name} {value}" if name in choices and value is not None and not isinstance(value, bool) \
                else name
            notes.append(f"not judged: no contract row for {shown} at {engine} {judged}")
            continue
        if not has:
            _judge(table.row(engine, "flag", name), f"flag {name}", engine, release, judged, refused, notes)
            continue
        if name not in choices or value is None or isinstance(value, bool):
            continue
        key = f"{name}={value}"
        has = table.accepts(engine, "value", key, release)
        if has is None:
            notes.append(f"not judged: no contract row for {name} {value} at {engine} {judged}")
        elif not has:
            _judge(table.row(engine, "value", key), f"{name} {value}", engine, release, judged, refused, notes)
    for variable in values.get("environment", {}):
        if table.accepts(engine, "env", variable, release) is False:
            row = table.row(engine, "env", variable)
            assert row is not None
            notes.append(f"{engine} {judged} does not read {variable} (engine_contracts.yaml: {row.versions}; "
                         f"{row.source})")
    if refused:
        raise RecipeError("; ".join(refused), file="engine_spec", key="engine_spec")
    return notes


def _known_release(engine: str, version: str, source: str) -> None:
    """RecipeError where the recipe names its engine's release by a tag the contract table does not
    know (llama.cpp v1.1.0: the table holds the builds of v0.2.0 to v0.6.0), naming the ones it does."""
    from provision import contracts

    table = contracts.load()
    if engine not in table.engines:
        return
    try:
        table.build(engine, version)
    except InventoryError as exc:
        raise RecipeError(exc.message, file=source, key="engine.version") from exc


def _flags_of(values: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(flag, value) of server_flags and of extra_args ('--x=v', '--x v', a bare '--x': None)."""
    found = list(values.get("server_flags", {}).items())
    args = [str(arg) for arg in values.get("extra_args", ())]
    for index, arg in enumerate(args):
        if not arg.startswith("-") or _is_number(arg):
            continue
        flag, equals, value = arg.partition("=")
        following = args[index + 1] if index + 1 < len(args) else None
        if not equals and following is not None and (not following.startswith("-") or _is_number(following)):
            value, equals = following, "="
        found.append((flag, value if equals else None))
    return found


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def spelt(engine: str, flag: str) -> str:
    """The option string the engine's parser matches: vLLM's FlexibleArgumentParser reads '--max_num_seqs'
    as '--max-num-seqs' and '--compilation-config.mode' as a key of '--compilation-config'."""
    if engine != "vllm" or not flag.startswith("--"):
        return flag
    return "--" + flag[2:].split(".", 1)[0].replace("_", "-")


def _judge(row: contracts.Row | None, what: str, engine: str, release: str, judged: str,
           refused: list[str], notes: list[str]) -> None:
    """A row whose range leaves the release out: refused where a source shows the release without it
    (the row's `lacks`), a note where that release was not read (the range starts at the first read)."""
    assert row is not None  # accepts() answered False: a row spoke
    if not row.lacked(release):
        notes.append(f"not judged: {engine} {judged} is outside the releases read to have {what} "
                     f"({row.versions}, {row.source}), and no release before those was read")
        return
    first = row.since()
    fix = f"pin {engine}=={first} or later (--set engine_spec={engine}=={first})" if first else \
        f"pin a release in {row.versions}"
    refused.append(f"{engine} {judged} has no {what}: the releases that have it are {row.versions} "
                   f"(engine_contracts.yaml, read in {row.source}); {fix}")


def validate_settings(raw: Mapping[str, Any], *, source: str, entity: str) -> dict[str, Any]:
    """validate_vars, its InventoryError a RecipeError naming the same file, recipe and key."""
    from provision.inventory import validate_vars

    try:
        return validate_vars(raw, source=source, entity=entity)
    except RecipeError:
        raise
    except InventoryError as exc:
        raise RecipeError(exc.message, file=exc.file, line=exc.line, entity=exc.entity, key=exc.key) from exc


def _mapping(data: Any, keys: set[str], required: set[str], where: str, source: str) -> Mapping[str, Any]:
    if not isinstance(data, dict):
        raise RecipeError(f"{where} must be a mapping", file=source)
    unknown = set(data) - keys
    if unknown:
        raise RecipeError(f"unknown key(s) {', '.join(sorted(map(str, unknown)))} in {where} "
                          f"(known: {', '.join(sorted(keys))})", file=source)
    missing = required - set(data)
    if missing:
        raise RecipeError(f"{where} lacks {', '.join(sorted(missing))}", file=source)
    return data


def _text(data: Mapping[str, Any], key: str, source: str, *, empty: bool = False) -> str:
    value = data.get(key, "")
    if not isinstance(value, str) or (not empty and not value.strip()):
        raise RecipeError(f"'{key}' must be {'a' if empty else 'a non-empty'} string, got {clip(repr(value))}",
                          file=source)
    return value


def _count(value: Any, key: str, source: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise RecipeError(f"hardware '{key}' must be an integer of at least {low}, got {clip(repr(value))}",
                          file=source)
    return value


def _figure(data: Any, source: str) -> Figure:
    entry = _mapping(data, _FIGURE_KEYS, {"metric", "value", "unit", "kind"}, "a figure", source)
    value = entry["value"]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RecipeError(f"a figure's value must be a number, got {clip(repr(value))}", file=source)
    kind = entry["kind"]
    if kind not in FIGURE_KINDS:
        raise RecipeError(f"a figure's kind is measured or cited, got {clip(repr(kind))}", file=source)
    # A figure says where it comes from: measured ones how, cited ones where. Neither is invented.
    if kind == "measured" and not all(entry.get(key) for key in ("how", "benchmark", "date", "tool")):
        raise RecipeError(f"measured figure '{entry['metric']}' must say how, benchmark, date and tool",
                          file=source)
    if kind == "cited" and not entry.get("where"):
        raise RecipeError(f"cited figure '{entry['metric']}' must say where it is cited from", file=source)
    if kind == "cited" and not re.search(r"\bhttps?://\S", str(entry["where"])):
        # "issue 35" points nowhere a user can follow: the page, issue or commit by its public address.
        raise RecipeError(f"cited figure '{entry['metric']}' must name the public address it is cited from "
                          "(https://...)", file=source)
    return Figure(metric=_text(entry, "metric", source), value=float(value), unit=_text(entry, "unit", source),
                  kind=kind, **{key: str(entry.get(key) or "") for key in
                                ("how", "where", "benchmark", "date", "tool")})


def from_mapping(data: Any, source: str, profiles: Mapping[str, Any] | None = None) -> Recipe:
    """A recipe from its YAML mapping; RecipeError (exit 2) names the file and what is wrong."""
    top = _mapping(data, _KEYS, _REQUIRED, "a recipe", source)
    name = _text(top, "name", source)
    model = _mapping(top["model"], _MODEL_KEYS, {"id"}, "model", source)
    engine = _mapping(top["engine"], _ENGINE_KEYS, {"name"}, "engine", source)
    hardware = _mapping(top["hardware"], _HARDWARE_KEYS, {"profile", "gpus"}, "hardware", source)
    if profiles is None:
        from provision.profiles import load_profiles

        profiles = load_profiles()
    profile = _text(hardware, "profile", source)
    if profile not in profiles:
        raise RecipeError(f"unknown profile '{clip(profile)}' (known: {', '.join(sorted(profiles))})",
                          file=source, key="hardware.profile")
    memory = hardware.get("gpu_memory_gib")
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, (int, float)) or memory <= 0):
        raise RecipeError(f"hardware 'gpu_memory_gib' must be a positive number or null, got {clip(repr(memory))}",
                          file=source)
    settings = top["settings"]
    if not isinstance(settings, dict):
        raise RecipeError("'settings' must be a mapping of inventory settings", file=source)
    doubled = [key for key in OWN_FIELDS if key in settings]
    if doubled:
        raise RecipeError(f"{', '.join(doubled)} belong in the recipe's model and engine fields, not settings",
                          file=source)
    figures = top["figures"]
    if figures == NOT_MEASURED:
        figures = []
    if not isinstance(figures, list) or (not figures and top["figures"] != NOT_MEASURED):
        raise RecipeError(f"'figures' is a list of figures, or '{NOT_MEASURED}'", file=source)
    notes = top.get("notes") or []
    if not isinstance(notes, list) or not all(isinstance(note, str) for note in notes):
        raise RecipeError("'notes' must be a list of strings", file=source)
    version = engine.get("version")
    if version is not None and (not isinstance(version, str) or not version.strip()):
        raise RecipeError(f"engine 'version' must be a string (quoted: \"0.32.0\") or null, got "
                          f"{clip(repr(version))}", file=source)
    if version is not None:
        _known_release(_text(engine, "name", source), version, source)
    upstream = check_upstream(top.get("upstream"), source)
    recipe = Recipe(
        name=name, description=_text(top, "description", source, empty=True) if "description" in top else "",
        model=_text(model, "id", source), revision=str(model.get("revision") or "main"),
        engine=_text(engine, "name", source), engine_version=version,
        settings=dict(settings),
        hardware=Hardware(profile=profile, gpus=_count(hardware["gpus"], "gpus", source, 0),
                          gpu_memory_gib=None if memory is None else float(memory),
                          nodes=_count(hardware.get("nodes", 1), "nodes", source, 1)),
        figures=tuple(_figure(entry, source) for entry in figures), source=_text(top, "source", source),
        notes=tuple(notes), file=source, upstream=upstream)
    recipe.inventory_vars()  # the settings validate, or the recipe is refused (naming the key)
    return recipe


def _upstream_value(kind: str, value: Any) -> bool:
    if kind == "text":
        return isinstance(value, str) and bool(value.strip())
    if kind == "texts":  # sparkrun takes one string or a list of them
        return isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))
    if kind == "count":
        return isinstance(value, int) and not isinstance(value, bool) and value >= 1
    if kind == "mapping":  # a YAML file's own fields, kept as they are
        return isinstance(value, dict) and all(isinstance(k, str) for k in value)
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def check_upstream(data: Any, source: str) -> dict[str, Any]:
    """A recipe's `upstream` (none: {}): a format of UPSTREAM_FIELDS and only that format's fields, each
    of its kind; anything else is refused by name."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RecipeError("'upstream' must be a mapping (format: NAME and that format's fields)", file=source)
    name = data.get("format")
    if not isinstance(name, str) or name not in UPSTREAM_FIELDS:
        raise RecipeError(f"upstream 'format' is one of {', '.join(UPSTREAM_FIELDS)}, got {clip(repr(name))}",
                          file=source, key="upstream.format")
    fields = UPSTREAM_FIELDS[name]
    for key, value in data.items():
        if key == "format":
            continue
        if key not in fields:
            raise RecipeError(f"unknown key {clip(repr(key))} in upstream of format {name} (known: "
                              f"{', '.join(fields)})", file=source, key="upstream")
        if not _upstream_value(fields[key], value):
            raise RecipeError(f"upstream '{key}' must be {UPSTREAM_KINDS[fields[key]]}, got {clip(repr(value))}",
                              file=source, key=f"upstream.{key}")
    return dict(data)


# The fields by which a sparkrun recipe (Spark Arena's v2, eugr's v1; recipe_version may be left out) is
# known where one of the tool's own is read.
SPARKRUN_FIELDS = ("recipe_version", "runtime", "command", "container")


def load_file(path: Path | Traversable, profiles: Mapping[str, Any] | None = None) -> Recipe:
    """A recipe file of the tool's own; RecipeError (exit 2) where it is not, and one of sparkrun's is
    pointed to recipe.import, which reads those."""
    data = datafiles.read_bounded(path, MAX_RECIPE_BYTES, RecipeError, "a recipe")
    parsed = read_yaml(data, str(path))
    if isinstance(parsed, dict) and not isinstance(parsed.get("engine"), dict) and \
            any(key in parsed for key in SPARKRUN_FIELDS):
        import shlex

        from provision import hints

        given = ", ".join(key for key in SPARKRUN_FIELDS if key in parsed)
        raise RecipeError(f"a sparkrun recipe (Spark Arena's format), not one of this tool's: import it first, "
                          f"`{hints.command(f'recipe.import {shlex.quote(str(path))} --output RECIPE.yaml')}`, "
                          f"then use RECIPE.yaml (its fields {given} are sparkrun's; a registry of such files: "
                          f"`{hints.command('registry.add URL')}`)", file=str(path))
    return from_mapping(parsed, str(path), profiles)


def read_yaml(data: bytes, source: str) -> Any:
    """A file's YAML (the safe subset), or RecipeError naming it."""
    try:
        return datafiles.load(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise RecipeError(f"not UTF-8 text: {exc.reason} at byte {exc.start}", file=source) from exc
    except yaml.YAMLError as exc:
        # The line and what is wrong there (YAML's own words), not its message cut before the line.
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or getattr(exc, "context", None) or str(exc)
        line = mark.line + 1 if mark is not None else None
        column = f", column {mark.column + 1}" if mark is not None else ""
        raise RecipeError(f"not YAML: {clip(str(problem), 160)}{column}", file=source, line=line) from exc


def load_recipes(directory: Traversable = RECIPE_DIR) -> dict[str, Recipe]:
    """The recipes of a directory (the shipped ones by default) by name."""
    recipes: dict[str, Recipe] = {}
    for entry in sorted(directory.iterdir(), key=lambda item: item.name):
        if not (entry.name.endswith(".yaml") and entry.is_file()):
            continue
        recipe = load_file(entry)
        if recipe.name in recipes:
            raise RecipeError(f"recipe '{recipe.name}' is defined twice", file=str(entry))
        recipes[recipe.name] = recipe
    return recipes


def find(name_or_path: str, recipes: Mapping[str, Recipe] | None = None) -> Recipe:
    """A shipped recipe by name, or a recipe file by its path."""
    known = load_recipes() if recipes is None else recipes
    if name_or_path in known:
        return known[name_or_path]
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return load_file(path)
    raise RecipeError(f"no recipe '{clip(name_or_path)}' (known: {', '.join(sorted(known))}; or a recipe "
                      "file's path)", file="command line")


def to_mapping(recipe: Recipe) -> dict[str, Any]:
    """The recipe as its file holds it (from_mapping reads it back to the same recipe)."""
    figures: Any = [{key: value for key, value in vars(figure).items() if value != ""}
                    for figure in recipe.figures] or NOT_MEASURED
    data: dict[str, Any] = {
        "name": recipe.name, "description": recipe.description,
        "model": {"id": recipe.model, "revision": recipe.revision},
        "engine": {"name": recipe.engine, "version": recipe.engine_version},
        "settings": dict(recipe.settings),
        "hardware": {"profile": recipe.hardware.profile, "gpus": recipe.hardware.gpus,
                     "gpu_memory_gib": recipe.hardware.gpu_memory_gib, "nodes": recipe.hardware.nodes},
        "figures": figures, "source": recipe.source}
    if recipe.notes:
        data["notes"] = list(recipe.notes)
    if recipe.upstream:
        data["upstream"] = {key: list(value) if isinstance(value, tuple) else
                            dict(value) if isinstance(value, Mapping) else value
                            for key, value in recipe.upstream.items()}
    return data


def to_yaml(recipe: Recipe) -> str:
    return str(yaml.safe_dump(to_mapping(recipe), sort_keys=False, allow_unicode=True, width=100))
