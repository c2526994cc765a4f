"""What every engine answers (provision.engines documents the whole). Pure: no I/O, no Fabric."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from packaging.utils import canonicalize_name

from provision import contracts
from provision.catalog import EngineEntry, MetricNames, flag_name, owned_by, owns
from provision.errors import ContractError

if TYPE_CHECKING:
    from provision.context import Context

PASS, FAIL, WARN = "pass", "fail", "warn"


def closing_args(settings: Any, resolutions: Sequence[str]) -> list[str]:
    """What every engine's command line ends with: the gate's resolutions the inventory does not give
    itself, then the inventory's own arguments (own_args)."""
    own = own_args(settings.extra_args, settings.server_flags)
    return [arg for arg in resolutions if arg not in own] + own


def own_args(extra_args: Sequence[str], server_flags: Mapping[str, Any]) -> list[str]:
    """The inventory's own server arguments: extra_args, then server_flags ({--flag: value}; true: the
    bare flag; false: none). A flag server_flags names is taken out of extra_args first (with its value:
    the next argument unless that is a flag), so a kept or tuned value replaces, never doubles, it."""
    named = set(server_flags)
    kept: list[str] = []
    skip_value = False
    for arg in extra_args:
        if skip_value:
            skip_value = False
            if not arg.startswith("-"):
                continue
        flag = arg.split("=", 1)[0]
        if flag in named:
            skip_value = "=" not in arg
            continue
        kept.append(arg)
    for flag, value in server_flags.items():
        if value is True:
            kept.append(flag)
        elif value is not False:
            kept += [flag, str(value)]
    return kept


@dataclass(frozen=True)
class Verdict:
    """An engine's answer to one gate rule: pass, fail (the rule's severity) or warn."""

    status: str
    message: str
    fix: str | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class UnitFile:
    """One systemd unit an engine runs on a host: its name, template and the values it prints."""

    name: str
    template: str
    values: Mapping[str, Any]


@dataclass(frozen=True)
class ConfigFile:
    """A file an engine's server reads (options, a host list), rendered from a template."""

    path: str
    template: str
    values: Mapping[str, Any]
    mode: int = 0o644
    owner: str = "root"  # "service" means the service user
    content: str | None = None  # verbatim, instead of the template


