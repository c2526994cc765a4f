"""The relay's faults on lab hosts over rate-limited links (tc): a relay host stopped mid-transfer, and a
relay serving a corrupted chunk. The chain is ws-5090 (from the hub) -> h200 -> cpu-1; h200 fails.
Both end with every host's files verified against the hub, byte for byte; the first then has cpu-1 serve
the relayed model with real vLLM (once is enough to show that a relayed copy serves: the second's copy
is the same files, verified the same way; a second deploy of it proved nothing more)."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from provision import inventory, lab
from provision.lab import hub, tinymodel
from tests.conftest import REPO
from tests.lab.conftest import on_host, run_invoke
from tests.lab.test_lab_weights import hub_call

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("restores_lab_cpu")]

CHAIN = ["ws-5090", "h200", "cpu-1"]
PADDING = 80 * 10**6  # bytes beside the tiny model: seconds of transfer at the limited rates
ROOT = "/srv/w-relay"


@pytest.fixture(scope="module")
def relay_model(the_lab: lab.Lab) -> Iterator[tuple[str, str]]:
    """A real tiny Llama vLLM can serve, with 80 MB of padding it never reads (vLLM loads the
    safetensors files when there are any): (repository, commit)."""
    with tempfile.TemporaryDirectory() as scratch:
        files = tinymodel.make(Path(scratch) / "files")
        (files / "padding.bin").write_bytes(os.urandom(PADDING))
        commit = hub.publish(the_lab.hub_root, "test/relay-llama", files)
    yield "test/relay-llama", commit
    the_lab.shape(None, None)


@pytest.fixture
def chain(the_lab: lab.Lab, lab_inventory: inventory.Inventory, relay_model: tuple[str, str],
          tmp_path: Path) -> Iterator[Path]:
    """An inventory with the three hosts as one cluster, no copy of the model on them, hub counters at 0."""
    for name in CHAIN:
        on_host(lab_inventory, name, ["rm", "-rf", ROOT])
    hub_call(the_lab, "/_lab/reset", {})
    document = yaml.safe_load(the_lab.inventory.read_text())
    document.pop("endpoints", None)  # of the clusters replaced below
    document["clusters"] = {"relay": {"hosts": CHAIN, "vars": {
        "model": relay_model[0], "model_dir": ROOT, "cluster_network": str(the_lab.network)}}}
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(document))
    yield path
    the_lab.shape(None, None)


def start_weights(path: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "invoke", "weights", "--inventory", str(path), "--cluster", "relay",
                             "--json"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, out[-3000:] + err[-3000:]
    document: dict[str, Any] = json.loads(out)
    return document


def part_size(lab_inventory: inventory.Inventory, host: str, commit: str) -> int:
    """Bytes of the padding file on the host so far (its part file, or the whole file once verified)."""
    probe = ("import os, sys\nfor p in sys.argv[1:]:\n    if os.path.exists(p):\n"
             "        print(os.path.getsize(p)); break\nelse:\n    print(0)\n")
    return int(on_host(lab_inventory, host, [
        "python3", "-c", probe, f"{ROOT}/test/relay-llama/.partial/{commit}/padding.bin.part",
        f"{ROOT}/test/relay-llama/revisions/{commit}/padding.bin"]).strip())


def wait_until(condition: Any, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.2)


def assert_every_host_verified(the_lab: lab.Lab, lab_inventory: inventory.Inventory, commit: str) -> None:
    """Each host's copy is the hub's, byte for byte, and its manifest names the commit."""
    for name in ("padding.bin", "model.safetensors", "config.json"):
        expected = hashlib.sha256((the_lab.hub_root / "repos" / "test/relay-llama" / "commits" / commit
                                   / name).read_bytes()).hexdigest()
        for host in CHAIN:
            found = on_host(lab_inventory, host, ["sha256sum", f"{ROOT}/test/relay-llama/current/{name}"]).split()[0]
            assert found == expected, (host, name)
    for host in CHAIN:
        leftovers = on_host(lab_inventory, host, ["find", f"{ROOT}/test/relay-llama", "-name", "*.part"])
        assert leftovers.strip() == "", (host, leftovers)  # no file left half-written


def assert_cpu1_serves_it() -> None:
    """cpu-1 (lab-cpu, real vLLM) deploys the relayed model, with nothing left to fetch, and answers a
    completion with it (the deploy's readiness gate)."""
    done = run_invoke("deploy", "--cluster", "lab-cpu", "--set", "model=test/relay-llama", "--set",
                      f"model_dir={ROOT}", "--json", "--timeout", "420", timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads(done.stdout)["hosts"]
    assert rows[0]["state"] == "ready" and rows[0]["weights_from"] is None, rows


def test_a_relay_host_stopped_mid_transfer_is_routed_around(
        the_lab: lab.Lab, lab_inventory: inventory.Inventory, relay_model: tuple[str, str], chain: Path) -> None:
    _, commit = relay_model
    the_lab.shape("80mbit", "80mbit")  # 10 MB/s: 8 s for the padding on every link
    process = start_weights(chain)
    wait_until(lambda: part_size(lab_inventory, "cpu-1", commit) > PADDING // 5, "cpu-1 has a fifth from h200")
    frozen = [int(pid) for pid in subprocess.run(["ip", "netns", "pids", "plab-h200"], capture_output=True,
                                                 text=True, check=True).stdout.split()]
    for pid in frozen:  # the whole host stops: sshd, the relay, its own fetch; no connection is closed
        os.kill(pid, signal.SIGSTOP)
    try:
        wait_until(lambda: part_size(lab_inventory, "cpu-1", commit) == PADDING, "cpu-1 has it all", timeout=180)
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
    report = finish(process)  # h200 goes on where it stopped once it runs again
    cpu1 = report["hosts"]["cpu-1"]["fetched"]
    assert cpu1["from"] == "peer h200" and [step["source"] for step in cpu1["rerouted"]] == ["h200"]
    assert cpu1["rerouted"][0]["next"] == "ws-5090", cpu1  # h200's own upstream took over
    assert cpu1["by_source"]["h200"] >= PADDING // 5 and cpu1["by_source"]["ws-5090"] > 0, cpu1
    assert "hub" not in cpu1["by_source"], cpu1
    total = report["hosts"]["ws-5090"]["fetched"]["bytes"]
    assert report["bytes_from_hub"] == total and hub_call(the_lab, "/_lab/stats")["bytes"] >= total
    the_lab.shape(None, None)
    assert_every_host_verified(the_lab, lab_inventory, commit)
    assert_cpu1_serves_it()


def test_a_relay_serving_a_corrupted_chunk_is_caught_and_left(
        the_lab: lab.Lab, lab_inventory: inventory.Inventory, relay_model: tuple[str, str], chain: Path) -> None:
    _, commit = relay_model
    # h200 receives at 10 MB/s, cpu-1 at 5 MB/s: h200's copy is ahead of what it has passed on.
    the_lab.shape("80mbit", "80mbit", rates={"cpu-1": "40mbit"})
    process = start_weights(chain)
    at = PADDING * 35 // 100
    wait_until(lambda: part_size(lab_inventory, "h200", commit) > PADDING * 45 // 100, "h200 has 45%")
    # A megabyte of h200's part file spoilt where h200 has written but not yet passed on (a fault of
    # its disk or memory): h200 sends it on as it is.
    spoil = ("import os, sys\nwith open(sys.argv[1], 'r+b') as f:\n    f.seek(int(sys.argv[2]))\n"
             "    f.write(os.urandom(1 << 20))\n")
    on_host(lab_inventory, "h200", ["python3", "-c", spoil,
                                    f"{ROOT}/test/relay-llama/.partial/{commit}/padding.bin.part", str(at)])
    assert part_size(lab_inventory, "cpu-1", commit) < at, "cpu-1 went past the chunk before it was spoilt"
    report = finish(process)
    cpu1 = report["hosts"]["cpu-1"]["fetched"]
    left = [step for step in cpu1["rerouted"] if step["source"] == "h200"]
    assert left and "its hash is not sha256:" in left[0]["why"], cpu1  # the digest caught it, at cpu-1 itself
    assert cpu1["quarantined"], cpu1  # the bad copy set aside, never served
    the_lab.shape(None, None)
    assert_every_host_verified(the_lab, lab_inventory, commit)


def test_the_controller_sends_each_wheel_into_the_cluster_once(
        the_lab: lab.Lab, lab_inventory: inventory.Inventory, chain: Path) -> None:
    """A venv of two small real wheels on the three hosts: the controller pushes them to ws-5090 only;
    h200 and cpu-1 receive them along the chain, check every sha256, and install from them."""
    venv_dir = "/opt/relay-test/venv"
    wheels = ("idna-3.10-py3-none-any.whl", "certifi-2024.8.30-py3-none-any.whl")
    for host in CHAIN:
        on_host(lab_inventory, host, ["rm", "-rf", "/opt/relay-test", *(f"/var/cache/provision/wheels/{w}" for w in wheels)])
    done = run_invoke("venv", "--inventory", str(chain), "--cluster", "relay", "--set",
                      "engine_spec=idna==3.10 certifi==2024.8.30", "--set", f"venv_dir={venv_dir}", "--json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    sizes = {path.name: path.stat().st_size for path in Path(os.environ.get("PROVISION_WHEELHOUSE",
                                                                             "/var/cache/provision/wheelhouse")).rglob("*.whl")
             if path.name in wheels}
    assert set(sizes) == set(wheels)
    assert report["wheels"]["pushed"] == {"ws-5090": sum(sizes.values())}  # one copy into the cluster
    assert report["bytes_from_controller"] == sum(sizes.values())
    assert report["wheels"]["relayed"] == {"h200": {"ws-5090": sum(sizes.values())},
                                           "cpu-1": {"h200": sum(sizes.values())}}
    for host in CHAIN:
        assert on_host(lab_inventory, host, [f"{venv_dir}/bin/python", "-c", "import idna, certifi; print('ok')"]) == "ok\n"
        on_host(lab_inventory, host, ["rm", "-rf", "/opt/relay-test"])
