"""The lab layer: real hosts booted once per test session (systemd-nspawn, sshd, systemd as PID 1).

These tests run in CI, every time. Where the lab cannot run they fail with the reason; only an
explicit PROVISION_SKIP_LAB=1 skips them.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import yaml

from provision import inventory, lab, remote
from provision.errors import LabError
from tests.conftest import REPO


def run_invoke(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """The tool as a user runs it: a separate process, its real exit code and output."""
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, check=False)


def invoke_json(*args: str, timeout: float = 900) -> tuple[int, dict, str]:
    """A task with --json: its exit code, its document ({} when it printed none) and all it printed."""
    done = run_invoke(*args, "--json", timeout=timeout)
    try:
        return done.returncode, json.loads(done.stdout), done.stdout + done.stderr
    except json.JSONDecodeError:
        return done.returncode, {}, done.stdout + done.stderr


def on_host(lab_inventory: inventory.Inventory, name: str, argv: list[str], stdin: str | None = None) -> str:
    """Run a command on a lab host over the tool's own SSH layer; its stdout."""
    runner = remote.SshRunner(lab_inventory.host(name), lab_inventory.ssh)
    try:
        return runner.run(argv, stdin=stdin).stdout
    finally:
        runner.close()


def clean_up_pair(inv: inventory.Inventory, hosts: Sequence[str], units: Sequence[str], venv_root: str) -> None:
    """Leave a module's multi-node hosts as the lab booted them, all at once: the units killed, not
    stopped (a `ray stop` waits out Ray's own shutdown, half a minute on each host), and everything the
    module's runs wrote removed; a step with nothing to do fails quietly."""
    def one(host: str) -> None:
        for argv in (["systemctl", "disable", *units], ["systemctl", "kill", "--signal=SIGKILL", *units],
                     ["systemctl", "stop", *units],
                     ["rm", "-rf", *(f"/etc/systemd/system/{unit}" for unit in units), "/etc/vllm/vllm.env",
                      venv_root, "/var/lib/provision/generations", "/var/lib/vllm/.config"],
                     ["systemctl", "daemon-reload"], ["systemctl", "reset-failed"]):
            on_host(inv, host, argv)

    cleanups = [threading.Thread(target=one, args=(host,)) for host in hosts]
    for cleanup in cleanups:
        cleanup.start()
    for cleanup in cleanups:
        cleanup.join(timeout=300)


def lab_api_key() -> str:
    """The API key the lab's servers and endpoint check: its secrets file's api_key, which the
    tool sends. A test that talks to a server itself, past the tool, sends it as any client would."""
    held = yaml.safe_load(lab.Lab().secrets_file.read_text())
    return str(held["api_key"])


def with_api_key(program: str) -> str:
    """A client program for a lab host's python3, sent on stdin (never on a command line), with the
    lab's API key where it says LAB_API_KEY."""
    return program.replace("LAB_API_KEY", repr(lab_api_key()))


@pytest.fixture(scope="session")
def the_lab() -> lab.Lab:
    """The lab, up: booted by the first worker that needs it (a second waits on the lab's lock and finds
    it up). The session's controlling process takes it down at the end if it was not up before
    (tests/conftest.py)."""
    if os.environ.get("PROVISION_SKIP_LAB") == "1":
        pytest.skip("PROVISION_SKIP_LAB=1: lab tests skipped on request")
    instance = lab.Lab()
    try:
        instance.up(progress=lambda line: None)
    except LabError as exc:
        pytest.fail(f"the lab could not be brought up: {exc}")
    return instance


def nothing_left(instance: lab.Lab) -> list[str]:
    """What lab.down left of what it made: processes, namespaces, links, files (none: [])."""
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=False).stdout
    left = {"network namespaces": "plab-" in namespaces, "links": "plab" in links,
            "cpu-1's systemd-nspawn": bool(lab._nspawn_pids("plab-cpu-1")), str(instance.dir): instance.dir.exists()}
    return [what for what, there in left.items() if there]


@pytest.fixture(scope="session")
def lab_inventory(the_lab: lab.Lab) -> inventory.Inventory:
    return inventory.load(the_lab.inventory)


@pytest.fixture
def lab_key(the_lab: lab.Lab) -> Path:
    return the_lab.key


def restore_lab_cpu() -> None:
    """cpu-1 back to the lab inventory's state, served and answering, and checked: a plan that changes
    nothing. A test that changes the host (another port, another model, an API key, a rollback to some
    earlier files) must leave the lab as the README's first command made it."""
    restore("lab-cpu", "cpu-1")


