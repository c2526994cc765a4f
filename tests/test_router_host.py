"""provision/host/router.py: its parsers on HAProxy 2.6's recorded answers, and the program end to end
against a real haproxy started here (two small HTTP workers behind it), shipped the way the tool ships
it (programs.ship piped to `python3 -`)."""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from provision import programs
from provision.host import router
from tests.fakes import JsonAnswers

FIXTURES = Path(__file__).parent / "fixtures" / "haproxy"
PREFIX = "debian12-haproxy2.6-"


def recorded(name: str) -> str:
    return (FIXTURES / f"{PREFIX}{name}").read_text(encoding="utf-8")


def by_name(name: str, backend: str = "be_tiny") -> dict[str, dict[str, Any]]:
    return {entry["server"]: entry for entry in router.servers(router.parse_stat(recorded(name)))
            if entry["backend"] == backend}


# -- the parsers on recorded answers ----------------------------------------------------------------

def test_version_from_show_version_and_from_haproxy_v() -> None:
    assert router.parse_version(recorded("show-version.txt")) == "2.6.12-1+deb12u4"
    assert router.parse_version("HAProxy version 2.6.12-1+deb12u4 2026/10/17 - https://haproxy.org/\n"
                                "Status: long-term supported branch\n") == "2.6.12-1+deb12u4"
    with pytest.raises(router.RouterError, match="Unknown command"):
        router.parse_version("Unknown command: 'show versio'\n")


NONE_FAILED = {"http_5xx": 0, "response_errors": 0, "connection_errors": 0, "server_aborts": 0, "retried": 0,
               "redispatched": 0}


def test_a_servers_failures_are_its_own_show_stat_columns() -> None:
    """w1 of the busy recording refused connections while down: econ and the retries HAProxy made."""
    rows = {(row["pxname"], row["svname"]): row for row in router.parse_stat(recorded("stat-busy.csv"))}
    w1 = rows[("be_tiny", "w1")]
    assert router.failures(w1) == {name: int(w1[column] or 0) for name, column in router.FAILURE_COLUMNS.items()}
    assert router.failures({"hrsp_5xx": "3", "eresp": "", "econ": "x"})["http_5xx"] == 3
    from provision.report import replica_failures
    assert replica_failures(NONE_FAILED) == "none"
    assert replica_failures({**NONE_FAILED, "http_5xx": 3, "response_errors": 1, "retried": 2}) == (
        "3 HTTP 5xx, 1 cut or unreadable; 2 retried elsewhere")


def test_stat_reads_the_servers_not_frontends_or_backends() -> None:
    found = router.servers(router.parse_stat(recorded("stat-up.csv")))
    assert found[:2] == [
        {"backend": "be_tiny", "server": "w1", "address": "127.0.0.1:18001", "state": "UP", "status": "UP",
         "in_flight": 0, "queued": 0, "check": "L7OK", "failures": NONE_FAILED},
        {"backend": "be_tiny", "server": "w2", "address": "127.0.0.1:18002", "state": "UP", "status": "UP",
         "in_flight": 0, "queued": 0, "check": "L7OK",
         "failures": {**NONE_FAILED, "retried": 2, "redispatched": 30}}]  # w1 was down a while before
    assert [(entry["backend"], entry["server"]) for entry in found[2:]] == [("be_other", "w2")]


@pytest.mark.parametrize(("name", "server", "state", "status", "check"), [
    ("stat-w2-drain.csv", "w2", "DRAIN", "DRAIN", "L7OK"),
    ("stat-w2-maint.csv", "w2", "MAINT", "MAINT", ""),
    ("stat-w1-down.csv", "w1", "DOWN", "DOWN", "L4CON"),
    ("stat-w1-up-2of3.csv", "w1", "UP", "UP 2/3", "L4CON"),  # up, a check failed: going down
    ("stat-w1-down-1of3.csv", "w1", "DOWN", "DOWN 1/3", "L7OK"),  # down, a check passed: coming up
    ("stat-up.csv", "be_other/w2", "DOWN", "DOWN 1/2", "L4OK"),  # be_other's w2 (TCP check, rise 2) coming up
])
def test_every_recorded_state(name: str, server: str, state: str, status: str, check: str) -> None:
    backend, _, server = server.rpartition("/")
    entry = by_name(name, backend or "be_tiny")[server]
    assert (entry["state"], entry["status"], entry["check"]) == (state, status, check)


def test_a_check_in_progress_reports_the_last_result() -> None:
    """HAProxy 2.6 marks a check that is running at that moment: "* L7OK" (seen from the real one in
    CI); the state action reports the last result, as between checks."""
    text = recorded("stat-up.csv")
    assert ",L7OK," in text
    running = router.servers(router.parse_stat(text.replace(",L7OK,", ",* L7OK,", 1)))
    assert [entry["check"] for entry in running[:2]] == ["L7OK", "L7OK"]


