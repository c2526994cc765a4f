"""Spark Arena's recipe registry (github.com/spark-arena/recipe-registry), read as it is and written back.

Its files are `recipe_version: "2"` YAML for sparkrun, which launches a container on DGX Sparks (sparkrun's
default registry, spark-arena/eugr-recipes, writes "1", which sparkrun reads the same way: FORMATS):

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
where a container's name says its release: vLLM, SGLang, llama.cpp (`llama-server`; a GGUF `REPO:QUANT`
model is the repository and its *QUANT* files, its --ctx-size read per slot) and TensorRT-LLM
(`trtllm-serve`). A file that lacks recipe_version, runtime or command is read as sparkrun fills them in
(RUNTIME_HINTS, GENERATED: its source cited line by line), each assumption said in `assumed` and in the
recipe's notes. The settings are held to the settings table (validate_vars);
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

from provision import catalog, serverfiles
from provision.errors import RecipeError, clip
from provision.recipes import (
    NOT_MEASURED,
    OWN_FIELDS,
    UPSTREAM_FIELDS,
    Hardware,
    Recipe,
    check_upstream,
    contract_notes,
    read_yaml,
)

FORMAT = "2"
# The versions sparkrun reads: "1" (eugr/spark-vllm-docker's recipes, sparkrun's default `eugr` registry)
# is read as "2" is; the version only picks sparkrun's container builder (eugr), V1_SOURCE. A v1 file's
# own fields: a top-level description, cluster_only (at least 2 nodes) and solo_only (exactly 1).
FORMATS = ("1", "2")
V1_SOURCE = "src/sparkrun/core/recipe.py:323-330 (_resolve_v1_migration), 577-578, 600-605, 622-625"
UPSTREAM_FORMAT = "spark-arena-v2"  # a recipe's `upstream` from this format (recipes.UPSTREAM_FIELDS)
# The fields of a v2 file this reader knows, and what it does with each.
READ = ("recipe_version", "model", "model_revision", "runtime", "min_nodes", "max_nodes", "container",
        "metadata", "mods", "defaults", "env", "command", "build_args", "description", "cluster_only", "solo_only")
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
    catalog.PORT: int, catalog.NAME: str, catalog.SLOTS: int}

# What sparkrun fills in where a file lacks a field, as its source says (github.com/spark-arena/sparkrun
# at SPARKRUN; file:line there): the reader assumes the same, and says so.
SPARKRUN = "spark-arena/sparkrun@0041b8f8fc1320ffa2e85d2d0ac760ee6be19de7"
VERSION_DEFAULT = "src/sparkrun/core/recipe.py:578"  # recipe_version: "2"
# No runtime: the command's first words name it (_resolve_runtime_from_command_hint, recipe.py:297-320, its
# patterns at recipe.py:32-35); no command, or one none of them matches, is vLLM (recipe.py:342-353:
# vllm-distributed or vllm-ray, both `vllm serve`).
RUNTIME_HINTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^vllm\s+serve\b"), "vllm"),
    (re.compile(r"^(?:sglang\s+serve|python3?\s+-m\s+sglang\.launch_server)\b"), "sglang"),
    (re.compile(r"^llama-server\b"), "llama-cpp"),
    (re.compile(r"^(?:trtllm-serve|mpirun\b.*trtllm)"), "trtllm"))
RUNTIME_HINT_SOURCE, RUNTIME_DEFAULT_SOURCE = "src/sparkrun/core/recipe.py:297-320", "src/sparkrun/core/recipe.py:342-353"


@dataclass(frozen=True)
class Generated:
    """How a sparkrun runtime writes its command where a recipe has none (its _build_command): the start,
    the model's flag (none: positional), each default's flag in the runtime's order (a flag of `bools`
    given only where the default is true), the runtime's own defaults, and where that is written."""

    start: str
    model_flag: str
    flags: tuple[tuple[str, str], ...]
    bools: frozenset[str] = frozenset()
    defaults: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""


_VLLM_FLAGS = (("tensor_parallel", "-tp"), ("port", "--port"), ("host", "--host"),
               ("gpu_memory_utilization", "--gpu-memory-utilization"), ("max_model_len", "--max-model-len"),
               ("max_num_batched_tokens", "--max-num-batched-tokens"), ("max_num_seqs", "--max-num-seqs"),
               ("served_model_name", "--served-model-name"), ("dtype", "--dtype"),
               ("quantization", "--quantization"), ("enforce_eager", "--enforce-eager"),
               ("enable_prefix_caching", "--enable-prefix-caching"), ("trust_remote_code", "--trust-remote-code"),
               ("pipeline_parallel", "-pp"), ("data_parallel", "--data-parallel-size"),
               ("kv_cache_dtype", "--kv-cache-dtype"), ("otlp_traces_endpoint", "--otlp-traces-endpoint"),
               ("api_key", "--api-key"))
_SGLANG_FLAGS = (("tensor_parallel", "--tp-size"), ("port", "--port"), ("host", "--host"),
                 ("pipeline_parallel", "--pp-size"), ("gpu_memory_utilization", "--mem-fraction-static"),
                 ("max_model_len", "--context-length"), ("max_num_seqs", "--max-running-requests"),
                 ("served_model_name", "--served-model-name"), ("dtype", "--dtype"), ("quantization", "--quantization"),
                 ("trust_remote_code", "--trust-remote-code"), ("chunked_prefill", "--chunked-prefill-size"),
                 ("kv_cache_dtype", "--kv-cache-dtype"), ("tokenizer_path", "--tokenizer-path"),
                 ("speculative_draft_model_path", "--speculative-draft-model-path"), ("api_key", "--api-key"))
