"""A service venv over a base environment (venv_base: a vendor's CUDA torch image): the controller's
resolve leaves out what the base holds and keeps its torch (real pip, against wheels made here), the
host makes the venv with the base's interpreter and pip installs only the rest (a real venv), and the
venv probe reads the base's packages through it."""
from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from provision import parsers, venv
from provision.errors import WheelhouseError
from provision.host import apply
from tests.test_checks import IMAGE_BASE


def make_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = (),
               module: str | None = None) -> Path:
    """A pure-Python wheel: its metadata and, where `module` is named, a module saying its version."""
    info = f"{name}-{version}.dist-info"
    files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                 + "".join(f"Requires-Dist: {line}\n" for line in requires),
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    if module:
        files[f"{module}.py"] = f"__version__ = {version!r}\n"
    record = "".join(f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
                     f"{len(text.encode())}\n" for path, text in files.items()) + f"{info}/RECORD,,\n"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in {**files, f"{info}/RECORD": record}.items():
            archive.writestr(member, text)
    return path


# A base like the image's, in miniature: a torch that needs its CUDA library, and a numpy.
PROVIDED = {"torch": ("2.11.0", ("nvidia_cudalib==13.0.2", "filelock")),
            "nvidia_cudalib": ("13.0.2", ()), "filelock": ("3.20.0", ()), "numpy": ("2.5.2", ())}


