"""Shared fixtures. The autouse guard keeps every test away from the developer's own SSH setup."""
from __future__ import annotations

from collections.abc import Iterator
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


@pytest.fixture(autouse=True)
def host_record_of_made_directories(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Host programs run in a test's own process record the directories they make in a file of the
    test's, not in this machine's /var/lib/provision."""
    from provision.host import common

    record = tmp_path / "made-directories.json"
    monkeypatch.setattr(common, "MADE_DIRECTORIES", str(record))
    return record


@pytest.fixture(autouse=True)
def no_personal_registries(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Tests never list the developer's own recipe registries: the data directory is the test's own
    (the lab's tests run the tool in child processes, which inherit it)."""
    monkeypatch.setenv("PROVISION_DATA_DIR", str(tmp_path / "provision-data"))


def _all_tasks(collection: object) -> list[object]:
    from invoke.collection import Collection

    assert isinstance(collection, Collection)
    return [*collection.tasks.values(), *(task for sub in collection.collections.values() for task in _all_tasks(sub))]


@pytest.fixture(autouse=True)
def tasks_keep_their_help() -> Iterator[None]:
    """Invoke's parser takes each option's help out of its task as it builds the parser (Task.arg_opts pops
    it): a test that runs the command line in this process would leave the next one (the reference pages,
    another -h) tasks without their help. Each test starts with the help as the tasks declare it."""
    from provision.cli import ns

    tasks = _all_tasks(ns)
    declared = [dict(task.help) for task in tasks]  # type: ignore[attr-defined]
    yield
    for task, help_ in zip(tasks, declared, strict=True):
        task.help = dict(help_)  # type: ignore[attr-defined]