_LLAMA_CPP_FLAGS = (("port", "--port"), ("host", "--host"), ("ctx_size", "--ctx-size"),
                    ("n_gpu_layers", "--n-gpu-layers"), ("parallel", "--parallel"), ("threads", "--threads"),
                    ("chat_template", "--chat-template"), ("reasoning_format", "--reasoning-format"),
                    ("split_mode", "--split-mode"), ("served_model_name", "--alias"), ("api_key", "--api-key"),
                    ("flash_attn", "--flash-attn"), ("cont_batching", "--cont-batching"), ("no_webui", "--no-webui"),
                    ("jinja", "--jinja"))
_TRTLLM_FLAGS = (("port", "--port"), ("host", "--host"), ("tensor_parallel", "--tp_size"),
                 ("pipeline_parallel", "--pp_size"), ("expert_parallel", "--ep_size"),
                 ("max_num_tokens", "--max_num_tokens"), ("max_batch_size", "--max_batch_size"),
                 ("max_model_len", "--max_seq_len"), ("backend", "--backend"), ("tokenizer", "--tokenizer"),
                 ("kv_cache_free_gpu_memory_fraction", "--kv_cache_free_gpu_memory_fraction"),
                 ("trust_remote_code", "--trust_remote_code"))
# By sparkrun's runtime name. vLLM and SGLang give -tp / --tp-size first, and only where it is set
# (vllm_distributed.py:192-212, sglang.py:231-251); llama.cpp's model is -hf for a hub repository and -m
# for a file (llama_cpp.py:297-340, its max_model_len read as ctx_size, :248-260); TensorRT-LLM's backend
# is pytorch unless one is given (trtllm.py:130-148).
GENERATED: Mapping[str, Generated] = {
    **dict.fromkeys(("vllm", "vllm-distributed", "vllm-ray"), Generated(
        "vllm serve", "", _VLLM_FLAGS, frozenset({"enforce_eager", "enable_prefix_caching", "trust_remote_code"}),
        source="src/sparkrun/runtimes/vllm_distributed.py:192-212, _vllm_common.py:83-111")),
    "sglang": Generated("python3 -m sglang.launch_server", "--model-path", _SGLANG_FLAGS,
                        frozenset({"trust_remote_code"}), source="src/sparkrun/runtimes/sglang.py:19-42, 231-251"),
    "llama-cpp": Generated("llama-server", "-hf", _LLAMA_CPP_FLAGS,
                           frozenset({"flash_attn", "cont_batching", "no_webui", "jinja"}), {"split_mode": "layer"},
                           source="src/sparkrun/runtimes/llama_cpp.py:19-45, 297-340"),
    "trtllm": Generated("trtllm-serve", "", _TRTLLM_FLAGS, frozenset({"trust_remote_code"}),
                        {"backend": "pytorch"}, source="src/sparkrun/runtimes/trtllm.py:29-44, 130-148"),
}
# sparkrun reads a GGUF model `REPO:QUANT` as the repository and the files matching *QUANT* in it
# (src/sparkrun/models/download.py:57-75, 441): the same files are model_files here.
GGUF_SOURCE = "src/sparkrun/models/download.py:57-75, 441"
HOST_NOTE = ("the listen address stays the inventory's bind_host (default 127.0.0.1): a recipe does not open "
             "a host to the network")
_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")
HF_FILE_FLAGS = ("-hff", "--hf-file")  # llama-server: the file of the -hf repository to load
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
    # What the file lacked and sparkrun fills in, as assumed here: (field, what and why), e.g.
    # ("runtime", "vllm: no runtime, and ... (sparkrun's default: src/sparkrun/core/recipe.py:342-353)").
    assumed: tuple[tuple[str, str], ...] = ()


