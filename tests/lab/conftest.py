"""The lab layer: real hosts booted once per test session (systemd-nspawn, sshd, systemd as PID 1).

These tests run in CI, every time. Where the lab cannot run they fail with the reason; only an
explicit PROVISION_SKIP_LAB=1 skips them.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from provision import inventory, lab
from provision.errors import LabError


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
