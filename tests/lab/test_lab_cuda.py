"""The driver against the CUDA the venv really holds, and CUDA-specific wheels from a package index.

ws-575 replays a 2x RTX 5090 workstation on driver 575.51.03 whose venv holds a torch built for CUDA
13.0. ws-5090 (driver 570.133.07) resolves a stand-in torch from the lab hub's per-variant indexes
(PEP 503, like PyTorch's `…/whl/cu130`) through the inventory's pip settings. Nothing is applied: these
are check and plan runs, and no host is changed.
"""
from __future__ import annotations

import json

import pytest

from provision import lab
from tests.lab.conftest import run_invoke

pytestmark = [pytest.mark.lab, pytest.mark.lab_group("lab-b")]


@pytest.fixture(scope="module")
def old_driver_host(the_lab: lab.Lab) -> str:
    the_lab.up(["ws-575"], progress=lambda line: None)
    return "ws-575"


def index_settings(the_lab: lab.Lab, variant: str, cuda_version: str, spec: str = "torch==2.9.0") -> list[str]:
    trusted = the_lab.hub_url.split("//", 1)[1]
    return ["--set", f"engine_spec={spec}", "--set", f"cuda_version={cuda_version}",
            "--set", f"pip_index_url={the_lab.index_url(variant)}",
            "--set", f'pip_trusted_hosts=["{trusted}"]']


def test_gate_blocks_a_venv_built_for_cuda_13_on_a_575_driver(old_driver_host: str) -> None:
    done = run_invoke("check", "--host", old_driver_host, "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["blocked"] == [old_driver_host]
    driver = {f["id"]: f for f in report["hosts"][old_driver_host]["findings"]}["driver.version"]
    assert driver["status"] == "fail" and driver["severity"] == "blocker"
    assert "575.51.03" in driver["message"] and "CUDA 13.0" in driver["message"]
    assert driver["evidence"]["minimum"] == "580.65.06"
    assert driver["evidence"]["cuda_from"].startswith("the venv's torch 2.11.0+cu130")


def test_plan_gates_the_wheels_about_to_be_installed(the_lab: lab.Lab) -> None:
    # cu130 wheels on a 570 driver: blocked at plan time, naming the wheel that decided.
    done = run_invoke("plan", "--host", "ws-5090", "--json", *index_settings(the_lab, "cu130", "13.0"))
    assert done.returncode == 1, done.stdout + done.stderr
    body = json.loads(done.stdout)["hosts"]["ws-5090"]
    assert body["verdict"] == "blocked" and "changes" not in body
    (blocker,) = [b for b in body["blockers"] if b["id"] == "driver.version"]
    assert blocker["evidence"]["cuda_from"] == "wheels to install: torch-2.9.0+cu130-py3-none-any.whl"
    # `check` sees the same: the gate runs on the wheels a provision would install.
    done = run_invoke("check", "--host", "ws-5090", "--json", *index_settings(the_lab, "cu130", "13.0"))
    assert done.returncode == 1 and json.loads(done.stdout)["blocked"] == ["ws-5090"], done.stdout
    # cu128 wheels run on it: the plan installs the venv from them.
    done = run_invoke("plan", "--host", "ws-5090", "--json", *index_settings(the_lab, "cu128", "12.8"))
    assert done.returncode == 0, done.stdout + done.stderr
    body = json.loads(done.stdout)["hosts"]["ws-5090"]
    assert any(c["kind"] == "venv" for c in body["changes"])


def test_wheels_the_driver_runs_replace_a_venv_it_cannot(old_driver_host: str, the_lab: lab.Lab) -> None:
    # ws-575's venv is cu130, which its driver cannot run; cu129 wheels about to replace it can.
    # It belongs to no cluster of the lab's: the model its twin ws-5090 serves, placed by hand (no fetch).
    served = ("--set", "model=Qwen/Qwen2.5-32B-Instruct-AWQ", "--set", "fetch_weights=false")
    done = run_invoke("plan", "--host", old_driver_host, "--json", *served, *index_settings(the_lab, "cu129", "12.9"))
    assert done.returncode == 0, done.stdout + done.stderr
    body = json.loads(done.stdout)["hosts"][old_driver_host]
    assert body["verdict"] != "blocked" and any(c["kind"] == "venv" for c in body["changes"])


def test_a_resolved_torch_of_another_build_is_refused_with_the_index_to_use(the_lab: lab.Lab) -> None:
    # A range is not rewritten: the index serves a cu130 build while the host is set for cu128.
    # (An open range would meet whatever else the controller's own pip configuration offers.)
    done = run_invoke("plan", "--host", "ws-5090", "--json",
                      *index_settings(the_lab, "cu130", "12.8", spec="torch>=2.9,<2.10"))
    assert done.returncode == 1, done.stdout + done.stderr
    error = json.loads(done.stdout)["hosts"]["ws-5090"]["error"]
    assert "resolved torch 2.9.0+cu130 (a CUDA 13.0 build" in error
    assert "needs the cu128 build" in error and "https://download.pytorch.org/whl/cu128" in error
