"""Prometheus on cpu-1 scraping the lab's vLLM (the CPU build serving lab-cpu), as the tool puts it there:
`prepare` installs Debian's prometheus (the gate's metrics.prometheus fails until then), `metrics --apply`
writes its configuration and targets; Prometheus's own API then says each target is up, and every query
of the shipped vLLM dashboard returns series from the lab. The endpoint's router and llama.cpp are scraped
in test_lab_router.py (their hosts are the other group's). Prometheus is removed from cpu-1 afterwards.

The GPU hosts of this group are replayed (nothing serves there, on loopback): `metrics` names them as
unreachable from cpu-1, with the setting that would change it, and writes no target for them.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision import inventory, lab
from tests.lab import prometheus_lab
from tests.lab.conftest import invoke_json, restore_lab_cpu

pytestmark = [pytest.mark.lab]


@pytest.fixture(scope="module")
def prometheus(the_lab: lab.Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, dict]]:
    restore_lab_cpu()
    inv = inventory.load(the_lab.inventory)
    path = prometheus_lab.prometheus_inventory(the_lab, "lab", "cpu-1", tmp_path_factory.mktemp("prometheus"))
    try:
        applied = prometheus_lab.put_prometheus(path, "cpu-1")
        yield path, f"http://{inv.host('cpu-1').address}:{prometheus_lab.PORT}", applied
    finally:
        prometheus_lab.remove_prometheus(inv, "cpu-1")


def test_the_targets_are_planned_from_the_inventory_and_the_unreachable_said(
        prometheus: tuple[Path, str, dict]) -> None:
    path, _, applied = prometheus
    code, planned, text = invoke_json("metrics", "--inventory", str(path))
    assert code == 0, text
    by_host = {target["host"]: target for target in planned["targets"] if target["job"] == "servers"}
    assert by_host["cpu-1"]["address"] == "127.0.0.1:8000" and by_host["cpu-1"]["unreachable"] is None
    assert by_host["cpu-1"]["labels"] == {"host": "cpu-1", "cluster": "lab-cpu", "engine": "vllm",
                                          "model": "tiny-llama"}
    for host in ("ws-5090", "h200", "spark-a"):  # replayed GPU hosts: their servers would listen on loopback
        assert "listens on 127.0.0.1 only" in by_host[host]["unreachable"], by_host[host]
    health = {(item["job"], item["host"]) for item in applied["applied"]["health"]}
    assert ("provision-servers", "cpu-1") in health and ("prometheus", "cpu-1") in health, applied


def test_prometheus_scrapes_the_lab_s_vllm_and_every_vllm_panel_answers(prometheus: tuple[Path, str, dict]) -> None:
    _, url, _ = prometheus
    up = prometheus_lab.wait_until_up(url, {"servers", "prometheus"})
    assert [labels["host"] for labels in up.values() if labels["job"] == "provision-servers"] == ["cpu-1"]
    # Requests first: the request counters and histograms (finish reasons, latencies) have series once
    # a request has finished.
    code, bench, text = invoke_json("bench", "--cluster", "lab-cpu", "--count", "4", "--concurrency", "2",
                                    "--max-tokens", "8")
    assert code == 0 and bench["succeeded"] == 4, text
    time.sleep(3)  # scraped since
    empty = prometheus_lab.unanswered_panels(url, "vllm")
    assert empty == [], "\n".join(empty)
    print("\nvLLM's panels answered: " + json.dumps(len(prometheus_lab.query(url, "vllm:num_requests_running"))))
