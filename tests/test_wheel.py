"""The installed tool, as the documentation installs and runs it: the wheel built from this checkout
by the docs' own line, installed into a fresh venv with its dependencies, then every command of the
README's Install section and of docs/index.md#install, and every `provision …` hint they print, run
from a directory outside the repository (no checkout on the path: templates, profiles, recordings and
the host programs all come from the wheel).

The wheel is built once, for every test here (the module's fixture; the module is one xdist group, so
one worker builds it). The venv has no system site-packages: the checkout's editable install (its
import hook in a .pth file) would otherwise answer for anything the wheel left out. Its dependencies
are resolved by pip from the wheel's own metadata, with no index: from wheels of the distributions
this interpreter has installed (tests/wheelhouse.py), so a dependency missing from pyproject.toml
fails here. Nothing asks the Hugging Face hub (HF_HUB_OFFLINE, and an endpoint nothing listens on).
"""
from __future__ import annotations

import glob
import json
import os
import platform
import re
import shlex
import shutil
import site
import subprocess
import sys
import sysconfig
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import provision
from tests.wheelhouse import wheelhouse

pytestmark = pytest.mark.xdist_group("wheel")  # one worker builds the wheel, once

ROOT = Path(__file__).resolve().parents[1]
BUILD_INPUTS = ("pyproject.toml", "README.md", "provision", "templates", "docs")
# Where the docs show how to install and first run the tool: (file, the heading of its section).
INSTALL_SECTIONS = (("README.md", "## Install"), ("docs/index.md", "## Install"))
VENV = "~/provision-venv"  # the docs' venv row
# The commands shown there that this test does not run, and why; every other one runs as written.
NOT_RUN = {
    "pipx install .": "pipx resolves the dependencies from the package index (this test uses none); the "
                      "same package installs from the same wheel below",
    "pipx install '.[lab]'": "as pipx install ., with the lab's extra (numpy, tokenizers, ...) from the index",
    "~/provision-venv/bin/pip install .": "a second build of the same source with the same backend: the "
                                          "wheel the docs' wheel line built goes into this venv instead",
    "pip install .": "as ~/provision-venv/bin/pip install . (a second build): the wheel goes into the venv",
    "python3 -m pip install -e '.[test]'": "the checkout's own install, CI's first step (.ci/run); "
                                           "test_an_editable_install_imports_the_mapped_templates_package",
    "provision lab.up": "root and the lab extra: the lab tests (tests/lab, in CI) boot the lab",
    "provision deploy --all --inventory inventory/": "installs a venv, weights and units on this machine "
                                                     "once its gate passes: the lab tests deploy (CI)",
}
# Tasks that only read (a host's facts at most) and so may run on this machine from a printed hint.
READ_ONLY = ("--version", "--list", "inventory", "facts", "check", "plan", "recipe.list", "recipe.show")
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
class Shown:
    """One command as a doc shows it."""

    doc: str
    command: str


def shown_commands(root: Path = ROOT) -> list[Shown]:
    """Every command of the install sections, in order: each code block's lines (a trailing `# ...`
    comment dropped), and each `backticked` command in the text and tables (python3, pip, pipx, ~/
    or provision at its start); `a && b` is two commands."""
    found: list[Shown] = []
    for doc, heading in INSTALL_SECTIONS:
        text = (root / doc).read_text()
        section = text.split(heading + "\n", 1)[1].split("\n## ", 1)[0]
        commands: list[str] = []
        for index, part in enumerate(section.split("```")):
            if index % 2:  # inside a code block
                commands.extend(re.split(r"\s{2,}#", line)[0].strip() for line in part.splitlines()[1:])
            else:
                # `provision` alone names the tool, `provision plan …` a form: neither is a command line.
                commands.extend(span for span in re.findall(r"`([^`\n]+)`", part)
                                if re.match(r"(python3 |pip |pipx |~/|provision )", span) and "…" not in span)
        for command in commands:
            for one in (piece.strip() for piece in command.split("&&")):
                if one and Shown(doc, one) not in found:
                    found.append(Shown(doc, one))
    return found