def restore(cluster: str, host: str) -> None:
    """Deploy `cluster` as the lab inventory declares it (gated on an answer), then check that its plan
    for `host` changes nothing. A cluster already as declared and healthy is left alone: its plan
    changes nothing and its status answers (a deploy would change nothing either, after its gate)."""
    first = run_invoke("plan", "--cluster", cluster, "--json")
    unchanged = first.returncode == 0 and json.loads(first.stdout)["hosts"][host]["changes"] == []
    if unchanged and run_invoke("status", "--cluster", cluster, "--json").returncode == 0:
        return
    done = run_invoke("deploy", "--cluster", cluster, "--json", "--timeout", "420", timeout=2400)
    assert done.returncode == 0, f"restoring {cluster} failed: {done.stdout[-2000:]} {done.stderr[-2000:]}"
    planned = run_invoke("plan", "--cluster", cluster, "--json")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert json.loads(planned.stdout)["hosts"][host]["changes"] == [], planned.stdout


@pytest.fixture(scope="module")
def restores_lab_cpu(the_lab: lab.Lab) -> Iterator[None]:
    """For modules whose tests change cpu-1: put it back once they are done, and check that it is."""
    yield
    restore_lab_cpu()


def restore_lab_llama() -> None:
    """cpu-2 back to lab-llama as the lab inventory declares it, answering, and planning no changes."""
    restore("lab-llama", "cpu-2")


@pytest.fixture(scope="module")
def lab_llama(the_lab: lab.Lab) -> Iterator[inventory.Inventory]:
    """For modules whose tests change cpu-2's llama.cpp server (which starts in a second, where vLLM's
    CPU build takes half a minute): cpu-2 booted and serving lab-llama first (its first deploy in a
    run builds llama.cpp there), put back and checked afterwards. The lab inventory as it is once
    cpu-2 runs (the session's lab_inventory was read before cpu-2 was booted)."""
    the_lab.up(["cpu-2"], progress=lambda line: None)
    restore_lab_llama()
    yield inventory.load(the_lab.inventory)
    restore_lab_llama()


# The lab's tests in two groups by the hosts they use, each run in order by one worker while the other
# group runs in another (a third worker takes the unit tests meanwhile). A group's hosts are its own:
# no test of one group changes, or depends on the state of, a host of the other.
#   lab      vLLM on cpu-1, the replayed GPU hosts ws-5090, h200, spark-a and spark-b, the hub's counters
#   lab-b    llama.cpp on cpu-2 and cpu-3 (and the endpoint between them), ws-broken, ws-575, and the
#            two nodes of the multi-node tests, pair-a and pair-b
# A module names its group with `pytest.mark.lab_group("lab-b")`; "lab" by default.
GROUP_HOSTS = {"lab": ("cpu-1", "ws-5090", "h200", "spark-a", "spark-b"),
               "lab-b": ("cpu-2", "cpu-3", "ws-broken", "ws-575", "pair-a", "pair-b")}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each lab test joins its module's group (xdist runs a group in one worker, in this order). Tests
    marked lab_last run after every other test of their group: they check what it left behind."""
    for item in items:
        if item.get_closest_marker("lab"):
            named = item.get_closest_marker("lab_group")
            item.add_marker(pytest.mark.xdist_group(named.args[0] if named else "lab"))
    last = [item for item in items if item.get_closest_marker("lab_last")]
    items[:] = [item for item in items if item not in last] + last


def group_inventory(the_lab: lab.Lab, group: str, folder: Path, endpoints: bool = True) -> Path:
    """The lab inventory with only `group`'s hosts, and the clusters and endpoints wholly on them: what
    "every host" means for a test of that group (the other group's hosts change meanwhile). Without
    endpoints where a test boots cpu-2 and cpu-3 together for something else: the lab inventory then
    names lab-tiny, whose router host the gate refuses until `prepare` installed HAProxy there."""
    document = yaml.safe_load(the_lab.inventory.read_text())
    hosts = set(GROUP_HOSTS[group])
    document["hosts"] = {name: body for name, body in document["hosts"].items() if name in hosts}
    document["clusters"] = {name: body for name, body in (document.get("clusters") or {}).items()
                            if set(body["hosts"]) <= hosts}
    kept = {name: body for name, body in (document.get("endpoints") or {}).items()
            if endpoints and body["host"] in hosts and set(body["clusters"]) <= set(document["clusters"])}
    document.pop("endpoints", None)
    if kept:
        document["endpoints"] = kept
    path = folder / f"{group}-inventory.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path
