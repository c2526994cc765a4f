"""Settings that would get past the tool's own safety, tried against the lab's serving host as a user
would type them: every flag the tool sets, slipped in through server_flags or extra_args, and every
hostile path for each path setting (and a model id that climbs out), exit 2 naming the setting before cpu-1 is contacted; a directory
the tool did not make is not taken over. Plan only: nothing here deploys."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from provision import inventory
from tests.lab.conftest import on_host, run_invoke
from tests.test_inventory import OWNED

pytestmark = [pytest.mark.lab]

# What a plan that went wrong would have changed: the system's directories and the tool's.
WATCHED = ["/", "/etc", "/usr", "/var/lib/vllm", "/var/lib/vllm/models", "/var/lib/vllm/hf", "/opt/vllm/venv"]
STAT = ["stat", "-c", "%n %a %U:%G %i", *WATCHED]
HOSTILE_PATHS = ["/", "/etc", "/usr", "/var/lib/vllm/models/../../../../etc"]
PATH_SETTINGS = ["model_dir", "hf_home", "venv_dir"]


def _owned_flag_overrides() -> list[tuple[str, str, str]]:
    """(--set value, the setting it names, the setting the refusal must name) for each flag every
    engine sets, through server_flags and through extra_args (in its --flag=value form)."""
    cases = {}
    for _engine, flag, setting in OWNED:
        cases[(f"server_flags={{{flag}: '0.0.0.0'}}", "server_flags")] = setting
        cases[(f"extra_args=['{flag}=0.0.0.0']", "extra_args")] = setting
    return [(given, key, setting) for (given, key), setting in cases.items()]


def _plans(overrides: list[str]) -> list[tuple[int, str]]:
    """`invoke plan --cluster lab-cpu --set X` for each X, two at a time (this is a 2-core machine)."""
    def plan(override: str) -> tuple[int, str]:
        done = run_invoke("plan", "--cluster", "lab-cpu", "--set", override, timeout=120)
        return done.returncode, done.stdout + done.stderr

    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(plan, overrides))


def test_no_setting_slips_past_the_tool_through_flags_or_paths(lab_inventory: inventory.Inventory) -> None:
    before = on_host(lab_inventory, "cpu-1", STAT)
    flag_cases = _owned_flag_overrides()
    path_cases = [(f"{setting}={path}", setting) for setting in PATH_SETTINGS for path in HOSTILE_PATHS]
    path_cases.append(("model=../../etc", "model"))  # not a hub repository id: no hub is asked either
    results = _plans([given for given, _, _ in flag_cases] + [given for given, _ in path_cases])
    for (given, key, setting), (code, output) in zip(flag_cases, results):
        assert code == 2, f"{given}: exit {code}: {output}"
        assert f"key '{key}'" in output and f"set {setting} instead" in output, f"{given}: {output}"
        assert "cpu-1" not in output, f"{given}: a host was planned: {output}"  # refused before any host
    for (given, setting), (code, output) in zip(path_cases, results[len(flag_cases):]):
        assert code == 2, f"{given}: exit {code}: {output}"
        assert f"key '{setting}'" in output, f"{given}: {output}"
        assert "cpu-1" not in output, f"{given}: a host was planned: {output}"
    assert on_host(lab_inventory, "cpu-1", STAT) == before


def test_an_existing_directory_the_tool_did_not_make_is_not_taken_over(
        lab_inventory: inventory.Inventory) -> None:
    foreign = "/srv/provision-safety-foreign"
    on_host(lab_inventory, "cpu-1", ["mkdir", "-m", "0755", "-p", foreign])
    try:
        before = on_host(lab_inventory, "cpu-1", ["stat", "-c", "%a %U:%G", foreign])
        done = run_invoke("plan", "--cluster", "lab-cpu", "--set", f"model_dir={foreign}", timeout=300)
        output = done.stdout + done.stderr
        assert done.returncode == 1, output
        assert f"directory {foreign} exists (0755 root:root) and is not the tool's" in output, output
        assert on_host(lab_inventory, "cpu-1", ["stat", "-c", "%a %U:%G", foreign]) == before == "755 root:root\n"
    finally:
        on_host(lab_inventory, "cpu-1", ["rmdir", foreign])
