"""An endpoint in the lab: cpu-2's router (HAProxy, installed by `prepare` from the lab's apt repository)
in front of two llama.cpp replicas of one model, lab-llama on cpu-2 and lab-llama-b on cpu-3.

Under a steady load through the endpoint (several clients, lab addresses only), a rolling deploy of
both replicas drains each one before its restart and puts it back after: no request fails. A replica's
server killed by its PID under load: the router stops sending to it, and no request fails meanwhile
(HAProxy retries a dropped request on the other replica). The module leaves cpu-2 as lab-llama's
inventory says without the endpoint (cpu-3 is forgotten again) and checks it.

Each case prints its figures (requests, failures, p95 latency against the steady state's).
"""
from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Self

import pytest
import yaml

from provision import inventory, lab, programs
from provision.endpoints import ADMIN_SOCKET
from tests.lab.conftest import invoke_json, on_host, run_invoke

pytestmark = [pytest.mark.lab]

KEY = "lab-endpoint-key-0123456789"  # the replicas listen beyond loopback: the endpoint and they check it
CLIENTS = 4
# A change that restarts each replica's server and nothing else: one more variable in its environment.
ROLL = ["--set", "environment={PROVISION_LAB_ROLL: '1'}"]


@dataclass
class Load:
    """CLIENTS clients sending one completion after another through the endpoint until stopped."""

    url: str
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def client(self, number: int) -> None:
        body = json.dumps({"model": "tiny-gguf", "prompt": f"client {number} says", "max_tokens": 8}).encode()
        while not self.stopping.is_set():
            started = time.monotonic()
            request = urllib.request.Request(f"{self.url}/v1/completions", data=body, headers={
                "Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=60) as answer:
                    ok = answer.status == 200 and bool(json.loads(answer.read())["choices"])
                    why = f"HTTP {answer.status}"
            except urllib.error.HTTPError as exc:
                exc.close()
                ok, why = False, f"HTTP {exc.code}: {exc.reason}"
            except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
                ok, why = False, str(exc)
            with self.lock:
                (self.latencies.append(time.monotonic() - started) if ok else self.failures.append(why))

    def __enter__(self) -> Self:
        self.threads = [threading.Thread(target=self.client, args=(n,), daemon=True) for n in range(CLIENTS)]
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=90)

    @property
    def sent(self) -> int:
        return len(self.latencies) + len(self.failures)

    def p95(self) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] if ordered else float("nan")


def router_servers(inv: inventory.Inventory) -> dict[str, str]:
    """Each replica's state in cpu-2's router, from its runtime API."""
    program = programs.ship(["router"], "router_main", {"action": "state", "socket": ADMIN_SOCKET})
    lines = on_host(inv, "cpu-2", ["python3", "-"], stdin=program).splitlines()
    result = json.loads(lines[-1])
    return {server["server"]: server["state"] for server in result["servers"]}


