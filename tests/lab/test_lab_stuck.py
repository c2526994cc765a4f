"""A wedged engine looks healthy, and status says it is not: on cpu-1's running vLLM (the CPU build runs
its API server and its EngineCore as separate processes, like the GPU build), the EngineCore process is
stopped (SIGSTOP) while four long completions run. /health and /v1/models, the API server's, still
answer; status calls the host stuck (exit 1) once the counter has stood still for the stall window (3 s
here). The EngineCore is always continued (SIGCONT) before the test ends; the completions then finish
and status is healthy again. Nothing is left on the host: the server is the one the lab left running."""
from __future__ import annotations

import json
import threading
import time

import pytest

from provision import inventory
from tests.lab.conftest import invoke_json, on_host, restore_lab_cpu, with_api_key

pytestmark = [pytest.mark.lab]

# Four completions of 200 tokens (ignore_eos: the tiny random model would stop early); as soon as the
# server counts them running, the EngineCore is stopped. Then it waits for its completions (they
# finish once the test continues the engine) and prints what it saw.
LOAD = r'''
import json, os, signal, sys, threading, time, urllib.request
base = "http://127.0.0.1:%s" % sys.argv[1]

def engine_core():
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and open("/proc/%s/comm" % pid).read().startswith("VLLM::EngineCor"):
                return int(pid)
        except OSError:
            pass

def running():
    with urllib.request.urlopen(base + "/metrics", timeout=5) as answer:
        return sum(float(line.rsplit(" ", 1)[1]) for line in answer.read().decode().splitlines()
                   if line.startswith("vllm:num_requests_running{"))

done = []
def complete(number):
    body = json.dumps({"model": "tiny-llama", "prompt": "Tell me about GPUs %d" % number, "max_tokens": 200,
                       "ignore_eos": True}).encode()
    request = urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json",
                                                                      "Authorization": "Bearer " + LAB_API_KEY})
    try:
        with urllib.request.urlopen(request, timeout=300) as answer:
            done.append(json.loads(answer.read())["usage"]["completion_tokens"])
    except Exception as exc:
        done.append(repr(exc))

clients = [threading.Thread(target=complete, args=(number,)) for number in range(4)]
for client in clients:
    client.start()
pid, seen, deadline = engine_core(), 0.0, time.time() + 20
while pid and time.time() < deadline:
    seen = running()
    if seen > 0:
        os.kill(pid, signal.SIGSTOP)
        break
    time.sleep(0.02)
for client in clients:
    client.join(300)
print(json.dumps({"engine_core": pid, "running_when_stopped": seen, "completions": done}))
'''

# The EngineCore's pid and state ("T": stopped); with the argument "cont", continue it first.
ENGINE = r'''
import json, os, signal, sys
for pid in os.listdir("/proc"):
    try:
        if pid.isdigit() and open("/proc/%s/comm" % pid).read().startswith("VLLM::EngineCor"):
            if sys.argv[1:] == ["cont"]:
                os.kill(int(pid), signal.SIGCONT)
            state = open("/proc/%s/stat" % pid).read().rsplit(")", 1)[1].split()[0]
            print(json.dumps({"pid": int(pid), "state": state}))
    except OSError:
        pass
'''


def engine_state(inv: inventory.Inventory, *args: str) -> dict:
    lines = on_host(inv, "cpu-1", ["python3", "-", *args], stdin=ENGINE).splitlines()
    return json.loads(lines[0]) if lines else {}


@pytest.fixture(scope="module")
def serving(the_lab: object, lab_inventory: inventory.Inventory) -> int:
    """cpu-1's server as the lab left it, answering (deployed first only where it is not)."""
    code, found, _text = invoke_json("status", "--host", "cpu-1")
    if code != 0 or found["hosts"]["cpu-1"]["health"] != "ok":  # exit 0 also where cpu-1 is idle: never deployed
        restore_lab_cpu()
    return int(lab_inventory.settings("cpu-1", {}).port)


def test_a_stopped_engine_core_under_running_requests_is_stuck_then_healthy_again(
        serving: int, lab_inventory: inventory.Inventory) -> None:
    loaded: dict = {}
    load = threading.Thread(target=lambda: loaded.update(json.loads(
        on_host(lab_inventory, "cpu-1", ["python3", "-", str(serving)], stdin=with_api_key(LOAD)))))
    load.start()
    try:
        deadline = time.monotonic() + 60
        while engine_state(lab_inventory).get("state") != "T" and time.monotonic() < deadline and load.is_alive():
            time.sleep(0.5)
        assert engine_state(lab_inventory).get("state") == "T", f"the EngineCore was not stopped: {loaded}"
        code, found, text = invoke_json("status", "--host", "cpu-1", "--stall-window", "3")
        host = found["hosts"]["cpu-1"]
        assert code == 1 and not found["healthy"], text
        assert host["health"] == "ok" and host["model"] == "tiny-llama", text  # what /health and /v1/models say
        assert host["progress"]["state"] == "stuck" and host["progress"]["seconds"] >= 3, text
        running = host["figures"]["running"]
        assert running >= 1 and host["figures"]["generation_tokens_per_s"] == 0, text
        assert host["problem"].startswith("stuck: vllm:generation_tokens_total has not moved for "), text
    finally:
        continued = engine_state(lab_inventory, "cont")
        load.join(300)
    assert continued.get("state") != "T" and not load.is_alive(), (continued, loaded)
    # The gauge status read is what the engine published last before it stopped: at least what the load
    # saw when it stopped it, at most the four it sent (the engine may schedule more between the two).
    assert loaded["running_when_stopped"] <= running <= 4 and loaded["completions"] == [200] * 4, (running, loaded)
    code, found, text = invoke_json("status", "--host", "cpu-1", "--stall-window", "3")
    assert code == 0 and found["hosts"]["cpu-1"]["progress"]["state"] in ("no requests", "generating"), text
