"""Shared fixtures. The autouse guard keeps every test away from the developer's own SSH setup."""
from __future__ import annotations

import os
import sys
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


# The lab's life across a test session. Each worker that runs a lab test brings the lab up (the lab's
# lock makes the second wait and find it up); only the controlling process, once every worker is done,
# takes down a lab it did not find up, so no worker takes the hosts away from one still running.
LAB_FOUND_UP = pytest.StashKey[bool]()


def _controls_the_session(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput") and os.environ.get("PROVISION_SKIP_LAB") != "1"


def pytest_sessionstart(session: pytest.Session) -> None:
    if _controls_the_session(session.config):
        from provision import lab

        instance = lab.Lab()
        session.config.stash[LAB_FOUND_UP] = instance.inventory.exists() and all(
            row["sshd"] == "answers" for row in instance.status())


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not _controls_the_session(session.config) or session.config.stash.get(LAB_FOUND_UP, True):
        return
    from provision import lab
    from tests.lab.conftest import nothing_left

    instance = lab.Lab()
    if not instance.dir.exists():  # no lab test ran
        return
    instance.down(keep_cache=True)
    left = nothing_left(instance)
    if left:
        print(f"\nthe lab's tests left {left} behind after lab.down", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
