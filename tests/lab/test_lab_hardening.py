"""The sandbox on a real host: the served unit runs confined, `invoke check` shows systemd's score of the
installed unit, and an operator's drop-in that loosens it turns the finding into a warning."""
from __future__ import annotations

import json

import pytest

from provision import hardening, inventory, lab
from tests.lab.conftest import on_host, run_invoke
from tests.test_render import EXPOSURE

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("restores_lab_cpu")]

DROP_IN_DIR = "/etc/systemd/system/vllm.service.d"
# What an operator might add to profile the GPU (Nsight Compute's counters want CAP_SYS_ADMIN).
LOOSENING = "[Service]\nCapabilityBoundingSet=CAP_SYS_ADMIN\nAmbientCapabilities=CAP_SYS_ADMIN\n" \
            "ProtectKernelTunables=no\nProtectProc=default\nRestrictNamespaces=no\n"


def unit_security(host: str) -> dict:
    done = run_invoke("check", "--host", host, "--json")
    report = json.loads(done.stdout)
    return next(f for f in report["hosts"][host]["findings"] if f["id"] == "unit.security")


def test_the_served_unit_is_confined_scored_on_the_host_and_a_loosening_drop_in_warns(
        the_lab: lab.Lab, lab_inventory: inventory.Inventory) -> None:
    done = run_invoke("deploy", "--cluster", "lab-cpu", "--json", "--timeout", "420")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    shown = on_host(lab_inventory, "cpu-1", ["systemctl", "show", "-p",
                                             "ActiveState,PrivateDevices,ProtectProc,UMask", "vllm.service"])
    for setting in ("ActiveState=active", "PrivateDevices=yes", "ProtectProc=invisible", "UMask=0077"):
        assert setting in shown, shown
    found = unit_security("cpu-1")
    assert (found["severity"], found["status"]) == ("info", "pass"), found
    # The host's systemd scores the installed unit as the unit test scores the golden one.
    assert found["evidence"]["units"]["vllm.service"]["exposure"] == EXPOSURE[("cpu-tiny-llama", "vllm.service")][2]
    assert found["evidence"]["target"] == hardening.EXPOSURE_TARGETS["default"]
    try:
        on_host(lab_inventory, "cpu-1", ["mkdir", "-p", DROP_IN_DIR])
        on_host(lab_inventory, "cpu-1", ["tee", f"{DROP_IN_DIR}/profiling.conf"], stdin=LOOSENING)
        loosened = unit_security("cpu-1")
    finally:
        on_host(lab_inventory, "cpu-1", ["rm", "-rf", DROP_IN_DIR])
    assert (loosened["severity"], loosened["status"]) == ("warning", "fail"), loosened
    assert loosened["evidence"]["units"]["vllm.service"]["exposure"] > hardening.EXPOSURE_TARGETS["default"]
