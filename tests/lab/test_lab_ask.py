"""What deploy prints to paste works where it is printed (this machine, the controller), and bare
`invoke status` is green on the lab as the README's first command leaves it (on this group's hosts:
the other group's change meanwhile)."""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from provision import lab
from tests.lab.conftest import group_inventory, invoke_json, run_invoke

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("the_lab")]


def test_the_request_deploy_prints_runs_here_as_printed() -> None:
    done = run_invoke("deploy", "--cluster", "lab-cpu", "--timeout", "420")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    (ask,) = [line.strip() for line in lines if line.strip().startswith("invoke ask ")]
    (watch,) = [line.removeprefix("Watch it: ") for line in lines if line.startswith("Watch it: ")]
    assert "curl" not in done.stdout  # cpu-1 listens on its own loopback: not reachable from here
    argv = shlex.split(ask)
    assert argv[:4] == ["invoke", "ask", "--host", "cpu-1"], ask
    asked = run_invoke(*argv[1:], timeout=120)
    assert asked.returncode == 0, asked.stdout + asked.stderr
    assert asked.stdout.startswith("Hello, my name is") and len(asked.stdout.strip()) > len("Hello, my name is")
    assert "tiny-llama" in asked.stderr
    watched = run_invoke(*shlex.split(watch)[1:], timeout=120)
    assert watched.returncode == 0, watched.stdout + watched.stderr


def test_ask_says_what_answered_and_fails_with_exit_1_where_nothing_serves() -> None:
    code, answer, text = invoke_json("ask", "--host", "cpu-1", "--max-tokens", "3", timeout=120)
    assert code == 0, text
    assert answer["model"] == "tiny-llama" and answer["completion_tokens"] == 3 and answer["text"]
    refused = run_invoke("ask", "--host", "h200", timeout=120)
    assert refused.returncode == 1
    assert "nothing answers at http://127.0.0.1:8000 on the host (connection refused)" in refused.stderr
    assert run_invoke("ask").returncode == 2


def test_bare_status_is_green_with_the_never_deployed_replay_hosts_idle(the_lab: lab.Lab, tmp_path: Path) -> None:
    # Every host of this group's (the other group's change meanwhile): tests/lab/conftest.py.
    hosts = ["--inventory", str(group_inventory(the_lab, "lab", tmp_path))]
    code, found, text = invoke_json("status", *hosts, timeout=120)
    assert code == 0 and found["healthy"] is True, text
    for name in ("ws-5090", "spark-a", "spark-b", "h200"):
        assert found["hosts"][name]["idle"].startswith("never provisioned by the tool"), found["hosts"][name]
        assert not found["hosts"][name]["healthy"]
    assert sorted(found["idle"]) == sorted(n for n, h in found["hosts"].items() if h["idle"])
    assert found["hosts"]["cpu-1"]["healthy"], found["hosts"]["cpu-1"]  # deployed by the first test
    table = run_invoke("status", *hosts, timeout=120)
    idle, healthy = len(found["idle"]), sum(host["healthy"] for host in found["hosts"].values())
    said = f"{healthy}/{len(found['hosts']) - idle} healthy, {idle} idle"
    assert table.returncode == 0 and said in table.stdout and idle >= 4, table.stdout
