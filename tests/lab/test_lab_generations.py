"""Generations in the lab: a rejected deploy is never a rollback target, the previous state comes back
whole (units' enablement and activity included), "ready" is about what this run applied, a run that
waited for the lock applies nothing already in place, a killed deploy is finished by the next one.

Generations are the tool's, not the engine's: these run on cpu-2's llama.cpp server, which starts in a
second where vLLM's CPU build takes half a minute, and they restart the server a dozen times. The one
that needs a readiness long enough for another run to change the host meanwhile gets it from a
server that never becomes ready. cpu-2 is put back afterwards (its plan changes nothing)."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import pytest

from provision import inventory, render
from provision.engines.llamacpp import DEFAULT_SLOTS
from provision.ops import LOCK
from tests.conftest import REPO
from tests.lab.conftest import invoke_json, on_host, run_invoke

pytestmark = [pytest.mark.lab, pytest.mark.lab_group("lab-b")]

STATE = "/var/lib/provision/generations/state.json"


@dataclass(frozen=True)
class Served:
    """A lab host serving one cluster: its unit, and how max_model_len shows in the unit's ExecStart."""

    host: str
    cluster: str
    unit: str
    context_flag: str
    slots: int = 1  # the sequences that flag's context is for: llama-server's --ctx-size is all its slots'

    def context(self, max_model_len: int) -> str:
        return f"{self.context_flag} {max_model_len * self.slots}"


LLAMA = Served("cpu-2", "lab-llama", "llama-server.service", "--ctx-size", DEFAULT_SLOTS)
BOGUS = 'extra_args=["--no-such-flag"]'  # llama-server exits at start: "error: invalid argument"
# llama-server (LLAMA_ARG_API_PREFIX, its --api-prefix) then serves every path under /never only: up, and its
# /health, where the readiness gate asks, answers 404.
NEVER_READY = "environment={LLAMA_ARG_API_PREFIX: /never}"


def generations(inv: inventory.Inventory, served: Served) -> dict:
    return json.loads(on_host(inv, served.host, ["cat", STATE]))


def current(inv: inventory.Inventory, served: Served) -> dict:
    state = generations(inv, served)
    return next(g for g in state["generations"] if g["id"] == state["current"])


def unit(inv: inventory.Inventory, served: Served) -> tuple[str, str, str]:
    text = on_host(inv, served.host, ["systemctl", "show", "-p", "UnitFileState,ActiveState,ExecStart", served.unit])
    values = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    return values["UnitFileState"], values["ActiveState"], values["ExecStart"]


def wait_for_pending(inv: inventory.Inventory, after: int, served: Served, limit: float = 300) -> dict:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            now = current(inv, served)
        except (json.JSONDecodeError, StopIteration):
            now = {}
        if now.get("id", 0) > after and now.get("state") == "pending":
            return now
        time.sleep(0.2)
    pytest.fail("the deploy never recorded its pending generation")


def test_good_rejected_good_then_rollback_restores_a_good_one(lab_llama: inventory.Inventory) -> None:
    deploy = ["deploy", "--cluster", LLAMA.cluster, "--timeout", "420"]
    code, changed, text = invoke_json(*deploy, "--set", "max_model_len=200")
    assert code == 0, text
    # A changed value: one restart, gated on /health and a real completion, with the time it took.
    (row,) = changed["hosts"]
    assert row["state"] == "ready" and row["ready_s"] is not None and "apply" in row["steps_s"], row
    assert any(f"restart {LLAMA.unit}" in change for change in row["planned"]), row["planned"]
    good = current(lab_llama, LLAMA)
    assert good["state"] == "good"
    code, report, text = invoke_json(*deploy, "--set", BOGUS)
    assert code == 1 and report["hosts"][0]["state"] == "rolled back", text
    assert f"rolled back to generation {good['id']}" in report["hosts"][0]["detail"]
    assert unit(lab_llama, LLAMA)[:2] == ("enabled", "active")  # as it was before the deploy
    code, _, text = invoke_json(*deploy)
    assert code == 0, text
    code, listing, text = invoke_json("rollback", "--host", LLAMA.host, "--list")
    assert code == 0, text
    rows = listing["hosts"][LLAMA.host]["generations"][-3:]
    assert [(row["state"], row["target"]) for row in rows] == [("good", True), ("rejected", False), ("good", False)]
    assert rows[0]["id"] == good["id"] and rows[-1]["current"]  # the current one runs: no rollback target
    assert rows[0]["default"] and listing["hosts"][LLAMA.host]["default"] == good["id"]
    # The rejected generation is never restored: rollback goes to the good one before the current.
    code, rolled, text = invoke_json("rollback", "--host", LLAMA.host)
    assert code == 0 and rolled["hosts"][LLAMA.host]["to"] == good["id"], text
    _state, _active, start = unit(lab_llama, LLAMA)
    assert LLAMA.context(200) in start and "--no-such-flag" not in start
    code, found, text = invoke_json(*deploy, "--set", "max_model_len=200")
    assert code == 0 and found["hosts"][0]["state"] == "ready", text  # the restored generation serves


