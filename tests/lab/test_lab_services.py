"""Two services on one lab host: cpu-3 serves two tiny models with llama.cpp's server, each its own
target (cpu-3/a, cpu-3/b), port, unit, environment file and generations.

cpu-3 first serves one model as the lab inventory has it (lab-llama-b); the inventory then declares
the two services, and the deploy's plan says the old unit is renamed. Service b deployed with a flag
its server refuses is rolled back on its own while service a keeps answering: every request sent to
a during b's failed deploy is answered, and a's server is the same process before and after. The
module forgets cpu-3 afterwards (as test_lab_router does).

Each case prints its figures (requests to a during b's deploy, failures, seconds).
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from provision import inventory, lab
from provision.lab import llama_cpp_lab_build
from tests.lab.conftest import invoke_json, on_host, run_invoke, with_api_key

pytestmark = [pytest.mark.lab, pytest.mark.lab_group("lab-b")]

SERVED = {"engine": "llamacpp", **llama_cpp_lab_build(), "max_model_len": 256}  # lab-llama's build: its cache
SERVICES = {"a": {"vars": {"model": "lab/tiny-gguf", "served_model_name": "tiny-a", "port": 8000}},
            "b": {"vars": {"model": "lab/tiny-gguf-b", "served_model_name": "tiny-b", "port": 8001}}}
ASK = """
import json, sys, urllib.request
body = json.dumps({"model": sys.argv[2], "prompt": "hello", "max_tokens": 4}).encode()
request = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer " + LAB_API_KEY})
with urllib.request.urlopen(request, timeout=20) as answer:
    print(json.loads(answer.read())["model"])
