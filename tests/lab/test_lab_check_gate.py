"""`invoke check` over SSH on the lab hosts of the mission's machines: the Spark pair with its stand-in
venv, every host of this group's passing the gate, the report's shape. (The workstations made to be
refused: test_lab_check.py.)"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from provision import checks, lab
from provision.lab import wheels
from tests.lab.conftest import group_inventory, run_invoke
from tests.lab.test_lab_check import by_id

pytestmark = pytest.mark.lab


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


def test_the_lab_passes_its_own_gate(the_lab: lab.Lab, tmp_path: Path) -> None:
    """`check --all` on every host of this group's: no warning on any host and no blocker (the two-node
    Spark pair's venv is the lab index's stand-ins: a vLLM with its own multi-node launch, torch,
    FlashInfer's kernels). The other group's hosts change meanwhile; its workstations are made to be
    refused (test_lab_check.py)."""
    hosts = group_inventory(the_lab, "lab", tmp_path)
    done = run_invoke("check", "--all", "--json", "--inventory", str(hosts))
    report = json.loads(done.stdout)
    assert report["errors"] == {}, report["errors"]
    assert report["blocked"] == [], report["blocked"]
    warned = [(host, finding["id"], finding["message"]) for host, body in report["hosts"].items()
              for finding in body["findings"] if finding["severity"] == "warning" and finding["status"] == "fail"]
    assert warned == []
    # An info finding is what the gate could not judge (memory.fits on a model whose weights the lab does
    # not fetch: its config.json is unknown), not a refusal: it is shown, and it is not counted here.
    refused = [(host, finding["id"]) for host, body in report["hosts"].items()
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
