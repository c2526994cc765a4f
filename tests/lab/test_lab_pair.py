"""Two lab hosts serve as one through vLLM's own multi-node launch (no Ray): the head's unit serves, the
other runs `vllm serve --headless`; a node killed is reported within status's window, and deploy brings
the pair back. Also: the plan of the lab's Spark pair renders that launch for a vLLM that has it, and Ray
for one that does not.

vLLM's CPU build cannot run a worker node (its CLI dies asking importlib.metadata for the distribution
`vllm`: engine_contracts.yaml), so the engine here is the lab's stand-in (provision/lab/pair_engine.py,
in the stand-in `vllm` wheel of the lab's index): the units, their order and the tool's handling of a
lost node are what is under test. The rendered lines themselves are judged by vLLM's own parser and
create_engine_config in test_lab_contract_vllm.py."""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from provision import inventory, lab
from provision.lab import wheels
from tests.lab.conftest import clean_up_pair, invoke_json, on_host, run_invoke

pytestmark = [pytest.mark.lab, pytest.mark.lab_group("lab-b")]

# Two hosts of their own (the lab's pair-a and pair-b play the same machines as ws-5090 and h200): these
# tests hold the hosts' locks for minutes, beside other tests of ws-5090 and h200.
HEAD, WORKER = "pair-a", "pair-b"
VENV = "/opt/pairlab/venv"
UNITS = ["vllm.service", "vllm-worker.service"]


