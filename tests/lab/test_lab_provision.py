"""provision, plan and rollback over SSH on lab hosts (units and environment; the venv comes later)."""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision import inventory, lab, remote, render
from tests.lab.conftest import group_inventory, on_host, run_invoke
from tests.lab.test_lab_serve import HEALTH

pytestmark = [pytest.mark.lab, pytest.mark.lab_group("lab-b")]

# Everything provision may touch, with content hashes, modes and owners: a host's fingerprint.
SNAPSHOT = ["sh", "-c", ("getent passwd vllm; for p in /etc/vllm /etc/systemd/system /var/lib/vllm "
                         "/var/lib/provision; do find $p -xdev -printf '%p %m %u:%g\\n' 2>/dev/null | sort; "
                         "find $p -xdev -type f -exec sha256sum {} + 2>/dev/null | sort; done; "
                         "systemctl show -p ActiveState,NRestarts,InvocationID vllm.service")]


@pytest.fixture(scope="module")
def broken(the_lab: lab.Lab) -> str:
    the_lab.up(["ws-broken"], progress=lambda line: None)
    return "ws-broken"


def test_provision_stops_at_the_gate_and_leaves_the_host_untouched(
        broken: str, lab_inventory: inventory.Inventory, the_lab: lab.Lab) -> None:
    inv = inventory.load(the_lab.inventory)
    before = on_host(inv, broken, SNAPSHOT)
    done = run_invoke("provision", "--cluster", "lab-broken")
    assert done.returncode == 1
    assert "blocked by the gate, nothing changed" in done.stdout
    assert "kernel.version" in done.stdout and "driver.flavour" in done.stdout
    assert on_host(inv, broken, SNAPSHOT) == before


@pytest.fixture
def clean_cpu3(the_lab: lab.Lab, tmp_path: Path) -> Iterator[Path]:
    """cpu-3 as the lab booted it: no service user, units, environment, wheels or kept versions; an
    inventory of this group's hosts without the endpoint cpu-2 and cpu-3 would form (its router host
    is refused until prepared: test_lab_router.py). cpu-3 is forgotten afterwards."""
    the_lab.up(["cpu-3"], progress=lambda line: None)
    path = group_inventory(the_lab, "lab-b", tmp_path, endpoints=False)
    inv = inventory.load(path)
    # A stopped server's last processes can linger a moment; userdel refuses a user that has any.
    script = ("systemctl disable --now llama-server.service 2>/dev/null; pkill -KILL -u vllm; sleep 1; "
              "rm -rf /etc/vllm /var/lib/vllm /var/lib/provision /opt/vllm /var/cache/provision "
              "/etc/systemd/system/llama-server.service; "
              "userdel -f vllm 2>/dev/null; systemctl daemon-reload; systemctl reset-failed; true")
    on_host(inv, "cpu-3", ["sh", "-c", script])
    yield path
    the_lab.remove(["cpu-3"])


def test_plan_changes_nothing_then_provision_creates_then_nothing_to_do(clean_cpu3: Path) -> None:
    # cpu-3 (lab-llama-b: llama.cpp's server, built from source, on the lab network with an API key).
    inv, given = inventory.load(clean_cpu3), ("--inventory", str(clean_cpu3))
    before = on_host(inv, "cpu-3", SNAPSHOT)
    planned = run_invoke("plan", "--host", "cpu-3", "--json", *given)
    assert planned.returncode == 0, planned.stderr
    changes = json.loads(planned.stdout)["hosts"]["cpu-3"]["changes"]
    kinds = [c["kind"] for c in changes]
    assert on_host(inv, "cpu-3", SNAPSHOT) == before  # plan is read-only
    assert kinds[:2] == ["user", "directory"] and "start" in kinds
    done = run_invoke("provision", "--host", "cpu-3", "--json", *given)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)["hosts"]["cpu-3"]
    assert report["applied"] == len(kinds)
    if any(c["kind"] == "venv" and c["target"] == "/opt/vllm/venv" for c in changes):
        assert report["push_bytes"] > 2**20  # a fresh host: the built server and its needs travelled
    modes = on_host(inv, "cpu-3", ["stat", "-c", "%n %a %U:%G", render.ENV_FILE,
                                   "/etc/systemd/system/llama-server.service", "/var/lib/vllm"])
    assert modes.splitlines() == [f"{render.ENV_FILE} 600 root:root",
                                  "/etc/systemd/system/llama-server.service 644 root:root",
                                  "/var/lib/vllm 750 vllm:vllm"]
    again = run_invoke("provision", "--host", "cpu-3", "--json", "--verbose", *given)
    assert json.loads(again.stdout)["hosts"]["cpu-3"]["changes"] == []
    executions = [line for line in again.stderr.splitlines() if "provision.remote: cpu-3:" in line]
    assert len(executions) == 1  # an unchanged host costs one round trip


def llama_unit_state(inv: inventory.Inventory) -> dict[str, str]:
    text = on_host(inv, "cpu-2", ["systemctl", "show", "-p", "ActiveState,InvocationID,NRestarts", "llama-server.service"])
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def answers_health(inv: inventory.Inventory, port: int, limit: float = 120) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if on_host(inv, "cpu-2", ["python3", "-"], stdin=HEALTH % port).strip() == "200":
            return True
        time.sleep(1)
    return False