class Engine:
    """The defaults are vLLM's answers where engines share them; each engine's module overrides the rest.
    What the engine is (its name, units, owned flags, metrics...) is its catalog entry's."""

    entry: EngineEntry
    # How a multi-node server reaches its nodes by default: "native" (vLLM's own), "ray", "mpi"; None: it
    # cannot. launch() answers for one cluster.
    cluster_launch: str | None = None
    worker_unit: str | None = None  # what runs on a multi-node cluster's other nodes (None: nothing of ours)
    # The server flag that bounds the requests it runs at once, where that is a flag of its own and not
    # the concurrent_sequences setting (engine_contracts.yaml has its row).
    concurrency_flag: str | None = None

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def title(self) -> str:
        return self.entry.title

    @property
    def server_unit(self) -> str:
        return self.entry.server_unit

    @property
    def units(self) -> tuple[str, ...]:
        return self.entry.units

    @property
    def worker_units(self) -> tuple[str, ...]:
        return self.entry.worker_units

    @property
    def api_key_variable(self) -> str | None:
        return self.entry.api_key_variable

    @property
    def model_format(self) -> str:
        return self.entry.model_format

    @property
    def metrics(self) -> MetricNames:
        return self.entry.metrics

    @property
    def source(self) -> str:
        return self.entry.source

    @property
    def owned_flags(self) -> Mapping[str, str]:
        return self.entry.owned_flags

    @property
    def host_flags(self) -> tuple[str, ...]:
        return self.entry.host_flags

    def owned(self, arg: str) -> tuple[str, str] | None:
        """Where `arg` (a flag, or --flag=value) is one the tool sets: that flag and the setting to use
        instead."""
        return owned_by(self.entry, arg)

    def release(self, settings: Any) -> str:
        """The release this host's unit is rendered for: the engine_spec pin, else the contract table's
        target."""
        return contracts.load().release(self.name, settings.engine_spec)

    def entrypoint(self, version: str | None) -> str:
        """The module `python -m` starts the server with in that release (None: the table's target): the
        first of the contract table's entrypoint rows the release has."""
        table = contracts.load()
        found = table.names(self.name, "entrypoint", version)
        if not found:
            raise ContractError(f"{self.title} {version or table.target(self.name)}: no server module in "
                                f"{contracts.DATA}")
        return found[0]

    def listen_address(self, command: Sequence[str]) -> str | None:
        """The address a rendered server command listens on: the value of its last host flag (the
        server takes the last); None where it names none."""
        address = None
        for index, arg in enumerate(command):
            flag = flag_name(arg)
            if not any(owns(owned, flag) for owned in self.host_flags):
                continue
            if "=" in arg:
                address = arg.split("=", 1)[1]
            elif index + 1 < len(command):
                address = command[index + 1]
        return address

    def server_command(self, ctx: Context, model: str, resolutions: Sequence[str]) -> list[str]:
        raise NotImplementedError

    def metric_names(self, settings: Any) -> MetricNames:
        """The names status and bench read from this host's server (an engine whose releases differ
        there answers by the release its settings pin)."""
        return self.metrics

    def kv_slots(self, settings: Any, length: int) -> tuple[int, int] | None:
        """Where the server allocates the KV cache of a fixed number of sequences at its start
        (llama.cpp's slots): how many, and the tokens each holds for a context of `length`. None where
        the cache is one pool that requests take blocks of as they grow (vLLM, TensorRT-LLM): memory.fits
        then counts how many sequences of `length` fit."""
        return None

    def environment(self, ctx: Context, environment: dict[str, str]) -> dict[str, str]:
        """The service environment with what the engine needs added (the API key is added by render)."""
        return environment

    def unit_files(self, ctx: Context, common: Mapping[str, Any], server: Mapping[str, Any],
                   resolutions: Sequence[str]) -> list[UnitFile]:
        """This host's units, in start order. `common` goes to every unit, `server` to the server's
        (with "model", what it loads, and "environment", the names the environment file sets)."""
        raise NotImplementedError

    def config_files(self, ctx: Context, secrets: Mapping[str, str | None], home: str) -> list[ConfigFile]:
        """Files the server reads besides the environment; `secrets` by their secrets-file names, `home`
        the service user's home."""
        return []

    def config_paths(self, home: str) -> tuple[str, ...]:
        """Every file config_files may render, on any host (a generation records them all)."""
        return ()

    def verify_modules(self, requirements: Sequence[str], wheels: Sequence[str]) -> list[str]:
        """Python modules a finished venv install must import (its wheels carry the server)."""
        return []

    def build_env(self, ctx: Context, jobs: int) -> dict[str, str]:
        """The engine's own settings for a source build of its venv (`venv_source`) on this host."""
        return {}

    def support(self, ctx: Context) -> Verdict | None:
        """Whether the engine runs this host's GPU and the model's quantization; None: nothing to say."""
        return None

    def nodes(self, ctx: Context) -> Verdict | None:
        """Whether the engine can spread this cluster's model over its nodes."""
        return None

    def launch(self, ctx: Context) -> str | None:
        """How this cluster's server reaches its nodes (None on one node)."""
        return self.cluster_launch if ctx.nodes > 1 else None

    def venv_site_files(self, ctx: Context) -> Mapping[str, str]:
        """Files the tool writes into the service venv's site-packages once pip is done ({name: text}):
        none by default. Part of the venv's key: a venv that lacks them is built again."""
        return {}

    def service_requirements(self, ctx: Context) -> tuple[str, ...]:
        """The service venv's requirements: the inventory's (engine_spec), and what the engine adds. The
        engine's package named without an exact pin leaves out the releases the host's indexes cannot
        install (index_gaps.yaml: 'vllm' -> 'vllm!=0.34.0' with PyPI alone)."""
        from provision import venv

        return installable(self.name, venv.requirements_of(ctx.settings), venv.indexes_of(ctx.settings))

    def worker_unit_for(self, settings: Any) -> str | None:
        """The unit a worker node of a cluster with these settings runs (before its facts are read)."""
        return self.worker_unit

    def pair_unit(self, ctx: Context) -> str | None:
        """This node's unit where the cluster's units are one server that restarts only whole (a start or
        restart of one restarts the others: plan.together); None where each restarts on its own."""
        return None

    def user_shell(self, ctx: Context) -> str:
        """The service user's login shell: none, unless another node must start processes as it."""
        return "/usr/sbin/nologin"


def installable(engine: str, requirements: Sequence[str], indexes: Any) -> tuple[str, ...]:
    """`requirements` with each unpinned requirement of the engine's package narrowed by the releases
    index_gaps.left_out names for these indexes (a venv.PipIndexes); an exact pin is kept as it is
    (engine.installable refuses it instead, with the fix)."""
    from provision import index_gaps, venv

    urls = [url for url in (indexes.index_url, *indexes.extra_index_urls) if url]
    excluded = index_gaps.left_out(engine, urls)
    if not excluded or venv.pinned_version(requirements, engine) is not None:
        return tuple(requirements)
    packages = {canonicalize_name(name) for name in contracts.load().engines[engine].packages}
    narrowed = []
    for requirement in requirements:
        if venv.requirement_name(requirement) in packages and ";" not in requirement:
            requirement += ("," if any(op in requirement for op in "<>=!~") else "") + ",".join(
                f"!={release}" for release in excluded)
        narrowed.append(requirement)
    return tuple(narrowed)