def test_a_failed_deploy_leaves_a_stopped_enabled_unit_stopped_and_enabled(lab_llama: inventory.Inventory) -> None:
    deploy = ["deploy", "--cluster", LLAMA.cluster, "--timeout", "420"]
    assert invoke_json(*deploy)[0] == 0
    on_host(lab_llama, LLAMA.host, ["systemctl", "stop", LLAMA.unit])
    code, report, text = invoke_json(*deploy, "--set", BOGUS)
    assert code == 1 and report["hosts"][0]["state"] == "rolled back", text
    assert unit(lab_llama, LLAMA)[:2] == ("enabled", "inactive")


def test_a_run_during_a_deploys_readiness_waits_for_its_verdict_or_is_refused_naming_it(
        lab_llama: inventory.Inventory) -> None:
    """The deploy holds the host's roll lock from its apply through its readiness verdict: a provision
    meanwhile changes nothing then (its apply would make "ready" about another run's files). Without
    --wait it is refused naming the deploy; with it, it applies once the deploy has given its verdict.
    The deploy's server never becomes ready (its API under another prefix), so its verdict comes at
    its timeout."""
    assert invoke_json("deploy", "--cluster", LLAMA.cluster, "--timeout", "420")[0] == 0
    before = current(lab_llama, LLAMA)["id"]
    deploy = subprocess.Popen([sys.executable, "-m", "invoke", "deploy", "--cluster", LLAMA.cluster, "--json",
                               "--set", "max_model_len=210", "--set", NEVER_READY, "--timeout", "20"], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pending = wait_for_pending(lab_llama, before, LLAMA)
        refused = run_invoke("provision", "--cluster", LLAMA.cluster, "--set", "max_model_len=220", "--json")
        waited = time.monotonic()
        meanwhile = run_invoke("provision", "--cluster", LLAMA.cluster, "--set", "max_model_len=220", "--wait", "120")
        waited = time.monotonic() - waited
        out, err = deploy.communicate(timeout=900)
    finally:
        deploy.kill()
    assert refused.returncode == 1, refused.stdout + refused.stderr
    said = json.loads(refused.stdout)["hosts"][LLAMA.host]["error"]
    assert "a deploy is rolling this host (run " in said and "deploy from " in said and "nothing done" in said, said
    assert meanwhile.returncode == 0, meanwhile.stdout + meanwhile.stderr
    assert deploy.returncode == 1, out + err
    row = json.loads(out)["hosts"][0]
    assert row["state"] == "rolled back", row  # its own verdict, on its own files: never ready
    assert generations(lab_llama, LLAMA)["generations"][-1]["id"] > pending["id"]
    assert next(g for g in generations(lab_llama, LLAMA)["generations"] if g["id"] == pending["id"])["state"] == "rejected"
    assert waited > 5, waited  # it waited for the deploy's verdict
    assert LLAMA.context(220) in unit(lab_llama, LLAMA)[2]  # the later run's config is what runs now


# Holds the host's provision lock until a file appears (then removes it): both runs plan while it is
# held, and both wait for it, whatever the order their processes start in.
HOLD_LOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
open(sys.argv[2] + ".held", "w").close()
while not os.path.exists(sys.argv[2]):
    time.sleep(0.1)
for path in (sys.argv[2], sys.argv[2] + ".held"):
    os.remove(path)
"""
# How many of the tool's host programs (`python3 -`, fed on stdin) run on the host now.
COUNT_PROGRAMS = """
import os
found = 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        found += open(f"/proc/{pid}/cmdline", "rb").read() == b"python3\\x00-\\x00"
    except OSError:
        pass
print(found)
"""
RELEASE = "/run/lock/provision-test-release"


def wait_on_host(inv: inventory.Inventory, argv: list[str], expected: str, limit: float = 300) -> None:
    deadline = time.monotonic() + limit
    while on_host(inv, LLAMA.host, argv).strip() != expected:
        assert time.monotonic() < deadline, f"{argv[-1] if argv else argv} never printed {expected}"
        time.sleep(0.2)


def test_two_identical_runs_that_wait_for_the_lock_apply_once(lab_llama: inventory.Inventory) -> None:
    assert invoke_json("deploy", "--cluster", LLAMA.cluster, "--timeout", "420")[0] == 0
    before = generations(lab_llama, LLAMA)
    argv = [sys.executable, "-m", "invoke", "provision", "--cluster", LLAMA.cluster, "--json", "--set", "port=8013",
            "--wait", "300"]
    holder = threading.Thread(target=on_host, args=(lab_llama, LLAMA.host, ["python3", "-c", HOLD_LOCK,
                                                                               LOCK, RELEASE]), daemon=True)
    holder.start()
    wait_on_host(lab_llama, ["python3", "-c", "import os, sys; print(os.path.exists(sys.argv[1]))",
                                 f"{RELEASE}.held"], "True")
    runs = [subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    try:
        wait_on_host(lab_llama, ["python3", "-c", COUNT_PROGRAMS], "2")  # both planned, both wait
    finally:
        on_host(lab_llama, LLAMA.host, ["touch", RELEASE])
        holder.join(timeout=60)
    answers = [run.communicate(timeout=600) for run in runs]
    assert all(run.returncode == 0 for run in runs), answers
    applied = sorted(json.loads(out)["hosts"][LLAMA.host]["applied"] for out, _ in answers)
    assert applied[0] == 0 and applied[1] > 0  # the second found everything in place after waiting
    after = generations(lab_llama, LLAMA)
    made = {g["id"] for g in after["generations"]} - {g["id"] for g in before["generations"]}
    assert made == {after["current"]}  # one new generation (older ones may be pruned beyond ten)
    # The last-known-good is still the version before: a rollback restores port 8000.
    code, rolled, text = invoke_json("rollback", "--host", LLAMA.host)
    assert code == 0 and rolled["hosts"][LLAMA.host]["to"] == before["current"], text
    assert "--port 8000" in unit(lab_llama, LLAMA)[2]


def killed_while_pending(inv: inventory.Inventory, args: list[str], after: int) -> dict:
    """Start the tool with `args` and kill it once its generation (newer than `after`) is pending:
    that generation's summary."""
    killed = subprocess.Popen([sys.executable, "-m", "invoke", *args], cwd=REPO,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return wait_for_pending(inv, after, LLAMA)
    finally:
        killed.kill()
        killed.wait()


def test_a_killed_deploy_is_finished_by_the_next_run(lab_llama: inventory.Inventory) -> None:
    assert invoke_json("deploy", "--cluster", LLAMA.cluster, "--timeout", "420")[0] == 0
    good = current(lab_llama, LLAMA)
    # The deploy is killed while its readiness waits. A server that exits is read at once, so this
    # change must keep the server up and never ready: llama-server reads an API prefix from its
    # environment and then answers /health only under it (NEVER_READY).
    args = ["deploy", "--cluster", LLAMA.cluster, "--set", NEVER_READY, "--timeout", "10"]
    pending = killed_while_pending(lab_llama, args, good["id"])
    assert "LLAMA_ARG_API_PREFIX" in on_host(lab_llama, LLAMA.host, ["cat", render.ENV_FILE])  # the change is in place
    time.sleep(max(0.0, pending["deadline"] - time.time()) + 1)  # its readiness deadline has passed
    planned = run_invoke("plan", *args[1:4])
    assert f"generation {pending['id']} was left pending by a deploy that stopped" in planned.stdout
    code, report, text = invoke_json(*args[:-2], "--timeout", "10")  # the same deploy again
    assert code == 1, text
    row = report["hosts"][0]
    assert row["state"] == "rolled back" and f"rolled back to generation {good['id']}" in row["detail"], row
    assert "LLAMA_ARG_API_PREFIX" not in on_host(lab_llama, LLAMA.host, ["cat", render.ENV_FILE])


def test_a_killed_deploy_whose_change_serves_is_promoted_by_the_next_run_at_once(lab_llama: inventory.Inventory) -> None:
    """Killed during its readiness, a deploy leaves its generation pending with a deadline minutes
    ahead. Its roll lock went with its connection: the next deploy, holding it, gives the verdict at
    once (no waiting out the deadline), and no generation is left pending."""
    assert invoke_json("deploy", "--cluster", LLAMA.cluster, "--timeout", "420")[0] == 0
    good = current(lab_llama, LLAMA)
    args = ["deploy", "--cluster", LLAMA.cluster, "--set", "max_model_len=200", "--timeout", "300"]
    pending = killed_while_pending(lab_llama, args, good["id"])
    assert pending["deadline"] > time.time() + 60
    code, report, text = invoke_json(*args)  # the same deploy again: its change is in place
    assert code == 0, text
    row = report["hosts"][0]
    assert row["state"] == "ready" and row["changes"] == 0, row
    assert row["detail"].startswith(f"generation {pending['id']} ({len(pending['changes'])} change(s), left "
                                    "unfinished by a deploy of"), row
    state = generations(lab_llama, LLAMA)
    assert [g["id"] for g in state["generations"] if g["state"] == "pending"] == [], state
    assert state["current"] == pending["id"] and current(lab_llama, LLAMA)["state"] == "good"
    assert invoke_json("deploy", "--cluster", LLAMA.cluster, "--timeout", "420")[0] == 0  # back as the inventory has it
