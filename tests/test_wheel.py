"""The installed tool: the wheel built from this checkout, installed into a fresh venv, run from a
directory outside the repository (no checkout on the path: templates, profiles, recordings and the
host programs all come from the wheel).

The venv has no system site-packages: the checkout's editable install (its import hook in a .pth
file) would otherwise answer for anything the wheel left out. The dependencies come from this
interpreter's site-packages, added to the venv's path by a .pth file of plain paths (Python runs no
.pth file found there), so the test needs no index and no network.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

import provision

ROOT = Path(__file__).resolve().parents[1]
BUILD_INPUTS = ("pyproject.toml", "README.md", "provision", "templates")
INVENTORY = """\
hosts:
  ws-alpha:
    address: 192.0.2.10
    profile: rtx5090
  cpu-beta:
    address: 192.0.2.11
    profile: cpu
clusters:
  beta-tiny:
    hosts: [cpu-beta]
    vars:
      model: org/tiny
"""


@dataclass(frozen=True)
class Installed:
    source: Path  # the copy the wheel was built from
    wheel: Path
    venv: Path
    outside: Path  # the working directory of every run: no repository there
    inventory: Path
    env: dict[str, str]

    def run(self, *args: str, codes: tuple[int, ...] = (0,)) -> str:
        done = subprocess.run([str(self.venv / "bin" / "provision"), *args], cwd=self.outside, env=self.env,
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode in codes, f"provision {' '.join(args)}: exit {done.returncode}\n{done.stderr}"
        return done.stdout

    def python(self, code: str) -> str:
        done = subprocess.run([str(self.venv / "bin" / "python"), "-c", code], cwd=self.outside, env=self.env,
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout


def _copy_sources(target: Path) -> None:
    """What the build reads, and nothing else: a stale build/ of the checkout never reaches the wheel."""
    for name in BUILD_INPUTS:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, target / name)


def _dependency_paths() -> list[str]:
    paths = [*site.getsitepackages(), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    if site.ENABLE_USER_SITE:
        paths.append(site.getusersitepackages())
    return list(dict.fromkeys(path for path in paths if Path(path).is_dir()))


def _make_venv(venv: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    purelib = subprocess.run([str(venv / "bin" / "python"), "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "dependencies.pth").write_text("\n".join(_dependency_paths()) + "\n")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    work = tmp_path_factory.mktemp("wheel")
    source, dist, venv, outside = work / "source", work / "dist", work / "venv", work / "elsewhere"
    source.mkdir()
    outside.mkdir()
    _copy_sources(source)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--wheel-dir", str(dist), str(source)], check=True, timeout=300)
    [wheel] = dist.glob("provision-*.whl")
    _make_venv(venv)
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("PYTHON", "PROVISION_", "PIP_"))}
    env.update({"PROVISION_LAB_DIR": str(work / "no-lab"), "COLUMNS": "250", "PYTHONNOUSERSITE": "1"})
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    str(wheel)], check=True, timeout=300, cwd=outside, env=env)
    inventory = outside / "hosts.yaml"
    inventory.write_text(INVENTORY)
    return Installed(source, wheel, venv, outside, inventory, env)


def _files_under(folder: Path, prefix: str) -> set[str]:
    return {f"{prefix}/{path.relative_to(folder).as_posix()}" for path in folder.rglob("*")
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"}


def test_the_wheel_holds_every_file_of_the_package_and_the_templates(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as archive:
        shipped = {name for name in archive.namelist() if not name.split("/")[0].endswith(".dist-info")}
        entry_points = archive.read(f"provision-{provision.__version__}.dist-info/entry_points.txt").decode()
    expected = _files_under(ROOT / "provision", "provision") | _files_under(ROOT / "templates", "provision/templates")
    assert not expected - shipped, ("left out of the wheel (a package missing from pyproject's packages, or "
                                    f"package-data that does not match): {sorted(expected - shipped)}")
    assert not shipped - expected, f"in the wheel but not in the checkout: {sorted(shipped - expected)}"
    assert "provision = provision.cli:main" in entry_points


def test_the_venv_runs_the_wheel_not_the_checkout(installed: Installed) -> None:
    answer = json.loads(installed.python(
        "import json, importlib.metadata as m, provision, provision.templates as t; "
        "d = m.distribution('provision'); "
        "print(json.dumps([provision.__file__, t.__file__, d.version, str(d.locate_file('provision'))]))"))
    module, templates, version, located = answer
    for path in (module, templates, located):
        assert Path(path).is_relative_to(installed.venv), path
    assert version == provision.__version__


def test_version_comes_from_the_package_metadata(installed: Installed) -> None:
    assert installed.run("--version").strip() == f"provision {provision.__version__}"


def test_list_shows_the_tasks_invoke_shows_in_the_checkout(installed: Installed) -> None:
    checkout = subprocess.run([sys.executable, "-m", "invoke", "--list"], cwd=ROOT, capture_output=True,
                              text=True, check=True, timeout=60).stdout
    # Only the heading differs: Invoke titles a bundled collection's tasks "Subcommands".
    tool = installed.run("--list").splitlines()
    assert tool[0] == "Subcommands:" and checkout.splitlines()[0] == "Available tasks:"
    assert tool[1:] == checkout.splitlines()[1:]
    assert any(line.split()[:1] == ["lab.up"] for line in tool)


def test_inventory_validates_a_file_and_names_its_hosts(installed: Installed) -> None:
    out = installed.run("inventory", "--inventory", str(installed.inventory))
    for name in ("ws-alpha", "cpu-beta", "beta-tiny", "rtx5090", "org/tiny"):
        assert name in out


def test_facts_of_this_machine_come_from_the_packaged_probe(installed: Installed) -> None:
    out = json.loads(installed.run("facts", "--host", "local", "--inventory", str(installed.inventory), "--json"))
    local = out["hosts"]["local"]
    assert local["kernel"] == platform.release()
    assert local["arch"] == platform.machine()


def test_facts_of_this_machine_need_no_inventory_anywhere(installed: Installed, tmp_path: Path) -> None:
    """An empty working directory, no $PROVISION_INVENTORY (the env has none of PROVISION_*) and a lab
    directory with nothing in it (PROVISION_LAB_DIR: a lab brought up by the checkout the tests run from
    would be the default there)."""
    assert "PROVISION_INVENTORY" not in installed.env
    assert not (Path(installed.env["PROVISION_LAB_DIR"]) / "inventory.yaml").exists()
    done = subprocess.run([str(installed.venv / "bin" / "provision"), "facts", "--host", "local", "--json"],
                          cwd=tmp_path, env=installed.env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    local = json.loads(done.stdout)["hosts"]["local"]
    assert (local["kernel"], local["arch"]) == (platform.release(), platform.machine())
    missing = subprocess.run([str(installed.venv / "bin" / "provision"), "facts", "--host", "ws-alpha"],
                             cwd=tmp_path, env=installed.env, capture_output=True, text=True, timeout=120,
                             check=False)
    assert missing.returncode == 2 and "none found. Looked, in this order:" in missing.stderr
    # The hint names the installed command, and it works: init writes ./inventory/hosts.yaml from the wheel.
    assert "`provision init --host local` writes a starter one" in missing.stderr
    written = subprocess.run([str(installed.venv / "bin" / "provision"), "init", "--host", "local"],
                             cwd=tmp_path, env=installed.env, capture_output=True, text=True, timeout=120,
                             check=False)
    assert written.returncode == 0, written.stderr
    assert "wrote inventory/hosts.yaml; next: `provision inventory --inventory inventory/hosts.yaml`" in written.stdout
    shown = subprocess.run([str(installed.venv / "bin" / "provision"), "inventory", "--inventory",
                            "inventory/hosts.yaml"], cwd=tmp_path, env=installed.env, capture_output=True, text=True,
                           timeout=120, check=False)
    assert shown.returncode == 0 and "local" in shown.stdout, shown.stderr


def test_plan_renders_the_units_from_the_packaged_templates(installed: Installed) -> None:
    base = ("--host", "local", "--inventory", str(installed.inventory), "--set", "model=org/tiny")
    # Whatever this machine lacks for a real server (systemd as PID 1, say) is forced: the plan is the point.
    checked = json.loads(installed.run("check", *base, "--json", codes=(0, 1)))  # 1: a blocker failed
    forced = [item for finding in checked["hosts"]["local"]["findings"]
              if finding["severity"] == "blocker" and finding["status"] == "fail"
              for item in ("--force", finding["id"])]
    out = installed.run("plan", *base, *forced)
    assert "+# Rendered by provision for local (profile cpu): the service environment." in out
    assert "+EnvironmentFile=/etc/vllm/vllm.env" in out
    assert "+ExecStart=/opt/vllm/venv/bin/python -m vllm.entrypoints.launchers.api_server.entry --model " in out


def test_lab_recordings_profiles_and_data_load_from_the_wheel(installed: Installed) -> None:
    out = json.loads(installed.python(
        "import json; from provision import cuda, known_issues, lab; from provision.profiles import load_profiles; "
        "from provision.recipes import load_recipes; "
        "machines = sorted({h.machine for h in lab.DEFAULT_HOSTS if h.machine}); "
        "print(json.dumps({'machines': {m: lab.load_machine(m)['name'] for m in machines}, "
        "'replayer': lab.REPLAYER.is_file(), 'profiles': sorted(load_profiles()), "
        "'issues': len(known_issues.load()), 'drivers': bool(cuda.driver_table()), "
        "'recipes': sorted(load_recipes())}))"))
    assert out["machines"] and all(name == machine for machine, name in out["machines"].items())
    assert out["replayer"] and out["issues"] > 0 and out["drivers"]
    assert {"cpu", "rtx5090", "dgx-spark", "hopper"} <= set(out["profiles"])
    assert "lab-cpu-tiny-llama" in out["recipes"]  # provision/recipes/*.yaml travel as package data
    assert "usage" in installed.run("lab.up", "--help").lower()


def test_an_editable_install_imports_the_mapped_templates_package(installed: Installed) -> None:
    """`pip install -e .` (the README's first command, CI) maps templates/ as provision.templates too."""
    venv = installed.outside.parent / "editable-venv"
    _make_venv(venv)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--no-build-isolation", "--editable", str(installed.source)],
                   check=True, timeout=300, cwd=installed.outside, env=installed.env)
    code = ("import importlib.resources as r; "
            "print((r.files('provision.templates') / 'systemd' / 'vllm.service.j2').read_text())")
    done = subprocess.run([str(venv / "bin" / "python"), "-c", code],
                          cwd=installed.outside, env=installed.env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip("\n") == (ROOT / "templates" / "systemd" / "vllm.service.j2").read_text().rstrip("\n")
