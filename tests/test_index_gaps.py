"""Engine releases PyPI alone cannot install (index_gaps.yaml), judged on the wheel METADATA and PyPI's
release list recorded on 2026-12-07: vLLM 0.34.0 pins flashinfer-python==0.7.3, which PyPI never carried."""
from __future__ import annotations

import json
from typing import Any

import pytest
from packaging.requirements import Requirement

from provision import checks, engines, index_gaps
from provision.context import Context
from provision.run import gating
from tests.conftest import FIXTURES
from tests.test_checks import PROFILES, recorded, settings
from tests.venvs import requires_dist

PYPI = json.loads((FIXTURES / "pypi" / "flashinfer-releases-2026-12-07.json").read_text())
FLASHINFER_INDEX = "https://flashinfer.ai/whl"


def installable(**values: Any) -> checks.Finding:
    ctx = Context(host="ws", profile=PROFILES["rtx5090"], settings=settings("rtx5090", **values),
                  facts=recorded("rtx5090x2-tr7960x"))
    return next(found for found in checks.evaluate(ctx) if found.id == "engine.installable")


@pytest.mark.parametrize("gap", index_gaps.load(), ids=lambda gap: f"{gap.engine}-{gap.requires}")
def test_each_gap_is_what_the_wheel_pins_and_pypi_lacks(gap: index_gaps.Gap) -> None:
    """The row agrees with the recorded wheel METADATA and PyPI's recorded release list; its `instead`
    release pins a version PyPI has."""
    wanted = Requirement(gap.requires)
    for release in gap.releases():
        metadata = (FIXTURES / "dist-info" / f"{gap.engine}-{release}.METADATA").read_text()
        assert gap.requires in requires_dist(metadata)
    carried = PYPI["releases"][wanted.name]
    assert not any(wanted.specifier.contains(version) for version in carried)
    instead = requires_dist((FIXTURES / "dist-info" / f"{gap.engine}-{gap.instead}.METADATA").read_text())
    pin = next(Requirement(line) for line in instead if Requirement(line).name == wanted.name)
    assert any(pin.specifier.contains(version) for version in carried)


def test_a_vllm_0_34_0_pin_with_pypi_alone_is_refused_with_the_index_and_0_33_0() -> None:
    found = installable(engine_spec="vllm==0.34.0")
    assert (found.status, found.severity) == ("fail", "blocker")
    assert "flashinfer-python==0.7.3, which PyPI does not carry" in found.message
    assert found.fix is not None
    assert f"add {FLASHINFER_INDEX} to pip_extra_index_urls" in found.fix and "vllm==0.33.0" in found.fix


def test_a_build_of_its_own_with_a_local_label_is_not_judged_by_pypis_pins() -> None:
    """The lab's Spark hosts pin a vLLM built for them (0.34.0+lab.a6d9c49d, from the lab's own index):
    its requirements are its own, not the PyPI wheel's."""
    found = installable(engine_spec="vllm==0.34.0+lab.a6d9c49d")
    assert found.status == "pass", found


def test_flashinfers_index_among_the_extra_indexes_lets_it_pass() -> None:
    found = installable(engine_spec="vllm==0.34.0", pip_extra_index_urls=[FLASHINFER_INDEX + "/"])
    assert found.status == "pass" and found.severity == "blocker"


def test_an_unpinned_vllm_leaves_0_34_0_out_and_says_which_release_it_gets() -> None:
    found = installable(engine_spec="vllm>=0.33")
    assert (found.status, found.severity) == ("pass", "info")
    assert found.evidence["requirements"] == ["vllm>=0.33,!=0.34.0"] and found.evidence["release"] == "0.33.0"
    assert "0.34.0 pins flashinfer-python==0.7.3" in found.message


def test_the_narrowed_requirement_is_what_pip_is_asked_for() -> None:
    ctx = Context(host="ws", profile=PROFILES["rtx5090"], settings=settings("rtx5090", engine_spec="vllm torch"),
                  facts=recorded("rtx5090x2-tr7960x"))
    assert engines.engine_of(ctx.settings).service_requirements(ctx) == ("vllm!=0.34.0", "torch")
    with_index = Context(host="ws", profile=PROFILES["rtx5090"], facts=recorded("rtx5090x2-tr7960x"),
                         settings=settings("rtx5090", engine_spec="vllm", pip_extra_index_urls=[FLASHINFER_INDEX]))
    assert engines.engine_of(with_index.settings).service_requirements(with_index) == ("vllm",)


def test_the_gate_does_not_ask_pip_for_a_refused_pin(monkeypatch: pytest.MonkeyPatch) -> None:
    """check and plan refuse it before anything changes: the resolve that would fail is not run."""
    def resolve_service(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("resolved a pin the indexes cannot install")

    monkeypatch.setattr(gating.venv, "resolve_service", resolve_service)
    ctx = Context(host="ws", profile=PROFILES["rtx5090"], settings=settings("rtx5090", engine_spec="vllm==0.34.0"),
                  facts=recorded("rtx5090x2-tr7960x"))
    errors: dict[str, BaseException] = {}
    result = gating._with_planned_wheels({"ws": ctx}, {"ws": ctx}.keys() & {"ws"}, errors)
    assert errors == {} and result["ws"].resolved_wheels is None
    assert next(f for f in checks.evaluate(result["ws"]) if f.id == "engine.installable").status == "fail"
