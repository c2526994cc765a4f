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
{config.NAME}), reads the expanded `vllm serve` command into inventory settings and server flags, and
names every part that has no bare-metal meaning (mods, build arguments, files inside the image, a
placeholder nothing defines, a default no placeholder uses): nothing is dropped unsaid. The settings
are held to the settings table (validate_vars); a recipe that cannot be used says why. `write` is the
way back, for a vLLM recipe whose settings fit the format. Pure: text in, values out.
"""
from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from provision.errors import RecipeError, clip
from provision.recipes import NOT_MEASURED, OWN_FIELDS, Hardware, Recipe, contract_notes, read_yaml

FORMAT = "2"
# The fields of a v2 file this reader knows, and what it does with each.
READ = ("recipe_version", "model", "model_revision", "runtime", "min_nodes", "max_nodes", "container",
        "metadata", "mods", "defaults", "env", "command", "build_args")
# sparkrun's runtimes and the engine each is here (None: no engine of this tool serves it).
RUNTIMES: Mapping[str, str | None] = {"vllm": "vllm", "llama-cpp": "llamacpp", "llamacpp": "llamacpp",
                                      "trtllm": "trtllm", "tensorrt-llm": "trtllm", "sglang": None,
                                      "atlas": None}
# Spark Arena's recipes are for DGX Spark ("launching LLM inference on DGX Spark", the registry's
# official-recipes/README.md): one GB10 a node, its memory unified.
PROFILE = "dgx-spark"
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_.]*)\}")
# vLLM's release images carry its version in their tag (vllm/vllm-openai:v0.20.0, ...-aarch64-cu130-...).
VLLM_IMAGE = re.compile(r"^(?:docker\.io/)?vllm/vllm-openai:v(?P<version>\d+\.\d+\.\d+(?:\.post\d+)?)"
                        r"(?:[-@].*)?$")
# vLLM's short aliases, read as the long flags they stand for (vllm/engine/arg_utils.py).
ALIASES = {"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size", "-dp": "--data-parallel-size"}
# The flags the tool renders from a setting: read into that setting, never kept as a flag.
SETTING_FLAGS: Mapping[str, tuple[str, type]] = {
    "--tensor-parallel-size": ("tensor_parallel_size", int),
    "--pipeline-parallel-size": ("pipeline_parallel_size", int),
    "--gpu-memory-utilization": ("gpu_memory_utilization", float),
    "--max-model-len": ("max_model_len", int),
    "--port": ("port", int),
    "--served-model-name": ("served_model_name", str),
}
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


def container_version(image: str) -> str | None:
    """The vLLM version an image's name says (vllm/vllm-openai:v0.20.0 -> "0.20.0"), or None: a
    `latest`, a nightly or a site's own build says nothing of what it holds."""
    found = VLLM_IMAGE.match(image.strip())
    return found["version"] if found else None


def pinned_vllm(spec: Any) -> str | None:
    """The version a engine_spec of exactly `vllm==X.Y.Z` pins, else None."""
    found = re.fullmatch(r"vllm==(\d+\.\d+\.\d+(?:\.post\d+)?)", str(spec or "").strip())
    return found[1] if found else None


def tokens(command: str) -> list[str]:
    """The command's arguments as a POSIX shell splits them (a backslash-newline joins lines)."""
    try:
        return shlex.split(command.replace("\\\n", " "))
    except ValueError as exc:
        raise RecipeError(f"the command cannot be split into arguments: {exc}", file="command") from exc


def _arguments(argv: list[str]) -> tuple[str | None, list[tuple[str, str | bool]]]:
    """`vllm serve MODEL --flag value --bare ...` -> (MODEL, [(--flag, value), (--bare, True)])."""
    rest = argv[2:]
    positional = rest.pop(0) if rest and not rest[0].startswith("-") else None
    pairs: list[tuple[str, str | bool]] = []
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
        following = rest[index + 1] if index + 1 < len(rest) else None
        if following is not None and (not following.startswith("-") or _NUMBER.match(following)):
            pairs.append((arg, following))
            index += 2
        else:
            pairs.append((arg, True))
            index += 1
    return positional, pairs


def _typed(value: str) -> Any:
    """A flag's value as YAML would hold it: numbers as numbers, the rest as written."""
    if _NUMBER.match(value):
        return float(value) if "." in value else int(value)
    return value


def _is_file_argument(value: str) -> bool:
    return bool(re.fullmatch(r"[^\s{}]+", value)) and ("/" in value or "." in value)