class _Reading:
    """One file's reading: what it names as not carried, as it goes."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.not_carried: list[tuple[str, str]] = []
        self.unknown: list[str] = []
        self.used: set[str] = set()
        self.values: dict[str, str] = {}
        self.notes: list[str] = []  # how a value was read where it is not the flag's as written

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


@dataclass(frozen=True)
class _Parsed:
    """A file's mapping with what sparkrun fills in filled in, what was assumed, and the defaults a
    generated command gave as bare flags (read, though no placeholder names them)."""

    data: dict[str, Any]
    assumed: tuple[tuple[str, str], ...] = ()
    consumed: frozenset[str] = frozenset()


def parse(text: str | bytes, source: str) -> dict[str, Any]:
    """A v2 file's mapping, recipe_version, runtime and command filled in where it lacks them as sparkrun
    fills them in (_fill); RecipeError: not YAML, not a mapping, a recipe_version other than "2", no model."""
    return _parse(text, source).data


def _parse(text: str | bytes, source: str) -> _Parsed:
    data = read_yaml(text.encode("utf-8") if isinstance(text, str) else text, source)
    if not isinstance(data, dict):
        raise RecipeError("not a recipe (a YAML mapping)", file=source)
    if "recipe_version" in data and str(data["recipe_version"]) not in FORMATS:
        raise RecipeError(f"not a sparkrun recipe (recipe_version: {clip(repr(data.get('recipe_version')))}; "
                          f"this reader reads {' and '.join(FORMATS)}, as sparkrun does)", file=source)
    for key in ("cluster_only", "solo_only"):
        if data.get(key) is not None and not isinstance(data[key], bool):
            raise RecipeError(f"'{key}' must be true or false, got {clip(repr(data[key]))}", file=source)
    if data.get("cluster_only") and data.get("solo_only"):
        raise RecipeError("cluster_only and solo_only are both true: the recipe runs nowhere", file=source)
    if not isinstance(data.get("model"), str) or not data["model"].strip():
        raise RecipeError("'model' must be a non-empty string", file=source)
    for key in ("runtime", "command"):
        if data.get(key) not in (None, "") and not isinstance(data[key], str):
            raise RecipeError(f"'{key}' must be a string, got {clip(repr(data[key]))}", file=source)
    return _fill(dict(data), source)


def _fill(data: dict[str, Any], source: str) -> _Parsed:
    """`data` with recipe_version, runtime and command where it lacks them, as sparkrun (SPARKRUN) fills
    them in: recipe_version "2"; the runtime the command's first words name, else vllm; the command the
    runtime writes from the defaults (GENERATED)."""
    assumed: list[tuple[str, str]] = []
    if "recipe_version" not in data:
        data["recipe_version"] = FORMAT
        assumed.append(("recipe_version", f'"{FORMAT}": the file gives none (sparkrun\'s default: {VERSION_DEFAULT})'))
    command = str(data.get("command") or "").strip()
    if not str(data.get("runtime") or "").strip():
        hinted = next((runtime for pattern, runtime in RUNTIME_HINTS if pattern.match(command)), None)
        if hinted is not None:
            data["runtime"] = hinted
            why = (f"{hinted}: the file gives none, and its command starts as sparkrun's {hinted} commands do "
                   f"(sparkrun: {RUNTIME_HINT_SOURCE})")
            assumed.append(("runtime", why))
        else:
            data["runtime"] = "vllm"
            given = "nor a command" if not command else "and its command starts as no runtime's does"
            assumed.append(("runtime", f"vllm: the file gives none, {given} (sparkrun's default: {RUNTIME_DEFAULT_SOURCE})"))
    consumed: frozenset[str] = frozenset()
    spec = GENERATED.get(str(data["runtime"]).strip())
    if not command and spec is not None:
        defaults = _mapping(data, "defaults", source)
        data["command"], consumed = _generate(spec, data["model"].strip(), defaults)
        why = (f"`{data['command']}`: the file gives none; sparkrun's {data['runtime']} runtime writes it from "
               f"the defaults so ({spec.source})")
        assumed.append(("command", why))
    return _Parsed(data, tuple(assumed), consumed)


def _true(value: Any) -> bool:
    return value is True or str(value).strip().lower() in ("true", "1", "yes", "on")


def _generate(spec: Generated, model: str, defaults: Mapping[str, Any]) -> tuple[str, frozenset[str]]:
    """The command sparkrun's runtime writes from the defaults (with their {placeholders}, expanded as a
    written command's are), and the defaults it gave as bare flags."""
    words = [spec.start]
    if spec.model_flag == "-hf" and ("/" not in model or model.lower().endswith(".gguf")):
        words.append("-m {model}")  # a file, not a hub repository
    else:
        words.append(f"{spec.model_flag} {{model}}".strip())
    consumed = set()
    for key, flag in spec.flags:
        given = key if key in defaults else "max_model_len" if key == "ctx_size" and "max_model_len" in defaults \
            else None
        value = defaults[given] if given is not None else spec.defaults.get(key)
        if value is None:
            continue
        if key in spec.bools:
            consumed.add(key)
            if _true(value):
                words.append(flag)
        elif given is not None:
            words.append(f"{flag} {{{given}}}")
        else:  # the runtime's own default
            words.append(f"{flag} {shlex.quote(_word(value))}")
    return " ".join(words), frozenset(consumed)


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
               arity: Mapping[str, str] | None = None, engine: str = "",
               ) -> tuple[str | None, list[tuple[str, Value]]]:
    """The arguments after the command's first `prefix` words (`vllm serve`, `python3 -m
    sglang.launch_server`): `vllm serve MODEL --flag value --bare ...` -> (MODEL, [(--flag, value),
    (--bare, True)]). With positional_model, a first argument that is no flag is the model, and a later
    one is a stray (its flag "", named by the caller); a flag takes as many values as its `arity` (the
    engine's parser's nargs, from the contract table: "+" and "*" every value up to the next flag, a count
    that many, else one), several kept as a tuple (vLLM's --cudagraph-capture-sizes 1 2 4). Without
    positional_model (a parser with no positional argument), every value after a flag is that flag's
    (SGLang's --cuda-graph-bs 1 2 4)."""
    from provision.recipes import spelt

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
        most = _most_values(spelt(engine, arg), arity or {}, positional_model)
        end = index + 1
        while end < len(rest) and _is_value(rest[end]) and (most is None or end - index <= most):
            end += 1
        values = rest[index + 1:end]
        pairs.append((arg, True if not values else values[0] if len(values) == 1 else tuple(values)))
        index = end
    return positional, pairs


