"""Weights the tool does not fetch (fetch_weights false) on lab hosts: a model placed by hand gets the
memory fit a fetched one gets, read from the host's own model directory; and the two-Spark cluster,
whose replayed recordings say aarch64 while its python3 runs this machine's x86_64, relays a forced
fetch from the hub once, with its helper venv's wheels resolved for what really runs them."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from provision import inventory, lab, remote
from tests.lab.conftest import invoke_json, on_host, run_invoke
from tests.lab.test_lab_weights import hub_call, served

pytestmark = pytest.mark.lab

REPO_ID = "lab/tiny-llama"
SPARKS = ("spark-a", "spark-b")
HUB_VENV = "/var/lib/provision/hub-venv"


def exists(inv: inventory.Inventory, host: str, path: str) -> bool:
    probe = "import os, sys; print(os.path.lexists(sys.argv[1]))"
    return on_host(inv, host, ["python3", "-c", probe, path]).strip() == "True"


def memory_fit(*args: str) -> dict[str, Any]:
    code, report, text = invoke_json("check", "--host", "ws-5090", "--set", f"model={REPO_ID}", *args)
    assert code == 0, text
    found: dict[str, Any] = next(f for f in report["hosts"]["ws-5090"]["findings"] if f["id"] == "memory.fits")
    return found


@pytest.fixture
def placed_by_hand(the_lab: lab.Lab, lab_inventory: inventory.Inventory) -> Iterator[str]:
    """The tiny model's files copied into a model directory on ws-5090 as a person would, then removed."""
    commit = hub_call(the_lab, f"/api/models/{REPO_ID}")["sha"]
    files = the_lab.hub_root / "repos" / REPO_ID / "commits" / commit
    directory = f"/srv/w-placed/{REPO_ID}"
    on_host(lab_inventory, "ws-5090", ["mkdir", "-p", directory])
    runner = remote.SshRunner(lab_inventory.host("ws-5090"), lab_inventory.ssh)
    try:
        for path in sorted(Path(files).iterdir()):
            runner.put(path, f"{directory}/{path.name}")
    finally:
        runner.close()
    yield directory
    on_host(lab_inventory, "ws-5090", ["rm", "-rf", "/srv/w-placed"])


def test_weights_placed_by_hand_get_the_fit_of_fetched_ones(placed_by_hand: str) -> None:
    fetched = memory_fit("--set", "fetch_weights=true", "--set", "model_dir=/srv/w-fit")
    placed = memory_fit("--set", "fetch_weights=false", "--set", "model_dir=/srv/w-placed")
    assert placed["status"] == fetched["status"] == "pass", (placed, fetched)
    assert placed["evidence"]["config_from"] == f"{placed_by_hand}/config.json on the host"
    assert placed["evidence"]["weights_from"] == f"file sizes in {placed_by_hand} on the host"
    assert fetched["evidence"]["config_from"] == "the hub"
    same = ("budget_gib", "weights_gib", "allowance_gib", "kv_budget_gib", "kv_dtype", "kv_bytes_per_token",
            "max_model_len", "kv_per_sequence_gib", "context_tokens", "concurrent_sequences", "attention")
    assert {key: placed["evidence"][key] for key in same} == {key: fetched["evidence"][key] for key in same}
    # An empty directory and no repository of that name on the hub: said, not silent.
    gone = memory_fit("--set", "fetch_weights=false", "--set", "model_dir=/srv/w-placed-none",
                      "--set", "model=lab/no-such-model")
    assert (gone["status"], gone["severity"]) == ("fail", "warning"), gone
    assert gone["message"].startswith("could not be estimated: /srv/w-placed-none/lab/no-such-model does not "
                                      "exist on the host; the hub: no model repository 'lab/no-such-model'"), gone


LEFT_BY_A_FETCH = ("/var/lib/provision", "/var/cache/provision/wheels")  # hub venv, generations; wheels


def listing(inv: inventory.Inventory, host: str, directory: str) -> list[str] | None:
    probe = ("import json, os, sys; d = sys.argv[1]; "
             "print(json.dumps(sorted(os.listdir(d)) if os.path.isdir(d) else None))")
    found: list[str] | None = json.loads(on_host(inv, host, ["python3", "-c", probe, directory]))
    return found


@pytest.fixture
def spark_fetch(the_lab: lab.Lab, lab_inventory: inventory.Inventory) -> Iterator[None]:
    """The Sparks put back after: the model directory removed, and what the fetch left in the tool's
    state and wheel directories (the hub venv, the generation, the wheels pushed for it) where it was
    not there before (a lab Spark has none: its cluster's weights are placed by hand)."""
    before = {(host, path): listing(lab_inventory, host, path) for host in SPARKS for path in LEFT_BY_A_FETCH}
    hub_call(the_lab, "/_lab/reset", {})
    yield
    for host in SPARKS:
        removed = ["/srv/w-spark"]
        for path in LEFT_BY_A_FETCH:
            had = before[(host, path)]
            removed += [path] if had is None else [f"{path}/{name}" for name in
                                                  sorted(set(listing(lab_inventory, host, path) or ()) - set(had))]
        on_host(lab_inventory, host, ["rm", "-rf", *removed])
    hub_call(the_lab, "/_lab/reset", {})


def test_the_two_spark_cluster_relays_a_fetch_from_the_hub_once(
        the_lab: lab.Lab, lab_inventory: inventory.Inventory, spark_fetch: None) -> None:
    plain = run_invoke("weights", "--cluster", "lab-spark")
    assert plain.returncode == 0, plain.stdout + plain.stderr
    for host in SPARKS:  # nothing was ever fetched there: not "as verified"
        assert f"{host}: not fetched: fetch_weights is false; none present in /var/lib/vllm/models/" in plain.stdout
    code, found, text = invoke_json("facts", "--host", "spark-a")
    assert code == 0, text
    spark = found["hosts"]["spark-a"]
    assert (spark["arch"], spark["python_machine"]) == ("aarch64", "x86_64"), spark
    code, report, text = invoke_json("weights", "--cluster", "lab-spark", "--set", f"model={REPO_ID}",
                                     "--set", "fetch_weights=true", "--set", "model_dir=/srv/w-spark")
    assert code == 0, text
    total = report["hosts"]["spark-a"]["weights"]["bytes"]
    assert [report["hosts"][host]["fetched"]["from"] for host in SPARKS] == ["hub", "peer spark-a"]
    assert [report["hosts"][host]["fetched"]["by_source"] for host in SPARKS] == [{"hub": total},
                                                                                  {"spark-a": total}]
    assert report["bytes_from_hub"] == total == served(the_lab, REPO_ID)  # the hub, once
    commit = report["hosts"]["spark-a"]["weights"]["commit"]
    hub_files = the_lab.hub_root / "repos" / REPO_ID / "commits" / commit
    for host in SPARKS:
        held = json.loads(on_host(lab_inventory, host, ["cat", f"/srv/w-spark/{REPO_ID}/current/config.json"]))
        assert held == json.loads((hub_files / "config.json").read_text())
        imports = "import hf_xet, huggingface_hub; print('ok')"  # the wheels run where they were put
        assert on_host(lab_inventory, host, [f"{HUB_VENV}/bin/python", "-c", imports]).strip() == "ok"
