"""Real vLLM (the CPU build) through provision on the lab's cpu-1: venv from a pushed wheelhouse,
the unit started and healthy, an unchanged host left running. A changed value restarting the server
once is the tool's, not vLLM's: test_lab_provision.py shows it on cpu-2's llama.cpp server, which
restarts in a second where vLLM's CPU build takes half a minute or more."""
from __future__ import annotations

import json
import time

import pytest

from provision import inventory, lab
from tests.lab.conftest import on_host, run_invoke, with_api_key

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("restores_lab_cpu")]

HEALTH = ("import sys, urllib.request\n"
          "try:\n    print(urllib.request.urlopen('http://127.0.0.1:%d/health', timeout=5).status)\n"
          "except Exception as exc:\n    print(exc)\n")
COMPLETE = ("import json, urllib.request\n"
            "body = json.dumps({'model': 'tiny-llama', 'prompt': 'hello world', 'max_tokens': 8}).encode()\n"
            "request = urllib.request.Request('http://127.0.0.1:%d/v1/completions', body,\n"
            "                                 {'Content-Type': 'application/json',\n"
            "                                  'Authorization': 'Bearer ' + LAB_API_KEY})\n"
            "print(urllib.request.urlopen(request, timeout=60).read().decode())\n")
METRICS = "import urllib.request\nprint(urllib.request.urlopen('http://127.0.0.1:%d/metrics').read().decode())\n"


def unit_state(lab_inventory: inventory.Inventory) -> dict[str, str]:
    text = on_host(lab_inventory, "cpu-1", ["systemctl", "show", "-p", ("ActiveState,InvocationID,ActiveEnterTimestamp,"
                                    "NRestarts,ExecMainStartTimestamp"), "vllm.service"])
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def wait_healthy(lab_inventory: inventory.Inventory, port: int = 8000, limit: float = 420) -> None:
    deadline = time.monotonic() + limit
    answer = ""
    while time.monotonic() < deadline:
        answer = on_host(lab_inventory, "cpu-1", ["python3", "-"], stdin=HEALTH % port).strip()
        if answer == "200":
            return
        time.sleep(5)
    journal = on_host(lab_inventory, "cpu-1", ["journalctl", "-u", "vllm", "--no-pager", "-n", "30"])
    pytest.fail(f"vllm.service not healthy within {limit:.0f}s ({answer}); journal:\n{journal}")


@pytest.fixture(scope="module")
def served(the_lab: lab.Lab, lab_inventory: inventory.Inventory) -> dict[str, str]:
    """cpu-1 provisioned from the lab inventory (the venv may already be there: it is kept) and healthy."""
    done = run_invoke("provision", "--cluster", "lab-cpu", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    wait_healthy(lab_inventory)
    return unit_state(lab_inventory)


def test_real_vllm_serves_the_tiny_model(served: dict[str, str], lab_inventory: inventory.Inventory) -> None:
    assert served["ActiveState"] == "active"
    reply = json.loads(on_host(lab_inventory, "cpu-1", ["python3", "-"], stdin=with_api_key(COMPLETE % 8000)))
    assert reply["model"] == "tiny-llama" and isinstance(reply["choices"][0]["text"], str)
    assert reply["usage"]["completion_tokens"] > 0
    metrics = on_host(lab_inventory, "cpu-1", ["python3", "-"], stdin=METRICS % 8000)
    assert "vllm:generation_tokens_total" in metrics and "vllm:kv_cache_usage_perc" in metrics


def test_the_venv_records_what_it_holds(served: dict[str, str], lab_inventory: inventory.Inventory) -> None:
    facts_json = json.loads(run_invoke("facts", "--host", "cpu-1", "--json").stdout)["hosts"]["cpu-1"]
    assert facts_json["venv"]["vllm"] == "0.32.0" and facts_json["venv"]["torch"].startswith("2.13.0")
    removed = on_host(lab_inventory, "cpu-1", ["/opt/vllm/venv/bin/pip", "show", "torchvision"])
    assert removed == ""  # uninstalled: it breaks imports beside the CPU torch


def test_second_provision_changes_nothing_and_does_not_restart(
        served: dict[str, str], lab_inventory: inventory.Inventory) -> None:
    again = run_invoke("provision", "--cluster", "lab-cpu", "--json")
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)["hosts"]["cpu-1"]
    assert report["changes"] == [] and report["push_bytes"] == 0
    after = unit_state(lab_inventory)
    assert after["InvocationID"] == served["InvocationID"]
    assert after["ExecMainStartTimestamp"] == served["ExecMainStartTimestamp"]


def test_the_venv_was_built_with_no_registry_reachable_and_verified(
        served: dict[str, str], lab_inventory: inventory.Inventory) -> None:
    # The three at once: each name waits out the host's resolver (about 10 s: "Temporary failure in
    # name resolution"; getaddrinfo takes no timeout of ours), 30 s one after another.
    probe = ("import socket, threading\n"
             "said = {}\n"
             "def reach(name):\n"
             "    try:\n        socket.create_connection((name, 443), timeout=3).close(); said[name] = 'reached'\n"
             "    except OSError as exc:\n        said[name] = 'unreachable'\n"
             "names = ('pypi.org', 'files.pythonhosted.org', 'huggingface.co')\n"
             "threads = [threading.Thread(target=reach, args=(name,)) for name in names]\n"
             "for thread in threads:\n    thread.start()\n"
             "for thread in threads:\n    thread.join()\n"
             "for name in names:\n    print(name, said.get(name))\n")
    answer = on_host(lab_inventory, "cpu-1", ["python3", "-"], stdin=probe)
    assert answer.split().count("unreachable") == 3, answer
    manifest = json.loads(on_host(lab_inventory, "cpu-1", ["cat", "/opt/vllm/venv/provision-manifest.json"]))
    assert manifest["versions"]["vllm"].startswith("0.32") and manifest["versions"]["torch"].startswith("2.13")
    assert manifest["versions"]["torch_cuda"] is None  # the CPU build: no CUDA arch list to check
    path = on_host(lab_inventory, "cpu-1", ["systemctl", "show", "-p", "ExecStart", "vllm.service"])
    assert "/var/lib/vllm/models/lab/tiny-llama/current" in path  # the verified revision from the hub