def _most_values(flag: str, arity: Mapping[str, str], positional_model: bool) -> int | None:
    """How many values may follow the flag (None: every one up to the next flag): its nargs ("+" and
    "*" every one, a count that many, "?" one); one where the parser takes a positional argument and the
    flag's nargs is not known, else every one."""
    nargs = arity.get(flag)
    if nargs in ("+", "*") or (nargs is None and not positional_model):
        return None
    return int(nargs) if nargs is not None and nargs.isdigit() else 1


def _typed(value: str) -> Any:
    """A flag's value as YAML would hold it: numbers as numbers, the rest as written."""
    if _NUMBER.match(value):
        return float(value) if "." in value else int(value)
    return value


def _is_file_argument(value: str) -> bool:
    return bool(re.fullmatch(r"[^\s{}]+", value)) and ("/" in value or "." in value)


# Where a container image keeps its own files (sparkrun's mods copy theirs to /workspace/mods/NAME and
# write into the working directory, eugr/spark-vllm-docker's launch-cluster.sh and mods/*/run.sh); not
# the model cache a container mounts (/root/.cache/huggingface), which the tool's model_dir replaces.
IMAGE_DIRS = ("/workspace", "/app", "/opt", "/usr", "/root")
_NOT_IMAGE = ("/root/.cache",)


def _under(path: str, folders: tuple[str, ...]) -> bool:
    return any(path == folder or path.startswith(folder + "/") for folder in folders)


def _image_file(flag: str, value: str) -> bool:
    """A flag's value is a file inside the container image, which no host has: a file-taking flag's
    (serverfiles.FILE_FLAGS) file argument, relative (to the container's working directory, where a mod
    puts it: `--reasoning-parser-plugin nano_v3_reasoning_parser.py`) or absolute; or any flag's absolute
    path to a file (its name has a suffix) under the image's folders (IMAGE_DIRS)."""
    if flag in serverfiles.FILE_FLAGS and _is_file_argument(value):
        return True
    name = value.rsplit("/", 1)[-1]
    return (value.startswith("/") and _under(value, IMAGE_DIRS) and not _under(value, _NOT_IMAGE)
            and "." in name.strip("."))


def _image_file_note(flag: str, value: str) -> str:
    """What the import says of a file inside the image: the flag is carried as a reference that must be
    given a local file, and how."""
    where = "a path of the image" if value.startswith("/") else \
        "relative: the container's working directory, where a mod puts it"
    return (f"{value} is a file inside the container image ({where}), which no host has: carried as "
            f"server_files {flag}: {serverfiles.IMAGE}{value}, which recipe.apply refuses until it is given "
            f"a local file ({serverfiles.set_hint([flag])})")


def _read_flags(reading: _Reading, pairs: list[tuple[str, Value]], engine: catalog.EngineEntry,
                command: str, model: str) -> dict[str, Any]:
    """The flags read by the engine's catalog entry: its recipe_flags into settings, its recipe_skips
    named with why, the others kept as server flags (extra_args where server_flags cannot hold them)."""
    settings: dict[str, Any] = {}
    flags: dict[str, Any] = {}
    files: dict[str, str] = {}  # flag -> image:PATH, a file inside the image the host needs
    extra: list[str] = []
    first: dict[str, tuple[str, ...]] = {}  # a server flag's words as the command gave them
    repeated: set[str] = set()  # flags given more than once: in extra_args, every time
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
        elif setting == catalog.CONTEXT and isinstance(value, str) and value.strip().lower() == "auto":
            # sparkrun reads max_model_len `auto` as none given (recipe.py:997-1003): the model's own
            # context, which the engine reads from the model's config.json when no length is given.
            reading.notes.append(f"{shown}: the model's own context (its config.json), as sparkrun reads `auto` "
                                 "(src/sparkrun/core/recipe.py:997-1003): max_model_len left unset, so the server "
                                 "takes the model's own")
        elif setting is not None and setting in SETTING_TYPES and isinstance(value, str):
            try:
                settings[setting] = SETTING_TYPES[setting](value)
            except ValueError:
                settings[setting] = value  # the settings check refuses it, naming the setting
        elif flag in engine.recipe_skips:
            reading.skip(shown, engine.recipe_skips[flag])
        elif isinstance(value, str) and _image_file(flag, value) and flag in serverfiles.FILE_FLAGS:
            files[flag] = serverfiles.IMAGE + value
            reading.skip(shown, _image_file_note(flag, value))
        elif isinstance(value, str) and _image_file(flag, value):
            # A key, a certificate, a config inside the image: no file the tool places (server_files takes
            # templates and plugins, readable by all), so the flag is not carried, and says why.
            reading.skip(shown, f"{value} is a file inside the container image, which no host has, and not a "
                                "template or plugin the tool places: put it on the host yourself and give the "
                                f"flag with its path there (server_flags {flag})")
        elif isinstance(value, tuple) or flag in flags or flag in repeated:
            # Several values, or a flag given again (vLLM's --middleware appends each one): server_flags
            # holds one value a flag, so each time it is given goes to extra_args, in the command's order.
            if flag in flags:
                del flags[flag]
                extra += [flag, *first[flag]]
            repeated.add(flag)
            extra += [flag, *words]
        elif _FLAG_NAME.match(flag):
            flags[flag] = _typed(value) if isinstance(value, str) else value
            first[flag] = words
        else:  # --attention-config.backend and the like: server_flags names plain flags only
            extra += [flag, *words]
    if flags:
        settings["server_flags"] = flags
    if files:
        settings["server_files"] = files
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
    from provision import contracts

    positional, pairs = _arguments(argv, len(start), engine.recipe_positional_model,
                                   contracts.load().arity(engine.name), engine.name)
    if positional is not None and positional != model:
        reading.skip(f"model argument {positional}", f"the recipe's model is {model}")
    files = [value for flag, value in pairs if flag in HF_FILE_FLAGS and isinstance(value, str)]
    if engine.model_format == "gguf":  # the repository's file (llama-server's -hff) is which file to fetch
        pairs = [(flag, value) for flag, value in pairs if flag not in HF_FILE_FLAGS]
    settings = _read_flags(reading, pairs, engine, " ".join(start), model)
    if engine.model_format == "gguf" and files:
        settings["model_files"] = files[-1:]
    if catalog.SLOTS in engine.recipe_flags.values():
        _per_slot(reading, settings)
    return settings, ""


