"""Faults on lab hosts: what the user sees names the host and the step, the other hosts go on, no
half-written file is left in place, and the next run converges."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from provision import inventory, lab
from tests.conftest import REPO
from tests.lab.conftest import on_host, run_invoke
from tests.lab.test_lab_weights import hub_call, publish, served

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("restores_lab_cpu")]


def test_a_host_down_before_the_run_is_named_the_others_converge_and_so_does_it_later(the_lab: lab.Lab) -> None:
    veth = the_lab.state()["hosts"]["h200"]["veth"]
    subprocess.run(["ip", "link", "set", veth, "down"], check=True)
    try:
        done = run_invoke("facts", "--host", "h200", "--host", "ws-5090", "--json")
    finally:
        subprocess.run(["ip", "link", "set", veth, "up"], check=True)
    report = json.loads(done.stdout)
    assert done.returncode == 1 and "h200" in report["errors"] and "ws-5090" in report["hosts"]
    assert "no answer" in report["errors"]["h200"] or "cannot connect" in report["errors"]["h200"]
    again = run_invoke("facts", "--host", "h200", "--host", "ws-5090", "--json")
    assert again.returncode == 0 and set(json.loads(again.stdout)["hosts"]) == {"h200", "ws-5090"}


def test_the_disk_filling_up_during_a_download_fails_that_host_and_the_next_run_resumes(
        the_lab: lab.Lab, lab_inventory: inventory.Inventory) -> None:
    for name in ("cpu-1", "ws-5090"):
        on_host(lab_inventory, name, ["sh", "-c", "rm -rf /srv/tight/* /srv/w-tight"])
    publish(the_lab, "test/tight", big=24 * 2**20)
    hub_call(the_lab, "/_lab/reset", {})
    # Slow enough to fill the disk mid-file: after huggingface_hub wrote its first 10 MiB chunk.
    cpu1 = lab_inventory.host("cpu-1").address
    hub_call(the_lab, "/_lab/faults", {"match": "test/tight/extra.safetensors", "delay": 0.02, "times": 1,
                                       "client": cpu1})
    args = ["weights", "--host", "cpu-1", "--host", "ws-5090", "--set", "model=test/tight", "--set", "fetch_weights=true",
            "--json"]
    # cpu-1 fetches into its 32 MiB filesystem (the gate sees room for the 29 MB); ws-5090 elsewhere.
    running = subprocess.Popen([sys.executable, "-m", "invoke", *args, "--set", "model_dir=/srv/tight/m"],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while hub_call(the_lab, "/_lab/stats").get("clients", {}).get(cpu1, 0) < 11 * 2**20 and time.monotonic() < deadline:
        time.sleep(0.2)
    on_host(lab_inventory, "cpu-1", ["dd", "if=/dev/zero", "of=/srv/tight/filler", "bs=1M", "count=32"])
    out, _err = running.communicate(timeout=300)
    report = json.loads(out)
    assert running.returncode == 1
    assert "No space left" in report["hosts"]["cpu-1"]["error"] and "extra.safetensors" in report["hosts"]["cpu-1"]["error"]
    assert report["hosts"]["ws-5090"].get("fetched", {}).get("bytes", 0) > 0, report  # the other host finished
    gone = on_host(lab_inventory, "cpu-1", ["sh", "-c", "test -e /srv/tight/m/test/tight/current; echo $?"])
    assert gone.strip() == "1"  # nothing half-fetched is served
    on_host(lab_inventory, "cpu-1", ["rm", "-f", "/srv/tight/filler"])
    hub_call(the_lab, "/_lab/reset", {})
    again = run_invoke(*args, "--set", "model_dir=/srv/tight/m")
    assert again.returncode == 0, again.stdout + again.stderr
    size = json.loads(again.stdout)["hosts"]["cpu-1"]["weights"]["bytes"]
    assert served(the_lab, "test/tight") < size  # resumed: what was on disk before the fill was kept
    ok = on_host(lab_inventory, "cpu-1", ["sha256sum", "/srv/tight/m/test/tight/current/extra.safetensors"])
    commit = json.loads(again.stdout)["hosts"]["cpu-1"]["weights"]["commit"]
    local = (the_lab.hub_root / "repos/test/tight/commits" / commit / "extra.safetensors").read_bytes()
    import hashlib
    assert ok.split()[0] == hashlib.sha256(local).hexdigest()


def test_the_tool_killed_during_a_venv_install_leaves_the_host_to_finish_and_the_next_run_converges(
        the_lab: lab.Lab, lab_inventory: inventory.Inventory) -> None:
    venv_dir = "/opt/killed/venv"
    on_host(lab_inventory, "cpu-1", ["sh", "-c", "rm -rf /opt/killed*"])
    args = ["venv", "--host", "cpu-1", "--set", f"venv_dir={venv_dir}", "--set", "engine_spec=ray==2.60.0"]
    running = subprocess.Popen([sys.executable, "-m", "invoke", *args], cwd=REPO, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    installing = ""
    while time.monotonic() < deadline and running.poll() is None:
        # "[k]" keeps the pattern from matching this very shell's command line
        installing = on_host(lab_inventory, "cpu-1", ["pgrep", "-f", "[k]illed/venv/bin/pip install"])
        if installing.strip():
            break
        time.sleep(0.5)
    assert running.poll() is None, "the venv install finished before it could be interrupted"
    running.kill()  # SIGKILL: no cleanup of any kind on the controller
    running.wait()
    # The host holds its lock and finishes or undoes the step on its own; the next run waits for it.
    done = run_invoke(*args, "--wait", "300", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    answer = on_host(lab_inventory, "cpu-1", [f"{venv_dir}/bin/python", "-c", "import ray; print(ray.__version__)"])
    assert answer.strip() == "2.60.0"
    leftovers = on_host(lab_inventory, "cpu-1", ["sh", "-c", ("find /opt /etc/vllm /var/cache/provision "
                                                              "-name '*.provision-tmp' -o -name '*.partial' | head")])
    assert leftovers.strip() == ""  # no half-written file anywhere the tool writes
    again = run_invoke(*args, "--json")
    assert json.loads(again.stdout)["hosts"]["cpu-1"]["changes"] == []  # converged: nothing left to do
    on_host(lab_inventory, "cpu-1", ["sh", "-c", "rm -rf /opt/killed*"])


def test_a_host_whose_link_is_cut_mid_run_fails_in_bounded_time_and_the_next_run_resumes(
        the_lab: lab.Lab, lab_inventory: inventory.Inventory) -> None:
    for name in ("cpu-1", "ws-5090"):
        on_host(lab_inventory, name, ["rm", "-rf", "/srv/w-cut"])
    publish(the_lab, "test/cut", big=24 * 2**20)
    hub_call(the_lab, "/_lab/reset", {})
    cpu1 = lab_inventory.host("cpu-1").address
    hub_call(the_lab, "/_lab/faults", {"match": "test/cut/extra.safetensors", "delay": 0.05, "times": 1,
                                       "client": cpu1})
    args = ["weights", "--host", "cpu-1", "--host", "ws-5090", "--set", "model=test/cut", "--set", "fetch_weights=true",
            "--set", "model_dir=/srv/w-cut", "--json"]
    running = subprocess.Popen([sys.executable, "-m", "invoke", *args], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while hub_call(the_lab, "/_lab/stats").get("clients", {}).get(cpu1, 0) < 11 * 2**20 and time.monotonic() < deadline:
        time.sleep(0.2)
    veth = the_lab.state()["hosts"]["cpu-1"]["veth"]
    subprocess.run(["ip", "link", "set", veth, "down"], check=True)
    cut = time.monotonic()
    try:
        out, _ = running.communicate(timeout=240)
    finally:
        took = time.monotonic() - cut
        subprocess.run(["ip", "link", "set", veth, "up"], check=True)
    report = json.loads(out)
    assert running.returncode == 1 and "error" in report["hosts"]["cpu-1"], report
    assert "cpu-1" in report["hosts"]["cpu-1"]["error"] and "weights" in report["hosts"]["cpu-1"]["error"]
    assert report["hosts"]["ws-5090"]["fetched"]["bytes"] > 0  # the other host finished
    assert took < 120, took  # the dead connection is noticed in about 30 s, not hours
    hub_call(the_lab, "/_lab/reset", {})
    again = run_invoke(*args, "--wait", "180")  # the host's own run may still hold its lock a moment
    assert again.returncode == 0, again.stdout + again.stderr
    size = json.loads(again.stdout)["hosts"]["cpu-1"]["weights"]["bytes"]
    assert 0 < served(the_lab, "test/cut") < size  # resumed from what reached the disk before the cut


def test_the_ssh_connection_cut_during_apply_names_the_host_and_the_next_run_converges(
        the_lab: lab.Lab, lab_inventory: inventory.Inventory) -> None:
    venv_dir = "/opt/cut/venv"
    on_host(lab_inventory, "cpu-1", ["sh", "-c", "rm -rf /opt/cut*"])
    args = ["venv", "--host", "cpu-1", "--host", "ws-5090", "--profile", "cpu", "--set", f"venv_dir={venv_dir}",
            "--set", "engine_spec=ray==2.60.0", "--json"]
    running = subprocess.Popen([sys.executable, "-m", "invoke", *args], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and running.poll() is None:
        if on_host(lab_inventory, "cpu-1", ["pgrep", "-f", "[c]ut/venv/bin/pip install"]).strip():
            break
        time.sleep(0.5)
    assert running.poll() is None, "the venv install finished before the link could be cut"
    veth = the_lab.state()["hosts"]["cpu-1"]["veth"]
    subprocess.run(["ip", "link", "set", veth, "down"], check=True)
    try:
        out, _ = running.communicate(timeout=240)
    finally:
        subprocess.run(["ip", "link", "set", veth, "up"], check=True)
    report = json.loads(out)
    assert running.returncode == 1
    error = report["hosts"]["cpu-1"]["error"]
    assert error.startswith("cpu-1: unreachable: during apply: connection lost while running python3"), error
    assert report["hosts"]["ws-5090"]["applied"] >= 1  # the other host's venv went on
    again = run_invoke(*args, "--wait", "300")
    assert again.returncode == 0, again.stdout + again.stderr
    answer = on_host(lab_inventory, "cpu-1", [f"{venv_dir}/bin/python", "-c", "import ray; print(ray.__version__)"])
    assert answer.strip() == "2.60.0"
    for name in ("cpu-1", "ws-5090"):
        on_host(lab_inventory, name, ["sh", "-c", "rm -rf /opt/cut*"])


def test_an_operators_drop_in_is_drift_the_plan_names_and_provision_leaves_alone(
        the_lab: lab.Lab, lab_inventory: inventory.Inventory) -> None:
    directory = "/etc/systemd/system/vllm.service.d"
    drop_in = f"{directory}/override.conf"
    write = ("import os,sys; os.makedirs(sys.argv[1], exist_ok=True); "
             "open(sys.argv[2], 'w').write('[Service]\\nCPUAffinity=0\\n')")
    on_host(lab_inventory, "cpu-1", ["python3", "-c", write, directory, drop_in])
    try:
        planned = run_invoke("plan", "--host", "cpu-1", "--json")
        host = json.loads(planned.stdout)["hosts"]["cpu-1"]
        assert planned.returncode == 1 and host["verdict"] == "blocked", planned.stdout
        assert {"id": "unit.dropins", "message": f"drift: drop-in {drop_in} overrides vllm.service"} in [
            {"id": b["id"], "message": b["message"]} for b in host["blockers"]]
        applied = run_invoke("provision", "--host", "cpu-1", "--json")
        assert applied.returncode == 1 and "applied" not in json.loads(applied.stdout)["hosts"]["cpu-1"]
        # Not reloaded by the tool: systemd has not read it, and the file is still the operator's.
        loaded = on_host(lab_inventory, "cpu-1", ["systemctl", "show", "-p", "DropInPaths", "vllm.service"])
        assert drop_in not in loaded
        assert "CPUAffinity=0" in on_host(lab_inventory, "cpu-1", ["cat", drop_in])
    finally:
        on_host(lab_inventory, "cpu-1", ["rm", "-rf", directory])
    assert run_invoke("plan", "--host", "cpu-1").returncode == 0