"""


def with_services(lab_file: Path, into: Path) -> Path:
    """The lab inventory with cpu-3 out of lab-llama-b (and its endpoint) and serving two services."""
    data = yaml.safe_load(lab_file.read_text())
    data["clusters"].pop("lab-llama-b", None)
    data.pop("endpoints", None)
    host = data["hosts"]["cpu-3"]
    host["vars"] = {**host.get("vars", {}), **SERVED}
    host["services"] = SERVICES
    into.write_text(yaml.safe_dump(data, sort_keys=False))
    return into


def ask(inv: inventory.Inventory, port: int, model: str) -> str:
    return on_host(inv, "cpu-3", ["python3", "-", str(port), model], stdin=with_api_key(ASK)).strip()


def main_pid(inv: inventory.Inventory, unit: str) -> str:
    return on_host(inv, "cpu-3", ["systemctl", "show", "--property=MainPID", "--value", unit]).strip()


@pytest.fixture(scope="module")
def two_services(the_lab: lab.Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """cpu-3 serving lab-llama-b as one server, then moved to two services; forgotten afterwards."""
    the_lab.up(["cpu-3"], progress=lambda line: None)
    try:
        # On loopback: lab-llama-b listens on the lab network for an endpoint, which needs the API key.
        code, report, text = invoke_json("deploy", "--cluster", "lab-llama-b", "--set", "bind_host=127.0.0.1",
                                         "--timeout", "420", timeout=2400)
        assert code == 0, text
        path = with_services(the_lab.inventory, tmp_path_factory.mktemp("services") / "inventory.yaml")
        planned = run_invoke("plan", "--host", "cpu-3", "--inventory", str(path))
        assert planned.returncode == 0, planned.stdout + planned.stderr
        code, report, text = invoke_json("deploy", "--host", "cpu-3", "--inventory", str(path), "--timeout", "420",
                                         timeout=1200)
        assert code == 0, text
        assert [(row["host"], row["state"]) for row in report["hosts"]] == [("cpu-3/a", "ready"), ("cpu-3/b", "ready")], text
        yield path, planned.stdout
    finally:
        the_lab.remove(["cpu-3"])


def test_two_models_serve_side_by_side_each_with_its_own_unit_and_status_row(two_services: tuple[Path, str]) -> None:
    path, planned = two_services
    # Moving to services, the plan said which unit became which.
    assert "renamed llama-server.service -> llama-server@a.service" in planned, planned
    inv = inventory.load(path)
    assert ask(inv, 8000, "tiny-a") == "tiny-a" and ask(inv, 8001, "tiny-b") == "tiny-b"
    for unit in ("llama-server@a.service", "llama-server@b.service"):
        assert on_host(inv, "cpu-3", ["systemctl", "is-active", unit]).strip() == "active"
    assert on_host(inv, "cpu-3", ["systemctl", "is-active", "llama-server.service"]).strip() != "active"
    code, found, text = invoke_json("status", "--host", "cpu-3", "--inventory", str(path))
    assert code == 0, text
    rows = {row["host"]: row for row in found["hosts"]} if isinstance(found["hosts"], list) else found["hosts"]
    assert set(rows) == {"cpu-3/a", "cpu-3/b"}, text
    assert rows["cpu-3/a"]["unit"]["name"] == "llama-server@a.service" and rows["cpu-3/a"]["healthy"]
    assert rows["cpu-3/b"]["unit"]["name"] == "llama-server@b.service" and rows["cpu-3/b"]["healthy"]
    planned_again = run_invoke("plan", "--host", "cpu-3", "--inventory", str(path), "--json")
    hosts = json.loads(planned_again.stdout)["hosts"]
    assert hosts["cpu-3/a"]["changes"] == [] and hosts["cpu-3/b"]["changes"] == [], planned_again.stdout


def test_a_bad_flag_on_one_service_is_rolled_back_while_the_other_keeps_answering(
        two_services: tuple[Path, str]) -> None:
    path, _ = two_services
    inv = inventory.load(path)
    pid_before = main_pid(inv, "llama-server@a.service")
    answers: list[str] = []
    failures: list[str] = []
    stopping = threading.Event()

    def keep_asking() -> None:
        while not stopping.is_set():
            try:
                answers.append(ask(inv, 8000, "tiny-a"))
            except Exception as exc:  # noqa: BLE001 - every failure is counted and shown
                failures.append(str(exc)[-200:])
            time.sleep(0.2)

    asker = threading.Thread(target=keep_asking, daemon=True)
    started = time.monotonic()
    asker.start()
    try:
        code, report, text = invoke_json("deploy", "--host", "cpu-3/b", "--inventory", str(path), "--timeout", "30",
                                         "--set", "extra_args=['--no-such-flag']", timeout=900)
        # A crash is seen at once, so the deploy and its rollback can take under two seconds: the load
        # goes on until it has made its five requests, every one of them overlapping or following them.
        until = time.monotonic() + 10
        while len(answers) + len(failures) < 5 and time.monotonic() < until:
            time.sleep(0.2)
    finally:
        stopping.set()
        asker.join(timeout=60)
    seconds = time.monotonic() - started
    print(f"\nservice a during service b's failed deploy and rollback: {len(answers) + len(failures)} requests, "
          f"{len(failures)} failed, {seconds:.1f} s")
    assert code == 1, text
    assert [row["host"] for row in report["hosts"]] == ["cpu-3/b"] and report["hosts"][0]["state"] != "ready", text
    assert "rolled back" in text or "rejected" in text, text
    assert not failures and len(answers) >= 5 and set(answers) == {"tiny-a"}, failures[:3]
    assert main_pid(inv, "llama-server@a.service") == pid_before  # a never restarted
    assert ask(inv, 8001, "tiny-b") == "tiny-b"  # b serves its last good generation again
    planned = run_invoke("plan", "--host", "cpu-3", "--inventory", str(path), "--json")
    hosts = json.loads(planned.stdout)["hosts"]
    assert hosts["cpu-3/a"]["changes"] == [] and hosts["cpu-3/b"]["changes"] == [], planned.stdout