def _per_slot(reading: _Reading, settings: dict[str, Any]) -> None:
    """llama-server's --ctx-size is the whole server's context, its slots' together; max_model_len is one
    slot's (engines/llamacpp.py SLOTS): --parallel N shares it N ways, auto slots share one pool that a
    request may fill alone (so max_model_len is all of it); 0 is the model's own (max_model_len unset)."""
    total, slots = settings.get(catalog.CONTEXT), settings.get(catalog.SLOTS)
    if not isinstance(total, int) or isinstance(total, bool):
        return  # none, or not a number: the settings check names it
    if total == 0:
        del settings[catalog.CONTEXT]
        reading.notes.append("--ctx-size 0 (the model's own context): max_model_len unset, each slot the "
                             "model's training context")
    elif isinstance(slots, int) and not isinstance(slots, bool) and slots > 0:
        settings[catalog.CONTEXT] = total // slots
        reading.notes.append(f"--ctx-size {total} is llama-server's whole context over --parallel {slots} "
                             f"slots: max_model_len {total // slots}, each slot's (engines/llamacpp.py SLOTS)")
    else:
        reading.notes.append(f"--ctx-size {total} is llama-server's whole context, which its auto slots share "
                             f"and one request may fill: max_model_len {total} here is each slot's own, "
                             "concurrent_sequences slots of it allocated (engines/llamacpp.py SLOTS)")


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
    parsed = _parse(text, source)
    data = parsed.data
    overrides = dict(overrides or {})
    own = [key for key in OWN_FIELDS if key in overrides]
    if own:
        raise RecipeError(f"{', '.join(own)} come from the recipe itself, not --set", file="command line")
    reading = _Reading(source)
    for key in data:
        if key == "name":  # sparkrun names a recipe by its file (recipe.py:580-582), as the tool does
            reading.skip("field name", f"{clip(repr(data[key]), 60)}: sparkrun names a recipe by its file, and so "
                                       "does the tool")
        elif key not in READ and _secret_names(data[key]):
            reading.skip(f"field {key}", f"a sparkrun field this reader does not know, holding "
                                         f"{', '.join(_secret_names(data[key]))}, a secret's name: neither kept "
                                         "nor written back by the export")
        elif key not in READ:
            reading.skip(f"field {key}", "a sparkrun field this reader does not know: no bare-metal meaning here "
                                         "(kept as it is, and written back by `recipe.export --format spark-arena`)")
    if str(data["recipe_version"]) == "1":
        reading.notes.append(f"recipe_version 1, read as sparkrun reads it: the same fields as version 2, the "
                             f"version choosing only sparkrun's container builder (eugr) (sparkrun: {V1_SOURCE})")
    model, runtime = data["model"].strip(), data["runtime"].strip()
    revision = data.get("model_revision")
    defaults = _mapping(data, "defaults", source)
    env = _mapping(data, "env", source)
    metadata = _mapping(data, "metadata", source)
    context: dict[str, Any] = {"model": model, **({"model_revision": revision} if revision else {})}
    context.update({key: reading.expand(value, context) if isinstance(value, str) else value
                    for key, value in defaults.items()})
    reading.used.clear()
    reading.used.update(parsed.consumed)
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
    secret_metadata = sorted(str(key) for key in metadata if key != "description" and (
        _is_secret_name(str(key)) or _secret_names(metadata[key])))
    if secret_metadata:
        reading.skip(f"metadata {', '.join(secret_metadata)}", "a secret's name: neither kept nor written back by "
                                                               "the export")
    extra_metadata = sorted(str(key) for key in metadata if key != "description" and str(key) not in secret_metadata)
    if extra_metadata:
        reading.skip(f"metadata {', '.join(extra_metadata)}", "descriptive fields of the registry, not settings "
                                                              "(kept, and written back by the export)")
    engine = RUNTIMES.get(runtime)
    entry = catalog.ENGINES[engine] if engine is not None else None
    refused = ""
    settings: dict[str, Any] = {}
    argv: list[str] = []
    command = data.get("command")
    if entry is None:
        refused = (f"runtime '{runtime}' has no engine here (engines: {', '.join(catalog.NAMES)}; "
                   f"runtimes read: {', '.join(_runtimes_read())})")
    elif not isinstance(command, str) or not command.strip():
        refused = "the recipe has no command to read"
    else:
        argv = tokens(reading.expand(command, context))
        settings, refused = _read_command(reading, argv, runtime, entry, model)
    served = model
    if entry is not None and entry.model_format == "gguf":
        served, files, why = _gguf_model(reading, model)
        refused = refused or why
        if files and "model_files" not in settings:
            settings["model_files"] = list(files)
    from provision.inventory import secret_variable

    environment: dict[str, str] = {}
    unusable: list[str] = []  # why a variable makes the recipe unusable (never its value)
    for variable, value in env.items():
        variable_name = str(variable)
        shown_before = set(reading.values)
        expanded = reading.expand(str(value), context) if value is not None else ""
        secret = secret_variable(variable_name)
        if secret is not None:
            # Nothing of a secret is kept or shown: not the variable, nor the placeholders it expanded.
            for placeholder in set(reading.values) - shown_before:
                del reading.values[placeholder]
            if expanded.strip():
                unusable.append(f"env {variable_name} is {secret}: a recipe that gives it a value publishes a secret (its "
                                "value is not shown, and nothing of it is kept); the server's API key is api_key, "
                                "and the hub's token hf_token, of the inventory's secrets file")
            else:
                reading.skip(f"env {variable_name}", f"{secret}, empty here: secrets come from the inventory's secrets "
                                            "file only")
            continue
        if PLACEHOLDER.search(expanded):
            names = ", ".join("{" + found + "}" for found in PLACEHOLDER.findall(expanded))
            reading.skip(f"env {variable}", f"its value names {names}, which nothing in the recipe defines")
            continue
        text = _word(value) if isinstance(value, bool) else expanded
        if "\n" in text or "\r" in text:
            unusable.append(f"env {variable_name} holds a line break: an environment file holds one variable a line")
            continue
        environment[variable_name] = text
    if environment:
        settings["environment"] = environment
    if unusable:
        refused = "; ".join([*unusable, *([refused] if refused else [])])
    image_files = serverfiles.needed(settings.get("server_files") or {})  # the command's own, before --set
    for key, value in defaults.items():
        if key not in reading.used and engine is not None and not refused:
            shown = NOT_SHOWN if _is_secret_name(str(key)) else _word(value)
            reading.skip(f"default {key}: {shown}", "no placeholder of the command or env uses it")
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
        notes += [f"assumed {what}: {why}" for what, why in parsed.assumed] + reading.notes
        recipe = Recipe(
            name=name, description=str(data.get("description") or metadata.get("description") or "").strip(),
            model=served,
            revision=str(revision or "main"), engine=str(engine), engine_version=version, settings=settings,
            hardware=Hardware(profile=PROFILE, gpus=1, gpu_memory_gib=None, nodes=nodes),
            figures=(), source=f"Spark Arena v2 recipe: {source}", notes=tuple(notes), file=source,
            upstream=_upstream(data, image_files, source))
        try:
            values = recipe.inventory_vars()
        except RecipeError as exc:
            refused, recipe = f"its settings do not validate: {exc.message} (key '{exc.key}')", None
        else:
            try:  # a flag the pinned release lacks refuses the recipe; one no row judges is a note
                found = contract_notes(recipe.engine, values, recipe.engine_version)
            except RecipeError as exc:
                refused, recipe = exc.message, None
            else:
                recipe = dataclasses.replace(recipe, notes=(*recipe.notes, *found)) if found else recipe
    return Imported(source=source, recipe=recipe, refused=refused, placeholders=_unsecret(reading.values),
                    unknown=tuple(reading.unknown), not_carried=tuple(reading.not_carried),
                    command=_shown_command(argv, entry),
                    engine=engine, engine_version=version, settings=_unsecret_settings(settings, entry),
                    assumed=parsed.assumed)