@dataclass
class Ran:
    """A command the test ran, where and what came back."""

    command: str
    code: int
    out: str
    seconds: float

    @property
    def hints(self) -> list[str]:
        """The commands it printed for a person to run next (`provision …` or `invoke …`)."""
        return re.findall(r"`((?:provision|invoke) [^`]+)`", self.out)


@dataclass
class Installed:
    source: Path  # the copy the wheel was built from (the docs' "this directory")
    wheel: Path
    venv: Path
    outside: Path  # the working directory of every run: no repository there
    inventory: Path
    env: dict[str, str]
    installs: list[Ran] = field(default_factory=list)  # the docs' install lines, as run by the fixture

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

    def shell_free(self, command: str, cwd: Path, env: dict[str, str] | None = None) -> Ran:
        """A doc's command as written: split as a shell would, `~/` and `*` expanded as a shell would,
        run without one (the project has no shell scripts)."""
        env = env or self.env
        argv = []
        for word in shlex.split(command):
            word = env["HOME"] + word[1:] if word.startswith("~/") else word
            matches = sorted(glob.glob(word, root_dir=cwd)) if "*" in word else []
            argv.extend(matches or [word])
        program = shutil.which(argv[0], path=env["PATH"]) or argv[0]
        started = time.monotonic()
        done = subprocess.run([program, *argv[1:]], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=300, check=False)
        return Ran(command, done.returncode, done.stdout + done.stderr, time.monotonic() - started)


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
    """A venv without pip whose dependencies are this interpreter's (a .pth file of plain paths): for
    the editable install, which the docs' lines do not make."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    purelib = subprocess.run([str(venv / "bin" / "python"), "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "dependencies.pth").write_text("\n".join(_dependency_paths()) + "\n")


def _requirements() -> list[str]:
    """What the wheel needs besides itself: its dependencies, and setuptools for the isolated build."""
    project = (ROOT / "pyproject.toml").read_text()
    build = re.search(r'requires = \["(setuptools[^"]*)"\]', project)
    assert build is not None
    listed = project.split("\ndependencies = [", 1)[1].split("\n]", 1)[0]
    return [build.group(1), *re.findall(r'^\s*"([^"]+)",', listed, re.MULTILINE)]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The docs' install lines, run as written from a copy of the checkout: the wheel's (build, then
    `pip install dist/provision-*.whl`) into the venv of the venv row (`python3 -m venv ~/provision-venv`,
    activated: its bin/ first on PATH). pip's configuration (PIP_NO_INDEX, PIP_FIND_LINKS) points it at
    local wheels; HOME is the test's own."""
    work = tmp_path_factory.mktemp("wheel")
    source, home, houses = work / "source", work / "home", work / "wheelhouse"
    outside = home / "elsewhere"
    source.mkdir()
    outside.mkdir(parents=True)
    _copy_sources(source)
    wheelhouse(_requirements(), houses)
    venv = home / VENV.removeprefix("~/")
    base = {key: value for key, value in os.environ.items()
            if not key.startswith(("PYTHON", "PROVISION_", "PIP_", "HF_", "VIRTUAL_ENV"))}
    # python3 is this interpreter (its bin/ first), whose distributions the wheelhouse holds.
    path = os.pathsep.join([str(venv / "bin"), str(Path(sys.executable).parent), base.get("PATH", "")])
    env = {**base, "HOME": str(home), "PATH": path, "PYTHONNOUSERSITE": "1", "COLUMNS": "250",
           "PROVISION_LAB_DIR": str(work / "no-lab"),  # no lab inventory as the default
           "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9",  # never the Hugging Face hub
           "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(houses), "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           "PIP_NO_COMPILE": "1"}  # each module is compiled when first imported, as without a venv
    done = Installed(source, source / "dist", venv, outside, outside / "hosts.yaml", env)
    for command in (next(c for c in _shown_texts() if c.startswith("python3 -m pip wheel")),
                    f"python3 -m venv {VENV}", next(c for c in _shown_texts() if c.startswith("pip install dist/"))):
        ran = done.shell_free(command, source)
        assert ran.code == 0, f"{command}: exit {ran.code}\n{ran.out[-3000:]}"
        done.installs.append(ran)
    [wheel] = (source / "dist").glob("provision-*.whl")
    done.wheel = wheel
    done.env = {key: value for key, value in env.items() if not key.startswith("PIP_")}
    done.inventory.write_text(INVENTORY)
    return done


