"""What every engine answers (provision.engines documents the whole). Pure: no I/O, no Fabric."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from provision.parsers import PROMETHEUS

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


# What the setting is that the tool renders an owned flag from: a flag the tool sets itself is refused
# in server_flags and extra_args (the server takes the last of two, so it would undo the setting and
# what the gate judged by it: the address, the API key).
LISTEN = "bind_host"
PORT = "port"
MODEL = "model"
NAME = "served_model_name"
KEY = "the secrets file's vllm_api_key"


def flag_name(arg: str) -> str:
    """The flag an argument names, as the engines' parsers read it: the part before "=", and in a
    long flag "_" as "-" (vLLM's parser takes --served_model_name for --served-model-name)."""
    flag = arg.split("=", 1)[0]
    return flag.replace("_", "-") if flag.startswith("--") else flag


def _owns(owned: str, flag: str) -> bool:
    """`flag` is `owned` or, for a long flag, a prefix of it: vLLM's argparse takes any unambiguous
    abbreviation (--ho for --host)."""
    return flag == owned or (flag.startswith("--") and len(flag) > 3 and owned.startswith(flag))


@dataclass(frozen=True)
class Verdict:
    """An engine's answer to one gate rule: pass, fail (the rule's severity) or warn."""

    status: str
    message: str
    fix: str | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MetricNames:
    """Where the server's metrics page is, how it is written and which samples mean what (status and
    bench). `format` is PROMETHEUS (text samples) or ITERATION_STATS (TensorRT-LLM 1.2's JSON list of
    iteration statistics, read by parsers.parse_iteration_stats into the same name -> value shape)."""

    path: str = "/metrics"
    format: str = PROMETHEUS
    running: tuple[str, ...] = ()  # each field: alternatives, the first present wins
    waiting: tuple[str, ...] = ()
    generated: tuple[str, ...] = ()  # counters of tokens
    prompted: tuple[str, ...] = ()
    kv_usage: tuple[str, ...] = ()  # a 0..1 gauge
    prefix_hits: tuple[str, ...] = ()
    prefix_queries: tuple[tuple[str, ...], ...] = ()  # summed over the outer tuple
    cache_info: str | None = None  # an info gauge whose labels say the KV cache's size (vLLM)
    # Counters of requests that failed in the server (summed; 'name{label="value"}' reads one label's
    # samples): status shows them since the server started. Empty where the engine counts none.
    failed: tuple[str, ...] = ()
    needs_key: bool = False  # the endpoint answers 401 without the API key

    @property
    def read(self) -> tuple[str, ...]:
        """Every sample these names read: the host sends back only these."""
        names = (*self.running, *self.waiting, *self.generated, *self.prompted, *self.kv_usage,
                 *self.prefix_hits, *(name for group in self.prefix_queries for name in group),
                 *(name.split("{", 1)[0] for name in self.failed))
        return (*names, self.cache_info) if self.cache_info else names


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
    """The defaults are vLLM's answers where engines share them; each engine's module overrides the rest."""

    name = ""
    title = ""
    server_unit = ""
    worker_unit: str | None = None  # what runs on a multi-node cluster's other nodes (None: nothing of ours)
    worker_units: tuple[str, ...] = ()  # every unit a worker node may run, by launch (status reads the one there)
    units: tuple[str, ...] = ()  # every unit this engine may render
    api_key_variable: str | None = None  # the environment variable the server reads its API key from
    # How a multi-node server reaches its nodes by default: "native" (vLLM's own), "ray", "mpi"; None: it
    # cannot. launch() answers for one cluster.
    cluster_launch: str | None = None
    metrics = MetricNames()
    model_format = "safetensors"  # or "gguf": one file the server loads
    source = ""  # the engine's documentation, for findings
    # The flags its server command sets from the settings (normalised by flag_name), with the setting
    # to use instead; host_flags: those that say the address the server listens on.
    owned_flags: ClassVar[Mapping[str, str]] = {}
    host_flags: tuple[str, ...] = ("--host",)
    # The server flag that bounds the requests it runs at once, where that is a flag of its own and not
    # the concurrent_sequences setting (engine_contracts.yaml has its row).
    concurrency_flag: str | None = None

    def owned(self, arg: str) -> tuple[str, str] | None:
        """Where `arg` (a flag, or --flag=value) is one the tool sets: that flag and the setting to use
        instead."""
        flag = flag_name(arg)
        return next(((owned, setting) for owned, setting in self.owned_flags.items() if _owns(owned, flag)),
                    None)

    def listen_address(self, command: Sequence[str]) -> str | None:
        """The address a rendered server command listens on: the value of its last host flag (the
        server takes the last); None where it names none."""
        address = None
        for index, arg in enumerate(command):
            flag = flag_name(arg)
            if not any(_owns(owned, flag) for owned in self.host_flags):
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