def test_busy_server_counts_its_requests_in_flight() -> None:
    found = by_name("stat-busy.csv")
    assert (found["w2"]["in_flight"], found["w2"]["queued"], found["w2"]["state"]) == (4, 0, "UP")
    assert (found["w1"]["in_flight"], found["w1"]["state"]) == (0, "DOWN")


def test_normalise_state() -> None:
    assert [router.normalise_state(text) for text in ("UP", "UP 1/2", "DOWN 1/2", "no check", "NOLB",
                                                      "MAINT (resolution)", "MAINT (via be/s)", "")] == [
        "UP", "UP", "DOWN", "UP", "NOLB", "MAINT", "MAINT", "UNKNOWN"]


def test_stat_that_is_not_csv_is_said() -> None:
    with pytest.raises(router.RouterError, match="Permission denied"):
        router.parse_stat("Permission denied\n\n")


def test_find_server_names_what_exists() -> None:
    found = router.servers(router.parse_stat(recorded("stat-up.csv")))
    with pytest.raises(router.RouterError, match=r"backend 'be_tiny' has no server 'w9' \(its servers: w1, w2\)"):
        router.find_server(found, "be_tiny", "w9")
    with pytest.raises(router.RouterError, match=r"no backend 'be_nope'.*backends: be_other, be_tiny"):
        router.find_server(found, "be_nope", "w1")


# -- end to end: a real haproxy ---------------------------------------------------------------------

class Worker(JsonAnswers):
    def do_GET(self) -> None:
        self.answer(200 if self.path == "/health" else 404, {})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        time.sleep(float(body.get("sleep", 0.05)))
        self.answer(200, {"port": self.server.server_address[1]})


def haproxy_binary() -> str:
    """The real haproxy these tests run; a failure saying how to install it where there is none."""
    binary = shutil.which("haproxy")
    if binary is None:
        pytest.fail("haproxy is not installed here: these tests run a real one "
                    "(apt-get install -y haproxy, as the project's first command does)")
    return binary


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Haproxy:
    def __init__(self, socket_path: Path, port: int) -> None:
        self.socket = str(socket_path)
        self.url = f"http://127.0.0.1:{port}"

    def run(self, action: str, **fields: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The program as the tool runs it: shipped, on the stdin of `python3 -`."""
        spec = {"action": action, "socket": self.socket, **fields}
        done = subprocess.run(["python3", "-"], input=programs.ship(["router"], "router_main", spec),
                              capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode == 0, done.stderr
        events = [json.loads(line) for line in done.stdout.splitlines()]
        results = [event for event in events if event["event"] == "result"]
        assert len(results) == 1 and events[-1] is results[0], done.stdout
        return results[0], events[:-1]

    def server(self, name: str) -> dict[str, Any]:
        result, _ = self.run("state")
        return next(entry for entry in result["servers"] if entry["server"] == name)

    def post(self, sleep: float, answers: list[int]) -> threading.Thread:
        def send() -> None:
            request = urllib.request.Request(f"{self.url}/v1/completions", method="POST",
                                             data=json.dumps({"sleep": sleep}).encode())
            with urllib.request.urlopen(request, timeout=30) as response:
                answers.append(response.status)

        thread = threading.Thread(target=send, daemon=True)
        thread.start()
        return thread

    def busy_server(self) -> str:
        """The server holding the one request in flight (leastconn picks either)."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            result, _ = self.run("state")
            busy = [entry["server"] for entry in result["servers"] if entry["in_flight"]]
            if busy:
                return str(busy[0])
            time.sleep(0.05)
        raise AssertionError("no server ever held the request in flight")

    def wait_up(self, *names: str) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            result, _ = self.run("state")
            if all(entry["status"] == "UP" for entry in result["servers"] if entry["server"] in names):
                return
            time.sleep(0.1)
        raise AssertionError(f"{names} never came UP")


@pytest.fixture(scope="module")
def haproxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Haproxy]:
    binary = haproxy_binary()
    workers = [ThreadingHTTPServer(("127.0.0.1", 0), Worker) for _ in range(2)]
    for worker in workers:
        threading.Thread(target=worker.serve_forever, daemon=True).start()
    directory = tmp_path_factory.mktemp("haproxy")
    port = free_port()
    admin = directory / "admin.sock"
    config = directory / "haproxy.cfg"
    config.write_text(
        f"global\n    stats socket {admin} mode 600 level admin\n"
        "defaults\n    mode http\n    timeout connect 2s\n    timeout client 30s\n    timeout server 30s\n"
        f"frontend ep_tiny\n    bind 127.0.0.1:{port}\n    default_backend be_tiny\n"
        "backend be_tiny\n    balance leastconn\n    option httpchk GET /health\n"
        "    http-check expect status 200\n    default-server inter 200ms fall 2 rise 1\n"
        + "".join(f"    server w{index} 127.0.0.1:{worker.server_address[1]} check\n"
                  for index, worker in enumerate(workers, 1)), encoding="utf-8")
    log = directory / "haproxy.log"
    with log.open("w", encoding="utf-8") as output:
        process = subprocess.Popen([binary, "-f", str(config)], stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while not admin.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"haproxy did not start: {log.read_text(encoding='utf-8')}")
            time.sleep(0.05)
        started = Haproxy(admin, port)
        started.wait_up("w1", "w2")
        yield started
    finally:
        process.terminate()
        process.wait(timeout=10)
        for worker in workers:
            worker.shutdown()
            worker.server_close()


