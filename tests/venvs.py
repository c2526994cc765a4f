"""Real virtualenvs for the venv fact's probe: made with `python3 -m venv`, their site-packages holding
the dist-info directories a test names, so the probe's own code runs on them as it runs on a host."""
from __future__ import annotations

import email.parser
import subprocess
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

from provision import engines, facts, venvreqs


def make_venv(root: Path, dists: Mapping[str, str], metadata: Mapping[str, str] | None = None) -> Path:
    """A venv at `root` whose site-packages holds NAME-VERSION.dist-info for each of `dists`
    ({'torch': '2.13.0'}, names as pip writes them: 'nvidia_cuda_runtime_cu12'); `metadata` gives a
    dist's METADATA text (a real one, copied in), the others get the headers every METADATA has."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = f"python{sysconfig.get_python_version()}"
    site = root / "lib" / python / "site-packages"
    assert site.is_dir(), site
    for name, version in dists.items():
        info = site / f"{name}-{version}.dist-info"
        info.mkdir()
        text = (metadata or {}).get(name) or f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        (info / "METADATA").write_text(text, encoding="utf-8")
    return root


def probe(venv: Path) -> tuple[list[str], str]:
    """The venv fact's command, as the gate asks it of `venv`, run there: (argv, stdout)."""
    argv = list(facts.venv_fact(str(venv), engines.dists()).argv or ())
    done = subprocess.run(argv, capture_output=True, text=True, check=True, env={"LC_ALL": "C", "LANG": "C"})
    return argv, done.stdout


def requires_dist(metadata: str) -> list[str]:
    """The Requires-Dist headers as the standard library's own mail parser reads them."""
    return [" ".join(value.split()) for value in email.parser.HeaderParser().parsestr(metadata).get_all("Requires-Dist")
            or ()]


def meeting(lines: list[str]) -> dict[str, str]:
    """A version of every distribution the lines name that meets each line naming it: the lowest of the
    versions the specifiers mention that all of them contain (or '1.0' where none says one)."""
    specs: dict[str, list[Requirement]] = {}
    for line in lines:
        requirement = Requirement(line)
        specs.setdefault(venvreqs.canonical(requirement.name), []).append(requirement)
    chosen = {}
    for name, requirements in specs.items():
        mentioned = sorted({Version(spec.version.replace(".*", "")) for r in requirements for spec in r.specifier}
                           | {Version("1.0")})
        chosen[name] = str(next(version for version in mentioned
                                if all(r.specifier.contains(version, prereleases=True) for r in requirements)))
    return chosen
