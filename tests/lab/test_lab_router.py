"""An endpoint in the lab: cpu-2's router (HAProxy, installed by `prepare` from the lab's apt repository)
in front of two llama.cpp replicas of one model, lab-llama on cpu-2 and lab-llama-b on cpu-3.

The load is what people put on an endpoint: eight clients streaming chats whose prompts fill most of
the served context, every request's outcome judged from its own stream and counted. Steady, it fails
nothing (llama.cpp's slots each hold max_model_len). A rolling deploy of both replicas drains each one
before its restart and puts it back after: no request fails. A replica's server killed by its PID under
load: the router stops sending to it; the streams it was answering are cut (nothing can save those),
and no request sent from the kill on fails (HAProxy retries a refused one on the other replica). The
module leaves cpu-2 as lab-llama's inventory says without the endpoint (cpu-3 is forgotten again) and
checks it.

Each case prints its counts (requests by outcome, p95 latency against the steady state's).
"""
from __future__ import annotations

import functools
import http.client
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import pytest
import yaml

from provision import inventory, lab, programs
from provision.endpoints import ADMIN_SOCKET
from tests.lab import prometheus_lab
from tests.lab.conftest import group_inventory, invoke_json, lab_api_key, on_host, run_invoke

pytestmark = [pytest.mark.lab, pytest.mark.lab_group("lab-b")]

# The replicas listen beyond loopback: the endpoint and they check the lab's API key (its secrets
# file's), which the tool sends with no VLLM_API_KEY in the environment, and these clients send too.
KEY = functools.cache(lab_api_key)
# Streamed chats from eight clients, as people load an endpoint: each prompt near the served context
# (max_model_len 256 per request: PROMPT_TOKENS of prompt, MAX_TOKENS of answer, a few spare).
CLIENTS = 8
MAX_TOKENS = 16
PROMPT_TOKENS = 220
# A change that restarts each replica's server and nothing else: one more variable in its environment.
ROLL = ["--set", "environment={PROVISION_LAB_ROLL: '1'}"]


def outcome_of(status: int, lines: list[str]) -> str:
    """One streamed chat's outcome, judged here from its lines (not by the tool's own reader): "ok" when
    it ended with [DONE] or a finish reason and carried no error chunk, else why not."""
    finished = done = False
    for line in lines:
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            done = True
            continue
        chunk = json.loads(payload)
        if "error" in chunk or chunk.get("object") == "error":
            return f"error in the stream: {json.dumps(chunk)[:200]}"
        finished = finished or any(choice.get("finish_reason") for choice in chunk.get("choices") or [])
    if status != 200:
        return f"HTTP {status}"
    return "ok" if done or finished else "cut: no [DONE] and no finish reason"


