"""SGLang: `python -m sglang.launch_server` (what `sglang serve` runs) from the service venv, on one node.

What the tool renders is judged by SGLang's own argument parsing (tests/test_sglang.py runs
prepare_server_args from the pinned release's files); the flags, their releases and the metric names are
rows of engine_contracts.yaml read from its source (sglang/srt/server_args.py, arg_groups/fields/*.py,
observability/metrics_collector.py at 0.5.23). Sources: https://docs.sglang.io/.

The field's state the gate knows is data (known_issues.yaml, engine sglang): the kernels sglang-kernel
ships per architecture, GB10's among them.

No API key is given to it: SGLang reads one only from --api-key (argv, which the tool keeps free of
secrets) or a --config file, and 0.5.23 logs its whole configuration at start, the key in clear
(entrypoints/engine.py, `server_args=` of resolved_dict(): only watermark fields are redacted). The
catalog's `keyless` says so and the gate's config.api_key keeps it on loopback, behind an endpoint whose
router checks the key."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from provision import catalog
from provision.engines.base import FAIL, PASS, WARN, Engine, UnitFile, Verdict, closing_args

if TYPE_CHECKING:
    from provision.context import Context

# Checkpoint formats (config.json quantization_config.quant_method) SGLang 0.5.23 loads, by the GPU's
# compute capability family (--quantization's choices, sglang/srt/arg_groups/fields/model.py; the
# kernels sglang-kernel 0.4.10 carries: sm_90/90a, sm_100, sm_120a and, on aarch64, sm_121a).
QUANTIZATIONS = ("none", "awq", "awq_marlin", "gptq", "gptq_marlin", "fp8", "compressed-tensors", "modelopt",
                 "modelopt_fp4", "mxfp4", "w8a8_fp8", "w8a8_int8")
MINIMUM_CAPABILITY = (8, 0)  # sglang-kernel's oldest kernels: sm_80 (x86_64); its aarch64 build starts at sm_90


class Sglang(Engine):
    entry = catalog.ENGINES["sglang"]
    concurrency_flag = "--max-running-requests"  # engine_contracts.yaml; tune's space tries it

    def server_command(self, ctx: Context, model: str, resolutions: Sequence[str]) -> list[str]:
        settings = ctx.settings
        venv = settings.venv_dir.rstrip("/")
        args = [f"{venv}/bin/python", "-m", self.entrypoint(self.release(settings)),
                "--model-path", model,
                "--served-model-name", str(settings.served_model_name or settings.model),
                "--host", str(settings.bind_host), "--port", str(settings.port),
                "--tp-size", str(settings.tensor_parallel_size), "--pp-size", str(settings.pipeline_parallel_size),
                # Status and bench read /metrics, which SGLang serves only when asked.
                "--enable-metrics"]
        if ctx.profile.gpu is not None:
            args += ["--mem-fraction-static", str(settings.gpu_memory_utilization)]
        if settings.max_model_len:
            args += ["--context-length", str(settings.max_model_len)]
        if settings.enable_prefix_caching is False:  # unset or true: the radix cache, on by default
            args.append("--disable-radix-cache")
        return args + closing_args(settings, resolutions)

    def verify_modules(self, requirements: Sequence[str], wheels: Sequence[str]) -> list[str]:
        from provision import venv

        serves = any(venv.requirement_name(req) == self.entry.package for req in requirements)
        return ["sglang", "torch"] if serves else []

    def unit_files(self, ctx: Context, common: Mapping[str, Any], server: Mapping[str, Any],
                   resolutions: Sequence[str]) -> list[UnitFile]:
        return [UnitFile(self.server_unit, "systemd/sglang.service.j2", {
            **common, **server, "exec_start": self.server_command(ctx, server["model"], resolutions)})]

    def nodes(self, ctx: Context) -> Verdict | None:
        if ctx.nodes < 2:
            return None
        return Verdict(FAIL, f"the tool serves SGLang on one node; this cluster has {ctx.nodes} nodes",
                       "serve a multi-node cluster with engine: vllm (its own launch) or trtllm (MPI)",
                       {"nodes": ctx.nodes})

    def support(self, ctx: Context) -> Verdict | None:
        """The GPU must be one sglang-kernel has kernels for, and the checkpoint a format SGLang loads.
        The field's traps on particular hardware (GB10) are known issues of their own."""
        gpu = ctx.profile.gpu
        if gpu is None:
            return Verdict(FAIL, "SGLang's CPU backend needs a CPU build of sgl-kernel that no registry "
                                 "package provides: the tool serves SGLang on NVIDIA GPUs",
                           "serve this host with engine: vllm (its CPU build) or llamacpp",
                           {"source": "https://docs.sglang.io/platforms/cpu_server.html"})
        major, minor = (int(part) for part in gpu.compute_capability.split("."))
        if (major, minor) < MINIMUM_CAPABILITY:
            return Verdict(FAIL, f"compute capability {gpu.compute_capability}: sglang-kernel has no kernels "
                                 "below 8.0", "serve this GPU with engine: vllm or llamacpp",
                           {"compute_capability": gpu.compute_capability})
        quantization = ctx.quantization
        if quantization is not None and quantization not in QUANTIZATIONS:
            return Verdict(FAIL, f"the checkpoint's format {quantization} is not one SGLang loads",
                           "serve a checkpoint in a format SGLang loads (--quantization's choices), or engine: vllm",
                           {"quantization": quantization, "formats": list(QUANTIZATIONS)})
        if quantization is None:
            return Verdict(WARN, f"compute capability {gpu.compute_capability}; the checkpoint's format is not "
                                 "known yet (the model's config.json was not read)",
                           "let the hub be asked, or check the format by hand", {})
        return Verdict(PASS, f"compute capability {gpu.compute_capability}; checkpoint {quantization}")


SGLANG = Sglang()
ENGINE = SGLANG  # provision.engines finds each engine's module by its catalog name
