"""Inventory loading: every malformed case gives one clear message (file, line, entity, key) and exit
code 2, before anything is contacted; the shipped inventories load; precedence is as documented."""
from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from provision import inventory
from provision.errors import InventoryError
from tests.conftest import FIXTURES, REPO

BAD = sorted((FIXTURES / "inventory" / "bad").glob("*.yaml"))


def expectation(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: ")
    return first[len("# expect: "):]


@pytest.mark.parametrize("path", BAD, ids=lambda path: path.stem)
def test_malformed_inventory_names_file_line_and_key(path: Path, tmp_path: Path) -> None:
    broken = tmp_path / path.name
    broken.write_text(path.read_text().replace("LISTENER_PORT", "2222"))
    with pytest.raises(InventoryError) as caught:
        inventory.load(broken)
    message = str(caught.value)
    assert message.startswith(str(broken)), message
    assert re.search(expectation(path), message), message
    assert "\n" not in message


class Listener:
    """A TCP port that records whether anything connected to it."""

    def __init__(self) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen()
        self.socket.settimeout(0.2)
        self.port = self.socket.getsockname()[1]
        self.connections = 0
        self.running = True
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while self.running:
            try:
                connection, _ = self.socket.accept()
                self.connections += 1
                connection.close()
            except OSError:
                continue

    def close(self) -> None:
        self.running = False
        self.thread.join()
        self.socket.close()


def run_invoke(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("path", BAD, ids=lambda path: path.stem)
def test_cli_exits_2_with_one_message_and_contacts_nothing(path: Path, tmp_path: Path) -> None:
    listener = Listener()
    try:
        broken = tmp_path / path.name
        broken.write_text(path.read_text().replace("LISTENER_PORT", str(listener.port)))
        done = run_invoke("facts", "--inventory", str(broken), "--all")
    finally:
        listener.close()
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {broken}"), done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert listener.connections == 0


def test_a_valid_inventory_pointing_at_the_listener_does_contact_it(tmp_path: Path) -> None:
    """The control for the test above: the same listener does see a real connection attempt."""
    listener = Listener()
    try:
        good = tmp_path / "good.yaml"
        good.write_text(f"ssh: {{connect_timeout: 2, known_hosts: {tmp_path}/kh}}\nhosts:\n"
                        f"  h: {{address: 127.0.0.1, port: {listener.port}, profile: cpu}}\n")
        done = run_invoke("facts", "--inventory", str(good), "--host", "h")
    finally:
        listener.close()
    assert done.returncode == 1
    assert listener.connections >= 1


def test_example_inventory_describes_the_two_systems() -> None:
    inv = inventory.load(REPO / "inventory")
    workstation = inv.settings("ws-5090")
    assert workstation["tensor_parallel_size"] == 2 and "AWQ" in workstation["model"]
    assert inv.host("ws-5090").profile.name == "rtx5090"
    pair = inv.cluster("spark-pair")
    assert pair.multi_node and pair.head == "spark-1"
    assert {inv.host(name).profile.name for name in pair.hosts} == {"dgx-spark"}


def test_precedence_command_line_host_group_cluster_profile(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("""
hosts:
  a: {address: 10.0.0.1, profile: dgx-spark, vars: {port: 8100, environment: {FROM_HOST: "1"}}}
  b: {address: 10.0.0.2, profile: dgx-spark}
groups:
  g: {hosts: [a, b], vars: {port: 8050, max_model_len: 4096, environment: {FROM_GROUP: "1"}}}
clusters:
  c: {hosts: [a, b], vars: {port: 8001, max_model_len: 2048, tensor_parallel_size: 2}}
""")
    inv = inventory.load(path)
    a = inv.settings("a", overrides=inventory.parse_overrides(["port=9000"]))
    assert (a["port"], a.origin["port"]) == (9000, "command line")
    assert inv.settings("a")["port"] == 8100
    b = inv.settings("b")
    assert (b["port"], b.origin["port"]) == (8050, "group g")
    assert (b["max_model_len"], b["tensor_parallel_size"]) == (4096, 2)
    assert (b["gpu_memory_utilization"], b.origin["gpu_memory_utilization"]) == (0.85, "profile dgx-spark")
    assert b["venv_dir"] == "/opt/vllm/venv" and b.origin["venv_dir"] == "default"
    env = inv.settings("a")["environment"]
    assert env["FROM_HOST"] == env["FROM_GROUP"] == "1"
    assert env["TRITON_PTXAS_PATH"] == "/usr/local/cuda/bin/ptxas"  # from the profile, merged


def test_directory_inventory_refuses_a_name_defined_in_two_files(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("hosts:\n  h1: {address: 10.0.0.1, profile: cpu}\n")
    (tmp_path / "b.yaml").write_text("hosts:\n  h1: {address: 10.0.0.2, profile: cpu}\n")
    with pytest.raises(InventoryError, match=r"b.yaml:2: host 'h1': defined twice \(also in .*a.yaml\)"):
        inventory.load(tmp_path)


def test_bad_command_line_override_is_a_usage_error() -> None:
    with pytest.raises(InventoryError, match="command line: key 'port': expected an integer"):
        inventory.parse_overrides(["port=abc"])
    with pytest.raises(InventoryError, match="expects KEY=VALUE"):
        inventory.parse_overrides(["port"])


def test_hardening_is_default_or_strict() -> None:
    assert inventory.VAR_SPECS["hardening"].default == "default"
    assert inventory.parse_overrides(["hardening=strict"]) == {"hardening": "strict"}
    with pytest.raises(InventoryError, match="key 'hardening': expected one of default, strict, got 'paranoid'"):
        inventory.parse_overrides(["hardening=paranoid"])


def test_a_gpu_profile_must_say_which_device_nodes_it_opens(tmp_path: Path) -> None:
    import yaml

    from provision.errors import ProfileError
    from provision.profiles import PROFILE_DIR, profile_from_mapping

    data = yaml.safe_load((PROFILE_DIR / "rtx5090.yaml").read_text())
    assert profile_from_mapping(data, "rtx5090.yaml").devices[0][0] == "char-nvidia-frontend rw"
    without = {k: v for k, v in data.items() if k != "devices"}
    with pytest.raises(ProfileError, match="a GPU profile must list the device nodes"):
        profile_from_mapping(without, "site.yaml")
    with pytest.raises(ProfileError, match="not a DeviceAllow= entry.*: /dev/nvidia\\* rw"):
        profile_from_mapping({**data, "devices": {"/dev/nvidia* rw": "globs are for group names"}}, "site.yaml")
    cpu = yaml.safe_load((PROFILE_DIR / "cpu.yaml").read_text())
    assert profile_from_mapping(cpu, "cpu.yaml").devices == ()


def test_unknown_host_and_missing_inventory_are_clear() -> None:
    inv = inventory.load(REPO / "inventory")
    with pytest.raises(InventoryError, match="unknown host 'nope'"):
        inv.host("nope")
    assert inv.host("local").connection == "local"
    with pytest.raises(InventoryError, match="no such file or directory"):
        inventory.load("/nonexistent/inventory.yaml")
