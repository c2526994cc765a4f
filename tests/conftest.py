"""Shared fixtures. The autouse guard keeps every test away from the developer's own SSH setup."""
from __future__ import annotations

from pathlib import Path

import paramiko
import pytest


@pytest.fixture(autouse=True)
def no_personal_ssh_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never read ~/.ssh/config: the inventory is the only source of connection settings."""
    original = paramiko.SSHConfig.from_path

    def guarded(path: str) -> paramiko.SSHConfig:
        if Path(path).expanduser().resolve().is_relative_to(Path.home() / ".ssh"):
            raise AssertionError(f"a test tried to read {path}")
        return original(path)

    monkeypatch.setattr(paramiko.SSHConfig, "from_path", staticmethod(guarded))


REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
