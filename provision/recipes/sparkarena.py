"""Spark Arena's recipe registry (github.com/spark-arena/recipe-registry), read as it is and written back.

Its files are `recipe_version: "2"` YAML for sparkrun, which launches a container on DGX Sparks:

    model: Intel/Qwen3-Coder-Next-int4-AutoRound
    runtime: vllm                    # the engine in the container
    max_nodes: 1                     # min_nodes / max_nodes: how many Sparks
    container: ghcr.io/...:latest    # the image (its engine's version is in its tag, or nowhere)
    mods: [mods/fix-...]             # changes sparkrun applies inside the container before launch
    defaults: {port: 8000, gpu_memory_utilization: 0.7, ...}
    env: {VLLM_MARLIN_USE_ATOMIC_ADD: "1"}
    command: |
      vllm serve {model} --gpu-memory-utilization {gpu_memory_utilization} ...

`read` expands the command's {placeholders} with the defaults (and {model}, {model_revision},
{config.NAME}), reads the expanded server command into inventory settings and server flags, and names
every part that has no bare-metal meaning (mods, build arguments, files inside the image, a placeholder
nothing defines, a default no placeholder uses): nothing is dropped unsaid. Every engine is read through
its catalog entry (provision/catalog.py): the runtime names it, its command starts as recipe_commands
say, recipe_flags say which flags are settings and recipe_skips which are not carried, image_pattern
where a container's name says its release. The settings are held to the settings table (validate_vars);
a recipe that cannot be used says why. `write` is the way back, for a vLLM recipe whose settings fit the
format. Pure: text in, values out.
"""
from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from provision import catalog
from provision.errors import RecipeError, clip
from provision.recipes import NOT_MEASURED, OWN_FIELDS, Hardware, Recipe, contract_notes, read_yaml

FORMAT = "2"
# The fields of a v2 file this reader knows, and what it does with each.
READ = ("recipe_version", "model", "model_revision", "runtime", "min_nodes", "max_nodes", "container",
        "metadata", "mods", "defaults", "env", "command", "build_args")
# sparkrun's runtimes and the engine each is here (the catalog's `runtimes`); None: a runtime known to
# have no engine of this tool (atlas: its own server).
RUNTIMES: Mapping[str, str | None] = {**catalog.runtime_engines(), "atlas": None}
# Spark Arena's recipes are for DGX Spark ("launching LLM inference on DGX Spark", the registry's
# official-recipes/README.md): one GB10 a node, its memory unified.
PROFILE = "dgx-spark"
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_.]*)\}")
# How a flag's value is read into the setting a catalog's recipe_flags name (a number where the settings
# table wants one); the model, the listen address and the prefix cache are read apart (_read_flags).
SETTING_TYPES: Mapping[str, type] = {
    catalog.TENSOR_PARALLEL: int, catalog.PIPELINE_PARALLEL: int, catalog.MEMORY: float, catalog.CONTEXT: int,
    catalog.PORT: int, catalog.NAME: str}
HOST_NOTE = ("the listen address stays the inventory's bind_host (default 127.0.0.1): a recipe does not open "
             "a host to the network")
_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")
_FLAG_NAME = re.compile(r"^--?[A-Za-z0-9][A-Za-z0-9_-]*$")  # what server_flags takes; others: extra_args


@dataclass(frozen=True)
class Imported:
    """What one registry file became: the recipe (None where it cannot be used: `refused` says why), each
    placeholder and its value, the placeholders nothing defines, and what was not carried, and why."""

    source: str
    recipe: Recipe | None
    refused: str = ""
    placeholders: Mapping[str, str] = field(default_factory=dict)
    unknown: tuple[str, ...] = ()
    not_carried: tuple[tuple[str, str], ...] = ()
    command: tuple[str, ...] = ()
    # What was read, refused or not: the engine its runtime is here (None: none), the release its container
    # (or the --set pin) says, and the settings as read from the command, env and --set (not validated
    # where refused).
    engine: str | None = None
    engine_version: str | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)