def test_state_of_a_real_haproxy(haproxy: Haproxy) -> None:
    result, _ = haproxy.run("state")
    assert result["ok"] is True
    assert result["version"] == router.parse_version(subprocess.run(
        ["haproxy", "-v"], capture_output=True, text=True, check=True).stdout)
    assert [(entry["backend"], entry["server"], entry["state"], entry["check"]) for entry in result["servers"]] == [
        ("be_tiny", "w1", "UP", "L7OK"), ("be_tiny", "w2", "UP", "L7OK")]


def test_drain_waits_for_the_request_in_flight_then_ready_brings_it_back(haproxy: Haproxy) -> None:
    answers: list[int] = []
    request = haproxy.post(1.2, answers)
    busy = haproxy.busy_server()
    result, events = haproxy.run("drain", backend="be_tiny", server=busy, timeout=10, poll=0.1)
    request.join(timeout=10)
    assert answers == [200]  # the request in flight finished, answered
    assert result["ok"] is True and result["drained"] is True and result["in_flight_left"] == 0, result
    assert 0.3 < result["waited_s"] < 5
    assert events and events[0]["stage"] == "drain" and events[0]["in_flight"] == 1
    assert haproxy.server(busy)["state"] == "MAINT"

    result, _ = haproxy.run("ready", backend="be_tiny", server=busy, timeout=10, poll=0.1)
    assert (result["ok"], result["up"], result["state"]) == (True, True, "UP"), result
    assert haproxy.server(busy)["status"] == "UP"


def test_drain_that_times_out_says_what_is_left(haproxy: Haproxy) -> None:
    answers: list[int] = []
    request = haproxy.post(2.0, answers)
    busy = haproxy.busy_server()
    result, _ = haproxy.run("drain", backend="be_tiny", server=busy, timeout=0.5, poll=0.1)
    assert (result["ok"], result["drained"], result["in_flight_left"]) == (True, False, 1), result
    assert 0.5 <= result["waited_s"] < 1.5
    assert haproxy.server(busy)["state"] == "MAINT"  # maintenance all the same: no new requests
    request.join(timeout=10)
    assert answers == [200]  # maintenance leaves the request in flight alone
    result, _ = haproxy.run("ready", backend="be_tiny", server=busy, timeout=10, poll=0.1)
    assert result["up"] is True, result


def test_wrong_names_give_one_error_line(haproxy: Haproxy) -> None:
    result, _ = haproxy.run("drain", backend="be_tiny", server="w9", timeout=1)
    assert result == {"ok": False, "event": "result",
                      "error": "backend 'be_tiny' has no server 'w9' (its servers: w1, w2)"}
    result, _ = haproxy.run("ready", backend="be_nope", server="w1", timeout=1)
    assert result["error"] == "HAProxy has no backend 'be_nope' with servers (backends: be_tiny)"
    assert {entry["state"] for entry in haproxy.run("state")[0]["servers"]} == {"UP"}  # nothing changed


def test_haproxy_refusing_a_command_is_said(haproxy: Haproxy) -> None:
    with pytest.raises(router.RouterError) as refused:
        router.set_state(haproxy.socket, "be_tiny", "w9", "drain")
    assert str(refused.value) == "HAProxy refused `set server be_tiny/w9 state drain`: No such server."
    with pytest.raises(router.RouterError, match=r"state drain`: No such backend\.$"):
        router.set_state(haproxy.socket, "be_nope", "w1", "drain")


def test_missing_or_refusing_socket_gives_one_error_line(tmp_path: Path) -> None:
    missing = Haproxy(tmp_path / "gone.sock", 1)
    result, _ = missing.run("state")
    assert result["ok"] is False
    assert result["error"] == (f"no HAProxy runtime socket at {tmp_path / 'gone.sock'} "
                               f"(is haproxy running with `stats socket {tmp_path / 'gone.sock'}`?)")
    dead = tmp_path / "dead.sock"
    with socket.socket(socket.AF_UNIX) as left:
        left.bind(str(dead))  # a socket file nobody listens on: what a stopped haproxy leaves
    result, _ = Haproxy(dead, 1).run("drain", backend="be_tiny", server="w1", timeout=1)
    assert result["error"] == f"HAProxy's runtime socket {dead} refuses connections (haproxy is not running)"
    assert "Traceback" not in json.dumps(result)
