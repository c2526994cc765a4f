"""The lab layer: real hosts booted once per test session (systemd-nspawn, sshd, systemd as PID 1).

These tests run in CI, every time. Where the lab cannot run they fail with the reason; only an
explicit PROVISION_SKIP_LAB=1 skips them.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from provision import inventory, lab, remote
from provision.errors import LabError
from tests.conftest import REPO


def run_invoke(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """The tool as a user runs it: a separate process, its real exit code and output."""
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def on_host(lab_inventory: inventory.Inventory, name: str, argv: list[str], stdin: str | None = None) -> str:
    """Run a command on a lab host over the tool's own SSH layer; its stdout."""
    runner = remote.SshRunner(lab_inventory.host(name), lab_inventory.ssh)
    try:
        return runner.run(argv, stdin=stdin).stdout
    finally:
        runner.close()


@pytest.fixture(scope="session")
def the_lab() -> Iterator[lab.Lab]:
    if os.environ.get("PROVISION_SKIP_LAB") == "1":
        pytest.skip("PROVISION_SKIP_LAB=1: lab tests skipped on request")
    instance = lab.Lab()
    already_up = instance.inventory.exists() and all(
        row["sshd"] == "answers" for row in instance.status())
    try:
        instance.up(progress=lambda line: None)
    except LabError as exc:
        pytest.fail(f"the lab could not be brought up: {exc}")
    yield instance
    if not already_up:
        instance.down(keep_cache=True)
        assert_nothing_left(instance)


def assert_nothing_left(instance: lab.Lab) -> None:
    """lab.down removed every process, namespace, link and file it made."""
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "plab-" not in namespaces
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert "plab" not in links
    assert not lab._nspawn_pids("plab-cpu-1") and not instance.dir.exists()


@pytest.fixture(scope="session")
def lab_inventory(the_lab: lab.Lab) -> inventory.Inventory:
    return inventory.load(the_lab.inventory)


@pytest.fixture
def lab_key(the_lab: lab.Lab) -> Path:
    return the_lab.key
