"""vLLM (the default engine): `python -m vllm.entrypoints.openai.api_server`, multi-node over Ray.

Sources: shared facts section 5 (serve flags, endpoints, metrics, Ray); https://docs.vllm.ai/."""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from provision.engines.base import (
    KEY,
    LISTEN,
    MODEL,
    NAME,
    PASS,
    PORT,
    Engine,
    MetricNames,
    UnitFile,
    Verdict,
    closing_args,
)

if TYPE_CHECKING:
    from provision.context import Context

RAY_HEAD_UNIT = "vllm-ray-head.service"
RAY_WORKER_UNIT = "vllm-ray-worker.service"
RAY_PORT = 6379


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
    # V1 engine names first, then V0's where they differ.
    metrics = MetricNames(
        running=("vllm:num_requests_running",), waiting=("vllm:num_requests_waiting",),
        generated=("vllm:generation_tokens_total",), prompted=("vllm:prompt_tokens_total",),
        kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        prefix_hits=("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
        prefix_queries=(("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),),
        cache_info="vllm:cache_config_info")

    def server_command(self, ctx: Context, model: str, resolutions: Sequence[str]) -> list[str]:
        settings = ctx.settings
        venv = settings.venv_dir.rstrip("/")
        args = [f"{venv}/bin/python", "-m", "vllm.entrypoints.openai.api_server",
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
        if link is not None:  # Ray and vLLM pick the node's address and interface from these
            for name in ("VLLM_HOST_IP", "RAY_NODE_IP_ADDRESS", "RAY_OVERRIDE_NODE_IP_ADDRESS"):
                environment[name] = link.address
            for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
                environment[name] = link.interface
        return environment

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
        if ctx.nodes < 2:
            return None
        return Verdict(PASS, f"{ctx.nodes} nodes over Ray (a head unit, worker units, then the server)")


VLLM = Vllm()
