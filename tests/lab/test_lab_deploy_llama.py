"""What systemd and the roll do with a server that dies, on cpu-2's llama.cpp server (it starts in a
second, where vLLM's CPU build takes half a minute): the engine plays no part in either."""
from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision import inventory, lab
from tests.lab.conftest import group_inventory, invoke_json, on_host
from tests.lab.test_lab_provision import SNAPSHOT

pytestmark = [pytest.mark.lab, pytest.mark.lab_group("lab-b")]


def rolled(inv: inventory.Inventory, host: str) -> list[str]:
    """What a roll changes on a host it reaches, from provision's SNAPSHOT: the service user, its
    environment, the units and their state. (A deploy stages weights and wheels on every host before
    it rolls, under /var/lib: those may be there.)"""
    kept = [line for line in on_host(inv, host, SNAPSHOT).splitlines() if "/var/lib/" not in line]
    return kept + on_host(inv, host, ["systemctl", "show", "-p", "ActiveState,NRestarts,InvocationID",
                                      "llama-server.service"]).splitlines()


def llama_unit_files(inv: inventory.Inventory) -> str:
    return on_host(inv, "cpu-2", ["sha256sum", "/etc/systemd/system/llama-server.service", "/etc/vllm/vllm.env"])


@pytest.fixture(scope="module")
def bystander(the_lab: lab.Lab, lab_llama: inventory.Inventory,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """cpu-3 up beside cpu-2, the host after cpu-2 in a roll that must stop at cpu-2: an inventory of
    the two without the endpoint they would form (test_lab_router.py's). cpu-3 is forgotten afterwards."""
    the_lab.up(["cpu-3"], progress=lambda line: None)
    yield group_inventory(the_lab, "lab-b", tmp_path_factory.mktemp("bystander"), endpoints=False)
    the_lab.remove(["cpu-3"])


def test_a_killed_server_is_restarted_by_systemd_and_status_shows_it(lab_llama: inventory.Inventory) -> None:
    # On cpu-2's llama.cpp server: systemd's restart and status's count are the engine's no more than
    # the roll below is, and it starts in a second where vLLM's CPU build takes half a minute.
    before = invoke_json("status", "--host", "cpu-2")[1]["hosts"]["cpu-2"]["unit"]["restarts"]
    on_host(lab_llama, "cpu-2", ["systemctl", "kill", "--signal=SIGKILL", "--kill-whom=main", "llama-server.service"])
    deadline = time.monotonic() + 120
    host: dict = {}
    while time.monotonic() < deadline:
        code, found, _ = invoke_json("status", "--host", "cpu-2")
        host = found.get("hosts", {}).get("cpu-2", {})
        if code == 0 and host.get("unit", {}).get("restarts") == before + 1:
            break
        time.sleep(2)
    assert host["unit"]["restarts"] == before + 1 and host["health"] == "ok", host


def test_a_broken_config_stops_the_roll_and_the_host_returns_to_what_worked(bystander: Path) -> None:
    inv = inventory.load(bystander)
    working, other = llama_unit_files(inv), rolled(inv, "cpu-3")
    code, report, text = invoke_json("deploy", "--inventory", str(bystander), "--host", "cpu-2", "--host", "cpu-3",
                                     "--timeout", "420",
                                     "--set", 'extra_args=["--no-such-flag"]')
    assert code == 1
    rows = {row["host"]: row for row in report["hosts"]}
    assert rows["cpu-2"]["state"] == "rolled back", text
    detail = rows["cpu-2"]["detail"]
    assert "crashed" in detail or "failed" in detail
    # llama-server's own refusal first, then how systemd saw it end; never systemd's cgroup notice.
    assert "error: invalid argument: --no-such-flag" in detail, detail
    assert "Failed to kill control group" not in detail
    if "Main process exited" in detail:
        assert detail.index("invalid argument") < detail.index("Main process exited"), detail
    assert rows["cpu-3"]["state"] == "not rolled"
    assert llama_unit_files(inv) == working  # the files this deploy wrote are back
    assert rolled(inv, "cpu-3") == other  # the roll never reached the host after it
    code, found, text = invoke_json("status", "--inventory", str(bystander), "--host", "cpu-2")
    assert code == 0 and found["hosts"]["cpu-2"]["health"] == "ok", text


def test_a_server_that_exits_with_status_zero_after_start_fails_the_deploy_within_seconds(
        lab_llama: inventory.Inventory, bystander: Path) -> None:
    """llama-server given --version prints its build and exits with status 0 right after its start, as
    vLLM's API server does once its engine died: the deploy says so at once (not after its timeout),
    with the exit status and the journal's own lines, and the host returns to what worked."""
    working = llama_unit_files(lab_llama)
    started = time.monotonic()
    code, report, text = invoke_json("deploy", "--inventory", str(bystander), "--host", "cpu-2", "--timeout", "420",
                                     "--set", 'extra_args=["--version"]')
    took = time.monotonic() - started
    assert code == 1, text
    row = {row["host"]: row for row in report["hosts"]}["cpu-2"]
    assert row["state"] == "rolled back", text
    assert "llama-server.service crashed after start (exit status 0" in row["detail"], row
    assert "version" in row["detail"].split("):", 1)[1], row  # llama-server's own line, from the journal
    assert took < 90, took  # seconds of readiness, not the 420 s timeout
    assert llama_unit_files(lab_llama) == working
