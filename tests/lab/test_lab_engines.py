"""Engines in the lab: cpu-1 switched between vLLM and llama.cpp (llama.cpp's own server on cpu-2:
test_lab_engines_llama.py).

cpu-1 is switched to llama.cpp by `deploy --set engine=llamacpp ...`: vLLM's unit is stopped and its
file removed; a switch whose new server fails is rolled back by the deploy itself; `invoke rollback`
brings vLLM back after a good one. The module leaves cpu-1 as the inventory says, and checks it.
"""
from __future__ import annotations

import json

import pytest

from provision import inventory, lab
from tests.lab.conftest import invoke_json, on_host, run_invoke

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("restores_lab_cpu")]

# cpu-1 on llama.cpp: the lab's GGUF, the same registry build as lab-llama, none of vLLM's arguments.
TO_LLAMA = ["--set", "engine=llamacpp", "--set", "model=lab/tiny-gguf", "--set", "served_model_name=tiny-gguf",
            "--set", f"venv_source={lab.LLAMA_CPP_SOURCE}", "--set", "engine_spec=null", "--set", "extra_args=[]",
            "--set", f"build_cmake_args={json.dumps(list(lab.LLAMA_CPP_LAB_CMAKE_ARGS))}"]


def unit_state(inv: inventory.Inventory, host: str, unit: str) -> tuple[str, bool]:
    """(is-active, whether the unit file exists) of a unit on a lab host."""
    active = on_host(inv, host, ["systemctl", "is-active", unit]).strip()
    path = f"/etc/systemd/system/{unit}"
    return active, on_host(inv, host, ["stat", "--format=%n", path]).strip() == path  # nothing when absent


@pytest.fixture(scope="module")
def both_served(the_lab: lab.Lab) -> inventory.Inventory:
    """cpu-1 on vLLM (lab-cpu), deployed and ready: the engine a switch starts from and comes back to."""
    code, report, text = invoke_json("deploy", "--cluster", "lab-cpu", "--timeout", "420", timeout=2400)
    assert code == 0 and report["hosts"][0]["state"] in ("ready", "unchanged"), text
    return inventory.load(the_lab.inventory)


def test_a_switch_whose_new_engine_fails_is_rolled_back_to_the_old(both_served: inventory.Inventory) -> None:
    # llama-server refuses an option it does not know: the new engine never becomes ready.
    code, report, text = invoke_json("deploy", "--cluster", "lab-cpu", *TO_LLAMA,
                                     "--set", 'extra_args=["--no-such-option"]', "--timeout", "120")
    (row,) = report["hosts"]
    assert code == 1 and row["state"] == "rolled back", text
    assert any("stop vllm.service" in change for change in row["planned"]), row["planned"]
    assert "the previous version is ready again" in row["detail"], row["detail"]
    assert unit_state(both_served, "cpu-1", "vllm.service") == ("active", True)
    assert unit_state(both_served, "cpu-1", "llama-server.service")[1] is False


def test_deploy_switches_engines_and_rollback_brings_the_old_one_back(both_served: inventory.Inventory) -> None:
    code, report, text = invoke_json("deploy", "--cluster", "lab-cpu", *TO_LLAMA, "--timeout", "300")
    (row,) = report["hosts"]
    assert code == 0 and row["state"] == "ready", text
    planned = row["planned"]
    assert any("stop vllm.service" in change for change in planned), planned
    assert any(change.startswith("remove /etc/systemd/system/vllm.service") for change in planned), planned
    assert any("start llama-server.service" in change for change in planned), planned
    assert unit_state(both_served, "cpu-1", "vllm.service") == ("inactive", False)
    assert unit_state(both_served, "cpu-1", "llama-server.service") == ("active", True)
    code, found, text = invoke_json("status", "--host", "cpu-1", *TO_LLAMA)
    assert code == 0 and found["hosts"]["cpu-1"]["model"] == "tiny-gguf", text
    # The generation before the switch comes back whole: vLLM's unit, venv and model, running.
    back = run_invoke("rollback", "--host", "cpu-1", timeout=600)
    assert back.returncode == 0, back.stdout + back.stderr
    assert unit_state(both_served, "cpu-1", "vllm.service") == ("active", True)
    assert unit_state(both_served, "cpu-1", "llama-server.service") == ("inactive", False)
