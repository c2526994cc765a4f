"""deploy, status, bench and logs against real vLLM (the CPU build) on the lab's cpu-1 (what systemd and
the roll do with a server that dies: test_lab_deploy_llama.py)."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from provision import inventory, lab, parsers
from tests.lab.conftest import group_inventory, invoke_json, on_host, run_invoke
from tests.lab.test_lab_serve import METRICS

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("restores_lab_cpu")]


@pytest.fixture(scope="module")
def deployed(the_lab: lab.Lab, lab_inventory: inventory.Inventory) -> dict:
    """lab-cpu deployed: whatever provision left is brought to the inventory's state, gated on readiness."""
    code, report, text = invoke_json("deploy", "--cluster", "lab-cpu", "--timeout", "420")
    assert code == 0, text
    return report

def test_deploy_leaves_a_ready_server_and_a_summary(deployed: dict, lab_inventory: inventory.Inventory) -> None:
    (row,) = deployed["hosts"]
    assert row["host"] == "cpu-1" and row["state"] in ("ready", "unchanged")
    active = on_host(lab_inventory, "cpu-1", ["systemctl", "is-active", "vllm.service"]).strip()
    assert active == "active"
    assert "--max-model-len 256" in on_host(lab_inventory, "cpu-1", ["systemctl", "cat", "vllm.service"])
    # A changed value's one restart, gated on /health and a real completion, is deployed on cpu-2's
    # llama.cpp server (test_lab_generations), where it takes a second instead of vLLM's half minute
    # twice (the change, then this module's restore); vLLM's own readiness gate is the first deploy's
    # (test_lab_ask) and tune's.

def test_status_and_bench_show_the_servers_own_figures(deployed: dict) -> None:
    code, report, text = invoke_json("bench", "--host", "cpu-1", "--count", "6", "--concurrency", "2",
                                     "--max-tokens", "8")
    assert code == 0, text
    assert report["succeeded"] == 6 and report["tokens_per_s"] > 0 and report["ttft_p50_s"] > 0
    assert report["server_generation_tokens"] == report["output_tokens"] > 0  # the server counted them too
    code, found, text = invoke_json("status", "--cluster", "lab-cpu")
    assert code == 0 and found["healthy"], text
    host = found["hosts"]["cpu-1"]
    assert host["health"] == "ok" and host["model"] == "tiny-llama" and len(host["revision"]) == 40
    assert host["unit"]["active"] == "active" and host["figures"]["kv_cache_usage_pct"] is not None
    assert host["figures"]["generation_tokens_total"] >= report["output_tokens"]
    assert host["figures"]["prefix_cache_hit_pct"] is not None  # six prompts sharing a prefix
    table = run_invoke("status", "--cluster", "lab-cpu")
    assert "cpu-1" in table.stdout and "tiny-llama" in table.stdout and "1/1 healthy" in table.stdout
    logs = run_invoke("logs", "--host", "cpu-1", "--lines", "50")
    lines = logs.stdout.splitlines()
    assert logs.returncode == 0 and 0 < len(lines) <= 51 and '"GET /metrics HTTP/1.1" 200' in logs.stdout

def test_the_kv_estimate_agrees_with_the_running_servers_own_capacity(deployed: dict,
                                                                        lab_inventory: inventory.Inventory) -> None:
    """memory.fits estimates the tiny model's KV cache from its config.json on the hub (check, plan) and on the
    host (status); the server reports its own (vllm:cache_config_info). Its blocks times the block size must
    agree with the estimate within 1 %: vLLM's CPU build allocates VLLM_CPU_KVCACHE_SPACE in whole blocks,
    the only rounding between the two. Status shows the server's kv_cache_size_tokens, which counts requests
    of max_model_len in whole blocks (256 here: below the blocks' product)."""
    code, found, text = invoke_json("status", "--host", "cpu-1")
    assert code == 0, text
    host = found["hosts"]["cpu-1"]
    reported, estimated = host["figures"]["kv_capacity_tokens"], host["kv_estimate_tokens"]
    assert reported and estimated, text
    metrics = on_host(lab_inventory, "cpu-1", ["python3", "-"], stdin=METRICS % 8000)
    info = next(line for line in metrics.splitlines() if line.startswith(parsers.CACHE_INFO + "{"))
    labels = parsers.info_labels(info, parsers.CACHE_INFO)
    assert reported == parsers.kv_capacity(labels) == int(labels["kv_cache_size_tokens"]), (reported, labels)
    blocks = int(labels["num_gpu_blocks"]) * int(labels["block_size"])
    assert abs(blocks - estimated) <= 0.01 * blocks, (blocks, estimated)
    code, checked, text = invoke_json("check", "--host", "cpu-1")
    fits = next(f for f in checked["hosts"]["cpu-1"]["findings"] if f["id"] == "memory.fits")
    assert fits["status"] == "pass" and fits["evidence"]["context_tokens"] == estimated, text
    code, planned, text = invoke_json("plan", "--host", "cpu-1")
    assert planned["hosts"]["cpu-1"]["memory"]["evidence"]["kv_bytes_per_token"] == 1024, text


def test_status_with_a_host_down_returns_within_its_timeout(the_lab: lab.Lab, tmp_path: Path) -> None:
    veth = the_lab.state()["hosts"]["h200"]["veth"]
    hosts = group_inventory(the_lab, "lab", tmp_path)  # every host of this group's
    subprocess.run(["ip", "link", "set", veth, "down"], check=True)
    try:
        started = time.monotonic()
        code, found, _text = invoke_json("status", "--all", "--timeout", "3", "--inventory", str(hosts))
        took = time.monotonic() - started
    finally:
        subprocess.run(["ip", "link", "set", veth, "up"], check=True)
    assert code == 1
    assert found["hosts"]["h200"]["reachable"] is False and found["hosts"]["h200"]["problem"]
    assert found["hosts"]["ws-5090"]["reachable"] is True  # the others are still reported
    assert took < 3 + 1 + 2 + 4  # timeout + window + margin, plus the tool's own start