def test_one_changed_value_changes_one_file_and_rollback_restores_it(lab_llama: inventory.Inventory) -> None:
    # On cpu-2's llama.cpp server: the files, the plan, the one restart and the rollback are the
    # tool's, and its restarts take a second where vLLM's take half a minute.
    assert run_invoke("provision", "--host", "cpu-2").returncode == 0
    unit = "/etc/systemd/system/llama-server.service"
    original = on_host(lab_llama, "cpu-2", ["cat", unit])
    served = llama_unit_state(lab_llama)
    changed = run_invoke("provision", "--host", "cpu-2", "--set", "port=8011", "--json")
    assert changed.returncode == 0, changed.stdout
    changes = json.loads(changed.stdout)["hosts"]["cpu-2"]["changes"]
    assert [(c["kind"], c["target"]) for c in changes][:2] == [("file", unit), ("daemon-reload", "systemd")]
    assert {c["target"] for c in changes if c["kind"] == "file"} == {unit}
    assert "--port 8011" in on_host(lab_llama, "cpu-2", ["cat", unit])
    # Restarted once, by the tool (not by systemd after a crash), and serving on the new port.
    assert [c["target"] for c in changes if c["kind"] == "restart"] == ["llama-server.service"], changes
    assert answers_health(lab_llama, 8011), "llama-server.service not healthy on port 8011"
    after = llama_unit_state(lab_llama)
    assert after["InvocationID"] != served["InvocationID"] and after["NRestarts"] == served["NRestarts"], (served, after)
    rolled = run_invoke("rollback", "--host", "cpu-2")
    assert rolled.returncode == 0 and unit in rolled.stdout
    assert on_host(lab_llama, "cpu-2", ["cat", unit]) == original


def test_a_second_run_fails_clearly_while_the_lock_is_held_then_waits(lab_llama: inventory.Inventory) -> None:
    # On cpu-2's llama.cpp server: the lock is the tool's, whatever the engine, and the two restarts
    # (another port, then back) take a second each where vLLM's take half a minute.
    assert run_invoke("provision", "--host", "cpu-2").returncode == 0  # converged: the next run only edits
    hold = ("import fcntl, os, time\nfd = os.open('/run/lock/provision.lock', os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\nos.ftruncate(fd, 0)\nos.write(fd, b'pid 4242 since test')\n"
            "time.sleep(20)\n")
    on_host(lab_llama, "cpu-2", ["systemd-run", "--unit=test-hold-lock", "--collect", "python3", "-c", hold])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # until the holder really holds it
        probe = on_host(lab_llama, "cpu-2", ["sh", "-c", "flock -n /run/lock/provision.lock true; echo $?"])
        if probe.strip() == "1":
            break
        time.sleep(0.3)
    else:
        pytest.fail("the test's lock holder never took the lock")
    blocked = run_invoke("provision", "--host", "cpu-2", "--set", "port=8012")
    assert blocked.returncode == 1, blocked.stdout
    assert "another provision holds /run/lock/provision.lock (pid 4242 since test)" in blocked.stderr + blocked.stdout
    waited = run_invoke("provision", "--host", "cpu-2", "--set", "port=8012", "--wait", "60")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert "--port 8012" in on_host(lab_llama, "cpu-2", ["cat", "/etc/systemd/system/llama-server.service"])
    back = run_invoke("provision", "--host", "cpu-2")  # back to the inventory's values
    assert back.returncode == 0, back.stdout + back.stderr


def test_rendered_units_pass_systemd_analyze_verify(the_lab: lab.Lab, tmp_path) -> None:
    """Every unit of the seed systems, verified by the real systemd of a lab host (pair-a: one of this
    group's, where nothing else uses /opt/vllm)."""
    from tests.test_render import seed_states
    the_lab.up(["pair-a"], progress=lambda line: None)
    inv = inventory.load(the_lab.inventory)
    runner = remote.SshRunner(inv.host("pair-a"), inv.ssh)
    made: list[str] = []
    try:
        assert runner.run(["python3", "-m", "venv", "/opt/vllm/venv"]).ok
        # ray's launcher would come with the venv; the verifier only needs an executable there.
        assert runner.run(["install", "-m", "0755", "/dev/null", "/opt/vllm/venv/bin/ray"]).ok
        runner.run(["useradd", "--system", "vllm"])
        assert runner.run(["mkdir", "-p", "/etc/vllm"]).ok
        assert runner.run(["touch", render.ENV_FILE]).ok
        # The other engines' programs (trtllm-serve, llama-server, mpirun) would come with the venv or
        # the host's packages too: an executable where each unit starts one is all the verifier checks.
        programs = sorted({line.split("=", 1)[1].split()[0] for state in seed_states().values()
                           for wanted in state.files if wanted.unit
                           for line in wanted.content.splitlines() if line.startswith("ExecStart=")})
        for program in programs:
            if not runner.run(["test", "-e", program]).ok:
                assert runner.run(["install", "-D", "-m", "0755", "/dev/null", program]).ok
                made.append(program)
        for case, state in seed_states().items():
            folder = f"/tmp/verify/{case}"  # real unit names, so Requires= between them resolve
            assert runner.run(["mkdir", "-p", folder]).ok
            names = []
            for wanted in state.files:
                if wanted.unit:
                    name = f"{folder}/{wanted.path.rsplit('/', 1)[1]}"
                    assert runner.run(["tee", name], stdin=wanted.content).ok
                    names.append(name)
            if not names:  # a TensorRT-LLM worker runs no unit of its own
                continue
            verified = runner.run(["systemd-analyze", "verify", *names])
            assert verified.ok and verified.stderr.strip() == "", f"{case}: {verified.stderr}"
    finally:
        runner.run(["rm", "-rf", "/tmp/verify", "/opt/vllm", render.ENV_FILE, *made])
        runner.close()