@pytest.fixture(scope="module")
def pair(the_lab: lab.Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    the_lab.up([HEAD, WORKER], progress=lambda line: None)
    document = yaml.safe_load(the_lab.inventory.read_text())
    document.pop("endpoints", None)  # of clusters this inventory replaces
    # Both hosts play 2-GPU machines: 2 nodes x 2 = TP 2 x PP 2. The stand-in vLLM and torch come from
    # the lab's index (its CPU variant: the hosts are deployed with the cpu profile).
    document["clusters"] = {"pair": {"hosts": [HEAD, WORKER], "head": HEAD, "vars": {
        "engine_spec": wheels.venv_spec(), "pip_extra_index_urls": [the_lab.index_url("cpu")],
        "pip_trusted_hosts": [the_lab.hub_url.split("//", 1)[1]], "venv_dir": VENV,
        "model": "/srv/no-model", "served_model_name": "pair", "tensor_parallel_size": 2,
        "pipeline_parallel_size": 2, "cluster_network": str(the_lab.network)}}}
    path = tmp_path_factory.mktemp("pair") / "inventory.yaml"
    path.write_text(yaml.safe_dump(document))
    yield path
    clean_up_pair(inventory.load(path), (HEAD, WORKER), UNITS, "/opt/pairlab")


def deploy(pair: Path) -> dict[str, Any]:
    code, document, text = invoke_json("deploy", "--inventory", str(pair), "--cluster", "pair", "--profile", "cpu",
                                       "--timeout", "120", timeout=900)
    assert code == 0, text
    return {row["host"]: row for row in document["hosts"]}


def status(pair: Path) -> tuple[int, dict[str, Any], float]:
    started = time.monotonic()
    code, document, text = invoke_json("status", "--inventory", str(pair), "--cluster", "pair", timeout=120)
    assert document, text
    return code, document["hosts"], time.monotonic() - started


def killed(inv: inventory.Inventory, host: str, unit: str) -> None:
    """SIGKILL the unit's processes and wait until systemd says it failed (neither node restarts alone)."""
    on_host(inv, host, ["systemctl", "kill", "--signal=SIGKILL", unit])
    becomes(inv, host, unit, "failed")


def becomes(inv: inventory.Inventory, host: str, unit: str, state: str) -> None:
    """Wait (30 s at most) until systemd says the unit is in `state`."""
    deadline = time.monotonic() + 30
    while on_host(inv, host, ["systemctl", "show", "-p", "ActiveState", "--value", unit]).strip() != state:
        assert time.monotonic() < deadline, f"{host}: {unit} did not become {state}"
        time.sleep(0.5)


def test_the_plan_renders_vllms_own_launch_for_a_release_that_has_it_and_ray_below_it(the_lab: lab.Lab) -> None:
    native = run_invoke("plan", "--cluster", "lab-spark", timeout=600)
    assert native.returncode == 0, native.stdout + native.stderr
    head, worker = native.stdout.split("spark-b:", 1)[0], native.stdout.split("spark-b:", 1)[1]
    assert "--nnodes 2 --node-rank 0" in head and "vllm-worker.service" not in head
    assert "vllm.entrypoints.cli.main serve" in worker and "--node-rank 1" in worker and "--headless" in worker
    for ray in ("vllm-ray-", "ray_non_carry_over", "RAY_", "--distributed-executor-backend ray", "/bin/ray"):
        assert ray not in native.stdout, ray
    # The native launch's engine.nodes ("... (no Ray)") is held by test_lab_check's gate test.
    before = f"engine_spec={wheels.venv_spec(wheels.VLLM_BEFORE_NATIVE)}"  # 0.11.0: no --nnodes yet
    over_ray = run_invoke("plan", "--cluster", "lab-spark", "--set", before, timeout=600)
    assert over_ray.returncode == 0, over_ray.stdout + over_ray.stderr
    assert "vllm-ray-head.service" in over_ray.stdout and "vllm-ray-worker.service" in over_ray.stdout
    assert "--distributed-executor-backend ray" in over_ray.stdout and "--nnodes" not in over_ray.stdout
    _, checked, text = invoke_json("check", "--cluster", "lab-spark", "--set", before, timeout=600)
    found = next(f for f in checked["hosts"]["spark-a"]["findings"] if f["id"] == "engine.nodes")
    assert found["status"] == "pass" and "Ray from ray-2.60.0+lab" in found["message"], (found, text[-2000:])


def test_the_pair_serves_as_one_and_a_lost_node_is_reported_then_brought_back(pair: Path) -> None:
    inv = inventory.load(pair)
    rows = deploy(pair)
    assert rows[HEAD]["state"] == "ready", rows
    code, hosts, _ = status(pair)
    assert code == 0 and hosts[HEAD]["healthy"] and hosts[WORKER]["healthy"], json.dumps(hosts, indent=1)
    assert hosts[WORKER]["unit"]["name"] == "vllm-worker.service"
    assert hosts[WORKER]["unit"]["note"] == f"vLLM headless worker; API on {HEAD}"
    assert not any("ray" in unit for unit in on_host(inv, WORKER, ["ls", "/etc/systemd/system"]).split())
    assert not on_host(inv, WORKER, ["find", f"{VENV}/lib", "-maxdepth", "3", "-iname", "ray*"])
    journal = run_invoke("logs", "--inventory", str(pair), "--host", WORKER, "--lines", "20", timeout=120)
    assert f"worker node 1: joined the head at {inv.host(HEAD).address}:29501" in journal.stdout, journal.stdout

    # The worker killed: the head still answers /health, status says the pair is broken.
    killed(inv, WORKER, "vllm-worker.service")
    code, hosts, seconds = status(pair)
    assert code == 1 and seconds < 60, (code, seconds)
    assert not hosts[WORKER]["healthy"] and "vllm-worker.service is failed" in hosts[WORKER]["problem"]
    assert hosts[HEAD]["health"] == "ok" and not hosts[HEAD]["healthy"], hosts[HEAD]
    assert f"answers, but without {WORKER}" in hosts[HEAD]["problem"]
    assert "invoke deploy --cluster pair" in hosts[HEAD]["problem"]
    # A request finds it out: it fails, and the server ends with status 0 (no Restart= would act on it).
    asked = run_invoke("ask", "--inventory", str(pair), "--host", HEAD, "--prompt", "Hello", timeout=120)
    assert asked.returncode == 1 and "remote worker crashing" in asked.stdout + asked.stderr, asked
    becomes(inv, HEAD, "vllm.service", "inactive")  # the head does not outlive its engine
    code, hosts, _ = status(pair)
    assert code == 1 and "vllm.service is inactive" in hosts[HEAD]["problem"], hosts[HEAD]
    planned = run_invoke("plan", "--inventory", str(pair), "--cluster", "pair", "--profile", "cpu", timeout=600)
    assert "start vllm-worker.service: not running" in planned.stdout, planned.stdout
    assert "start vllm.service: not running" in planned.stdout, planned.stdout
    rows = deploy(pair)
    assert rows[HEAD]["state"] == "ready", rows
    code, hosts, _ = status(pair)
    assert code == 0 and hosts[HEAD]["healthy"] and hosts[WORKER]["healthy"], json.dumps(hosts, indent=1)

    # The head killed: the worker node stays up, bound to a head that is gone; deploy restarts both.
    killed(inv, HEAD, "vllm.service")
    code, hosts, seconds = status(pair)
    assert code == 1 and seconds < 60
    assert not hosts[HEAD]["healthy"] and "vllm.service is failed" in hosts[HEAD]["problem"], hosts[HEAD]
    assert hosts[WORKER]["unit"]["active"] == "active"
    planned = run_invoke("plan", "--inventory", str(pair), "--cluster", "pair", "--profile", "cpu", timeout=600)
    assert "start vllm.service: not running" in planned.stdout, planned.stdout
    assert f"restart vllm-worker.service: restarts with {HEAD}'s vllm.service" in planned.stdout, planned.stdout
    rows = deploy(pair)
    assert rows[HEAD]["state"] == "ready", rows
    code, hosts, _ = status(pair)
    assert code == 0 and hosts[HEAD]["healthy"] and hosts[WORKER]["healthy"], json.dumps(hosts, indent=1)
    said = on_host(inv, HEAD, ["journalctl", "-u", "vllm.service", "-n", "30", "--no-pager"])
    assert said.count("head: worker node 1 joined") >= 1, said