class _Reading:
    """One file's reading: what it names as not carried, as it goes."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.not_carried: list[tuple[str, str]] = []
        self.unknown: list[str] = []
        self.used: set[str] = set()
        self.values: dict[str, str] = {}

    def skip(self, what: str, why: str) -> None:
        self.not_carried.append((what, why))

    def expand(self, text: str, context: Mapping[str, Any]) -> str:
        """`text` with each {placeholder} that the context defines replaced; the others kept as written
        and named unknown."""

        def value(found: re.Match[str]) -> str:
            name = found[1]
            key = name.removeprefix("config.")
            if key in context:
                self.used.add(key)
                self.values[name] = _word(context[key])
                return self.values[name]
            if name not in self.unknown:
                self.unknown.append(name)
            return found[0]

        return PLACEHOLDER.sub(value, text)


def _word(value: Any) -> str:
    """A default as the command reads it (true/false as YAML writes them)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _mapping(data: Any, key: str, source: str) -> dict[str, Any]:
    value = data.get(key) or {}
    if not isinstance(value, dict):
        raise RecipeError(f"'{key}' must be a mapping", file=source)
    return value


def parse(text: str | bytes, source: str) -> dict[str, Any]:
    """A v2 file's mapping, or RecipeError: not YAML, not a mapping, not recipe_version "2"."""
    data = read_yaml(text.encode("utf-8") if isinstance(text, str) else text, source)
    if not isinstance(data, dict):
        raise RecipeError("not a recipe (a YAML mapping)", file=source)
    if str(data.get("recipe_version")) != FORMAT:
        raise RecipeError(f"not a Spark Arena v2 recipe (recipe_version: {clip(repr(data.get('recipe_version')))}; "
                          f"this reader reads \"{FORMAT}\")", file=source)
    for key in ("model", "runtime"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise RecipeError(f"'{key}' must be a non-empty string", file=source)
    return data


def container_version(image: str, engine: str = "vllm") -> str | None:
    """The engine's version an image's name says, by its catalog image_pattern (vllm/vllm-openai:v0.20.0
    -> "0.20.0"; lmsysorg/sglang:v0.5.23 -> "0.5.23" for sglang), or None: a `latest`, a nightly, a site's
    own build or an engine with no release images says nothing of what it holds."""
    pattern = catalog.ENGINES[engine].image_pattern
    found = re.match(pattern, image.strip()) if pattern else None
    return found["version"] if found else None


def pinned(spec: Any, engine: str = "vllm") -> str | None:
    """The version an engine_spec of exactly `PACKAGE==X.Y.Z` pins (the engine's catalog package), else None."""
    package = re.escape(catalog.ENGINES[engine].package)
    found = re.fullmatch(rf"{package}==(\d+\.\d+\.\d+(?:\.post\d+)?)", str(spec or "").strip())
    return found[1] if found else None


def pinned_vllm(spec: Any) -> str | None:
    """The version a engine_spec of exactly `vllm==X.Y.Z` pins, else None."""
    return pinned(spec, "vllm")


def tokens(command: str) -> list[str]:
    """The command's arguments as a POSIX shell splits them (a backslash-newline joins lines)."""
    try:
        return shlex.split(command.replace("\\\n", " "))
    except ValueError as exc:
        raise RecipeError(f"the command cannot be split into arguments: {exc}", file="command") from exc


Value = str | bool | tuple[str, ...]  # a flag's value: one, none (a bare flag) or several (nargs="+")


def _is_value(arg: str) -> bool:
    return not arg.startswith("-") or bool(_NUMBER.match(arg))


def _arguments(argv: list[str], prefix: int = 2, positional_model: bool = True,
               ) -> tuple[str | None, list[tuple[str, Value]]]:
    """The arguments after the command's first `prefix` words (`vllm serve`, `python3 -m
    sglang.launch_server`): `vllm serve MODEL --flag value --bare ...` -> (MODEL, [(--flag, value),
    (--bare, True)]). With positional_model, a first argument that is no flag is the model, and a later
    one is a stray (its flag "", named by the caller); without (a parser with no positional argument),
    every value after a flag is that flag's: several as a tuple (SGLang's --cuda-graph-bs 1 2 4)."""
    rest = argv[prefix:]
    positional = rest.pop(0) if positional_model and rest and not rest[0].startswith("-") else None
    pairs: list[tuple[str, Value]] = []
    index = 0
    while index < len(rest):
        arg = rest[index]
        if not arg.startswith("-") or _NUMBER.match(arg):
            pairs.append(("", arg))  # a stray positional: named below
            index += 1
            continue
        if "=" in arg and arg.startswith("--"):
            flag, value = arg.split("=", 1)
            pairs.append((flag, value))
            index += 1
            continue
        end = index + 1
        while end < len(rest) and _is_value(rest[end]) and (end == index + 1 or not positional_model):
            end += 1
        values = rest[index + 1:end]
        pairs.append((arg, True if not values else values[0] if len(values) == 1 else tuple(values)))
        index = end
    return positional, pairs


def _typed(value: str) -> Any:
    """A flag's value as YAML would hold it: numbers as numbers, the rest as written."""
    if _NUMBER.match(value):
        return float(value) if "." in value else int(value)
    return value


def _is_file_argument(value: str) -> bool:
    return bool(re.fullmatch(r"[^\s{}]+", value)) and ("/" in value or "." in value)


def _read_flags(reading: _Reading, pairs: list[tuple[str, Value]], engine: catalog.EngineEntry,
                command: str, model: str) -> dict[str, Any]:
    """The flags read by the engine's catalog entry: its recipe_flags into settings, its recipe_skips
    named with why, the others kept as server flags (extra_args where server_flags cannot hold them)."""
    settings: dict[str, Any] = {}
    flags: dict[str, Any] = {}
    extra: list[str] = []
    positional = engine.recipe_positional_model
    for given, value in pairs:
        if not given:
            why = (f"a positional argument after the model: {command} takes one" if positional else
                   f"a positional argument: {command} takes none")
            reading.skip(f"argument {value}", why)
            continue
        flag = engine.recipe_aliases.get(given, given)
        words = value if isinstance(value, tuple) else () if value is True else (str(value),)
        shown = " ".join((given, *words))
        placeholders = [name for word in words for name in PLACEHOLDER.findall(word)]
        if placeholders:
            names = ", ".join("{" + name + "}" for name in placeholders)
            reading.skip(shown, f"its value names {names}, which nothing in the recipe defines")
            continue
        setting = engine.recipe_flags.get(flag)
        if setting == catalog.PREFIX_CACHE and isinstance(value, bool):
            # vLLM's --enable-prefix-caching / --no-enable-prefix-caching: bare flags
            settings[setting] = not flag.startswith("--no-")
        elif setting == catalog.LISTEN:
            reading.skip(shown, HOST_NOTE)
        elif setting == catalog.MODEL:
            why = "the model is the recipe's own field" + (" (given once, before the flags)" if positional else "")
            if isinstance(value, str) and value != model:
                why += f": the recipe's model is {model}"
            reading.skip(shown, why)
        elif setting is not None and setting in SETTING_TYPES and isinstance(value, str):
            try:
                settings[setting] = SETTING_TYPES[setting](value)
            except ValueError:
                settings[setting] = value  # the settings check refuses it, naming the setting
        elif flag in engine.recipe_skips:
            reading.skip(shown, engine.recipe_skips[flag])
        elif flag == "--chat-template" and isinstance(value, str) and _is_file_argument(value):
            reading.skip(shown, f"{value} is a file inside the container image: put it on the host and give "
                                "server_flags --chat-template its absolute path")
        elif isinstance(value, tuple):  # several values: server_flags holds one
            extra += [flag, *value]
        elif _FLAG_NAME.match(flag):
            flags[flag] = _typed(value) if isinstance(value, str) else value
        else:  # --attention-config.backend and the like: server_flags names plain flags only
            extra += [flag, value] if isinstance(value, str) else [flag]
    if flags:
        settings["server_flags"] = flags
    if extra:
        settings["extra_args"] = extra
    return settings


def _engine_version(reading: _Reading, image: Any, overrides: Mapping[str, Any], engine: str) -> str | None:
    if not isinstance(image, str) or not image.strip():
        reading.skip("container", "none given: the venv's pin must come from the user (--set engine_spec=...)")
        return None
    version = container_version(image, engine)
    given = [key for key in ("engine_spec", "venv_source", "venv_wheels") if key in overrides]
    if given:
        reading.skip(f"container {image}", f"replaced by the venv given ({', '.join(given)})")
        return pinned(overrides.get("engine_spec"), engine)
    if version is None:
        package = catalog.ENGINES[engine].package
        reading.skip(f"container {image}", "its engine version cannot be known from its name: give the venv's "
                                           f"pin (--set engine_spec={package}==X.Y.Z)")
    return version


def _starts(starts: tuple[tuple[str, ...], ...]) -> str:
    """`vllm serve`; `sglang serve`, `python3 -m ...` or `python -m ...`."""
    shown = [f"`{' '.join(start)}`" for start in starts]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"


def _commands_read() -> str:
    """What this reader reads: each engine's command starts, from the catalog."""
    return "; ".join(f"{_starts(entry.recipe_commands)} commands ({entry.title})"
                     for entry in catalog.ENGINES.values() if entry.recipe_commands)


def _read_command(reading: _Reading, argv: list[str], runtime: str, engine: catalog.EngineEntry,
                  model: str) -> tuple[dict[str, Any], str]:
    """The expanded command's settings by the engine's catalog entry, or why it is not read."""
    if not engine.recipe_commands:
        return {}, (f"runtime '{runtime}' is {engine.title} here, whose recipe commands this reader does not "
                    f"read: it reads {_commands_read()}")
    start = next((start for start in engine.recipe_commands if tuple(argv[:len(start)]) == start), None)
    if start is None:
        longest = max(len(start) for start in engine.recipe_commands)
        words = argv[:longest]  # as many words as the longest start, up to the first long flag
        shown = " ".join(words[:next((at for at, arg in enumerate(words) if arg.startswith("--")), longest)])
        return {}, (f"the command starts `{shown}`: runtime '{runtime}' is {engine.title} "
                    f"here, whose command starts {_starts(engine.recipe_commands)}")
    positional, pairs = _arguments(argv, len(start), engine.recipe_positional_model)
    if positional is not None and positional != model:
        reading.skip(f"model argument {positional}", f"the recipe's model is {model}")
    return _read_flags(reading, pairs, engine, " ".join(start), model), ""


def _gpus(settings: Mapping[str, Any]) -> int:
    """The GPUs tensor x pipeline parallel asks (a value the settings check refuses counts as 1)."""
    gpus = 1
    for key in ("tensor_parallel_size", "pipeline_parallel_size"):
        value = settings.get(key, 1)
        gpus *= value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1
    return gpus


def _what_was_read(settings: Mapping[str, Any]) -> str:
    """The settings read, shortly: scalars with their values, flags and variables by name."""
    parts = []
    for key, value in settings.items():
        if isinstance(value, Mapping):
            parts.append(f"{key} {', '.join(map(str, value))}")
        elif isinstance(value, list | tuple):
            parts.append(f"{key} {' '.join(map(str, value))}")
        else:
            parts.append(f"{key} {_word(value)}")
    return "; ".join(parts) or "no settings"


def read(text: str | bytes, source: str, name: str, overrides: Mapping[str, Any] | None = None) -> Imported:
    """One v2 file as a recipe of ours (see the module's docstring); RecipeError where it is not a v2
    recipe at all; `refused` where it is one that cannot be used here."""
    data = parse(text, source)
    overrides = dict(overrides or {})
    own = [key for key in OWN_FIELDS if key in overrides]
    if own:
        raise RecipeError(f"{', '.join(own)} come from the recipe itself, not --set", file="command line")
    reading = _Reading(source)
    for key in data:
        if key not in READ:
            reading.skip(f"field {key}", "a sparkrun field this reader does not know: no bare-metal meaning here")
    model, runtime = data["model"].strip(), data["runtime"].strip()
    revision = data.get("model_revision")
    defaults = _mapping(data, "defaults", source)
    env = _mapping(data, "env", source)
    metadata = _mapping(data, "metadata", source)
    context: dict[str, Any] = {"model": model, **({"model_revision": revision} if revision else {})}
    context.update({key: reading.expand(value, context) if isinstance(value, str) else value
                    for key, value in defaults.items()})
    reading.used.clear()
    reading.values.clear()
    mods = data.get("mods") or []
    for mod in [mods] if isinstance(mods, str) else mods:
        reading.skip(f"mod {mod}", "a sparkrun mod changes the container before launch: no bare-metal meaning; "
                                   "see what it changes and carry that into the venv or the host by hand")
    build_args = data.get("build_args") or []
    if build_args:
        shown = build_args if isinstance(build_args, str) else " ".join(map(str, build_args))
        reading.skip(f"build_args {shown}",
                     "arguments that build the container image: on bare metal, a venv_source built with the "
                     "same change")
    extra_metadata = sorted(str(key) for key in metadata if key != "description")
    if extra_metadata:
        reading.skip(f"metadata {', '.join(extra_metadata)}", "descriptive fields of the registry, not settings")
    engine = RUNTIMES.get(runtime)
    entry = catalog.ENGINES[engine] if engine is not None else None
    refused = ""
    settings: dict[str, Any] = {}
    argv: list[str] = []
    command = data.get("command")
    if entry is None:
        refused = (f"runtime '{runtime}' has no engine here (engines: {', '.join(catalog.NAMES)}; "
                   f"runtimes read: {', '.join(k for k, v in RUNTIMES.items() if v)})")
    elif not isinstance(command, str) or not command.strip():
        refused = "the recipe has no command to read"
    else:
        argv = tokens(reading.expand(command, context))
        settings, refused = _read_command(reading, argv, runtime, entry, model)
    environment: dict[str, str] = {}
    for variable, value in env.items():
        expanded = reading.expand(str(value), context) if value is not None else ""
        if PLACEHOLDER.search(expanded):
            names = ", ".join("{" + found + "}" for found in PLACEHOLDER.findall(expanded))
            reading.skip(f"env {variable}", f"its value names {names}, which nothing in the recipe defines")
            continue
        environment[str(variable)] = _word(value) if isinstance(value, bool) else expanded
    if environment:
        settings["environment"] = environment
    for key, value in defaults.items():
        if key not in reading.used and engine is not None and not refused:
            reading.skip(f"default {key}: {_word(value)}", "no placeholder of the command or env uses it")
    version = _engine_version(reading, data.get("container"), overrides, engine) if engine else None
    settings.update(overrides)
    nodes, too_many = _nodes(data, settings, source)
    refused = refused or too_many
    if not refused and entry is not None and nodes > 1 and entry.multi_node is None:
        # An engine the tool serves on one node only (the catalog's multi_node: SGLang here).
        asked = f"min_nodes {data['min_nodes']}, " if data.get("min_nodes") else ""
        refused = (f"the tool serves {entry.title} on one node, and this recipe asks {nodes} DGX Spark hosts "
                   f"({asked}tensor x pipeline parallel {_gpus(settings)} GPUs, one a DGX Spark); read: "
                   f"{_what_was_read(settings)}")
    recipe = None
    if not refused and entry is not None:
        carried_not = "; ".join(what for what, _ in reading.not_carried) or "nothing"
        notes = [f"imported from Spark Arena's v2 recipe {source}; not carried: {carried_not}"]
        if nodes > 1:
            launch = entry.multi_node
            notes.append(f"runs on {nodes} DGX Spark hosts: an inventory cluster of {nodes} hosts ({launch}, "
                         "which the tool sets up)")
        if version is None and not any(key in overrides for key in ("engine_spec", "venv_source", "venv_wheels")):
            notes.append("engine version unknown: give the venv's pin (engine_spec) before serving it")
        recipe = Recipe(
            name=name, description=str(metadata.get("description") or "").strip(), model=model,
            revision=str(revision or "main"), engine=str(engine), engine_version=version, settings=settings,
            hardware=Hardware(profile=PROFILE, gpus=1, gpu_memory_gib=None, nodes=nodes),
            figures=(), source=f"Spark Arena v2 recipe: {source}", notes=tuple(notes), file=source)
        try:
            values = recipe.inventory_vars()
        except RecipeError as exc:
            refused, recipe = f"its settings do not validate: {exc.message} (key '{exc.key}')", None
        else:
            found = contract_notes(recipe.engine, values)
            if found:
                recipe = dataclasses.replace(recipe, notes=(*recipe.notes, *found))
    return Imported(source=source, recipe=recipe, refused=refused, placeholders=dict(reading.values),
                    unknown=tuple(reading.unknown), not_carried=tuple(reading.not_carried), command=tuple(argv),
                    engine=engine, engine_version=version, settings=settings)


def _nodes(data: Mapping[str, Any], settings: Mapping[str, Any], source: str) -> tuple[int, str]:
    """The Sparks the recipe needs, one GPU each: its tensor x pipeline parallel GPUs, at least min_nodes;
    and why not, where max_nodes is fewer."""
    counts = {}
    for key in ("min_nodes", "max_nodes"):
        value = data.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise RecipeError(f"'{key}' must be a positive integer, got {clip(repr(value))}", file=source)
        counts[key] = value
    low, high = counts["min_nodes"], counts["max_nodes"]
    if low is not None and high is not None and low > high:
        raise RecipeError(f"min_nodes {low} is above max_nodes {high}", file=source)
    gpus = _gpus(settings)
    nodes = max(int(low or 1), gpus)
    if high is not None and nodes > high:
        return nodes, (f"tensor x pipeline parallel asks {gpus} GPUs, one a DGX Spark, and max_nodes is {high}")
    return nodes, ""


# Writing: the settings a v2 file has a place for; any other a recipe gives is refused by name.
WRITTEN = {"tensor_parallel_size", "pipeline_parallel_size", "gpu_memory_utilization", "max_model_len",
           "enable_prefix_caching", "served_model_name", "port", "bind_host", "server_flags", "extra_args",
           "environment", "engine_spec"}
_PLACEHELD = (("bind_host", "host", "--host"), ("port", "port", "--port"),
              ("tensor_parallel_size", "tensor_parallel", "-tp"),
              ("pipeline_parallel_size", "pipeline_parallel", "-pp"),
              ("gpu_memory_utilization", "gpu_memory_utilization", "--gpu-memory-utilization"),
              ("max_model_len", "max_model_len", "--max-model-len"),
              ("served_model_name", "served_model_name", "--served-model-name"))


def write(recipe: Recipe, container: str | None = None) -> str:
    """The recipe as a Spark Arena v2 file, where its engine and settings fit the format: vLLM, and a
    container (the image named by its vLLM version, or the one given). RecipeError says what does not fit."""
    if recipe.engine != "vllm":
        title = catalog.ENGINES[recipe.engine].title if recipe.engine in catalog.ENGINES else recipe.engine
        raise RecipeError(f"engine {recipe.engine} ({title}): Spark Arena's v2 export writes vLLM recipes only "
                          "(a `vllm serve` command in a vllm/vllm-openai container)", file=recipe.file or recipe.name)
    values = recipe.inventory_vars()
    extra = sorted(key for key in recipe.settings if key not in WRITTEN)
    if extra:
        raise RecipeError(f"{', '.join(extra)} have no place in a Spark Arena recipe (a container replaces "
                          "the venv and the host's layout)", file=recipe.file or recipe.name)
    pinned = pinned_vllm(values.get("engine_spec"))
    image = container or (f"vllm/vllm-openai:v{pinned}" if pinned else None)
    if image is None:
        raise RecipeError("its engine version is not a vllm==X.Y.Z pin, so no container is known: give one "
                          "(--container IMAGE)", file=recipe.file or recipe.name)
    from provision.inventory import VAR_SPECS

    defaults: dict[str, Any] = {}
    lines = ["vllm serve {model}"]
    for setting, placeholder, flag in _PLACEHELD:
        # The listen address and port always (a container's server listens where its command says);
        # the others where the recipe gives them, else the engine's own default stands.
        value = values.get(setting, VAR_SPECS[setting].default if setting in ("bind_host", "port") else None)
        if value is None:
            continue
        defaults[placeholder] = value
        lines.append(f"{flag} {{{placeholder}}}")
    if "enable_prefix_caching" in values:
        lines.append("--enable-prefix-caching" if values["enable_prefix_caching"] else "--no-enable-prefix-caching")
    from provision.engines.base import own_args

    own = own_args(values.get("extra_args", ()), values.get("server_flags", {}))
    index = 0
    while index < len(own):  # a flag and its value on one line
        if index + 1 < len(own) and not own[index + 1].startswith("-"):
            lines.append(f"{own[index]} {shlex.quote(own[index + 1])}")
            index += 2
        else:
            lines.append(own[index])
            index += 1
    data: dict[str, Any] = {"recipe_version": FORMAT, "model": recipe.model}
    if recipe.revision != "main":
        data["model_revision"] = recipe.revision
    data.update({"runtime": "vllm", "container": image})
    if recipe.hardware.nodes > 1:
        data["min_nodes"] = recipe.hardware.nodes
    data["max_nodes"] = recipe.hardware.nodes
    data["metadata"] = {"description": recipe.description or recipe.name}
    data["defaults"] = defaults
    if values.get("environment"):
        data["env"] = dict(values["environment"])
    data["command"] = " \\\n  ".join(lines) + "\n"
    hardware = recipe.hardware
    head = (f"# {recipe.name}, exported from a provision recipe ({recipe.source}); measured on profile "
            f"{hardware.profile}, {hardware.gpus} GPU(s) x {hardware.nodes} node(s); figures: ")
    head += "; ".join(f"{f.metric} {f.value:g} {f.unit} ({f.kind})" for f in recipe.figures) or NOT_MEASURED
    if container and values.get("engine_spec"):
        head += f"; its venv pin {values['engine_spec']} is replaced by the container"
    return f"{clip(head, 400)}\n" + str(yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True,
                                                   width=100))


class _Dumper(yaml.SafeDumper):
    """The safe dumper, a text of several lines written as a block (`command: |`), as the registry does."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _text)