def chat(url: str, messages: list[dict[str, str]], timeout: float = 60) -> tuple[str, str]:
    """One streamed chat through the endpoint, read to its end: (outcome, its text)."""
    body = json.dumps({"model": "tiny-gguf", "messages": messages, "max_tokens": MAX_TOKENS, "stream": True,
                       "temperature": 0}).encode()
    request = urllib.request.Request(f"{url}/v1/chat/completions", data=body, headers={
        "Authorization": f"Bearer {KEY()}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            lines = [raw.decode("utf-8", "replace").strip() for raw in answer]
            status = answer.status
    except urllib.error.HTTPError as exc:
        why = exc.read(300).decode("utf-8", "replace")
        exc.close()
        return f"HTTP {exc.code}: {why}", ""
    except TimeoutError:
        return "timeout", ""
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        return f"reset: {type(exc).__name__}: {exc}", ""
    try:
        found = outcome_of(status, lines)
    except ValueError:
        found = "a line that is not JSON"
    text = "".join(json.loads(line[5:]).get("choices", [{}])[0].get("delta", {}).get("content") or ""
                   for line in lines if line.startswith("data:") and line[5:].strip() not in ("[DONE]", "")
                   and found == "ok")
    return found, text


def prompt_near_the_context(url: str) -> str:
    """A user message whose chat, with the model's template, is about PROMPT_TOKENS tokens as the server
    counts them (its usage.prompt_tokens of a one-token chat), found from two probes (linear in words)."""
    def tokens(words: int) -> int:
        body = json.dumps({"model": "tiny-gguf", "max_tokens": 1, "messages": [
            {"role": "user", "content": " ".join(f"w{i % 10}" for i in range(words))}]}).encode()
        request = urllib.request.Request(f"{url}/v1/chat/completions", data=body, headers={
            "Authorization": f"Bearer {KEY()}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            return int(json.loads(answer.read())["usage"]["prompt_tokens"])

    low, high = tokens(10), tokens(40)
    words = 10 + int((PROMPT_TOKENS - low) * 30 / max(1, high - low))
    assert PROMPT_TOKENS - 8 <= tokens(words) <= PROMPT_TOKENS + 8, (low, high, words, tokens(words))
    return " ".join(f"w{i % 10}" for i in range(words))


@dataclass
class Load:
    """CLIENTS clients streaming one chat after another through the endpoint until stopped, each
    request's start, end and outcome counted."""

    url: str
    prompt: str
    outcomes: list[tuple[float, float, str]] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def client(self, number: int) -> None:
        turn = 0
        while not self.stopping.is_set():
            started = time.monotonic()
            found, _ = chat(self.url, [{"role": "user", "content": f"{number}.{turn % 10} {self.prompt}"}])
            turn += 1
            with self.lock:
                self.outcomes.append((started, time.monotonic(), found))

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
        return len(self.outcomes)

    @property
    def failures(self) -> list[str]:
        return [found for _, _, found in self.outcomes if found != "ok"]

    def counts(self) -> str:
        """Every outcome and how often: "412 ok" or "398 ok, 14 cut: ...". """
        tally: dict[str, int] = {}
        for _, _, found in self.outcomes:
            tally[found] = tally.get(found, 0) + 1
        return ", ".join(f"{n} {found}" for found, n in sorted(tally.items(), key=lambda item: -item[1]))

    def p95(self) -> float:
        ordered = sorted(end - start for start, end, found in self.outcomes if found == "ok")
        return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] if ordered else float("nan")


def router_servers(inv: inventory.Inventory) -> dict[str, str]:
    """Each replica's state in cpu-2's router, from its runtime API."""
    program = programs.ship(["router"], "router_main", {"action": "state", "socket": ADMIN_SOCKET})
    lines = on_host(inv, "cpu-2", ["python3", "-"], stdin=program).splitlines()
    result = json.loads(lines[-1])
    return {server["server"]: server["state"] for server in result["servers"]}


@pytest.fixture(scope="module")
def endpoint(the_lab: lab.Lab) -> Iterator[tuple[inventory.Inventory, str, str]]:
    """cpu-2 prepared (HAProxy) and both replicas deployed, the tool given no secret in its environment
    (the lab's secrets file holds them); afterwards cpu-3 is forgotten and lab-llama deployed again as
    the lab inventory has it, without the endpoint."""
    the_lab.up(["cpu-2", "cpu-3"], progress=lambda line: None)
    before = os.environ.pop("VLLM_API_KEY", None)
    try:
        done = run_invoke("prepare", "--host", "cpu-2", timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        for cluster in ("lab-llama-b", "lab-llama"):  # the router on cpu-2 starts with a replica there to send to
            code, report, text = invoke_json("deploy", "--cluster", cluster, "--timeout", "420", timeout=2400)
            assert code == 0 and report["hosts"][0]["state"] in ("ready", "unchanged"), text
        inv = inventory.load(the_lab.inventory)
        # The router started with the last deploy: its first checks of cpu-3 may time out while the lab
        # network learns the new cpu-3 (a host of that address was there before, under another MAC), and
        # HAProxy calls a server UP before its first check has run. Both must stay UP over three checks.
        deadline = time.monotonic() + 90
        steady_since: float | None = None
        while True:
            now = time.monotonic()
            if router_servers(inv) == {"lab-llama": "UP", "lab-llama-b": "UP"}:
                steady_since = steady_since or now
                if now - steady_since >= 6:
                    break
            else:
                steady_since = None
            assert now < deadline, f"the router did not keep both replicas up: {router_servers(inv)}"
            time.sleep(1)
        url = f"http://{inv.host('cpu-2').address}:9000"
        yield inv, url, prompt_near_the_context(url)
    finally:
        if before is not None:
            os.environ["VLLM_API_KEY"] = before
        the_lab.remove(["cpu-3"])
        code, report, text = invoke_json("deploy", "--cluster", "lab-llama", "--timeout", "420", timeout=1200)
        assert code == 0, text
        planned = run_invoke("plan", "--cluster", "lab-llama", "--json")
        assert json.loads(planned.stdout)["hosts"]["cpu-2"]["changes"] == [], planned.stdout
        assert on_host(inventory.load(the_lab.inventory), "cpu-2",
                       ["systemctl", "is-active", "provision-router.service"]).strip() != "active"


def test_the_endpoint_needs_the_key_and_status_shows_both_replicas(
        endpoint: tuple[inventory.Inventory, str, str]) -> None:
    _, url, _ = endpoint
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


def test_a_bare_status_after_deploying_the_endpoint_is_not_red_without_exported_keys(
        the_lab: lab.Lab, endpoint: tuple[inventory.Inventory, str, str], tmp_path: Path) -> None:
    """The lab's commands need no environment of yours: its secrets file holds the key the endpoint
    and its replicas check, and a plain `status` (every host) sends it."""
    assert "VLLM_API_KEY" not in os.environ
    # Every host of this group's (the other group's change meanwhile): tests/lab/conftest.py.
    code, found, text = invoke_json("status", "--inventory", str(group_inventory(the_lab, "lab-b", tmp_path)))
    assert code == 0 and found["healthy"], text
    assert not [name for name, host in found["hosts"].items() if host.get("problem")], text
    assert "HTTP 401" not in text
    for name in ("cpu-2", "cpu-3"):
        assert found["hosts"][name]["health"] == "ok", found["hosts"][name]
    assert {r["host"]: r["state"] for r in found["endpoints"]["lab-tiny"]["replicas"]} == {"cpu-2": "UP", "cpu-3": "UP"}


@pytest.fixture(scope="module")
def prometheus(the_lab: lab.Lab, endpoint: tuple[inventory.Inventory, str, str],
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """Prometheus on cpu-2 as the tool puts it there (`prepare`, `metrics --apply`), scraping lab-llama on
    cpu-2, lab-llama-b on cpu-3 (with the key), the endpoint's router and cpu-3's node exporter (Debian's,
    installed as a site would); removed from both hosts afterwards. Its inventory and its address."""
    inv, _, _ = endpoint
    on_host(inv, "cpu-3", ["apt-get", "update", "-q"])
    on_host(inv, "cpu-3", ["apt-get", "install", "-y", "-q", "prometheus-node-exporter"])
    path = prometheus_lab.prometheus_inventory(the_lab, "lab-b", "cpu-2", tmp_path_factory.mktemp("prometheus"))
    try:
        applied = prometheus_lab.put_prometheus(path, "cpu-2")
        print("\nmetrics --apply: " + json.dumps(applied["applied"]["health"]))
        yield path, f"http://{inv.host('cpu-2').address}:{prometheus_lab.PORT}"
    finally:
        prometheus_lab.remove_prometheus(inv, "cpu-2")
        on_host(inv, "cpu-3", ["apt-get", "purge", "-y", "-q", "prometheus-node-exporter"])
        on_host(inv, "cpu-3", ["rm", "-rf", "/var/lib/prometheus"])


def test_prometheus_scrapes_both_replicas_the_router_and_the_node_exporter_and_every_panel_answers(
        endpoint: tuple[inventory.Inventory, str, str], prometheus: tuple[Path, str]) -> None:
    path, url = prometheus
    _, endpoint_url, _ = endpoint
    up = prometheus_lab.wait_until_up(url, {"servers", "routers", "node", "prometheus"})
    servers = {labels["host"]: labels for labels in up.values() if labels["job"].startswith("provision-servers")}
    assert {host: (labels["cluster"], labels["engine"], labels["model"], labels["endpoint"])
            for host, labels in servers.items()} == {"cpu-2": ("lab-llama", "llamacpp", "tiny-gguf", "lab-tiny"),
                                                     "cpu-3": ("lab-llama-b", "llamacpp", "tiny-gguf", "lab-tiny")}
    # Both replicas' pages check the key: their job sends it from the key file.
    assert {labels["job"] for labels in servers.values()} == {"provision-servers-keyed"}
    code, bench, text = invoke_json("bench", "--endpoint", "lab-tiny", "--count", "8", "--concurrency", "4",
                                    "--max-tokens", "8")
    assert code == 0 and bench["succeeded"] == 8, text
    time.sleep(3)  # two scrapes after the requests: rates over them
    empty = {name: prometheus_lab.unanswered_panels(url, name) for name in ("llamacpp", "endpoint")}
    assert empty == {"llamacpp": [], "endpoint": []}, empty
    # What the tool knows of cpu-3 beside its engine's metrics: node-exporter's textfile, which --apply wrote.
    known = prometheus_lab.query(url, 'provision_unit_active{host="cpu-3"}')
    assert {item["metric"]["unit"]: item["value"][1] for item in known} == {"llama-server.service": "1"}, known
    assert prometheus_lab.query(url, 'provision_generation{host="cpu-3"}'), "no generation of cpu-3 exported"
    # Unchanged, a second --apply writes nothing on the Prometheus host.
    code, again, text = invoke_json("metrics", "--apply", "--inventory", str(path))
    assert code == 0 and again["applied"]["written"] == [] and again["applied"]["planned"] == [], text
    assert endpoint_url


def test_a_rolling_deploy_of_both_replicas_fails_no_request_through_the_endpoint(
        endpoint: tuple[inventory.Inventory, str, str]) -> None:
    inv, url, prompt = endpoint
    with Load(url, prompt):  # warm-up: the first requests after a start are slower
        time.sleep(3)
    with Load(url, prompt) as steady:
        time.sleep(20)
    print(f"\nsteady, {CLIENTS} clients streaming chats of ~{PROMPT_TOKENS}+{MAX_TOKENS} tokens (the served "
          f"context 256): {steady.sent} requests: {steady.counts()}")
    assert not steady.failures and steady.sent > 0, steady.failures[:3]
    code, found, text = invoke_json("status", "--host", "cpu-2", "--host", "cpu-3")
    assert code == 0, text
    for replica in found["endpoints"]["lab-tiny"]["replicas"]:  # the router saw no failure either
        assert {key: replica["failures"][key] for key in ("http_5xx", "response_errors")} == {
            "http_5xx": 0, "response_errors": 0}, replica
    rolls = []
    with Load(url, prompt) as rolling:
        for extra in (ROLL, []):  # the change, then back to the inventory's: both restart each replica
            code, report, text = invoke_json("deploy", "--host", "cpu-3", "--host", "cpu-2", *extra,
                                             "--timeout", "300", timeout=1200)
            assert code == 0, text
            rolls.append(report)
    states = {host["host"]: host for roll in rolls for host in roll["hosts"]}
    for roll in rolls:  # each replica was drained and put back
        for host in roll["hosts"]:
            assert {"drain", "restore"} <= set(host["steps_s"]), host
    print(f"\nrolling deploy of 2 replicas, twice, under {CLIENTS} clients: {rolling.sent} requests "
          f"({rolling.counts()}); p95 {rolling.p95():.3f} s during the rolls against "
          f"{steady.p95():.3f} s steady ({rolling.p95() / steady.p95():.2f}x, {steady.sent} steady requests)")
    assert not rolling.failures, rolling.failures[:5]
    assert set(states) == {"cpu-2", "cpu-3"}
    assert router_servers(inv) == {"lab-llama": "UP", "lab-llama-b": "UP"}


def test_a_replica_killed_under_load_is_taken_out_by_the_router_and_only_its_streams_in_flight_are_cut(
        endpoint: tuple[inventory.Inventory, str, str]) -> None:
    """A stream whose server dies mid-answer cannot be saved (its first tokens are already the client's):
    those in flight at the kill may be cut, at most the killed replica's slots. Every request sent from
    the kill on is answered whole: the router retries refused connections on the other replica."""
    inv, url, prompt = endpoint
    pid = on_host(inv, "cpu-3", ["systemctl", "show", "--property=MainPID", "--value", "llama-server.service"]).strip()
    assert pid.isdigit() and int(pid) > 0, pid
    with Load(url, prompt) as load:
        time.sleep(3)
        # The kill lands somewhere while its SSH command runs: in flight is what overlapped that span.
        sending = time.monotonic()
        on_host(inv, "cpu-3", ["kill", "-9", pid])
        killed = time.monotonic()
        out_after = None
        while time.monotonic() - killed < 30:
            if router_servers(inv).get("lab-llama-b") != "UP":
                out_after = time.monotonic() - killed
                break
        time.sleep(2)
    in_flight = [found for started, ended, found in load.outcomes if started < killed and ended > sending]
    after = [found for started, _, found in load.outcomes if started >= killed]
    cut = [found for found in in_flight if found != "ok"]
    print(f"\nreplica killed (kill -9 {pid}) under {CLIENTS} clients: the router took it out after "
          f"{out_after if out_after is None else round(out_after, 2)} s; {load.sent} requests ({load.counts()}); "
          f"{len(in_flight)} in flight at the kill, {len(cut)} of them cut; {len(after)} sent after it, "
          f"{sum(found != 'ok' for found in after)} failed")
    assert out_after is not None, "the router still sends to the killed replica after 30 s"
    assert [found for found in after if found != "ok"] == []
    assert len(cut) <= 4 and all(found.startswith(("cut", "reset")) for found in cut), cut
    deadline = time.monotonic() + 90  # systemd starts it again (Restart=on-failure); the router takes it back
    while router_servers(inv).get("lab-llama-b") != "UP":
        assert time.monotonic() < deadline, "the restarted replica is not back in the router"
        time.sleep(1)


Ran = tuple[int, dict[str, Any], str, float]


def deploy_at_once(*runs: list[str], apart: float = 0.05) -> list[Ran]:
    """Deploys started `apart` seconds one after the other, each a process of its own, run to their
    end: each one's exit code, --json document, output, and when it ended (monotonic)."""
    found: dict[int, Ran] = {}
    lock = threading.Lock()

    def one(number: int, args: list[str]) -> None:
        done = run_invoke("deploy", *args, "--json")
        ended = time.monotonic()
        try:
            document = json.loads(done.stdout)
        except json.JSONDecodeError:
            document = {}
        with lock:
            found[number] = (done.returncode, document, done.stdout + done.stderr, ended)

    threads = []
    for number, args in enumerate(runs):
        if number:
            time.sleep(apart)
        threads.append(threading.Thread(target=one, args=(number, args)))
        threads[-1].start()
    for thread in threads:
        thread.join(timeout=900)
    return [found[number] for number in sorted(found)]


def environment_of(inv: inventory.Inventory) -> str:
    return on_host(inv, "cpu-3", ["cat", "/etc/vllm/vllm.env"])


def test_two_deploys_of_one_replica_50_ms_apart_under_load_fail_no_request_and_the_later_changes_nothing(
        endpoint: tuple[inventory.Inventory, str, str]) -> None:
    """The first to take cpu-3's roll lock rolls it; the other, refused at the lock, has drained
    nothing and put nothing back (a second drain and restore mid-restart sent clients to a replica
    still loading its model: HTTP 503). Then both with --wait to different values: the second waits
    for the first, and what it reports is what it found under the lock it held."""
    inv, url, prompt = endpoint
    with Load(url, prompt) as load:
        time.sleep(2)
        runs = deploy_at_once(["--cluster", "lab-llama-b", *ROLL, "--timeout", "300"],
                              ["--cluster", "lab-llama-b", "--set", "max_model_len=128", "--timeout", "300"])
        time.sleep(2)
    won = [(code, report) for code, report, _, _ in runs if code == 0]
    lost = [(code, report, text) for code, report, text, _ in runs if code != 0]
    print(f"\ntwo deploys of lab-llama-b 50 ms apart under {CLIENTS} clients: {load.sent} requests "
          f"({load.counts()}); exits {[run[0] for run in runs]}; the refused one says: "
          f"{lost[0][1]['hosts'][0]['detail'] if lost and lost[0][1] else '-'}")
    assert len(won) == 1 and len(lost) == 1, [run[2][-2000:] for run in runs]
    assert {"drain", "restore"} <= set(won[0][1]["hosts"][0]["steps_s"]), won[0][1]
    code, report, text = lost[0]
    assert code == 1, text
    host = report["hosts"][0]
    assert host["state"] == "failed" and "drain" not in host["steps_s"] and "restore" not in host["steps_s"], host
    assert "provision.roll.lock (run " in host["detail"] and "deploy from " in host["detail"], host
    assert "nothing drained or changed" in host["detail"], host
    assert not load.failures, load.failures[:5]
    # The winner's settings are what runs: the loser wrote nothing.
    assert ("PROVISION_LAB_ROLL" in environment_of(inv)) == (runs[0][0] == 0)

    # The host as the inventory has it; then one deploy that changes it and one that would change
    # nothing, both waiting for each other (--wait). Whichever holds the roll lock second either finds
    # the host as its facts read it, or is refused: never "unchanged" of a host the other changed.
    code, report, text = invoke_json("deploy", "--cluster", "lab-llama-b", "--timeout", "300")
    assert code == 0, text
    runs = deploy_at_once(["--cluster", "lab-llama-b", *ROLL, "--timeout", "300", "--wait", "60"],
                          ["--cluster", "lab-llama-b", "--timeout", "300", "--wait", "60"])
    print("\nthen one that changes cpu-3 and one that changes nothing, both with --wait 60, 50 ms apart: " + "; ".join(
        f"exit {code}, {report['hosts'][0]['state']}: {report['hosts'][0]['detail']}" if report else f"exit {code}"
        for code, report, _, _ in runs))
    for code, report, text, _ in runs:
        assert code == 0 or "another run changed its generations" in report["hosts"][0]["detail"], text[-2000:]
    assert runs[0][0] == 0 or runs[1][0] == 0
    last = max((run for run in runs if run[0] == 0), key=lambda run: run[3])
    # The run that ended last with exit 0 said what the host is: with the change, or without it.
    assert ("PROVISION_LAB_ROLL" in environment_of(inv)) == (last is runs[0]), [run[2][-1500:] for run in runs]
    code, report, text = invoke_json("deploy", "--cluster", "lab-llama-b", "--timeout", "300")
    assert code == 0, text
    assert router_servers(inv) == {"lab-llama": "UP", "lab-llama-b": "UP"}


def router_pid(inv: inventory.Inventory) -> str:
    """The router's master process (HAProxy's master-worker mode: a reload keeps it, a restart does not)."""
    return on_host(inv, "cpu-2", ["systemctl", "show", "--property=MainPID", "--value", "provision-router.service"]).strip()


def test_an_endpoint_losing_and_regaining_a_replica_reloads_its_router_without_a_failed_request(
        the_lab: lab.Lab, endpoint: tuple[inventory.Inventory, str, str], tmp_path: Path) -> None:
    inv, url, prompt = endpoint
    document = yaml.safe_load(the_lab.inventory.read_text())
    document["endpoints"]["lab-tiny"]["clusters"] = ["lab-llama"]
    # The endpoint without lab-llama-b in an inventory of its own: the lab's stays as it is for the
    # other tests' commands, which read it meanwhile.
    one_replica = tmp_path / "inventory.yaml"
    one_replica.write_text(yaml.safe_dump(document, sort_keys=False))
    pid = router_pid(inv)
    with Load(url, prompt) as load:
        time.sleep(2)
        code, one, text = invoke_json("provision", "--host", "cpu-2", "--inventory", str(one_replica), timeout=600)
        assert code == 0, text
        assert router_servers(inv) == {"lab-llama": "UP"}
        time.sleep(2)
        code, both, text = invoke_json("provision", "--host", "cpu-2", timeout=600)
        assert code == 0, text
        time.sleep(2)
    for report in (one, both):
        changes = [(change["kind"], change["target"]) for change in report["hosts"]["cpu-2"]["changes"]]
        assert changes == [("file", "/etc/provision-router/haproxy.cfg"), ("reload", "provision-router.service")], changes
    print(f"\nreplica lab-llama-b taken out of the endpoint and put back (two router reloads) under {CLIENTS} "
          f"clients: {load.sent} requests ({load.counts()}), p95 {load.p95():.3f} s")
    assert router_pid(inv) == pid  # reloaded, never restarted
    assert not load.failures, load.failures[:5]
    deadline = time.monotonic() + 30
    while router_servers(inv) != {"lab-llama": "UP", "lab-llama-b": "UP"}:
        assert time.monotonic() < deadline, f"lab-llama-b is not back in the router: {router_servers(inv)}"
        time.sleep(1)


def test_the_rolls_under_load_show_in_the_router_s_metrics(prometheus: tuple[Path, str]) -> None:
    """Every roll above drained its replica (HAProxy's state MAINT while it restarted) and put it back: the
    router's exporter, scraped every second, holds it, and the requests each replica answered meanwhile."""
    _, url = prometheus
    drained = prometheus_lab.query(url, 'max_over_time(haproxy_server_status{state="MAINT"}[30m])')
    assert {item["metric"]["server"]: item["value"][1] for item in drained} == {"lab-llama": "1", "lab-llama-b": "1"}
    answered = prometheus_lab.query(url, "increase(haproxy_server_http_responses_total{code=\"2xx\"}[30m])")
    assert {item["metric"]["server"] for item in answered if float(item["value"][1]) > 0} == {"lab-llama", "lab-llama-b"}
    back = prometheus_lab.query(url, 'haproxy_server_status{state="UP"}')
    assert {item["metric"]["server"]: item["value"][1] for item in back} == {"lab-llama": "1", "lab-llama-b": "1"}
