"""Two lab hosts form a real Ray cluster from the rendered head and worker units; deploy refuses to
start vLLM while a node is missing."""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from provision import inventory, lab, parsers
from tests.lab.conftest import clean_up_pair, on_host, run_invoke

pytestmark = [pytest.mark.lab, pytest.mark.lab_group("lab-b")]

# Two hosts of their own (the lab's pair-a and pair-b play the same machines as ws-5090 and h200): these
# tests hold the hosts' locks for minutes, beside other tests of ws-5090 and h200.
HEAD, WORKER = "pair-a", "pair-b"
VENV = "/opt/raylab/venv"
# The launch over Ray (distributed_backend: ray; the default for a vLLM before 0.11.1). The inventory
# names no Ray: the tool adds the one the contract table pins for a multi-node vLLM venv over Ray
# (engine_contracts.yaml), as it does beside vLLM. `packaging` stands in for the engine's package (the
# CPU build's 3.5 GB venv on two more hosts would double the suite's install time): the units, the Ray
# cluster and deploy's gate are what is under test. Both hosts play 2-GPU machines: 2 nodes x 2 = TP 2 x PP 2.
VARS = {"engine_spec": "packaging==26.4", "venv_dir": VENV, "model": "/srv/no-model", "served_model_name": "pair",
        "tensor_parallel_size": 2, "pipeline_parallel_size": 2, "distributed_backend": "ray"}


@pytest.fixture(scope="module")
def pair(the_lab: lab.Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    the_lab.up([HEAD, WORKER], progress=lambda line: None)
    document = yaml.safe_load(the_lab.inventory.read_text())
    document.pop("endpoints", None)  # of clusters this inventory replaces
    document["clusters"] = {"raypair": {"hosts": [HEAD, WORKER], "head": HEAD,
                                        "vars": {**VARS, "cluster_network": str(the_lab.network)}}}
    path = tmp_path_factory.mktemp("ray") / "inventory.yaml"
    path.write_text(yaml.safe_dump(document))
    yield path
    clean_up_pair(inventory.load(path), (HEAD, WORKER), UNITS, "/opt/raylab")


UNITS = ["vllm.service", "vllm-ray-head.service", "vllm-ray-worker.service"]


def ray_nodes(inv: inventory.Inventory) -> tuple[int, str]:
    address = inv.host(HEAD).address
    text = on_host(inv, HEAD, [f"{VENV}/bin/ray", "status", f"--address={address}:6379"])
    return parsers.parse_ray_status(text), text


def test_the_rendered_units_form_a_two_node_ray_cluster_and_deploy_waits_for_both(pair: Path) -> None:
    provisioned = run_invoke("provision", "--inventory", str(pair), "--cluster", "raypair", "--profile", "cpu",
                             "--json", timeout=1200)
    assert provisioned.returncode == 0, provisioned.stdout + provisioned.stderr
    inv = inventory.load(pair)
    deadline = time.monotonic() + 120
    count, text = ray_nodes(inv)
    while count < 2 and time.monotonic() < deadline:
        time.sleep(3)
        count, text = ray_nodes(inv)
    assert count == 2, text  # `ray status` on the head lists both nodes
    worker_env = on_host(inv, WORKER, ["cat", "/etc/vllm/vllm.env"])
    assert f'VLLM_HOST_IP="{inv.host(WORKER).address}"' in worker_env
    assert "RAY_NODE_IP_ADDRESS" not in worker_env  # read by neither Ray nor vLLM
    kept = on_host(inv, WORKER, ["cat", "/var/lib/vllm/.config/vllm/ray_non_carry_over_env_vars.json"])
    assert "NCCL_SOCKET_IFNAME" in json.loads(kept)  # the head's interface never replaces the worker's
    done = run_invoke("deploy", "--inventory", str(pair), "--cluster", "raypair", "--profile", "cpu",
                      "--set", "max_model_len=250", "--timeout", "60", "--json", timeout=1200)
    report = json.loads(done.stdout)
    rows = {row["host"]: row for row in report["hosts"]}
    # Ray saw both nodes, so vLLM was started on the head; with no vLLM in this venv it then crashed:
    # deploy says so and rejects what it applied (the head's unit; the worker had nothing to change):
    # the head gets back the provision's generation, with its units as they ran before (Ray keeps running).
    assert "Ray sees" not in rows[HEAD]["detail"], rows[HEAD]
    assert "crashed" in rows[HEAD]["detail"] or "failed" in rows[HEAD]["detail"], rows[HEAD]
    assert rows[HEAD]["state"] == "rolled back" and rows[WORKER]["changes"] == 0, rows
    assert "--max-model-len 250" not in on_host(inv, HEAD, ["cat", "/etc/systemd/system/vllm.service"])
    assert ray_nodes(inv)[0] == 2


def test_deploy_refuses_to_start_vllm_while_a_node_is_missing(pair: Path) -> None:
    inv = inventory.load(pair)
    # The worker's Ray cannot run (deploy starts its unit again, and it dies at once): a node missing.
    on_host(inv, WORKER, ["sh", "-c", f"systemctl stop vllm-ray-worker.service; chmod -x {VENV}/bin/ray"])
    on_host(inv, HEAD, ["sh", "-c", "systemctl stop vllm.service; systemctl reset-failed vllm.service; true"])
    # Ray's head counts a stopped node as alive until its health checks time out: wait until it sees one.
    deadline = time.monotonic() + 180
    while ray_nodes(inv)[0] > 1 and time.monotonic() < deadline:
        time.sleep(3)
    assert ray_nodes(inv)[0] == 1
    before = on_host(inv, HEAD, ["systemctl", "show", "-p", "InvocationID,ActiveState", "vllm.service"])
    done = run_invoke("deploy", "--inventory", str(pair), "--cluster", "raypair", "--profile", "cpu",
                      "--set", "max_model_len=300", "--timeout", "30", "--json", timeout=600)
    assert done.returncode == 1
    rows = {row["host"]: row for row in json.loads(done.stdout)["hosts"]}
    assert "Ray sees 1 of 2 nodes; vLLM not started" in rows[HEAD]["detail"], rows
    after = on_host(inv, HEAD, ["systemctl", "show", "-p", "InvocationID,ActiveState", "vllm.service"])
    on_host(inv, WORKER, ["chmod", "+x", f"{VENV}/bin/ray"])
    assert after == before  # vLLM was not started
