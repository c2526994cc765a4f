"""The Pythons a release installs on (python_floors.yaml), judged on PyPI's files recorded on 2026-12-07:
vLLM 0.32+, SGLang 0.5.22+, torch 2.15 and Triton 3.9 require Python >= 3.11; SGLang 0.5.23 ships wheels
for CPython 3.11 to 3.13 only."""
from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from provision import checks, python_floors
from provision.context import Context
from provision.run import gating
from tests.conftest import FIXTURES
from tests.test_checks import PROFILES, recorded, settings

PYPI = json.loads((FIXTURES / "pypi" / "python-floors-2026-12-07.json").read_text())


def host_python(profile: str, machine: str, python: str, **values: Any) -> checks.Finding:
    """host.python on a recorded machine whose python3 is `python` (Ubuntu 22.04's is 3.10.12)."""
    ctx = Context(host="h", profile=PROFILES[profile], settings=settings(profile, **values),
                  facts=dataclasses.replace(recorded(machine), python=python))
    return next(found for found in checks.evaluate(ctx) if found.id == "host.python")


def wheel_pythons(wheels: list[str]) -> SpecifierSet | None:
    """The CPython minors a release's wheels cover, as a specifier; None where an abi3 wheel covers
    every later one (the Requires-Python alone then says)."""
    tags = {name.split("-")[-3] for name in wheels}
    if any(name.split("-")[-2] == "abi3" for name in wheels):
        return None
    minors = sorted(int(tag[3:]) for tag in tags if tag.startswith("cp3") and tag[3:].isdigit())
    return SpecifierSet(f">=3.{minors[0]},<3.{minors[-1] + 1}")


# The recorded releases a row speaks of (the release before each floor is tried on 3.10 below).
RECORDED = [(package, version) for package, releases in PYPI["releases"].items() for version in releases
            if any(floor.package == package and floor.versions.contains(Version(version)) for floor in python_floors.load())]


@pytest.mark.parametrize(("package", "release"), RECORDED, ids=lambda value: str(value))
def test_the_rows_say_what_pypis_files_say_of_each_release_read(package: str, release: str) -> None:
    """For each recorded release, the rows together refuse exactly the Pythons (3.10 to 3.15) that its
    files do not install on, by Requires-Python or by their wheels' tags."""
    files = PYPI["releases"][package][release]
    by_files = SpecifierSet(files["requires_python"]) & (wheel_pythons(files["wheels"]) or SpecifierSet())
    for minor in range(10, 16):
        python = f"3.{minor}.0"
        assert (python_floors.refusals({package: release}, python) == ()) == by_files.contains(python), python


def test_every_row_speaks_of_a_release_read() -> None:
    for floor in python_floors.load():
        assert any(floor.versions.contains(Version(version)) for version in PYPI["releases"][floor.package]), floor


@pytest.mark.parametrize(("package", "before"), [("vllm", "0.31.0"), ("sglang", "0.5.21"), ("torch", "2.14.1"),
                                                 ("triton", "3.8.0")])
def test_the_release_before_each_floor_installs_on_python_3_10(package: str, before: str) -> None:
    assert SpecifierSet(PYPI["releases"][package][before]["requires_python"]).contains("3.10.12")
    assert python_floors.refusals({package: before}, "3.10.12") == ()


def test_vllm_0_34_0_on_ubuntu_22_04s_python_is_refused_with_its_floor() -> None:
    found = host_python("rtx5090", "rtx5090x2-tr7960x", "3.10.12", engine_spec="vllm==0.34.0")
    assert (found.status, found.severity) == ("fail", "blocker")
    assert "vllm 0.34.0 needs Python <3.15,>=3.11 (Requires-Python" in found.message
    assert found.fix is not None and "python3.12" in found.fix
    assert found.evidence["source"] == ["https://pypi.org/pypi/vllm/json"]
    assert host_python("rtx5090", "rtx5090x2-tr7960x", "3.10.12", engine_spec="vllm==0.31.0").status == "pass"


def test_sglang_0_5_23_on_python_3_14_is_refused_by_its_wheels() -> None:
    found = host_python("dgx-spark", "dgx-spark-gb10", "3.14.0", engine="sglang", engine_spec="sglang==0.5.23")
    assert (found.status, found.severity) == ("fail", "blocker")
    assert "sglang 0.5.23 needs Python <3.14,>=3.11 (wheels for CPython 3.11 to 3.13 only" in found.message
    assert host_python("dgx-spark", "dgx-spark-gb10", "3.13.1", engine="sglang",
                       engine_spec="sglang==0.5.23").status == "pass"


def test_the_planned_wheels_are_judged_before_the_pins() -> None:
    """What pip resolved is what installs: torch 2.15.0 among the planned wheels on Python 3.10."""
    ctx = Context(host="h", profile=PROFILES["rtx5090"], settings=settings("rtx5090", engine_spec="vllm torch"),
                  facts=dataclasses.replace(recorded("rtx5090x2-tr7960x"), python="3.10.12"),
                  resolved_wheels=("torch-2.15.0-cp310-cp310-manylinux_2_28_x86_64.whl",))
    found = checks.host_python(ctx)
    assert found.status == "fail" and "torch 2.15.0 needs Python >=3.11" in found.message


def test_the_gate_does_not_ask_pip_for_a_release_this_python_cannot_install(monkeypatch: pytest.MonkeyPatch) -> None:
    def resolve_service(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("resolved a release this Python cannot install")

    monkeypatch.setattr(gating.venv, "resolve_service", resolve_service)
    ctx = Context(host="h", profile=PROFILES["rtx5090"], settings=settings("rtx5090", engine_spec="vllm==0.34.0"),
                  facts=dataclasses.replace(recorded("rtx5090x2-tr7960x"), python="3.10.12"))
    errors: dict[str, BaseException] = {}
    result = gating._with_planned_wheels({"h": ctx}, {"h"}, errors)
    assert errors == {} and result["h"].resolved_wheels is None
    assert checks.host_python(result["h"]).status == "fail"