def _read_flags(reading: _Reading, pairs: list[tuple[str, str | bool]]) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    flags: dict[str, Any] = {}
    extra: list[str] = []
    for given, value in pairs:
        if not given:
            reading.skip(f"argument {value}", "a positional argument after the model: vllm serve takes one")
            continue
        flag = ALIASES.get(given, given)
        shown = given if value is True else f"{given} {value}"
        if isinstance(value, str) and PLACEHOLDER.search(value):
            names = ", ".join("{" + name + "}" for name in PLACEHOLDER.findall(value))
            reading.skip(shown, f"its value names {names}, which nothing in the recipe defines")
            continue
        if flag in SETTING_FLAGS and isinstance(value, str):
            setting, kind = SETTING_FLAGS[flag]
            try:
                settings[setting] = kind(value)
            except ValueError:
                settings[setting] = value  # the settings check refuses it, naming the setting
        elif flag == "--enable-prefix-caching":
            settings["enable_prefix_caching"] = True
        elif flag == "--no-enable-prefix-caching":
            settings["enable_prefix_caching"] = False
        elif flag == "--host":
            reading.skip(shown, HOST_NOTE)
        elif flag == "--model":
            reading.skip(shown, "the model is the recipe's own field (given once, before the flags)")
        elif flag == "--distributed-executor-backend":
            reading.skip(shown, "the tool sets it on a multi-node cluster (mp for vLLM's own launch, ray below 0.11.1)")
        elif flag == "--chat-template" and isinstance(value, str) and _is_file_argument(value):
            reading.skip(shown, f"{value} is a file inside the container image: put it on the host and give "
                                "server_flags --chat-template its absolute path")
        elif _FLAG_NAME.match(flag):
            flags[flag] = _typed(value) if isinstance(value, str) else value
        else:  # --attention-config.backend and the like: server_flags names plain flags only
            extra += [flag, value] if isinstance(value, str) else [flag]
    if flags:
        settings["server_flags"] = flags
    if extra:
        settings["extra_args"] = extra
    return settings


def _engine_version(reading: _Reading, image: Any, overrides: Mapping[str, Any]) -> str | None:
    if not isinstance(image, str) or not image.strip():
        reading.skip("container", "none given: the venv's pin must come from the user (--set engine_spec=...)")
        return None
    version = container_version(image)
    given = [key for key in ("engine_spec", "venv_source", "venv_wheels") if key in overrides]
    if given:
        reading.skip(f"container {image}", f"replaced by the venv given ({', '.join(given)})")
        return pinned_vllm(overrides.get("engine_spec"))
    if version is None:
        reading.skip(f"container {image}", "its engine version cannot be known from its name: give the venv's "
                                           "pin (--set engine_spec=vllm==X.Y.Z)")
    return version


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
    refused = ""
    settings: dict[str, Any] = {}
    argv: list[str] = []
    command = data.get("command")
    if engine is None:
        refused = (f"runtime '{runtime}' has no engine here (engines: vllm, trtllm, llamacpp; "
                   f"runtimes read: {', '.join(k for k, v in RUNTIMES.items() if v)})")
    elif not isinstance(command, str) or not command.strip():
        refused = "the recipe has no command to read"
    else:
        argv = tokens(reading.expand(command, context))
        if engine != "vllm" or argv[:2] != ["vllm", "serve"]:
            refused = (f"the command starts `{' '.join(argv[:2])}`: this reader reads `vllm serve` commands "
                       "(the vllm runtime)")
        else:
            positional, pairs = _arguments(argv)
            if positional is not None and positional != model:
                reading.skip(f"model argument {positional}", f"the recipe's model is {model}")
            settings = _read_flags(reading, pairs)
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
    version = _engine_version(reading, data.get("container"), overrides) if engine else None
    settings.update(overrides)
    nodes, too_many = _nodes(data, settings, source)
    refused = refused or too_many
    recipe = None
    if not refused:
        carried_not = "; ".join(what for what, _ in reading.not_carried) or "nothing"
        notes = [f"imported from Spark Arena's v2 recipe {source}; not carried: {carried_not}"]
        if nodes > 1:
            notes.append(f"runs on {nodes} DGX Spark hosts: an inventory cluster of {nodes} hosts (vLLM's own "
                         "multi-node launch, or Ray below 0.11.1, which the tool sets up)")
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
                    unknown=tuple(reading.unknown), not_carried=tuple(reading.not_carried), command=tuple(argv))


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
    gpus = 1
    for key in ("tensor_parallel_size", "pipeline_parallel_size"):
        value = settings.get(key, 1)
        gpus *= value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1
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
        raise RecipeError(f"engine {recipe.engine}: Spark Arena's v2 export writes vLLM recipes only",
                          file=recipe.file or recipe.name)
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
