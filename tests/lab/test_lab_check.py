"""`invoke check` over SSH on lab hosts playing good and failing configurations."""
from __future__ import annotations

import json
import subprocess

import pytest

from provision import checks, inventory, lab
from provision.lab import wheels
from tests.lab.conftest import run_invoke

pytestmark = pytest.mark.lab


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
    done = run_invoke("check", "--host", "cpu-1", "--force", "kernel.versoin")
    assert done.returncode == 2 and "unknown checks: kernel.versoin" in done.stderr


def test_spark_pair_passes_with_gb10_memory_from_meminfo(the_lab: lab.Lab) -> None:
    done = run_invoke("check", "--cluster", "lab-spark", "--json")
    assert done.returncode == 0, done.stdout
    report = json.loads(done.stdout)
    for host in ("spark-a", "spark-b"):
        found = by_id(report, host)
        assert found["memory.unified_headroom"]["status"] == "pass"
        assert found["memory.unified_headroom"]["evidence"]["nvidia_smi_memory"] == [None]
        assert found["config.triton_ptxas"]["status"] == "pass"
        assert found["cluster.network"]["status"] == "pass"
    assert report["hosts"]["spark-a"]["resolutions"] == {"extra_args": ["--disable-custom-all-reduce"]}


# Lab hosts made for the gate to refuse (lab.DEFAULT_HOSTS says what each plays): their blockers are the
# point. Anything else the gate says against the lab is of the lab's own making.
MADE_TO_BE_REFUSED = {"ws-broken", "ws-575"}


def test_the_lab_passes_its_own_gate(broken_host: str) -> None:
    """`check --all` on whatever the lab runs: no warning on any host, no blocker but on the hosts made
    to be refused (the two-node Spark pair's venv is the lab index's stand-ins: a vLLM with its own
    multi-node launch, torch, FlashInfer's kernels)."""
    done = run_invoke("check", "--all", "--json")
    report = json.loads(done.stdout)
    assert report["errors"] == {}, report["errors"]
    assert set(report["blocked"]) <= MADE_TO_BE_REFUSED and broken_host in report["blocked"], report["blocked"]
    warned = [(host, finding["id"], finding["message"]) for host, body in report["hosts"].items()
              for finding in body["findings"] if finding["severity"] == "warning" and finding["status"] == "fail"]
    assert warned == []
    # An info finding is what the gate could not judge (memory.fits on a model whose weights the lab does
    # not fetch: its config.json is unknown), not a refusal: it is shown, and it is not counted here.
    refused = [(host, finding["id"]) for host, body in report["hosts"].items() if host not in MADE_TO_BE_REFUSED
               for finding in body["findings"] if finding["status"] == "fail" and finding["severity"] != "info"]
    unjudged = [(host, finding["id"]) for host, body in report["hosts"].items()
                for finding in body["findings"] if finding["status"] == "fail" and finding["severity"] == "info"]
    assert all(rule == "memory.fits" for _, rule in unjudged), unjudged
    assert refused == []
    nodes = by_id(report, "spark-a")["engine.nodes"]  # vLLM's own launch: the stand-in vLLM is 0.34.0
    assert nodes["status"] == "pass" and "no Ray" in nodes["message"], nodes
    assert nodes["evidence"]["vllm"] == wheels.VLLM_NATIVE, nodes


def test_check_json_shape_is_stable(the_lab: lab.Lab) -> None:
    done = run_invoke("check", "--host", "cpu-1", "--json")
    report = json.loads(done.stdout)
    assert set(report) == {"hosts", "errors", "blocked"}
    host = report["hosts"]["cpu-1"]
    assert set(host) == {"verdict", "findings", "resolutions"}
    assert [finding["id"] for finding in host["findings"]] == list(checks.RULE_IDS)
    for finding in host["findings"]:
        assert set(finding) == {"id", "severity", "status", "message", "evidence", "fix"}
        assert finding["severity"] in {"blocker", "warning", "info"}
        assert finding["status"] in {"pass", "fail", "skip", "forced"}


def test_a_host_that_stopped_running_is_forgotten_by_the_next_lab_up(broken_host: str, the_lab: lab.Lab) -> None:
    """A lab left recorded across a reboot of this machine (or a killed run) must not hand the tool an
    inventory naming hosts that refuse connections: the next `lab.up` forgets what no longer runs."""
    record = the_lab.state()["hosts"][broken_host]
    for pid in lab._nspawn_pids(f"plab-{broken_host}"):
        lab._terminate(pid)
    said: list[str] = []
    try:
        the_lab.up(progress=said.append)
        written = inventory.load(the_lab.inventory)
        assert broken_host not in written.hosts and "lab-broken" not in written.clusters
        assert broken_host not in the_lab.state()["hosts"]
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
        assert record["netns"] not in netns.split()
        assert any(line.startswith(f"{broken_host} was recorded but no longer runs") for line in said), said
    finally:
        the_lab.up([broken_host], progress=lambda line: None)  # back as the module's fixture left it
    assert broken_host in inventory.load(the_lab.inventory).hosts