@pytest.fixture()
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An index of its own (pip's find-links, no other): the engine, what it needs beside torch, and
    a torch of another release and a newer numpy the resolve must not take or may take."""
    folder = tmp_path / "index"
    make_wheel(folder, "engine", "1.0", ("torch==2.11.0", "numpy", "helper>=1"))
    make_wheel(folder, "engine", "2.0", ("torch==2.12.0", "numpy"))
    make_wheel(folder, "engine", "3.0", ("torch==2.11.0", "numpy==2.3.5"))
    make_wheel(folder, "helper", "1.1", ("filelock",))
    make_wheel(folder, "torch", "2.11.0")  # the index's own build of the base's release
    make_wheel(folder, "torch", "2.12.0")
    make_wheel(folder, "numpy", "2.3.5")
    monkeypatch.setenv("PROVISION_WHEELHOUSE", str(tmp_path / "wheelhouse"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_CONSTRAINT", raising=False)
    return folder


def python_now() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def test_the_resolve_leaves_out_what_the_base_holds_and_keeps_its_torch(index: Path) -> None:
    import platform

    house = venv.resolve(["engine==1.0"], [], platform.machine(), python_now(), provided=PROVIDED)
    names = sorted(wheel.name for wheel in house.wheels)
    # engine and helper come; torch, its CUDA library, filelock and numpy are the base's (the base's numpy
    # 2.5.2 outranks the index's 2.3.5), and no stand-in is left among the wheels.
    assert names == ["engine-1.0-py3-none-any.whl", "helper-1.1-py3-none-any.whl"]
    recorded = json.loads((house.directory / "index.json").read_text())
    assert recorded["provided"] == ["filelock==3.20.0", "numpy==2.5.2", "nvidia_cudalib==13.0.2", "torch==2.11.0"]


def test_an_engine_that_needs_another_torch_than_the_base_s_is_refused_with_both(index: Path) -> None:
    import platform

    with pytest.raises(WheelhouseError) as refused:
        venv.resolve(["engine==2.0"], [], platform.machine(), python_now(), provided=PROVIDED)
    said = str(refused.value)
    assert "torch==2.12.0" in said and "provides nvidia_cudalib==13.0.2, torch==2.11.0" in said


def test_a_release_of_the_base_the_engine_refuses_is_let_go_and_the_venv_brings_its_own(index: Path) -> None:
    import platform

    said: list[str] = []
    house = venv.resolve(["engine==3.0"], [], platform.machine(), python_now(), provided=PROVIDED,
                         progress=said.append)
    assert sorted(wheel.name for wheel in house.wheels) == ["engine-3.0-py3-none-any.whl",
                                                           "numpy-2.3.5-py3-none-any.whl"]
    assert "  the base's numpy==2.5.2 do not fit: the venv brings its own" in said
    assert json.loads((house.directory / "index.json").read_text())["provided"] == [
        "filelock==3.20.0", "nvidia_cudalib==13.0.2", "torch==2.11.0"]


def test_the_kept_packages_are_torch_and_its_cuda_libraries_of_the_recorded_image() -> None:
    image = parsers.parse_base_probe(IMAGE_BASE.read_text())
    kept = venv.kept_from_base(image.dists)
    assert {"torch", "torchvision", "torchaudio", "triton", "nvidia_nccl_cu13", "nvidia_cudnn_cu13",
            "cuda_bindings"} <= set(kept)
    assert "numpy" not in kept and "transformers" not in kept  # the venv may bring its own


def test_a_base_is_part_of_the_venv_key() -> None:
    from tests.test_checks import settings

    house = venv.Wheelhouse(Path("/nowhere"), (venv.Wheel("engine-1.0-py3-none-any.whl", "0" * 64, 1),))
    image = parsers.parse_base_probe(IMAGE_BASE.read_text())
    plain = venv.venv_change_data(settings("hopper"), (), house)
    over = venv.venv_change_data(settings("hopper", venv_base="/opt/torch/.venv"), (), house, base=image)
    assert "base" not in plain and over["base"] == {"python": "/opt/torch/.venv/bin/python",
                                                    "site": ["/opt/torch/.venv/lib/python3.12/site-packages"],
                                                    "pth": parsers.BASE_PTH}
    assert plain["key"] != over["key"]
    from provision import plan, render
    from provision.facts import HostFacts

    desired = render.DesiredState(files=(), directories=(), units=(), absent_units=(), user="vllm", home="/var/lib/vllm")
    [change] = [c for c in plan.build(desired, HostFacts(host="h"), over) if c.kind == "venv"]
    assert change.reason == "missing; made over /opt/torch/.venv (venv_base: its torch and CUDA libraries)"


def test_the_host_makes_the_venv_over_the_base_and_installs_only_the_rest(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Real venvs: a base holding `basetorch` (and pip), a venv over it; pip, run by the venv's
    python, counts basetorch as installed and adds only the engine; both import; the venv probe
    reads basetorch's version through the base."""
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "basetorch", "2.11.0", module="basetorch")
    make_wheel(wheels, "engine", "1.0", ("basetorch==2.11.0",), module="engine")
    base_dir = tmp_path / "base"
    subprocess.run([sys.executable, "-m", "venv", str(base_dir)], check=True)
    subprocess.run([str(base_dir / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index",
                    "--find-links", str(wheels), "basetorch"], check=True)
    found = subprocess.run([str(base_dir / "bin" / "python"), "-c", parsers.BASE_PROBE], capture_output=True,
                           text=True, check=True)
    base = parsers.parse_base_probe(found.stdout)
    assert base.version_of("basetorch") == "2.11.0" and "pip" in base.dists
    monkeypatch.setattr(apply, "write_atomically", lambda path, data, mode, uid, gid: Path(path).write_bytes(data))
    target = str(tmp_path / "venv")
    pip = apply.make_venv(target, {"python": base.executable, "site": list(base.site), "pth": parsers.BASE_PTH})
    subprocess.run(pip + ["install", "-q", "--no-index", "--find-links", str(wheels), "engine==1.0"], check=True)
    own = next((tmp_path / "venv" / "lib").glob("python*/site-packages"))
    assert sorted(p.name for p in own.glob("*.dist-info")) == ["engine-1.0.dist-info"]  # basetorch stayed the base's
    imported = subprocess.run([target + "/bin/python", "-c", "import engine, basetorch; print(basetorch.__file__)"],
                              capture_output=True, text=True, check=True)
    assert imported.stdout.startswith(str(base_dir))
    probed = parsers.parse_venv_probe(subprocess.run([target + "/bin/python", "-c", parsers.VENV_PROBE, "engine"],
                                                     capture_output=True, text=True, check=True).stdout)
    assert probed.dists is not None and probed.dists["basetorch"] == "2.11.0"
    assert probed.requires == {"engine": ("basetorch==2.11.0",)}
