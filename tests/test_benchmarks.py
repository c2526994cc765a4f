"""The benchmark's report (benchmarks/run.py): ratios and target verdicts from measured medians."""
from __future__ import annotations

import importlib.util
import shlex
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

SPEC = importlib.util.spec_from_file_location("bench_run", Path(__file__).parents[1] / "benchmarks" / "run.py")
assert SPEC and SPEC.loader
run = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(run)


def row(tool: str, scenario: str, hosts: int, median: float, sessions: int = 1, cpu: float = 1.0,
        own: float = 0.5) -> dict[str, Any]:
    return {"tool": tool, "scenario": scenario, "hosts": hosts, "median": median, "cpu_median": cpu,
            "tool_cpu_median": own, "samples": [median], "sessions": sessions, "logins": 1}


def test_ratios_and_verdicts_follow_the_medians() -> None:
    results = [row("provision", "noop", 8, 1.0, sessions=1), row("ansible", "noop", 8, 10.0),
               row("pyinfra", "noop", 8, 1.5), row("pyinfra", "noop", 16, 5.0),
               row("provision", "noop", 1, 0.6, cpu=1.0, own=0.5),
               row("provision", "noop", 16, 1.2, cpu=3.1, own=0.8),
               row("provision", "status", 1, 2.0), row("provision", "status", 16, 2.5, cpu=4.0, own=0.95),
               row("provision", "facts", 16, 1.0, sessions=2)]
    assert run.ratio(results, "noop", 8, "provision", "ansible") == 0.1
    verdicts = run.targets(results)
    assert "8 hosts vs ansible: 0.10x (target <= 0.2x): met" in verdicts[0]
    assert "8 hosts vs pyinfra: 0.67x (target <= 0.3x): missed" in verdicts[1]
    assert "16 hosts vs pyinfra: 0.24x (target <= 0.3x): met" in verdicts[2]
    assert "1 host: 0.60 s (target <= 0.5 s): missed" in verdicts[3]
    # (3.1 - 1.0) / 15 hosts of machine CPU, (0.8 - 0.5) / 15 of it the tool's own
    assert "0.140 CPU s (target <= 0.1): missed; of it 0.020 s the tool's own" in verdicts[4]
    assert "3.1 CPU s" in verdicts[4]
    assert "1.25x (2.50 s against 2.00 s; target <= 1.2x): missed" in verdicts[5]
    assert "4.0 CPU s" in verdicts[5] and "0.030 CPU s per extra host" in verdicts[5]
    assert "at most 2 SSH session(s) per host (target 1): missed" in verdicts[6]
    assert "at most 1 SSH session(s) per host (target <= 3): met" in verdicts[7]


def test_the_markdown_table_has_a_row_per_host_count_and_dashes_for_tools_not_run() -> None:
    results = [row("provision", "noop", 1, 0.5), row("provision", "noop", 2, 0.6), row("ansible", "noop", 2, 6.0)]
    text = run.markdown(results, {"date": "d", "machine": "m", "command": "c", "repeat": 1})
    lines = [line for line in text.splitlines() if line.startswith(("| 1 |", "| 2 |"))]
    assert lines[0].startswith("| 1 | 0.50 (1.0) | - | - | - | - |")
    assert lines[1].startswith("| 2 | 0.60 (1.0) | 6.00 (1.0) | - | 0.10x | - |")


def test_ansible_and_pyinfra_run_the_status_program_as_python3_c() -> None:
    source = (run.HERE / "status.py").read_text()
    compile(source, "status.py", "exec")
    pyinfra = run.commands(Path("/work"), 2)["pyinfra"]["status"]
    assert pyinfra[-2:-1] == ["server.Command"]
    # pyinfra hands the command to the host's shell: it must split back into exactly this argv.
    assert shlex.split(pyinfra[-1].removeprefix("command=")) == ["python3", "-c", source]
    [play] = yaml.safe_load((run.HERE / "ansible" / "status.yml").read_text())
    argv = play["tasks"][0]["ansible.builtin.command"]["argv"]
    assert argv[:2] == ["python3", "-c"] and "/../status.py') }}" in argv[2]


class StandInLab:
    """What run.py asks of the lab, recorded: bench-01 already running before the run, nothing booted
    for real."""

    def __init__(self) -> None:
        self.booted: list[str] = []
        self.removed: list[str] = []

    def status(self) -> list[dict[str, Any]]:
        return [{"host": "cpu-1", "process": "running", "sshd": "answers"},
                {"host": "bench-01", "process": "running", "sshd": "answers"},
                {"host": "bench-03", "process": "gone", "sshd": "silent"}]

    def up(self, names: Sequence[str], progress: Any = print) -> None:
        self.booted = [name for name in names if name != "bench-01"]

    def state(self) -> dict[str, Any]:
        return {"hosts": {name: {"address": f"10.0.0.{n}"} for n, name in enumerate(run.bench_names(4), 1)}}

    def remove(self, names: Sequence[str]) -> None:
        self.removed.extend(names)


@pytest.mark.parametrize("fails", [False, True], ids=["ends", "fails"])
def test_the_run_stops_the_hosts_it_booted_and_only_those(monkeypatch: pytest.MonkeyPatch, fails: bool) -> None:
    """Once the results are in, or when a measurement fails, the bench hosts this run booted stop and
    leave the lab inventory; one that was running before (bench-01) and the lab's other hosts stay."""
    the_lab = StandInLab()
    measured: list[list[str]] = []

    def measure_all(hosts: Any, *_: Any) -> list[dict[str, Any]]:
        measured.append(hosts.names)
        assert not the_lab.removed  # nothing stops while the tools run
        if fails:
            raise RuntimeError("a tool's run failed")
        return []

    monkeypatch.setattr(run, "lab", SimpleNamespace(Lab=lambda: the_lab))
    monkeypatch.setattr(run.os, "geteuid", lambda: 0)
    monkeypatch.setattr(run, "ensure_tools_venv", lambda: None)
    monkeypatch.setattr(run, "measure_all", measure_all)
    monkeypatch.setattr(run, "write_report", lambda *_: None)
    if fails:
        with pytest.raises(RuntimeError, match="a tool's run failed"):
            run.main(["--counts", "1,4"])
    else:
        assert run.main(["--counts", "1,4"]) == 0
    assert measured == [["bench-01", "bench-02", "bench-03", "bench-04"]]
    assert the_lab.removed == the_lab.booted == ["bench-02", "bench-03", "bench-04"]
