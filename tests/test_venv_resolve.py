"""The controller's resolve with the inventory's index settings: real pip against a PEP 503 index on disk
holding the lab's stand-in torch wheels (one directory per PyTorch variant, as PyTorch serves them)."""
from __future__ import annotations

import platform
from pathlib import Path

import pytest

from provision import venv
from provision.inventory import Settings
from provision.lab import wheels
from provision.profiles import load_profiles


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PROVISION_WHEELHOUSE", str(tmp_path / "wheelhouse"))
    root = tmp_path / "simple"
    for variant, wheel in wheels.torch_variants(tmp_path / "made").items():
        project = root / variant / "torch"
        project.mkdir(parents=True)
        wheel.rename(project / wheel.name)
        # pip reads a file:// index's project page from index.html (PEP 503's simple page)
        (project / "index.html").write_text(f'<a href="{wheel.name.replace("+", "%2B")}">{wheel.name}</a>\n')
    return root


def resolve(index: Path, variant: str, spec: str, wanted: str, said: list[str]) -> venv.Wheelhouse:
    return venv.resolve([spec], [], platform.machine(), platform.python_version(), progress=said.append,
                        indexes=venv.PipIndexes(index_url=f"file://{index}/{variant}"), torch_variant=wanted)


def test_an_exact_pin_takes_the_variant_and_the_resolve_shows_progress(index: Path) -> None:
    said: list[str] = []
    house = resolve(index, "cu130", "torch==2.9.0", "cu130", said)
    assert [w.name for w in house.wheels] == ["torch-2.9.0+cu130-py3-none-any.whl"]
    assert said[0].startswith("resolving torch==2.9.0+cu130 for ")
    # one line per package pip takes up (Collecting from a web index, Processing from one on disk)
    assert any(line.startswith("  [1] ") and "torch" in line for line in said)


def test_a_resolved_build_of_another_variant_is_refused_and_not_kept(index: Path) -> None:
    with pytest.raises(venv.WheelhouseError) as caught:
        resolve(index, "cu130", "torch>=2.9,<2.10", "cu128", [])
    assert "resolved torch 2.9.0+cu130 (a CUDA 13.0 build" in str(caught.value)
    assert "https://download.pytorch.org/whl/cu128" in str(caught.value)
    assert not list(Path(venv.config.wheelhouse()).glob("*"))  # nothing half-made left to reuse


def test_pip_failure_names_pips_last_words(index: Path) -> None:
    with pytest.raises(venv.WheelhouseError, match="pip download failed .*(torch==9.9|ResolutionImpossible)"):
        resolve(index, "cu130", "torch==9.9", "cu130", [])


def test_index_settings_become_pip_flags() -> None:
    indexes = venv.PipIndexes("https://mirror.example/simple", ("https://download.pytorch.org/whl/cu128",),
                              ("mirror.example",))
    assert indexes.args() == ["--index-url", "https://mirror.example/simple",
                              "--extra-index-url", "https://download.pytorch.org/whl/cu128",
                              "--trusted-host", "mirror.example"]


@pytest.mark.parametrize(("profile", "cuda_version", "variant"), [
    ("rtx5090", None, "cu128"), ("rtx5090", "13.0", "cu130"), ("dgx-spark", None, "cu130"),
    ("cpu", None, "cpu"), ("hopper", "12.9", "cu129")])
def test_each_profile_names_its_torch_variant(profile: str, cuda_version: str | None, variant: str) -> None:
    settings = Settings.of({"cuda_version": cuda_version})
    assert venv.torch_variant_of(load_profiles()[profile], settings) == variant


def test_a_variant_the_profile_does_not_take_is_refused() -> None:
    with pytest.raises(venv.WheelhouseError, match="cu126 build does not fit the rtx5090 profile"):
        venv.torch_variant_of(load_profiles()["rtx5090"], Settings.of({"cuda_version": "12.6"}))
    with pytest.raises(venv.WheelhouseError, match="cu128 build does not fit the dgx-spark profile"):
        venv.torch_variant_of(load_profiles()["dgx-spark"], Settings.of({"cuda_version": "12.8"}))


def test_exact_torch_pins_take_the_variant_and_nothing_else_changes() -> None:
    assert venv.pin_torch_variant(["vllm==0.11.0", "torch==2.8.0", "torch>=2.8", "torch==2.8.0+cu129"],
                                  "cu128") == ("vllm==0.11.0", "torch==2.8.0+cu128", "torch>=2.8",
                                               "torch==2.8.0+cu129")
