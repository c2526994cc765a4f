"""CI's entry point (.ci/run): a Python program that `bash .ci/run` starts, ending with the README's
test command."""
from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import REPO


def _dry_run(*launcher: str) -> list[str]:
    done = subprocess.run([*launcher, ".ci/run", "--dry-run"], cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=True)
    return done.stdout.splitlines()


def _readme_block_after(words: str) -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    match = re.search(re.escape(words) + r".*?```\n(.*?)\n```", text, re.DOTALL)
    assert match, f"README: no code block after {words!r}"
    return match.group(1).strip()


def test_bash_hands_the_file_to_python_and_both_list_the_same_steps() -> None:
    through_bash = _dry_run("bash")
    assert through_bash == _dry_run(sys.executable)
    assert "python3 -m pip install -q -e '.[test]'" in through_bash


def test_the_last_step_is_the_readmes_test_command() -> None:
    assert _dry_run("bash")[-1] == _readme_block_after("The second runs the tests")


def test_no_shell_scripts_in_the_repository() -> None:
    # Hidden folders (.git, benchmarks/.venv with other tools' files) and build outputs are not the project's.
    found = [path.relative_to(REPO) for path in REPO.rglob("*.sh")
             if not any(part.startswith(".") or part in ("build", "dist") for part in path.relative_to(REPO).parts)]
    assert found == []


def test_ci_installs_exactly_what_the_readmes_first_command_installs() -> None:
    """A test that passes in CI passes after the README's first command on a fresh machine too."""
    first = _readme_block_after("The first installs the tool")
    installs = [step for step in first.split(" && ") if " install " in f" {step} "]
    ci = [line for line in _dry_run(sys.executable) if " install " in line]
    assert len(installs) == len(ci) == 2, (installs, ci)
    apt_readme, pip_readme = installs
    apt_ci, pip_ci = ci
    assert apt_readme.split()[3:] == apt_ci.split()[4:], (apt_readme, apt_ci)  # the packages, after -y [-qq]
    assert pip_readme.replace("'", "").split()[-2:] == pip_ci.replace("'", "").split()[-2:], (pip_readme, pip_ci)