NOT_SHOWN = "(a secret: not shown)"


def _is_secret_name(name: str) -> bool:
    """A name whose value is a secret: an engine's API key variable or a credential's (*_API_KEY, *_TOKEN,
    *_SECRET, *_PASSWORD...; api_key and hf_token as a recipe's defaults name them), or a flag that takes one."""
    from provision.inventory import secret_variable

    return secret_variable(name.removeprefix("config.").lstrip("-").replace("-", "_").upper()) is not None


def _secret_names(value: Any) -> list[str]:
    """The keys within a field's value (mappings, lists of them, at any depth) that name a secret
    (HF_TOKEN, api_key...): such a field is not kept for the export, which never carries a secret."""
    found: list[str] = []
    if isinstance(value, Mapping):
        for key, inner in value.items():
            if _is_secret_name(str(key)):
                found.append(str(key))
            found += _secret_names(inner)
    elif isinstance(value, list):
        for inner in value:
            found += _secret_names(inner)
    return found


def _unsecret(values: Mapping[str, str]) -> dict[str, str]:
    """The placeholders and their values, a secret's value not shown."""
    return {name: NOT_SHOWN if _is_secret_name(name) else value for name, value in values.items()}


def _shown_command(argv: list[str], entry: catalog.EngineEntry | None) -> tuple[str, ...]:
    """The expanded command as it may be printed: the value of a flag that takes a key (the engine's
    --api-key, any --*-token or --*-secret) not shown, given as `--flag VALUE` or `--flag=VALUE`."""
    from provision.inventory import credential_in_json

    keyed = {flag for flag, setting in (entry.owned_flags if entry else {}).items() if setting == catalog.KEY}
    shown: list[str] = []
    hide_next = False
    for arg in argv:
        flag, equals, value = arg.partition("=")
        if hide_next:
            shown.append(NOT_SHOWN)
            hide_next = False
        elif arg.startswith("-") and (flag in keyed or _is_secret_name(flag) or catalog.credential_flag(flag)):
            shown.append(f"{flag}={NOT_SHOWN}" if equals else arg)
            hide_next = not equals
        elif arg.startswith("--") and equals and credential_in_json(value):
            shown.append(f"{flag}={NOT_SHOWN}")
        elif credential_in_json(arg):  # a flag's JSON value holding a token
            shown.append(NOT_SHOWN)
        else:
            shown.append(arg)
    return tuple(shown)


