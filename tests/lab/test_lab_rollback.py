"""rollback on the lab's cpu-2 under a bounded load loop, against its llama.cpp server: it restores the
generation that ran before the deploy (whatever other generations earlier tests left numbered in
between), it says success only once the restored generation answers (a completion and status, right
after rc 0), and what a run applied with --set shows in status as drift until it is rolled back. Two
restarts in all (the deploy of a harmless change, then its rollback). Generations, drift and the
readiness gate are the tool's, not the engine's: llama.cpp's server starts in a second, where vLLM's
CPU build takes half a minute or more (test_lab_generations.py says the same of its own tests)."""
from __future__ import annotations

import json
import threading
import time

import pytest

from provision import inventory
from tests.lab.conftest import invoke_json, on_host, with_api_key
from tests.lab.test_lab_generations import LLAMA, current, unit

pytestmark = [pytest.mark.lab, pytest.mark.lab_group("lab-b")]

STOP = "/run/provision-test-load.stop"

# Runs on cpu-2 (its server listens on loopback only): a few clients, each sending one-token completions
# until the stop file appears, LIMIT seconds pass or COUNT requests were sent; then one JSON line.
LOAD = """
import json, os, threading, time, urllib.request
LIMIT, COUNT, CLIENTS = 300, 4000, 3
began = time.time()
results, lock = [], threading.Lock()
body = json.dumps({"model": "tiny-gguf", "prompt": "Hello", "max_tokens": 1}).encode()
def client():
    while time.time() - began < LIMIT and not os.path.exists(STOP_FILE):
        with lock:
            if len(results) >= COUNT:
                return
        sent = time.time()
        try:
            request = urllib.request.Request("http://127.0.0.1:8000/v1/completions", body,
                                             {"Content-Type": "application/json",
                                              "Authorization": "Bearer " + LAB_API_KEY})
            ok = urllib.request.urlopen(request, timeout=10).status == 200
        except Exception:
            ok = False
        with lock:
            results.append((sent, time.time(), ok))
        time.sleep(0.05 if ok else 0.2)
threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps(results))
""".replace("STOP_FILE", repr(STOP))

# One completion, waited for as long as a loaded two-core lab host may take to answer one (three
# clients keep it busy): a server that is down refuses the connection at once, whatever the timeout.
ONE_COMPLETION = """
import json, urllib.request
body = json.dumps({"model": "tiny-gguf", "prompt": "Hello", "max_tokens": 1}).encode()
request = urllib.request.Request("http://127.0.0.1:8000/v1/completions", body,
                                 {"Content-Type": "application/json", "Authorization": "Bearer " + LAB_API_KEY})
print(urllib.request.urlopen(request, timeout=60).status)
"""


def test_rollback_under_load_returns_once_the_restored_generation_answers(
        lab_llama: inventory.Inventory) -> None:
    lab_inventory = lab_llama  # cpu-2 up and serving lab-llama as the lab inventory declares it
    before = current(lab_inventory, LLAMA)
    # What runs now is what the rollback must come back to: a generation a rollback may restore.
    assert before["state"] in ("good", "applied"), before
    code, deployed, text = invoke_json("deploy", "--cluster", "lab-llama", "--set", "max_model_len=200",
                                       "--timeout", "420")
    assert code == 0 and deployed["hosts"][0]["state"] == "ready", text
    code, found, text = invoke_json("status", "--cluster", "lab-llama")
    drift = found["hosts"]["cpu-2"]["drift"]
    assert any("--set max_model_len" in line for line in drift), text  # healthy, yet not the inventory's

    on_host(lab_inventory, "cpu-2", ["rm", "-f", STOP])
    answers: list[str] = []
    load = threading.Thread(target=lambda: answers.append(on_host(lab_inventory, "cpu-2", ["python3", "-"], with_api_key(LOAD))))
    load.start()
    try:
        time.sleep(3)  # the loop is under way against the deployed generation
        started = time.time()
        code, rolled, text = invoke_json("rollback", "--host", "cpu-2", "--timeout", "300")
        returned = time.time()
        # Right after rc 0, the restored generation serves: a completion, with no retry, and status
        # (still under the load) finds it healthy, running the inventory's settings again.
        answered = on_host(lab_inventory, "cpu-2", ["python3", "-"], with_api_key(ONE_COMPLETION)).strip() if code == 0 else ""
        status_code, found, status_text = invoke_json("status", "--cluster", "lab-llama") if code == 0 else (1, {}, "")
    finally:
        on_host(lab_inventory, "cpu-2", ["touch", STOP])
        load.join(timeout=360)
    assert code == 0, text
    assert answered == "200", answered
    row = rolled["hosts"]["cpu-2"]
    assert row["to"] == before["id"] and row["ready_s"] is not None, (row, before)
    status_row = found["hosts"]["cpu-2"]
    assert status_code == 0 and status_row["healthy"], status_text
    assert not any("--set" in line for line in status_row["drift"]), status_text
    assert LLAMA.context(200) not in unit(lab_inventory, LLAMA)[2]

    results = json.loads(answers[0])
    failed = [(sent, done) for sent, done, ok in results if not ok]
    print(f"load during rollback: {len(results)} requests, {len(failed)} failed; rollback took "
          f"{returned - started:.1f}s; outage {max(d for _, d in failed) - min(s for s, _ in failed):.1f}s"
          if failed else f"load during rollback: {len(results)} requests, none failed")
    assert results and any(ok for _, _, ok in results), results[:5]
    # No request sent after the rollback said success failed (clocks: the controller's and the host's
    # are the same machine's).
    assert not [sent for sent, _ in failed if sent > returned], (len(failed), returned)
    on_host(lab_inventory, "cpu-2", ["rm", "-f", STOP])
