"""`init` against a lab host over real SSH: spark-a replays a DGX Spark, and init must take it for one.
It changes nothing on the host (a probe only); the file it writes is the tool's own input."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from provision import inventory, lab
from tests.lab.conftest import run_invoke

pytestmark = [pytest.mark.lab, pytest.mark.lab_group("lab-b")]


def test_init_for_a_spark_over_ssh_writes_an_inventory_the_tool_accepts(
        the_lab: lab.Lab, lab_inventory: inventory.Inventory, tmp_path: Path) -> None:
    spark = lab_inventory.host("spark-a")
    assert lab_inventory.ssh.key_file and lab_inventory.ssh.known_hosts
    out = tmp_path / "hosts.yaml"
    done = run_invoke("init", "--host", f"spark={spark.user}@{spark.address}", "--output", str(out),
                      "--key-file", lab_inventory.ssh.key_file, "--known-hosts", lab_inventory.ssh.known_hosts,
                      "--json", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    answer = json.loads(done.stdout)["hosts"]["spark"]
    assert answer["profile"] == "dgx-spark", answer["profile_reason"]
    assert answer["profile_reason"].startswith("1 x NVIDIA GB10 (compute capability 12.1)")
    assert answer["tensor_parallel_size"] == 1 and answer["model"] and answer["max_model_len"]
    assert answer["found"].startswith("aarch64, kernel 6.17.0-1014-nvidia")  # the replayed Spark's
    text = out.read_text()
    written = inventory.load(out)
    host = written.hosts["spark"]
    assert (host.address, host.user, host.profile.name) == (spark.address, spark.user, "dgx-spark")
    assert written.ssh.key_file == lab_inventory.ssh.key_file
    shown = run_invoke("inventory", "--inventory", str(out))
    assert shown.returncode == 0 and "dgx-spark" in shown.stdout, shown.stderr
    # The written inventory reaches the host: facts over it come back from the same machine.
    facts = run_invoke("facts", "--host", "spark", "--inventory", str(out), "--json", timeout=300)
    assert facts.returncode == 0, facts.stderr
    assert json.loads(facts.stdout)["hosts"]["spark"]["gpus"][0]["name"] == "NVIDIA GB10"
    again = run_invoke("init", "--host", f"{spark.user}@{spark.address}", "--output", str(out),
                       "--key-file", lab_inventory.ssh.key_file, "--known-hosts", lab_inventory.ssh.known_hosts)
    assert again.returncode == 2 and "exists; init never overwrites" in again.stderr
    assert out.read_text() == text
