"""A venv built on a full disk, for real: host/apply.py's build_venv on a 1 MiB tmpfs (this machine's
tests run as root). `python -m venv` alone says only "ensurepip returned non-zero exit status 1"."""
from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.host import apply as host_apply
from provision.host.common import StepFailed


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "tiny"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a 1 MiB tmpfs needs root")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "provision-test", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_venv_on_a_full_disk_says_no_space_left_and_keeps_the_commands_own_words(
        tiny_disk: Path, tmp_path: Path) -> None:
    wheelhouse = tmp_path / "wheels"
    wheelhouse.mkdir()
    venv = tiny_disk / "venv"
    with pytest.raises(StepFailed) as failed:
        host_apply.build_venv({"wheelhouse": str(wheelhouse), "venv": str(venv), "wheels": {}, "requirements": [],
                               "key": "k"})
    message = str(failed.value)
    assert message.startswith("No space left on device: ") and f"filesystem of {tiny_disk}" in message, message
    assert "ensurepip" in message  # the failing command's stderr tail stays
    assert not venv.exists()  # the half-built venv is gone


def test_a_failure_with_room_left_is_not_put_down_to_the_disk(tmp_path: Path) -> None:
    assert host_apply.free_space_note(str(tmp_path / "venv")) == ""
