"""`invoke check` over SSH on lab hosts playing failing configurations (the good ones:
test_lab_check_gate.py), and lab.up forgetting a host that stopped running."""
from __future__ import annotations

import json
import subprocess

import pytest

from provision import inventory, lab
from tests.lab.conftest import run_invoke

pytestmark = [pytest.mark.lab, pytest.mark.lab_group("lab-b")]


@pytest.fixture(scope="module")
def broken_host(the_lab: lab.Lab) -> str:
    the_lab.up(["ws-broken"], progress=lambda line: None)
    return "ws-broken"


def by_id(report: dict, host: str) -> dict[str, dict]:
    return {finding["id"]: finding for finding in report["hosts"][host]["findings"]}


def test_failing_workstation_is_blocked_with_the_right_findings(broken_host: str) -> None:
    done = run_invoke("check", "--cluster", "lab-broken", "--json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["blocked"] == ["ws-broken"]
    found = by_id(report, "ws-broken")
    failing = {rule for rule, finding in found.items() if finding["status"] == "fail"}
    assert failing == {"kernel.version", "driver.flavour", "gpu.count", "disk.space", "config.dmabuf"}
    assert found["kernel.version"]["evidence"] == {"kernel": "6.8.0-45-generic", "minimum": "6.14"}
    assert found["gpu.count"]["evidence"]["gpus"] == 1
    small = found["disk.space"]["evidence"]
    assert all(entry["free_gib"] < 1 for entry in small.values())  # the 64 MiB filesystems, read for real


def test_forcing_every_blocker_lets_it_pass_but_keeps_them_in_the_report(broken_host: str) -> None:
    forced = ["kernel.version", "driver.flavour", "gpu.count", "disk.space", "config.dmabuf"]
    args = [arg for rule in forced for arg in ("--force", rule)]
    done = run_invoke("check", "--host", "ws-broken", "--json", *args)
    assert done.returncode == 0, done.stdout
    found = by_id(json.loads(done.stdout), "ws-broken")
    assert {rule for rule, f in found.items() if f["status"] == "forced"} == set(forced)


def test_unknown_force_id_is_bad_usage(the_lab: lab.Lab) -> None:
    done = run_invoke("check", "--host", "ws-broken", "--force", "kernel.versoin")
    assert done.returncode == 2 and "unknown checks: kernel.versoin" in done.stderr




def test_a_host_that_stopped_running_is_forgotten_by_the_next_lab_up(broken_host: str, the_lab: lab.Lab) -> None:
    """A lab left recorded across a reboot of this machine (or a killed run) must not hand the tool an
    inventory naming hosts that refuse connections: the next `lab.up` forgets what no longer runs."""
    record = the_lab.state()["hosts"][broken_host]
    for pid in lab._nspawn_pids(f"plab-{broken_host}"):
        lab._terminate(pid)
    said: list[str] = []
    try:
        # Another host of this group's asked for (the default hosts are the other group's, which may
        # have one cut off this moment): the stopped one, not asked for, is forgotten.
        the_lab.up(["ws-575"], progress=said.append)
        written = inventory.load(the_lab.inventory)
        assert broken_host not in written.hosts and "lab-broken" not in written.clusters
        assert broken_host not in the_lab.state()["hosts"]
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
        assert record["netns"] not in netns.split()
        assert any(line.startswith(f"{broken_host} was recorded but no longer runs") for line in said), said
    finally:
        the_lab.up([broken_host], progress=lambda line: None)  # back as the module's fixture left it
    assert broken_host in inventory.load(the_lab.inventory).hosts