def _unsecret_settings(settings: Mapping[str, Any], entry: catalog.EngineEntry | None) -> dict[str, Any]:
    """The settings as read, for showing: a key given as a server flag not shown (the recipe holding one is
    refused, and the refusal and the JSON show what was read)."""
    shown = dict(settings)
    if "server_flags" in shown:
        shown["server_flags"] = {flag: NOT_SHOWN if _shown_command([flag, str(value)], entry)[-1] == NOT_SHOWN
                                 else value for flag, value in shown["server_flags"].items()}
    if "extra_args" in shown:
        shown["extra_args"] = list(_shown_command(list(shown["extra_args"]), entry))
    return shown


def _runtimes_read() -> list[str]:
    """The runtimes whose engine's recipe commands this reader reads (the catalog's recipe_commands)."""
    return [runtime for runtime, engine in RUNTIMES.items()
            if engine is not None and catalog.ENGINES[engine].recipe_commands]


def _gguf_model(reading: _Reading, model: str) -> tuple[str, tuple[str, ...], str]:
    """A one-file engine's model (llama.cpp's GGUF) as the tool takes it: `REPO:QUANT` is the repository
    and its files matching *QUANT* (as sparkrun fetches them, GGUF_SOURCE); an absolute .gguf path is
    that file on the host; a repository alone is the repository. The third: why it cannot be taken."""
    if model.lower().endswith(".gguf"):
        if not model.startswith("/"):
            return model, (), (f"the model {model} is a GGUF file by a relative path (the container's): the tool "
                               "takes a hub repository or an absolute path on the host")
        reading.notes.append(f"the model is the file {model} on the host, not fetched: put it there")
        return model, (), ""
    if ":" not in model:
        return model, (), ""
    repo, quant = model.rsplit(":", 1)
    reading.notes.append(f"model {model}: the repository {repo}, its files matching *{quant}* (model_files), "
                         f"as sparkrun fetches a GGUF quant ({GGUF_SOURCE})")
    return repo, (f"*{quant}*",), ""


def _upstream(data: Mapping[str, Any], files: Mapping[str, str], source: str) -> dict[str, Any]:
    """What of the file has no bare-metal meaning, kept as the recipe's upstream so that `write` gives it
    back as it was: the container, mods, build_args, min_nodes and max_nodes as the file has them, and
    the files inside the image its command names ({flag: path})."""
    upstream: dict[str, Any] = {"format": UPSTREAM_FORMAT}
    for key in UPSTREAM_FIELDS[UPSTREAM_FORMAT]:
        if key not in ("files", "metadata", "unread") and data.get(key) not in (None, "", []):
            upstream[key] = data[key]
    if files:
        upstream["files"] = dict(files)
    metadata = data.get("metadata")
    kept = {str(key): value for key, value in metadata.items() if key != "description"
            and not _is_secret_name(str(key)) and not _secret_names(value)} if isinstance(metadata, dict) else {}
    if kept:
        upstream["metadata"] = kept
    unread = {str(key): value for key, value in data.items()
              if key not in READ and key != "name" and not _secret_names(value)}
    if unread:
        upstream["unread"] = unread
    return check_upstream(upstream, source)


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
    if data.get("cluster_only"):  # sparkrun: at least two nodes (recipe.py:600-605)
        low = max(low or 1, 2)
    if data.get("solo_only"):  # sparkrun: exactly one
        high = 1
    if low is not None and high is not None and low > high:
        raise RecipeError(f"min_nodes {low} is above max_nodes {high}", file=source)
    gpus = _gpus(settings)
    nodes = max(int(low or 1), gpus)
    if high is not None and nodes > high:
        bound = "solo_only (one node, sparkrun's recipe.py:600-605)" if data.get("solo_only") else \
            f"max_nodes is {high}"
        return nodes, f"tensor x pipeline parallel asks {gpus} GPUs, one a DGX Spark, and {bound}"
    return nodes, ""


# Writing: the settings a v2 file has a place for; any other a recipe gives is refused by name.
WRITTEN = {"tensor_parallel_size", "pipeline_parallel_size", "gpu_memory_utilization", "max_model_len",
           "enable_prefix_caching", "served_model_name", "port", "bind_host", "server_flags", "extra_args",
           "environment", "engine_spec", "server_files"}
_PLACEHELD = (("bind_host", "host", "--host"), ("port", "port", "--port"),
              ("tensor_parallel_size", "tensor_parallel", "-tp"),
              ("pipeline_parallel_size", "pipeline_parallel", "-pp"),
              ("gpu_memory_utilization", "gpu_memory_utilization", "--gpu-memory-utilization"),
              ("max_model_len", "max_model_len", "--max-model-len"),
              ("served_model_name", "served_model_name", "--served-model-name"))


