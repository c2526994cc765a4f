"""After the whole suite: the lab the README's first command booted is as that command left it.

Runs last (marker lab_last). Every module whose tests change cpu-1 restores it (tests/lab/conftest.py);
this checks the sum of them: the plan for lab-cpu changes nothing and its server is healthy.
"""
from __future__ import annotations

import json

import pytest

from provision import inventory
from tests.lab.conftest import on_host, run_invoke

pytestmark = [pytest.mark.lab, pytest.mark.lab_last]


def test_the_suite_leaves_lab_cpu_planning_no_changes_and_healthy(lab_inventory: inventory.Inventory) -> None:
    installed = on_host(lab_inventory, "cpu-1", ["systemctl", "show", "-p", "LoadState", "vllm.service"]).strip()
    if installed != "LoadState=loaded":
        pytest.skip("lab-cpu was never deployed in this run (a subset of the suite): nothing to compare")
    planned = run_invoke("plan", "--cluster", "lab-cpu", "--json")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert json.loads(planned.stdout)["hosts"]["cpu-1"]["changes"] == [], planned.stdout
    found = run_invoke("status", "--cluster", "lab-cpu", "--json")
    assert found.returncode == 0, found.stdout + found.stderr
    host = json.loads(found.stdout)["hosts"]["cpu-1"]
    assert host["healthy"] and host["model"] == "tiny-llama", host
