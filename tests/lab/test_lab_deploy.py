"""deploy, status, bench and logs against real vLLM (the CPU build) on the lab's cpu-1; what systemd
and the roll do with a server that dies, on cpu-2's llama.cpp server (it starts in a second)."""
from __future__ import annotations

import subprocess
import time

import pytest

from provision import inventory, lab, parsers
from tests.lab.conftest import invoke_json, on_host, run_invoke
from tests.lab.test_lab_provision import SNAPSHOT
from tests.lab.test_lab_serve import METRICS

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("restores_lab_cpu")]

def llama_unit_files(inv: inventory.Inventory) -> str:
    return on_host(inv, "cpu-2", ["sha256sum", "/etc/systemd/system/llama-server.service", "/etc/vllm/vllm.env"])

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


def test_a_killed_server_is_restarted_by_systemd_and_status_shows_it(lab_llama: inventory.Inventory) -> None:
    # On cpu-2's llama.cpp server: systemd's restart and status's count are the engine's no more than
    # the roll below is, and it starts in a second where vLLM's CPU build takes half a minute.
    before = invoke_json("status", "--host", "cpu-2")[1]["hosts"]["cpu-2"]["unit"]["restarts"]
    on_host(lab_llama, "cpu-2", ["systemctl", "kill", "--signal=SIGKILL", "--kill-whom=main", "llama-server.service"])
    deadline = time.monotonic() + 120
    host: dict = {}
    while time.monotonic() < deadline:
        code, found, _ = invoke_json("status", "--host", "cpu-2")
        host = found.get("hosts", {}).get("cpu-2", {})
        if code == 0 and host.get("unit", {}).get("restarts") == before + 1:
            break
        time.sleep(2)
    assert host["unit"]["restarts"] == before + 1 and host["health"] == "ok", host

def test_a_broken_config_stops_the_roll_and_the_host_returns_to_what_worked(lab_llama: inventory.Inventory) -> None:
    inv = lab_llama
    working, other = llama_unit_files(inv), on_host(inv, "h200", SNAPSHOT)
    code, report, text = invoke_json("deploy", "--host", "cpu-2", "--host", "h200", "--timeout", "420",
                                     "--set", 'extra_args=["--no-such-flag"]')
    assert code == 1
    rows = {row["host"]: row for row in report["hosts"]}
    assert rows["cpu-2"]["state"] == "rolled back", text
    assert "crashed" in rows["cpu-2"]["detail"] or "failed" in rows["cpu-2"]["detail"]
    assert rows["h200"]["state"] == "not rolled"
    assert llama_unit_files(inv) == working  # the files this deploy wrote are back
    assert on_host(inv, "h200", SNAPSHOT) == other  # the host after it was never touched
    code, found, text = invoke_json("status", "--host", "cpu-2")
    assert code == 0 and found["hosts"]["cpu-2"]["health"] == "ok", text

def test_a_server_that_exits_with_status_zero_after_start_fails_the_deploy_within_seconds(
        lab_llama: inventory.Inventory) -> None:
    """llama-server given --version prints its build and exits with status 0 right after its start, as
    vLLM's API server does once its engine died: the deploy says so at once (not after its timeout),
    with the exit status and the journal's own lines, and the host returns to what worked."""
    working = llama_unit_files(lab_llama)
    started = time.monotonic()
    code, report, text = invoke_json("deploy", "--host", "cpu-2", "--timeout", "420",
                                     "--set", 'extra_args=["--version"]')
    took = time.monotonic() - started
    assert code == 1, text
    row = {row["host"]: row for row in report["hosts"]}["cpu-2"]
    assert row["state"] == "rolled back", text
    assert "llama-server.service crashed after start (exit status 0" in row["detail"], row
    assert "version" in row["detail"].split("):", 1)[1], row  # llama-server's own line, from the journal
    assert took < 90, took  # seconds of readiness, not the 420 s timeout
    assert llama_unit_files(lab_llama) == working


def test_status_with_a_host_down_returns_within_its_timeout(the_lab: lab.Lab) -> None:
    veth = the_lab.state()["hosts"]["h200"]["veth"]
    subprocess.run(["ip", "link", "set", veth, "down"], check=True)
    try:
        started = time.monotonic()
        code, found, _text = invoke_json("status", "--all", "--timeout", "3")
        took = time.monotonic() - started
    finally:
        subprocess.run(["ip", "link", "set", veth, "up"], check=True)
    assert code == 1
    assert found["hosts"]["h200"]["reachable"] is False and found["hosts"]["h200"]["problem"]
    assert found["hosts"]["ws-5090"]["reachable"] is True  # the others are still reported
    assert took < 3 + 1 + 2 + 4  # timeout + window + margin, plus the tool's own start
