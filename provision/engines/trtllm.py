"""TensorRT-LLM's OpenAI-compatible server (`trtllm-serve`, PyTorch backend), for Blackwell and Hopper.

One node: `trtllm-serve MODEL --tp_size N ...` with an options file (extra_llm_api_options) that turns on
the statistics status reads. Several nodes (a Spark pair): the documented MPI launch, `mpirun` on the head
starting one rank per GPU through `trtllm-llmapi-launch` on every node over SSH, with the cluster
network's interface for MPI, UCX and NCCL. The head's service user holds the cluster's MPI key (the
secret mpi_ssh_key); the workers' service user accepts it from the head's address only.
It cannot run without an NVIDIA GPU: its units, plans and gate are tested on recorded facts.

Which release: the exact `tensorrt_llm==X` pin of engine_spec, else the contract table's target (1.2.0,
provision/engine_contracts.yaml). Every flag rendered is a row there (and an option of the fixture
tests/fixtures/engines/trtllm-serve-v1.2.0.json, the release's own serve.py); a flag the release lacks is
left out (1.2 to 1.3.0rc6 have no served-name option; 1.3.0rc7 has --served_model_name). Status reads 1.2's JSON iteration statistics at /metrics,
and the trtllm_* Prometheus names only from the release that serves them (1.3.0rc on).

Sources:
  flags, endpoints        https://nvidia.github.io/TensorRT-LLM/commands/trtllm-serve/trtllm-serve.html
  per release             provision/engine_contracts.yaml (each row with its source)
  multi-node (mpirun)     https://build.nvidia.com/spark/trt-llm/stacked-sparks
  support matrix          https://nvidia.github.io/TensorRT-LLM/reference/support-matrix.html
  no API key              https://github.com/NVIDIA/TensorRT-LLM/issues/9950
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from provision import catalog, contracts, hints
from provision.catalog import MetricNames
from provision.engines.base import (
    FAIL,
    PASS,
    WARN,
    ConfigFile,
    Engine,
    UnitFile,
    Verdict,
    closing_args,
)

if TYPE_CHECKING:
    from provision.context import Context

SERVE_DOC = catalog.ENGINES["trtllm"].source
SPARK_PAIR_DOC = "https://build.nvidia.com/spark/trt-llm/stacked-sparks"
SUPPORT_DOC = "https://nvidia.github.io/TensorRT-LLM/reference/support-matrix.html"
OPTIONS_FILE = "/etc/vllm/trtllm-options.yaml"
HOSTFILE = "/etc/vllm/mpi-hostfile"
MPI_KNOWN_HOSTS = "/etc/vllm/mpi-known-hosts"
MPI_KEY = "/etc/vllm/mpi-key"  # the service user's, 0600
MPIRUN = "/usr/bin/mpirun"  # Debian/Ubuntu openmpi-bin (TensorRT-LLM's install asks for libopenmpi-dev)
# GPUs the PyTorch backend runs, by compute capability (support matrix: Hopper, Blackwell B200/GB200,
# B300/GB300, RTX PRO / GeForce Blackwell, GB10; Ada and Ampere are left to vLLM here).
GPUS = {"9.0": "Hopper", "10.0": "Blackwell (B200/GB200)", "10.3": "Blackwell (B300/GB300)",
        "12.0": "Blackwell (RTX 50 / RTX PRO)", "12.1": "Blackwell (GB10, DGX Spark)"}
# Checkpoint formats (config.json quantization_config.quant_method) per architecture family. ModelOpt
# checkpoints ("modelopt": NVFP4, FP8) are TensorRT-LLM's own; AWQ/GPTQ W4A16 is a Hopper path only.
QUANTIZATIONS = {
    "hopper": ("none", "fp8", "modelopt", "w4a8_awq", "awq", "gptq"),
    "blackwell": ("none", "fp8", "modelopt", "nvfp4", "mxfp4"),
}
# The spellings releases have had (engine_contracts.yaml): click declares it --served_model_name, and
# click takes no other spelling (--served-model-name is "No such option").
SERVED_NAME_FLAGS = ("--served_model_name",)
# 1.3.0rc on: /prometheus/metrics (return_perf_metrics) with the trtllm_ names.
PROMETHEUS_METRICS = MetricNames(
    path="/prometheus/metrics",
    running=("trtllm_num_requests_running",), waiting=("trtllm_num_requests_waiting",),
    generated=("trtllm_generation_tokens_total",), prompted=("trtllm_prompt_tokens_total",),
    kv_usage=("trtllm_kv_cache_utilization",),
    prefix_hits=("trtllm_prompt_cached_tokens_total",),
    prefix_queries=(("trtllm_prompt_tokens_total",),))
# 1.2: /metrics answers the iteration statistics as JSON (the catalog's metrics).
ITERATION_METRICS = catalog.TRTLLM_METRICS


class TrtLlm(Engine):
    entry = catalog.ENGINES["trtllm"]
    cluster_launch = "mpi"
    concurrency_flag = "--max_batch_size"  # engine_contracts.yaml; tune's spaces try it

    def metric_names(self, settings: Any) -> MetricNames:
        table = contracts.load()
        serves = table.accepts(self.name, "metric", PROMETHEUS_METRICS.running[0], self.release(settings))
        return PROMETHEUS_METRICS if serves else ITERATION_METRICS

    def served_name_flag(self, settings: Any) -> str | None:
        """The release's option for the name clients use, or None where it has none (before 1.3.0rc7)."""
        table = contracts.load()
        release = self.release(settings)
        return next((flag for flag in SERVED_NAME_FLAGS if table.accepts(self.name, "flag", flag, release)), None)

    def _multi(self, ctx: Context) -> bool:
        return bool(ctx.cluster and ctx.cluster.multi_node)

    def server_command(self, ctx: Context, model: str, resolutions: Sequence[str]) -> list[str]:
        settings = ctx.settings
        venv = settings.venv_dir.rstrip("/")
        served_flag = self.served_name_flag(settings)
        served = [served_flag, str(settings.served_model_name or settings.model)] if served_flag else []
        serve = [f"{venv}/bin/trtllm-serve", model, "--backend", "pytorch", *served,
                 "--host", str(settings.bind_host), "--port", str(settings.port),
                 "--tp_size", str(settings.tensor_parallel_size), "--pp_size", str(settings.pipeline_parallel_size),
                 "--kv_cache_free_gpu_memory_fraction", str(settings.gpu_memory_utilization),
                 "--extra_llm_api_options", OPTIONS_FILE]
        # --max_seq_len is per request, as vLLM's max_model_len and unlike llama.cpp's --ctx-size
        # (engines/llamacpp.py SLOTS): "Maximum total length of one request, including prompt and
        # outputs" (the 1.2 line's tensorrt_llm/commands/serve.py, the commit engine_contracts.yaml cites).
        # Its KV cache is one pool, --kv_cache_free_gpu_memory_fraction of what the weights leave
        # (get_llm_args' KvCacheConfig), which the GUARANTEED_NO_EVICT scheduler set there admits a request
        # to only when it can finish; --max_batch_size ("Maximum number of requests that the engine can
        # schedule") bounds how many at once. Nothing is multiplied by a slot count here.
        if settings.max_model_len:
            serve += ["--max_seq_len", str(settings.max_model_len)]
        return serve + closing_args(settings, resolutions)

    def _launch(self, ctx: Context, serve: list[str], environment: Sequence[str]) -> list[str]:
        """One rank per GPU of the cluster, from the head: every variable of the rendered service
        environment passed on by name (-x NAME: values stay in the 0600 environment file, never in the
        command line)."""
        venv = ctx.settings.venv_dir.rstrip("/")
        return [MPIRUN, "--hostfile", HOSTFILE, "-np", str(ctx.parallel), "--map-by", f"ppr:{self._per_node(ctx)}:node",
                *(arg for name in environment for arg in ("-x", name)),
                f"{venv}/bin/trtllm-llmapi-launch", *serve]

    def _per_node(self, ctx: Context) -> int:
        return max(1, ctx.parallel // ctx.nodes)

    def environment(self, ctx: Context, environment: dict[str, str]) -> dict[str, str]:
        link = ctx.link
        if link is None:
            return environment
        # MPI's out-of-band and TCP traffic, UCX and NCCL on the cluster network's interface (the
        # playbook's UCX_NET_DEVICES / NCCL_SOCKET_IFNAME / OMPI_MCA_btl_tcp_if_include).
        environment.update({
            "NCCL_SOCKET_IFNAME": link.interface, "GLOO_SOCKET_IFNAME": link.interface,
            "UCX_NET_DEVICES": link.interface, "OMPI_MCA_btl_tcp_if_include": link.interface,
            "OMPI_MCA_oob_tcp_if_include": link.interface,
            # mpirun reaches the workers as the service user with the cluster's key, host keys checked.
            "OMPI_MCA_plm_rsh_args": f"-o BatchMode=yes -o StrictHostKeyChecking=yes "
                                     f"-o UserKnownHostsFile={MPI_KNOWN_HOSTS} -i {MPI_KEY}",
            "OMPI_MCA_plm_rsh_agent": "ssh"})
        return environment

    def unit_files(self, ctx: Context, common: Mapping[str, Any], server: Mapping[str, Any],
                   resolutions: Sequence[str]) -> list[UnitFile]:
        if not ctx.is_head:
            return []  # a worker's ranks are started by the head's mpirun, over SSH
        serve = self.server_command(ctx, server["model"], resolutions)
        return [UnitFile(self.server_unit, "systemd/trtllm-serve.service.j2", {
            **common, **server, "mpi": self._multi(ctx),
            "exec_start": self._launch(ctx, serve, server["environment"]) if self._multi(ctx) else serve})]

    def config_files(self, ctx: Context, secrets: Mapping[str, str | None], home: str) -> list[ConfigFile]:
        settings = ctx.settings
        files = []
        if ctx.is_head:
            # The fraction goes in the file's kv_cache_config too, not on the command line alone. Releases
            # before PR 9262 build each config of the file from the file's own keys and merge shallowly
            # (tensorrt_llm/llmapi/llm_utils.py update_llm_args_with_extra_dict:
            # `llm_args_dict["kv_cache_config"] = KvCacheConfig(**file's kv_cache_config)`, then
            # `llm_args = llm_args | llm_args_dict`): the file's kv_cache_config replaces the one
            # get_llm_args made from --kv_cache_free_gpu_memory_fraction, and the fraction falls back to
            # KvCacheConfig's own default -- on a DGX Spark's unified memory, not the 0.85 asked.
            # Said in both places it is the same value on every release, however it merges; the flag
            # stays (harmless, and what `ps` shows).
            files.append(ConfigFile(OPTIONS_FILE, "engines/trtllm-options.yaml.j2", {
                "host": ctx.host, "enable_block_reuse": None if settings.enable_prefix_caching is None
                else "true" if settings.enable_prefix_caching else "false",
                "free_gpu_memory_fraction": str(settings.gpu_memory_utilization)}))
        if not self._multi(ctx):
            return files
        key = secrets.get("mpi_ssh_key")
        nodes = ctx.cluster_addresses
        if not key or len(nodes) < ctx.nodes:
            # The gate's engine.nodes blocks this first; a forced run stops here.
            raise ValueError("the MPI key or a node's cluster address is missing (see engine.nodes)")
        if ctx.is_head:
            per_node = self._per_node(ctx)
            files += [
                ConfigFile(HOSTFILE, "engines/mpi-hostfile.j2", {"host": ctx.host, "nodes": [
                    (nodes[name], per_node) for name in ctx.cluster_order]}),
                ConfigFile(MPI_KNOWN_HOSTS, "engines/mpi-known-hosts.j2", {"host": ctx.host, "keys": [
                    (nodes[name], ctx.host_keys[name]) for name in ctx.cluster_order if name != ctx.host]}),
                ConfigFile(MPI_KEY, "", {}, mode=0o600, owner="service", content=key.strip() + "\n")]
        else:
            files.append(ConfigFile(f"{home}/.ssh/authorized_keys", "engines/mpi-authorized-keys.j2", {
                "host": ctx.host, "head": ctx.head_cluster_address, "cluster": ctx.cluster.name if ctx.cluster else "",
                "public_key": public_key(key)}, mode=0o600, owner="service"))
        return files

    def config_paths(self, home: str) -> tuple[str, ...]:
        return (OPTIONS_FILE, HOSTFILE, MPI_KNOWN_HOSTS, MPI_KEY, f"{home}/.ssh/authorized_keys")

    def verify_modules(self, requirements: Sequence[str], wheels: Sequence[str]) -> list[str]:
        names = [req.lower().replace("-", "_") for req in requirements] + [
            name.rsplit("/", 1)[-1].lower() for name in wheels]
        return ["tensorrt_llm"] if any(name.startswith("tensorrt_llm") for name in names) else []

    def user_shell(self, ctx: Context) -> str:
        # mpirun's ssh runs orted through the user's shell on each worker: nologin would refuse it.
        return "/bin/sh" if self._multi(ctx) and not ctx.is_head else "/usr/sbin/nologin"

    def support(self, ctx: Context) -> Verdict | None:
        if ctx.profile.gpu is None:
            return Verdict(FAIL, "TensorRT-LLM runs on NVIDIA GPUs only; this profile has none",
                           "serve this host with engine: vllm or llamacpp", {"profile": ctx.profile.name})
        capability = ctx.profile.gpu.compute_capability
        seen = sorted({gpu.compute_cap for gpu in ctx.facts.gpus or () if gpu.compute_cap})
        capability = seen[0] if seen else capability
        if capability not in GPUS:
            return Verdict(FAIL, f"TensorRT-LLM's PyTorch backend does not list compute capability {capability}",
                           f"serve this host with engine: vllm ({SUPPORT_DOC})", {"compute_capability": capability})
        family = "hopper" if capability.startswith("9.") else "blackwell"
        quantization = ctx.quantization
        evidence = {"compute_capability": capability, "gpu": GPUS[capability], "quantization": quantization,
                    "source": SUPPORT_DOC}
        if quantization is None:
            return Verdict(WARN, f"{GPUS[capability]} is supported; the checkpoint's quantization is unknown "
                                 "(the hub was not asked)", f"check the checkpoint against {SUPPORT_DOC}", evidence)
        if quantization not in QUANTIZATIONS[family]:
            return Verdict(FAIL, f"TensorRT-LLM has no {quantization} kernels for {GPUS[capability]}",
                           f"serve an NVFP4 or FP8 checkpoint (ModelOpt) on Blackwell, or serve this one with "
                           f"engine: vllm ({SUPPORT_DOC})", evidence)
        return Verdict(PASS, f"{GPUS[capability]} with a {quantization} checkpoint", None, evidence)

    def nodes(self, ctx: Context) -> Verdict | None:
        if ctx.nodes < 2:
            return None
        evidence = {"nodes": ctx.nodes, "ranks": ctx.parallel, "source": SPARK_PAIR_DOC}
        if not ctx.mpi_key_set:
            return Verdict(FAIL, "a multi-node TensorRT-LLM cluster starts its ranks over SSH: the cluster "
                                 "needs an MPI key", "make one (ssh-keygen -t ed25519 -N '' -f mpi_key) and put the "
                                 "private key in the inventory's secrets file as mpi_ssh_key", evidence)
        addresses = ctx.cluster_addresses
        missing = [name for name in ctx.cluster_order if name not in addresses]
        if missing:
            return Verdict(FAIL, f"no address on the cluster network for {', '.join(missing)}",
                           "see cluster.network", evidence)
        unknown = [name for name in ctx.cluster_order if name != ctx.cluster_head and name not in ctx.host_keys]
        if unknown:
            return Verdict(FAIL, f"the SSH host key of {', '.join(unknown)} could not be read: mpirun checks it",
                           f"make /etc/ssh/ssh_host_ed25519_key.pub readable on those nodes (see `{hints.command('facts')}`)",
                           evidence)
        return Verdict(PASS, f"{ctx.nodes} nodes, {ctx.parallel} ranks: mpirun on the head over SSH, host keys "
                             f"checked ({SPARK_PAIR_DOC})", None, evidence)


def public_key(private_key: str) -> str:
    """The OpenSSH public line of an OpenSSH private key (ed25519, ECDSA or RSA), as ssh-keygen -y says it."""
    import io

    import paramiko

    errors = []
    for kind in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            key = kind.from_private_key(io.StringIO(private_key))
        except (paramiko.SSHException, ValueError) as exc:
            errors.append(str(exc))
            continue
        return f"{key.get_name()} {key.get_base64()}"
    raise ValueError("mpi_ssh_key is not an unencrypted OpenSSH private key")


TRTLLM = TrtLlm()
ENGINE = TRTLLM  # provision.engines finds each engine's module by its catalog name