def write(recipe: Recipe, container: str | None = None) -> str:
    """The recipe as a Spark Arena v2 file, where its engine and settings fit the format: vLLM, and a
    container (the one given; else the one it was imported with, while its venv pin is that image's
    release or none; else the image named by its vLLM version). What its upstream keeps of a v2 file is
    written back as it was: mods, build_args, min_nodes and max_nodes (while its node count lies between
    them), the files inside the image its command names, its metadata and the fields of sparkrun's the
    reader does not know (executor_config, pre_exec, distribution_config, as the file has them). A secret's variable (an engine's API key, a
    token) is never written. RecipeError says what does not fit."""
    if recipe.engine != "vllm":
        title = catalog.ENGINES[recipe.engine].title if recipe.engine in catalog.ENGINES else recipe.engine
        raise RecipeError(f"engine {recipe.engine} ({title}): Spark Arena's v2 export writes vLLM recipes only "
                          "(a `vllm serve` command in a vllm/vllm-openai container)", file=recipe.file or recipe.name)
    values = recipe.inventory_vars()
    extra = sorted(key for key in recipe.settings if key not in WRITTEN)
    if extra:
        raise RecipeError(f"{', '.join(extra)} have no place in a Spark Arena recipe (a container replaces "
                          "the venv and the host's layout)", file=recipe.file or recipe.name)
    from provision.inventory import VAR_SPECS, secret_variable

    secrets = [f"{name} ({secret_variable(name)})" for name in values.get("environment", {})
               if secret_variable(name)]
    if secrets:
        raise RecipeError(f"environment {', '.join(secrets)}: a shared recipe never carries a secret; take it "
                          "out of the recipe (the inventory's secrets file holds the API key and the hub token)",
                          file=recipe.file or recipe.name)
    upstream = recipe.upstream if recipe.upstream.get("format") == UPSTREAM_FORMAT else {}
    files = {**serverfiles.needed(values.get("server_files", {})), **upstream.get("files", {})}
    local = sorted(set(values.get("server_files", {})) - set(files))
    if local:
        raise RecipeError(f"server_files {', '.join(local)}: a file of the controller, which no container image "
                          "holds (a sparkrun mod would have to put it there)", file=recipe.file or recipe.name)
    pinned = pinned_vllm(values.get("engine_spec"))
    kept = upstream.get("container")
    if kept is not None and pinned is not None and container_version(kept) != pinned:
        kept = None  # the venv pin replaced it: the pin's release image
    image = container or kept or (f"vllm/vllm-openai:v{pinned}" if pinned else None)
    if image is None:
        raise RecipeError("its engine version is not a vllm==X.Y.Z pin, so no container is known: give one "
                          "(--container IMAGE)", file=recipe.file or recipe.name)
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
    if values.get("enable_prefix_caching") is not None:  # unset: vLLM's own choice, as imported
        lines.append("--enable-prefix-caching" if values["enable_prefix_caching"] else "--no-enable-prefix-caching")
    from provision.engines.base import own_args

    # A file's flag names the path inside the image, in place of the same flag elsewhere.
    own = own_args(values.get("extra_args", ()), {**values.get("server_flags", {}), **files})
    index = 0
    while index < len(own):  # a flag and its values on one line (--cudagraph-capture-sizes 1 2 4)
        end = index + 1
        while end < len(own) and _is_value(own[end]):
            end += 1
        lines.append(" ".join([own[index], *(shlex.quote(word) for word in own[index + 1:end])]))
        index = end
    data: dict[str, Any] = {"recipe_version": FORMAT, "model": recipe.model}
    if recipe.revision != "main":
        data["model_revision"] = recipe.revision
    data["runtime"] = "vllm"
    nodes = recipe.hardware.nodes
    low, high = upstream.get("min_nodes"), upstream.get("max_nodes")
    if upstream and (low or 1) <= nodes <= (high or nodes):  # as imported (none given: sparkrun's own, 1 up)
        data.update({key: value for key, value in (("min_nodes", low), ("max_nodes", high)) if value is not None})
    else:  # not imported, or its node count moved out of them: exactly its own
        data.update({"min_nodes": nodes} if nodes > 1 else {})
        data["max_nodes"] = nodes
    data["container"] = image
    data["metadata"] = {"description": recipe.description or recipe.name, **upstream.get("metadata", {})}
    data.update({key: upstream[key] for key in ("build_args", "mods") if key in upstream})
    data["defaults"] = defaults
    data.update({key: value for key, value in upstream.get("unread", {}).items() if key not in data})
    if values.get("environment"):
        data["env"] = dict(values["environment"])
    data["command"] = " \\\n  ".join(lines) + "\n"
    hardware = recipe.hardware
    head = (f"# {recipe.name}, exported from a provision recipe ({recipe.source}); measured on profile "
            f"{hardware.profile}, {hardware.gpus} GPU(s) x {hardware.nodes} node(s); figures: ")
    head += "; ".join(f"{f.metric} {f.value:g} {f.unit} ({f.kind})" for f in recipe.figures) or NOT_MEASURED
    if container and values.get("engine_spec"):
        head += f"; its venv pin {values['engine_spec']} is replaced by the container"
    elif not container and upstream.get("container") not in (None, image):
        head += f"; its venv pin {values['engine_spec']} replaces the container {upstream['container']}"
    return f"{clip(head, 400)}\n" + str(yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True,
                                                   width=100))


class _Dumper(yaml.SafeDumper):
    """The safe dumper, a text of several lines written as a block (`command: |`), as the registry does."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _text)