@pytest.fixture(scope="module")
def endpoint(the_lab: lab.Lab) -> Iterator[tuple[inventory.Inventory, str]]:
    """cpu-2 prepared (HAProxy) and both replicas deployed with the API key; afterwards cpu-3 is forgotten
    and lab-llama deployed again as the lab inventory has it, without the endpoint and the key."""
    the_lab.up(["cpu-2", "cpu-3"], progress=lambda line: None)
    before = os.environ.get("VLLM_API_KEY")
    os.environ["VLLM_API_KEY"] = KEY
    try:
        done = run_invoke("prepare", "--host", "cpu-2", timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        for cluster in ("lab-llama-b", "lab-llama"):  # the router on cpu-2 starts with a replica there to send to
            code, report, text = invoke_json("deploy", "--cluster", cluster, "--timeout", "420", timeout=2400)
            assert code == 0 and report["hosts"][0]["state"] in ("ready", "unchanged"), text
        inv = inventory.load(the_lab.inventory)
        # The router started with the last deploy: its first checks of cpu-3 may time out while the lab
        # bridge learns the new pair of hosts; it sends to a replica once a check has passed.
        deadline = time.monotonic() + 60
        while router_servers(inv) != {"lab-llama": "UP", "lab-llama-b": "UP"}:
            assert time.monotonic() < deadline, f"the router did not see both replicas up: {router_servers(inv)}"
            time.sleep(1)
        yield inv, f"http://{inv.host('cpu-2').address}:9000"
    finally:
        if before is None:
            os.environ.pop("VLLM_API_KEY", None)
        else:
            os.environ["VLLM_API_KEY"] = before
        the_lab.remove(["cpu-3"])
        code, report, text = invoke_json("deploy", "--cluster", "lab-llama", "--timeout", "420", timeout=1200)
        assert code == 0, text
        planned = run_invoke("plan", "--cluster", "lab-llama", "--json")
        assert json.loads(planned.stdout)["hosts"]["cpu-2"]["changes"] == [], planned.stdout
        assert on_host(inventory.load(the_lab.inventory), "cpu-2",
                       ["systemctl", "is-active", "provision-router.service"]).strip() != "active"


def test_the_endpoint_needs_the_key_and_status_shows_both_replicas(endpoint: tuple[inventory.Inventory, str]) -> None:
    _, url = endpoint
    request = urllib.request.Request(f"{url}/v1/completions", data=b'{"model": "tiny-gguf", "prompt": "hi"}',
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    refused.value.close()
    assert refused.value.code == 401
    code, found, text = invoke_json("status", "--host", "cpu-2", "--host", "cpu-3")
    assert code == 0, text
    replicas = found["endpoints"]["lab-tiny"]["replicas"]
    assert [(r["cluster"], r["host"], r["state"]) for r in replicas] == [
        ("lab-llama", "cpu-2", "UP"), ("lab-llama-b", "cpu-3", "UP")], replicas
    table = run_invoke("status", "--host", "cpu-2", "--host", "cpu-3")
    assert "lab-llama-b (cpu-3" in table.stdout and "UP" in table.stdout, table.stdout
    code, bench, text = invoke_json("bench", "--endpoint", "lab-tiny", "--count", "8", "--concurrency", "4",
                                    "--max-tokens", "8")
    assert code == 0 and bench["succeeded"] == 8 and bench["output_tokens"] == 64, text
    assert bench["server_generation_tokens"] is None  # spread over the replicas: not one server's counter


def test_a_rolling_deploy_of_both_replicas_fails_no_request_through_the_endpoint(
        endpoint: tuple[inventory.Inventory, str]) -> None:
    inv, url = endpoint
    with Load(url):  # warm-up: the first requests after a start are slower
        time.sleep(3)
    with Load(url) as steady:
        time.sleep(10)
    assert not steady.failures and steady.sent > 0, steady.failures[:3]
    rolls = []
    with Load(url) as rolling:
        for extra in (ROLL, []):  # the change, then back to the inventory's: both restart each replica
            code, report, text = invoke_json("deploy", "--host", "cpu-3", "--host", "cpu-2", *extra,
                                             "--timeout", "300", timeout=1200)
            assert code == 0, text
            rolls.append(report)
    states = {host["host"]: host for roll in rolls for host in roll["hosts"]}
    for roll in rolls:  # each replica was drained and put back
        for host in roll["hosts"]:
            assert {"drain", "restore"} <= set(host["steps_s"]), host
    print(f"\nrolling deploy of 2 replicas, twice, under {CLIENTS} clients: {rolling.sent} requests, "
          f"{len(rolling.failures)} failed; p95 {rolling.p95():.3f} s during the rolls against "
          f"{steady.p95():.3f} s steady ({rolling.p95() / steady.p95():.2f}x, {steady.sent} steady requests)")
    assert not rolling.failures, rolling.failures[:5]
    assert set(states) == {"cpu-2", "cpu-3"}
    assert router_servers(inv) == {"lab-llama": "UP", "lab-llama-b": "UP"}


def test_a_replica_killed_under_load_is_taken_out_by_the_router_without_a_failed_request(
        endpoint: tuple[inventory.Inventory, str]) -> None:
    inv, url = endpoint
    pid = on_host(inv, "cpu-3", ["systemctl", "show", "--property=MainPID", "--value", "llama-server.service"]).strip()
    assert pid.isdigit() and int(pid) > 0, pid
    with Load(url) as load:
        time.sleep(3)
        killed = time.monotonic()
        on_host(inv, "cpu-3", ["kill", "-9", pid])
        out_after = None
        while time.monotonic() - killed < 30:
            if router_servers(inv).get("lab-llama-b") != "UP":
                out_after = time.monotonic() - killed
                break
        time.sleep(2)
    print(f"\nreplica killed (kill -9 {pid}) under {CLIENTS} clients: the router took it out after "
          f"{out_after if out_after is None else round(out_after, 2)} s; {load.sent} requests, "
          f"{len(load.failures)} failed")
    assert out_after is not None, "the router still sends to the killed replica after 30 s"
    assert not load.failures, load.failures[:5]
    deadline = time.monotonic() + 90  # systemd starts it again (Restart=on-failure); the router takes it back
    while router_servers(inv).get("lab-llama-b") != "UP":
        assert time.monotonic() < deadline, "the restarted replica is not back in the router"
        time.sleep(1)


def router_pid(inv: inventory.Inventory) -> str:
    """The router's master process (HAProxy's master-worker mode: a reload keeps it, a restart does not)."""
    return on_host(inv, "cpu-2", ["systemctl", "show", "--property=MainPID", "--value", "provision-router.service"]).strip()


def test_an_endpoint_losing_and_regaining_a_replica_reloads_its_router_without_a_failed_request(
        the_lab: lab.Lab, endpoint: tuple[inventory.Inventory, str]) -> None:
    inv, url = endpoint
    original = the_lab.inventory.read_text()
    document = yaml.safe_load(original)
    document["endpoints"]["lab-tiny"]["clusters"] = ["lab-llama"]
    pid = router_pid(inv)
    with Load(url) as load:
        try:
            time.sleep(2)
            the_lab.inventory.write_text(yaml.safe_dump(document, sort_keys=False))
            code, one, text = invoke_json("provision", "--host", "cpu-2", timeout=600)
            assert code == 0, text
            assert router_servers(inv) == {"lab-llama": "UP"}
            time.sleep(2)
        finally:
            the_lab.inventory.write_text(original)
        code, both, text = invoke_json("provision", "--host", "cpu-2", timeout=600)
        assert code == 0, text
        time.sleep(2)
    for report in (one, both):
        changes = [(change["kind"], change["target"]) for change in report["hosts"]["cpu-2"]["changes"]]
        assert changes == [("file", "/etc/provision-router/haproxy.cfg"), ("reload", "provision-router.service")], changes
    print(f"\nreplica lab-llama-b taken out of the endpoint and put back (two router reloads) under {CLIENTS} "
          f"clients: {load.sent} requests, {len(load.failures)} failed, p95 {load.p95():.3f} s")
    assert router_pid(inv) == pid  # reloaded, never restarted
    assert not load.failures, load.failures[:5]
    deadline = time.monotonic() + 30
    while router_servers(inv) != {"lab-llama": "UP", "lab-llama-b": "UP"}:
        assert time.monotonic() < deadline, f"lab-llama-b is not back in the router: {router_servers(inv)}"
        time.sleep(1)