def _shown_texts() -> list[str]:
    return [shown.command for shown in shown_commands()]


def _files_under(folder: Path, prefix: str) -> set[str]:
    return {f"{prefix}/{path.relative_to(folder).as_posix()}" for path in folder.rglob("*")
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"}


def test_the_wheel_holds_every_file_of_the_package_and_the_templates(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as archive:
        shipped = {name for name in archive.namelist() if not name.split("/")[0].endswith(".dist-info")}
        entry_points = archive.read(f"provision-{provision.__version__}.dist-info/entry_points.txt").decode()
    expected = (_files_under(ROOT / "provision", "provision") | _files_under(ROOT / "templates", "provision/templates")
                | _files_under(ROOT / "docs", "provision/docs"))
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
    # The checkout's tasks.py hands `invoke` to the tool's program: the same listing, heading and all.
    tool = installed.run("--list").splitlines()
    assert tool[0] == "Subcommands:" and tool == checkout.splitlines()
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


def test_a_starter_inventory_without_a_model_is_refused_with_the_line_to_add(installed: Installed,
                                                                            tmp_path: Path) -> None:
    """`init` on a host it knows no model for (this machine: no GPU) leaves `model` commented out;
    `inventory` says so and the gate refuses the host, naming the file and the line, rather than
    passing a host whose unit would have no model to start."""
    tool = str(installed.venv / "bin" / "provision")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([tool, *args], cwd=tmp_path, env=installed.env, capture_output=True, text=True,
                              timeout=120, check=False)

    assert run("init", "--host", "local").returncode == 0
    assert "# vars: {model: ORG/NAME}" in (tmp_path / "inventory" / "hosts.yaml").read_text()
    shown = run("inventory", "--inventory", "inventory/")
    assert shown.returncode == 0, shown.stderr
    assert ("local: no model to serve (the gate refuses it): add `vars: {model: ORG/NAME}` under it in "
            "inventory/hosts.yaml") in " ".join(shown.stdout.split())
    checked = run("check", "--host", "local", "--inventory", "inventory/", "--json")
    assert checked.returncode == 1, checked.stderr
    report = json.loads(checked.stdout)
    (found,) = [f for f in report["hosts"]["local"]["findings"] if f["id"] == "config.model"]
    assert (found["status"], found["severity"]) == ("fail", "blocker")
    assert found["fix"].startswith("add `vars: {model: ORG/NAME}` under host local in inventory/hosts.yaml")
    assert "local" in report["blocked"]


def test_the_starter_inventory_cites_documentation_pages_this_install_holds(installed: Installed,
                                                                          tmp_path: Path) -> None:
    """The starter inventory cited "the project's docs/inventory.md", a file an installed user does not
    have, and no documentation site is published to point at instead: the pages come with the wheel and
    the file names where they are on this machine; so does `provision -h` for the first page."""
    done = subprocess.run([str(installed.venv / "bin" / "provision"), "init", "--host", "local"], cwd=tmp_path,
                          env=installed.env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    header = (tmp_path / "inventory" / "hosts.yaml").read_text().split("\nhosts:")[0]
    cited = re.findall(r"^#\s+(/\S+\.md)$", header, flags=re.MULTILINE)
    assert [Path(page).name for page in cited] == ["inventory.md", "settings.md"], header
    for page, source in zip(cited, ("docs/inventory.md", "docs/reference/settings.md"), strict=True):
        assert Path(page).is_relative_to(installed.venv), page
        assert Path(page).read_text() == (ROOT / source).read_text()
    assert "docs/inventory.md;" not in header
    helped = subprocess.run([str(installed.venv / "bin" / "provision"), "-h"], cwd=tmp_path, env=installed.env,
                            capture_output=True, text=True, timeout=120, check=True)
    (index,) = re.findall(r"^Documentation \(it comes with the tool\): (/\S+)$", helped.stdout, flags=re.MULTILINE)
    assert Path(index).is_relative_to(installed.venv) and Path(index).read_text() == (ROOT / "docs/index.md").read_text()


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


def _flags(command: str) -> list[str]:
    return [word.split("=", 1)[0] for word in shlex.split(command) if word.startswith("--")]


def _parses(installed: Installed, command: str) -> None:
    """A `provision …` line that is not run here names a task this tool has, with flags that task takes."""
    words = shlex.split(command)
    task = words[1]
    if task.startswith("--"):
        return
    helped = installed.shell_free(f"provision {task} --help", installed.outside)
    assert helped.code == 0, f"{command}: `provision {task}` is no task of the installed tool\n{helped.out}"
    missing = [flag for flag in _flags(command) if not re.search(rf"^\s+(-\w, )?{re.escape(flag)}\b", helped.out,
                                                                  re.MULTILINE)]
    assert not missing, f"{command}: `provision {task}` takes no {missing}"


def test_the_docs_install_commands_and_the_hints_they_print_run_as_written(installed: Installed) -> None:
    """Each install command of README.md's and docs/index.md's install sections, run as written in a
    directory outside the repository (the install lines by the fixture, the others here, in order),
    then each `provision …` hint they print: run where it only reads, else held to a task and flags
    the tool has. None is a usage error (exit 2) and none prints an `invoke …` hint, which runs only
    in a checkout."""
    shown = shown_commands()
    assert {s.doc for s in shown} == {"README.md", "docs/index.md"}
    ran: list[Ran] = list(installed.installs)
    done = {r.command for r in ran}
    for command in dict.fromkeys(s.command for s in shown):
        if command in NOT_RUN:
            if command.startswith("provision "):
                _parses(installed, command)
            continue
        if command in done or command.startswith(("python3 -m pip wheel", "pip install dist/")):
            continue
        result = installed.shell_free(command, installed.outside)
        ran.append(result)
        done.add(command)
        # 1: a blocker, which the gate and the plan report with exit 1 on a machine that cannot serve
        assert result.code in (0, 1), f"{command}: exit {result.code}\n{result.out[-3000:]}"
        assert "Traceback" not in result.out, f"{command}\n{result.out[-3000:]}"
    outputs = {r.command: r.out for r in ran}
    assert outputs["provision --version"].strip() == f"provision {provision.__version__}"
    assert outputs[f"{VENV}/bin/provision --version"].strip() == f"provision {provision.__version__}"
    assert "wrote inventory/hosts.yaml" in outputs["provision init --host local"]
    assert "local: " in outputs["provision check --all --inventory inventory/"]  # the host's table, judged
    # Every hint printed, one level down and once each.
    hints: list[str] = list(dict.fromkeys(hint for r in ran for hint in r.hints))
    assert "provision inventory --inventory inventory/hosts.yaml" in hints
    followed = []
    for hint in hints:
        assert not hint.startswith("invoke "), f"the installed tool printed a checkout-only hint: {hint}"
        words = shlex.split(hint)
        if words[1] in READ_ONLY and not re.search(r"\b[A-Z][A-Z_/]+\b", hint):  # no placeholder left to fill
            result = installed.shell_free(hint, installed.outside)
            assert result.code in (0, 1) and "Traceback" not in result.out, f"{hint}: exit {result.code}\n{result.out}"
            followed.append(hint)
        else:
            _parses(installed, hint)
    assert followed, "no printed hint was followed"
    timing = "; ".join(f"{r.command}: {r.seconds:.1f} s" for r in ran)
    print(f"ran {len(ran)} doc commands and followed {len(followed)} hints: {timing}")


def test_every_command_left_out_is_still_shown_and_says_why() -> None:
    """NOT_RUN holds no line the docs no longer show (else it would excuse nothing), each with a reason."""
    shown = {s.command for s in shown_commands()}
    assert set(NOT_RUN) <= shown, sorted(set(NOT_RUN) - shown)
    assert all(len(why) > 20 for why in NOT_RUN.values())
