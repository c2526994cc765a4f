"""Faults of a server, on cpu-2's llama.cpp server (it dies and starts in a second): a crash loop is
stopped by the unit's bound, status says so, and the next good run converges."""
from __future__ import annotations

import json
import time

import pytest

from provision import inventory
from tests.lab.conftest import on_host, run_invoke

pytestmark = [pytest.mark.lab, pytest.mark.lab_group("lab-b")]


def unit(inv: inventory.Inventory) -> dict[str, str]:
    text = on_host(inv, "cpu-2", ["systemctl", "show", "-p", "ActiveState,NRestarts,Result", "llama-server.service"])
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def test_a_crash_looping_server_is_stopped_by_its_bound_and_status_says_so(lab_llama: inventory.Inventory) -> None:
    # cpu-2's llama.cpp server, given a flag it refuses, dies at every start, at once, the way a storm
    # would go without the bound (the bound is the unit's, whatever the engine).
    done = run_invoke("provision", "--cluster", "lab-llama", "--set", 'extra_args=["--no-such-flag"]')
    assert done.returncode == 0, done.stdout + done.stderr  # provision does not wait for readiness; deploy does
    deadline = time.monotonic() + 600
    state = unit(lab_llama)
    while time.monotonic() < deadline and state["ActiveState"] != "failed":
        time.sleep(5)
        state = unit(lab_llama)
    assert state["ActiveState"] == "failed" and state["Result"] == "exit-code", state
    restarts = int(state["NRestarts"])
    assert 1 <= restarts <= 5  # StartLimitBurst=5 in 600 s: the loop ends, it does not storm
    time.sleep(15)
    assert unit(lab_llama) == state  # and stays ended
    found = run_invoke("status", "--cluster", "lab-llama", "--json")
    host = json.loads(found.stdout)["hosts"]["cpu-2"]
    assert found.returncode == 1 and host["unit"]["active"] == "failed" and host["unit"]["restarts"] == restarts
    # Shown since it stopped: when its last process ended, not the last start systemd keeps.
    ended = on_host(lab_llama, "cpu-2", ["systemctl", "show", "-p", "ExecMainExitTimestamp,ActiveEnterTimestamp",
                                         "llama-server.service"])
    times = dict(line.split("=", 1) for line in ended.splitlines() if "=" in line)
    assert host["unit"]["since"] == times["ExecMainExitTimestamp"], (host["unit"], times)
    # The next run with the good configuration converges (start clears the start limit).
    fixed = run_invoke("deploy", "--cluster", "lab-llama", "--timeout", "420", "--json")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert unit(lab_llama)["ActiveState"] == "active"
