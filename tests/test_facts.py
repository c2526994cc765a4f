"""Gathering: one execution per host, the probe's answer turned into HostFacts, missing tools as facts."""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from provision import facts, inventory, lab, parsers, remote, report
from provision.errors import CommandFailed, ParseError, ProvisionError
from provision.host import probe as hostprobe
from provision.runner import Result
from tests.conftest import FIXTURES
from tests.fakes import FakeRunner, ok, probe_answer_from_recording


def runner_replaying(machine: str) -> FakeRunner:
    answer = probe_answer_from_recording(lab.load_machine(machine))
    return FakeRunner(machine, lambda argv, stdin: ok(answer, argv))


def test_facts_take_exactly_one_execution_and_send_the_probe_on_stdin() -> None:
    runner = runner_replaying("dgx-spark-gb10")
    gathered = facts.gather(runner, paths=["/opt/vllm/venv"])
    assert runner.executions == 1
    ((argv, stdin),) = runner.calls
    assert argv == ["python3", "-I", "-S", "-"]  # the host's PYTHON* variables and site module left out
    assert stdin is not None and '"/opt/vllm/venv"' in stdin
    assert "def collect(spec: Dict[str, Any]) -> Dict[str, Any]:" in stdin
    assert gathered.kernel == "6.17.0-1014-nvidia" and gathered.arch == "aarch64"
    assert gathered.gpus[0].name == "NVIDIA GB10"
    assert gathered.memory is not None and gathered.memory.total == 125513720 * 1024
    assert gathered.cpu is not None and gathered.cpu.parts[5] == "0xd85"
    assert gathered.cpu.models[5] == "Cortex-X925" and gathered.cpu.hybrid is None
    assert gathered.rdma is not None and len(gathered.rdma) == 4


def _fixture_output(fact: str, case: str) -> dict[str, object]:
    data = json.loads((FIXTURES / "facts" / fact / f"{case}.json").read_text())
    return {"exit": 0, "stdout": data["stdout"], "stderr": "", "missing": False, "timed_out": False}


def test_intel_hybrid_lists_reach_the_topology_and_their_absence_is_no_note() -> None:
    """The i9-13900K class: lscpu names one model for all 32 CPUs; the kernel's lists tell P from E."""
    results = {"lscpu": _fixture_output("lscpu", "intel-i9-13900k"),
               "lscpu_cpus": _fixture_output("lscpu_cpus", "intel-8p16e-13900k-class"),
               "cpu_core_cpus": _fixture_output("cpu_core_cpus", "intel-8p16e-13900k-class"),
               "cpu_atom_cpus": _fixture_output("cpu_atom_cpus", "intel-8p16e-13900k-class")}
    answer = json.dumps({"python": "3.12.3", "paths": {}, "results": results})
    hybrid = facts.gather(FakeRunner("ws", lambda argv, stdin: ok(answer))).cpu
    assert hybrid is not None and hybrid.hybrid == parsers.HybridCpus(tuple(range(16)), tuple(range(16, 32)))
    assert len(set(hybrid.model_names)) == 1
    absent = {"exit": 1, "stdout": "", "stderr": "", "missing": True, "timed_out": False}
    results.update(cpu_core_cpus=absent, cpu_atom_cpus=absent)
    answer = json.dumps({"python": "3.12.3", "paths": {}, "results": results})
    plain = facts.gather(FakeRunner("ws", lambda argv, stdin: ok(answer)))
    assert plain.cpu is not None and plain.cpu.hybrid is None
    assert not {"cpu_core_cpus", "cpu_atom_cpus"} & set(plain.notes)


def test_a_cpu_host_without_nvidia_tools_is_described_not_crashed() -> None:
    answer = json.dumps({"python": "3.11.2", "paths": {}, "results": {
        "gpus": {"exit": 127, "stdout": "", "stderr": "", "missing": True, "timed_out": False},
        "nvidia_driver": {"exit": 1, "stdout": "", "stderr": "", "missing": True, "timed_out": False},
        "init": {"exit": 0, "stdout": "systemd\n", "stderr": "", "missing": False, "timed_out": False},
    }})
    gathered = facts.gather(FakeRunner("cpu", lambda argv, stdin: ok(answer)))
    assert gathered.gpus == () and gathered.driver is None and gathered.systemd_is_pid1
    assert gathered.notes["gpus"] == "nvidia-smi: not present on the host"
    assert "not present" in gathered.notes["nvidia_driver"]


def test_nvidia_smi_that_cannot_reach_the_driver_is_explained() -> None:
    answer = json.dumps({"python": "3.10.12", "paths": {}, "results": {"gpus": {
        "exit": 9, "stdout": "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
        "driver. Make sure that the latest NVIDIA driver is installed and running.\n", "stderr": "",
        "missing": False, "timed_out": False}}})
    gathered = facts.gather(FakeRunner("ws", lambda argv, stdin: ok(answer)))
    assert gathered.notes["gpus"].startswith("nvidia-smi cannot talk to the NVIDIA driver")


def test_host_without_python3_gets_a_clear_error() -> None:
    missing = Result("env python3 -", 127, "", "env: 'python3': No such file or directory", 0.01)
    with pytest.raises(ProvisionError, match="python3 is not installed"):
        facts.gather(FakeRunner("bare", lambda argv, stdin: missing))


def test_failed_or_garbled_probe_raises_with_evidence() -> None:
    failed = Result("env python3 -", 1, "", "Traceback ...\nMemoryError", 0.01)
    with pytest.raises(CommandFailed, match="MemoryError"):
        facts.gather(FakeRunner("h", lambda argv, stdin: failed))
    with pytest.raises(ParseError, match="did not answer JSON"):
        facts.gather(FakeRunner("h", lambda argv, stdin: ok("Welcome to Ubuntu!\n")))


def test_a_login_shell_banner_before_the_answer_is_named_as_such() -> None:
    """A .bashrc that prints: the answer itself is intact after it, and the error says so."""
    answer = probe_answer_from_recording(lab.load_machine("h200x2-driver580"))
    banner = "Welcome to node07 (managed by the lab team)\n  * load average: 0.52\n"
    with pytest.raises(ParseError) as raised:
        facts.gather(FakeRunner("h200", lambda argv, stdin: ok(banner + answer + "\n")))
    message = str(raised.value)
    assert "starts with text from the login shell: 'Welcome to node07 (managed by the lab team) * load " in message
    assert "did not answer JSON" not in message


def _huge_writer(marker: Path) -> list[str]:
    """A command printing 64 MiB (64 times the cap), then leaving a mark that it got to the end."""
    code = ("import sys\nblock = b'x' * (1 << 20)\nfor _ in range(64): sys.stdout.buffer.write(block)\n"
            "sys.stdout.flush()\nopen(sys.argv[1], 'w').close()\n")
    return [sys.executable, "-c", code, str(marker)]


def test_a_command_printing_far_more_than_the_cap_is_stopped_and_the_probe_stays_small(tmp_path) -> None:
    """The probe reads at most MAX_OUTPUT of a command, then stops it: before, it held the whole
    output (768 MiB from one nvidia-smi) and only then cut it to the cap."""
    marker = tmp_path / "finished"
    tracemalloc.start()
    try:
        started = time.monotonic()
        answer = hostprobe._run(_huge_writer(marker), 60)
        seconds = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert answer["truncated"] is True and len(answer["stdout"]) == hostprobe.MAX_OUTPUT
    assert peak < 8 * hostprobe.MAX_OUTPUT  # the cap and its decoded text, not the 64 MiB
    time.sleep(0.5)
    assert not marker.exists() and seconds < 30  # stopped, not waited for
    assert answer["exit"] == -signal.SIGKILL
    # A fact whose command was cut is unreadable, not a short answer.
    gathered = facts.facts_from_probe("h", ok(json.dumps({"python": "3.11.2", "paths": {}, "results": {
        "lscpu": {**answer, "exit": 0}}})))
    assert gathered.cpu is None and "lscpu" in gathered.unreadable
    assert "printed more than the probe keeps" in gathered.notes["lscpu"]


def test_a_command_within_the_cap_is_read_whole_with_its_exit_code() -> None:
    code = "import sys\nsys.stdout.write('a' * 300000)\nsys.stderr.write('warn\\n')\nsys.exit(3)\n"
    answer = hostprobe._run([sys.executable, "-c", code], 30)
    took = answer.pop("seconds")
    assert answer == {"exit": 3, "stdout": "a" * 300000, "stderr": "warn\n", "missing": False,
                      "timed_out": False, "truncated": False}
    assert 0 < took < 30


def test_the_probe_lists_drop_in_directories(tmp_path) -> None:
    (tmp_path / "vllm.service.d").mkdir()
    (tmp_path / "vllm.service.d" / "override.conf").write_text("[Service]\nCPUAffinity=0-3\n")
    spec = facts.probe_spec([], [], 5, {"dirs": [str(tmp_path / "vllm.service.d"), str(tmp_path / "none.d")]})
    answer = hostprobe.collect(spec)
    gathered = facts.facts_from_probe("h", ok(json.dumps(answer)), [])
    assert gathered.dirs == {str(tmp_path / "vllm.service.d"): ("override.conf",), str(tmp_path / "none.d"): None}


def test_probe_reports_missing_commands_timeouts_files_and_space() -> None:
    answer = hostprobe.collect({
        "commands": {"absent": ["no-such-command-xyz"], "slow": [sys.executable, "-c",
                                                                  "import time; time.sleep(5)"]},
        "files": {"nofile": "/nonexistent/file"},
        "paths": ["/nonexistent/deeper/dir"],
        "timeout": 0.5,
    })
    assert answer["results"]["absent"]["missing"] is True
    assert answer["results"]["slow"]["timed_out"] is True
    assert answer["results"]["nofile"]["missing"] is True
    space = answer["paths"]["/nonexistent/deeper/dir"]
    assert space["checked"] == "/" and space["exists"] is False and space["free"] > 0


def test_a_command_stopped_for_its_time_is_stopped_with_the_processes_it_started() -> None:
    """A wrapper that hangs (a vendor's nvidia-smi script, say) and its child: both end with the timeout,
    not only the wrapper (its child would stay, its parent PID 1)."""
    answer = hostprobe.collect({"commands": {"hangs": ["sh", "-c", "sleep 600 & echo $!; wait"]}, "timeout": 1})
    result = answer["results"]["hangs"]
    assert result["timed_out"] is True
    child = int(result["stdout"].split()[0])
    for _ in range(50):  # gone, or a zombie waiting for its new parent to reap it
        try:
            state = Path(f"/proc/{child}/status").read_text().split("State:")[1].split()[0]
        except (FileNotFoundError, IndexError):
            break
        if state == "Z":
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the hung command's child {child} is still running")


def test_local_connection_gathers_this_machines_real_facts_in_one_execution() -> None:
    runner = remote.connect(inventory.local_host(), inventory.SshSettings())
    gathered = facts.gather(runner, paths=["/"])
    assert runner.executions == 1
    assert gathered.arch == platform.machine()
    assert gathered.python is not None and gathered.python.count(".") == 2
    assert gathered.disks[0].exists and gathered.disks[0].free_bytes > 0


COUNTING = """#!{python}
import sys
with open({log!r}, "a") as handle:
    handle.write("ran\\n")
print('{{"python": "3.11.2", "vllm": "0.11.0", "torch": "2.9.0+cu130", "cuda": "13.0"}}')
"""


def _counting_program(path, log) -> None:
    """A stand-in program that writes a line to `log` each time it runs (the venv's python,
    systemd-analyze): what a cached answer must not start."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(COUNTING.format(python=sys.executable, log=str(log)))
    path.chmod(0o755)


def _runs(log) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def _collect(fact: facts.Fact, cache) -> dict:
    spec = facts.probe_spec([fact], [], 5)
    spec["cache_file"] = str(cache)
    return hostprobe.collect(spec)


def _venv(tmp_path):
    venv = tmp_path / "venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    (site / "torch" / "lib").mkdir(parents=True)
    (site / "torch" / "version.py").write_text("__version__ = '2.9.0+cu130'\ncuda: Optional[str] = '13.0'\n")
    (site / "torch" / "lib" / "libtorch_cuda.so").write_bytes(b"\x7fELF")
    (site / "nvidia" / "nccl" / "lib").mkdir(parents=True)
    (site / "nvidia" / "nccl" / "lib" / "libnccl.so.2").write_bytes(b"\x7fELF")
    (site / "torch-2.9.0+cu130.dist-info").mkdir()
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.11.2\n")
    _counting_program(venv / "bin" / "python", tmp_path / "runs.log")
    return venv, site


def _bump(path) -> None:
    """An edit that keeps the size: only mtime and ctime say it happened."""
    data = path.read_bytes()
    time.sleep(0.01)
    path.write_bytes(data)


VENV_CHANGES = {
    "pip installs a package": lambda venv, site: (site / "vllm-0.11.0.dist-info").mkdir(),
    "pip removes a package": lambda venv, site: (site / "torch-2.9.0+cu130.dist-info").rmdir(),
    "torch/version.py edited in place": lambda venv, site: _bump(site / "torch" / "version.py"),
    "libtorch_cuda.so replaced": lambda venv, site: (site / "torch" / "lib" / "libtorch_cuda.so").write_bytes(b"new"),
    "libnccl replaced by hand": lambda venv, site: (site / "nvidia" / "nccl" / "lib" / "libnccl.so.2").write_bytes(b"2.29"),
    "the venv remade on another python": lambda venv, site: (venv / "pyvenv.cfg").write_text("version = 3.12.3\n"),
    "its python replaced": lambda venv, site: _counting_program(venv / "bin" / "python", venv.parent / "runs.log"),
}


@pytest.mark.parametrize("change", list(VENV_CHANGES))
def test_the_venv_fact_is_answered_from_the_hosts_cache_until_a_file_it_depends_on_changes(tmp_path, change) -> None:
    venv, site = _venv(tmp_path)
    fact, cache, log = facts.venv_fact(str(venv)), tmp_path / "cache" / "probe.json", tmp_path / "runs.log"
    first = _collect(fact, cache)
    assert _runs(log) == 1 and first["cache"]["written"] and "cached" not in first["results"]["venv"]
    again = _collect(fact, cache)
    assert _runs(log) == 1, "an unchanged venv ran its python again"
    assert again["results"]["venv"]["cached"] is True and again["cache"]["written"] is False
    assert fact.parse(again["results"]["venv"]["stdout"]) == fact.parse(first["results"]["venv"]["stdout"])
    VENV_CHANGES[change](venv, site)
    changed = _collect(fact, cache)
    assert _runs(log) == 2 and "cached" not in changed["results"]["venv"], change


def _probe_on(python: str | None):
    """collect() as a host runs it: here, or shipped to `python -I -S -` (python None: here)."""
    def collect(fact: facts.Fact, cache) -> dict:
        spec = facts.probe_spec([fact], [], 5)
        spec["cache_file"] = str(cache)
        if python is None:
            return hostprobe.collect(spec)
        done = subprocess.run([python, *facts.PROBE_PYTHON[1:]], input=facts.probe_program(spec),
                              capture_output=True, text=True, timeout=60, cwd="/", check=False)
        assert done.returncode == 0, done.stderr
        return facts.probe_answer(done.stdout)
    return collect


def _how(answers: list[dict]) -> list[str]:
    return ["cached" if answer["results"]["venv"].get("cached") else "ran" for answer in answers]


@pytest.mark.parametrize("python", ["this python", "python3.6"])
def test_two_venvs_on_one_host_each_keep_their_answer_in_the_hosts_cache(tmp_path, python) -> None:
    """A host with two services in two venvs is sent one probe per venv (run.gating.gather), each
    asking a fact named "venv": both answers are kept, a second round answers both from the cache,
    and a change in one venv asks that venv alone again."""
    interpreter = None if python == "this python" else _python("3.6")
    if python != "this python" and interpreter is None:
        pytest.skip("no python3.6 on this machine")
    collect = _probe_on(interpreter)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (venv_a, _), (venv_b, site_b) = _venv(tmp_path / "a"), _venv(tmp_path / "b")
    asked = (facts.venv_fact(str(venv_a)), facts.venv_fact(str(venv_b)))
    log_a, log_b = tmp_path / "a" / "runs.log", tmp_path / "b" / "runs.log"
    cache = tmp_path / "cache" / "probe.json"

    first = [collect(fact, cache) for fact in asked]
    assert _how(first) == ["ran", "ran"] and (_runs(log_a), _runs(log_b)) == (1, 1)
    assert all(answer["cache"]["written"] for answer in first)
    kept = json.loads(cache.read_text()).values()
    assert sorted(entry["key"]["argv"][0] for entry in kept) == [
        f"{venv_a}/bin/python", f"{venv_b}/bin/python"]

    again = [collect(fact, cache) for fact in asked]
    assert _how(again) == ["cached", "cached"] and (_runs(log_a), _runs(log_b)) == (1, 1)
    assert not any(answer["cache"]["written"] for answer in again)

    _bump(site_b / "torch" / "version.py")
    assert _how([collect(fact, cache) for fact in asked]) == ["cached", "ran"]
    assert (_runs(log_a), _runs(log_b)) == (1, 2)
    assert _how([collect(fact, cache) for fact in asked]) == ["cached", "cached"]
    assert (_runs(log_a), _runs(log_b)) == (1, 2)


def test_the_hosts_cache_misses_an_old_entry_and_keeps_a_bounded_number_per_fact(tmp_path) -> None:
    """An entry of the old form (one per fact's name) misses, runs and is kept anew in the new form;
    venvs that come and go leave at most MAX_SLOTS entries of the fact: the newest stored."""
    venvs = []
    for index in range(hostprobe.MAX_SLOTS + 2):
        (tmp_path / str(index)).mkdir()
        venvs.append(_venv(tmp_path / str(index))[0])
    cache = tmp_path / "cache" / "probe.json"
    cache.parent.mkdir()
    first = facts.venv_fact(str(venvs[0]))
    argv, identity = list(first.argv or ()), list(first.identity)
    # What the probe kept before: an entry named after the fact, whose key still matches.
    result = {"exit": 0, "stdout": "{}", "stderr": "", "missing": False}
    cache.write_text(json.dumps({"venv": {"key": hostprobe._key(argv, identity, []), "result": result}}))

    assert _how([_collect(first, cache)]) == ["ran"] and _runs(tmp_path / "0" / "runs.log") == 1
    assert list(json.loads(cache.read_text())) == [hostprobe._slot("venv", argv, identity, [])]
    for venv in venvs[1:]:
        _collect(facts.venv_fact(str(venv)), cache)

    def pythons() -> set[str]:
        return {entry["key"]["argv"][0] for entry in json.loads(cache.read_text()).values()}

    assert pythons() == {f"{venv}/bin/python" for venv in venvs[-hostprobe.MAX_SLOTS:]}
    assert _how([_collect(facts.venv_fact(str(venvs[-hostprobe.MAX_SLOTS])), cache)]) == ["cached"]
    # The first venv asked again runs (its entry went) and is kept; the oldest stored goes.
    assert _how([_collect(first, cache)]) == ["ran"] and _runs(tmp_path / "0" / "runs.log") == 2
    assert pythons() == {f"{venv}/bin/python" for venv in [venvs[0], *venvs[-hostprobe.MAX_SLOTS + 1:]]}


def _units(tmp_path):
    root = str(tmp_path / "root")
    system = tmp_path / "root" / "etc" / "systemd" / "system"
    system.mkdir(parents=True)
    (system / "vllm.service").write_text("[Service]\nExecStart=/opt/vllm/venv/bin/vllm serve\n")
    program = tmp_path / "bin" / "systemd-analyze"
    _counting_program(program, tmp_path / "runs.log")
    fact = dataclasses.replace(next(fact for fact in facts.FACTS if fact.name == "unit_security"), argv=(str(program), "security"),
                               identity=facts.unit_files(root))
    return fact, system, program


UNIT_CHANGES = {
    "the unit rewritten": lambda system, program: (system / "vllm.service").write_text("[Service]\nUser=vllm\n"),
    "a drop-in added (systemctl edit)": lambda system, program: (
        (system / "vllm.service.d").mkdir(), (system / "vllm.service.d" / "override.conf").write_text("[Service]\n")),
    "a drop-in for every service": lambda system, program: (
        (system / "service.d").mkdir(), (system / "service.d" / "10-all.conf").write_text("[Service]\n")),
    "a runtime unit (systemctl --runtime)": lambda system, program: (
        (system.parents[2] / "run" / "systemd" / "system").mkdir(parents=True),
        (system.parents[2] / "run" / "systemd" / "system" / "llama-server.service").write_text("[Service]\n")),
    "the unit removed": lambda system, program: (system / "vllm.service").unlink(),
    "systemd-analyze upgraded": lambda system, program: _counting_program(program, program.parents[1] / "runs.log"),
}


@pytest.mark.parametrize("change", list(UNIT_CHANGES))
def test_the_unit_scores_are_answered_from_the_hosts_cache_until_a_unit_file_changes(tmp_path, change) -> None:
    fact, system, program = _units(tmp_path)
    cache, log = tmp_path / "cache" / "probe.json", tmp_path / "runs.log"
    _collect(fact, cache)
    assert _collect(fact, cache)["results"]["unit_security"]["cached"] is True and _runs(log) == 1
    UNIT_CHANGES[change](system, program)
    assert "cached" not in _collect(fact, cache)["results"]["unit_security"] and _runs(log) == 2, change
    assert _collect(fact, cache)["results"]["unit_security"]["cached"] is True and _runs(log) == 2


def _boot_keyed(tmp_path, name: str):
    """The fact `name` with its program a counting stand-in and the files it is keyed by under tmp_path
    (a boot id, the CPUs online, the driver's version file), as a host has them."""
    program = tmp_path / "bin" / name
    _counting_program(program, tmp_path / "runs.log")
    fact = next(fact for fact in facts.FACTS if fact.name == name)
    files = {path: tmp_path / "proc" / path.lstrip("/") for path in fact.keyed_by}
    for path, local in files.items():
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text({facts.BOOT_ID: "989f0869-1148-4510-ad17-a9c54847d6a5\n", facts.CPUS_ONLINE: "0-31\n",
                          facts.NVIDIA_VERSION: "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  "
                                                "580.159.04\n"}[path])
    return dataclasses.replace(fact, argv=(str(program), *fact.argv[1:]),
                               keyed_by=tuple(str(local) for local in files.values())), files, program


BOOT_CHANGES = {
    "a reboot (a new boot id)": (facts.BOOT_ID, "8f648788-2b91-4b26-996d-0bd379122baa\n"),
    "a CPU taken offline (hotplug)": (facts.CPUS_ONLINE, "0-30\n"),
    "the driver reloaded without a reboot": (
        facts.NVIDIA_VERSION, "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.173.02\n"),
    "the driver unloaded": (facts.NVIDIA_VERSION, None),
    "the program upgraded": (None, None),
}
BOOT_KEYED = [(fact.name, change) for fact in facts.FACTS if fact.keyed_by for change, (path, _) in BOOT_CHANGES.items()
              if path is None or path in fact.keyed_by]


def test_what_holds_for_a_boot_is_keyed_by_it() -> None:
    keyed = {fact.name: fact.keyed_by for fact in facts.FACTS if fact.keyed_by}
    assert keyed == {"uname": (facts.BOOT_ID,), "lscpu": (facts.BOOT_ID, facts.CPUS_ONLINE),
                     "lscpu_cpus": (facts.BOOT_ID, facts.CPUS_ONLINE),
                     "lscpu_models": (facts.BOOT_ID, facts.CPUS_ONLINE),
                     "gpu_topology": (facts.BOOT_ID, facts.NVIDIA_VERSION)}
    # The GPUs' readings (memory in use, temperature), the units and the addresses change while a host runs.
    assert not any(fact.keyed_by or fact.identity for fact in facts.FACTS if fact.name in ("gpus", "units", "interfaces"))


@pytest.mark.parametrize(("name", "change"), BOOT_KEYED, ids=[f"{name}: {change}" for name, change in BOOT_KEYED])
def test_an_answer_that_holds_for_a_boot_is_kept_until_its_key_changes(tmp_path, name: str, change: str) -> None:
    fact, files, program = _boot_keyed(tmp_path, name)
    cache, log = tmp_path / "cache" / "probe.json", tmp_path / "runs.log"
    first = _collect(fact, cache)
    assert _runs(log) == 1 and first["cache"]["written"] and "cached" not in first["results"][name]
    again = _collect(fact, cache)
    assert _runs(log) == 1 and again["results"][name]["cached"] is True, "an unchanged boot ran the command again"
    assert again["results"][name]["stdout"] == first["results"][name]["stdout"]
    path, content = BOOT_CHANGES[change]
    if path is None:
        _counting_program(program, tmp_path / "runs.log")  # rewritten: a new inode, size and mtime
    elif content is None:
        files[path].unlink()
    else:
        files[path].write_text(content)
    assert "cached" not in _collect(fact, cache)["results"][name] and _runs(log) == 2, change
    assert _collect(fact, cache)["results"][name]["cached"] is True and _runs(log) == 2


def test_the_cache_is_root_s_alone_and_a_cache_that_cannot_be_written_only_costs_the_runs(tmp_path) -> None:
    fact, _, _ = _units(tmp_path)
    cache, log = tmp_path / "cache" / "probe.json", tmp_path / "runs.log"
    _collect(fact, cache)
    assert (cache.stat().st_mode & 0o777) == 0o600 and (cache.parent.stat().st_mode & 0o777) == 0o700
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    for _ in range(2):
        answer = _collect(fact, blocked / "probe.json")
        assert answer["cache"]["written"] is False and "a-file" in answer["cache"]["error"]
        assert answer["results"]["unit_security"]["exit"] == 0
    assert _runs(log) == 3


def test_a_command_that_timed_out_is_not_kept(tmp_path) -> None:
    cache = tmp_path / "probe.json"
    slow = facts.Fact("slow", str, argv=(sys.executable, "-c", "import time; time.sleep(5)"),
                      identity=(str(tmp_path / "nothing"),))
    spec = facts.probe_spec([slow], [], 0.3)
    spec["cache_file"] = str(cache)
    for _ in range(2):
        answer = hostprobe.collect(spec)
        assert answer["results"]["slow"]["timed_out"] is True and "cached" not in answer["results"]["slow"]
    assert not cache.exists()


def test_the_probe_accounts_for_each_fact_how_it_was_answered_and_how_long_it_took(tmp_path) -> None:
    fact, _, _ = _units(tmp_path)
    listed = facts.Fact("listed", str, argv=(sys.executable, "-c", "import time; time.sleep(0.2)"))
    read = facts.Fact("read", str, file=str(tmp_path / "runs.log"))
    absent = facts.Fact("absent", str, argv=("no-such-program-here",))
    asked = [fact, listed, read, absent]
    spec = facts.probe_spec(asked, [], 5)
    spec["cache_file"] = str(tmp_path / "cache.json")
    hostprobe.collect(spec)
    account = facts.probe_account(hostprobe.collect(spec), asked)
    assert [(step.fact, step.how) for step in account.steps] == [
        ("unit_security", "cached"), ("listed", "ran"), ("read", "read"), ("absent", "missing")]
    assert account.steps[1].seconds >= 0.2 and account.steps[0].seconds == 0.0
    assert [step.source for step in account.steps if step.how == "ran"] == [sys.executable]
    assert account.seconds is not None and account.seconds >= 0.2
    assert account.cache_file == str(tmp_path / "cache.json") and not account.cache_written


def test_probe_commands_run_at_once(tmp_path) -> None:
    # Each command waits until all four have started: one after the other, the first times out.
    wait = ("import os, sys, time\n"
            "open(os.path.join(sys.argv[1], sys.argv[2]), 'w').close()\n"
            "while len(os.listdir(sys.argv[1])) < 4:\n"
            "    time.sleep(0.01)\n")
    spec = {"commands": {f"c{i}": [sys.executable, "-c", wait, str(tmp_path), str(i)] for i in range(4)},
            "timeout": 3}
    results = hostprobe.collect(spec)["results"]
    assert [results[f"c{i}"]["timed_out"] for i in range(4)] == [False] * 4
    assert all(results[f"c{i}"]["exit"] == 0 for i in range(4))


def test_the_facts_table_shows_the_venv_when_one_exists_and_says_when_none() -> None:
    from provision import lab, report
    from tests.fakes import ok, probe_answer_from_recording

    with_venv = (*facts.FACTS, facts.venv_fact("/opt/vllm/venv"))
    recorded = facts.facts_from_probe("ws-575", ok(probe_answer_from_recording(
        lab.load_machine("rtx5090x2-driver575-venv-cu130"))), with_venv)
    rows = dict(report.facts_rows(recorded))
    assert rows["venv"] == "no engine, torch 2.11.0+cu130 (CUDA 13.0), NCCL 2.28.9; Python 3.12.3"
    bare = facts.facts_from_probe("ws-5090", ok(probe_answer_from_recording(
        lab.load_machine("rtx5090x2-tr7960x"))), with_venv)
    assert dict(report.facts_rows(bare))["venv"] == "not collected"


SHIPPED_WITH = {"apply": ("generations", "apply"), "weights": ("relay", "weights"), "probe": ("gguf", "probe")}


@pytest.mark.parametrize("name", ["probe", "apply", "generations", "relay", "weights", "build", "nccl", "serve", "roll"])
def test_every_host_program_ships_self_contained(name: str) -> None:
    """What a host receives imports nothing of this package: it runs where provision is not installed."""
    from provision import programs

    text = programs.ship(SHIPPED_WITH.get(name, (name,)), "print", {"ok": 1})
    assert "from provision" not in text and "import provision" not in text
    done = subprocess.run([sys.executable, "-I", "-"], input=text,
                          capture_output=True, text=True, timeout=60, cwd="/", check=False)
    assert done.returncode == 0 and done.stdout.strip() == "{'ok': 1}", done.stderr


def _python(version: str) -> str | None:
    """An interpreter of that version that starts, if this machine has one (pyenv keeps old ones)."""
    candidates = [shutil.which(f"python{version}"),
                  *sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}")))]
    for candidate in candidates:
        if candidate and subprocess.run([candidate, "-c", "pass"], capture_output=True, timeout=30,
                                        check=False).returncode == 0:
            return candidate
    return None


@pytest.mark.parametrize(("name", "oldest"), [("probe", "3.6"), ("apply", "3.7"), ("weights", "3.7"), ("relay", "3.7"),
                                              ("build", "3.7"), ("nccl", "3.7"), ("serve", "3.7"), ("roll", "3.7")])
def test_every_host_program_runs_on_the_oldest_python3_it_promises(name: str, oldest: str) -> None:
    """The probe must answer on any python3 (it reports the version the gate refuses); the others
    need 3.7 for their `from __future__ import annotations` (provision/host/__init__.py)."""
    from provision import programs

    python = _python(oldest)
    if python is None:
        pytest.skip(f"no python{oldest} on this machine")
    text = programs.ship(SHIPPED_WITH.get(name, (name,)), "print", {"ok": 1})
    flags = facts.PROBE_PYTHON[1:] if name == "probe" else ("-I", "-")  # the probe's as it is started
    done = subprocess.run([python, *flags], input=text, capture_output=True, text=True, timeout=60,
                          cwd="/", check=False)
    assert done.returncode == 0 and done.stdout.strip() == "{'ok': 1}", done.stderr


# ---------------------------------------------------------------------------------------------
# nccl.conf files and the reachability probe


def _here(argv: list[str], stdin: str | None) -> Result:
    """The shipped program run by this machine's python3, as a host runs it."""
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60, check=False)
    return Result(" ".join(argv), done.returncode, done.stdout, done.stderr, 0.1)


def test_the_reachability_probe_tells_an_open_port_from_a_closed_one_in_one_execution() -> None:
    import socket
    with socket.socket() as listening, socket.socket() as closed:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        runner = FakeRunner("h", _here)
        answer = facts.reach(runner, [f"127.0.0.1:{listening.getsockname()[1]}",
                                      f"127.0.0.1:{closed.getsockname()[1]}", "no-such-host.invalid:443"],
                             timeout=2)
    assert runner.executions == 1
    opened, refused, unknown = answer.values()
    assert opened is None
    assert refused is not None and refused.startswith("ConnectionRefusedError")
    assert unknown is not None and unknown.startswith("gaierror")


def test_a_gather_asks_for_no_reachability_and_reads_nccl_conf_files_as_files() -> None:
    spec = facts.probe_spec((*facts.FACTS, facts.venv_fact("/opt/vllm/venv")), [], 20.0,
                            {"users": ["vllm"], "home_files": [facts.USER_NCCL_CONF]})
    assert "reach" not in spec
    assert spec["files"]["nccl_conf"] == "/etc/nccl.conf" and spec["files"]["cmdline"] == "/proc/cmdline"
    assert "nccl_conf" not in spec["commands"] and "cmdline" not in spec["commands"]


def test_the_service_users_nccl_conf_comes_with_the_inspected_user() -> None:
    conf = json.loads((FIXTURES / "facts" / "nccl_conf" / "image-ib-use-inline.json").read_text())["stdout"]
    answer = json.loads(probe_answer_from_recording(lab.load_machine("dgx-spark-gb10")))
    answer["results"]["nccl_conf"] = {"exit": 0, "stdout": conf, "stderr": "", "missing": False, "timed_out": False}
    answer["inspect"] = {"users": {"vllm": {"exists": True, "uid": 998, "home": "/var/lib/vllm/",
                                            "home_files": {".nccl.conf": "NCCL_DEBUG=WARN\n"}},
                                   "other": {"exists": True, "uid": 999, "home": "/home/other",
                                             "home_files": {".nccl.conf": None}}}}
    gathered = facts.facts_from_probe("spark", ok(json.dumps(answer)))
    assert gathered.nccl_conf == {"/var/lib/vllm/.nccl.conf": {"NCCL_DEBUG": "WARN"},
                                  "/etc/nccl.conf": {"NCCL_IB_USE_INLINE": "1"}}
    answer["inspect"]["users"]["vllm"]["home_files"] = {".nccl.conf": "just words\n"}
    broken = facts.facts_from_probe("spark", ok(json.dumps(answer)))
    assert "nccl_conf" in broken.unreadable
    assert broken.notes["nccl_conf"].startswith("/var/lib/vllm/.nccl.conf: cannot parse")
    absent = {"exit": 1, "stdout": "", "stderr": "", "missing": True, "timed_out": False}
    answer["results"]["nccl_conf"] = absent
    del answer["inspect"]
    plain = facts.facts_from_probe("spark", ok(json.dumps(answer)))
    assert plain.nccl_conf == {} and "nccl_conf" not in plain.notes  # most hosts have none: no note


def test_the_probe_reads_a_users_home_file_or_answers_none() -> None:
    import pwd
    me = pwd.getpwuid(os.getuid()).pw_name
    state = hostprobe.inspect({"users": [me], "home_files": [".provision-test-absent-nccl.conf"]})["users"][me]
    assert state["home_files"] == {".provision-test-absent-nccl.conf": None}



NO_SYSTEMD = ("System has not been booted with systemd as init system (PID 1). Can't operate.\n"
              "Failed to connect to bus: Host is down\n")  # systemctl's words in a container (PID 1 not systemd)


def _answered(results: dict[str, dict[str, object]]) -> facts.HostFacts:
    answer = json.dumps({"python": "3.11.7", "paths": {}, "results": results})
    return facts.gather(FakeRunner("box", lambda argv, stdin: ok(answer)))


def test_a_fact_the_host_could_not_answer_is_unknown_not_empty() -> None:
    """No `ip` on the host (the probe finds no such program) and a systemctl that cannot reach systemd:
    neither reads as "no interfaces" or "not installed", in the table or in the JSON."""
    gathered = _answered({
        "interfaces": {"exit": 127, "stdout": "", "stderr": "", "missing": True, "timed_out": False},
        "units": {"exit": 1, "stdout": "", "stderr": NO_SYSTEMD, "missing": False, "timed_out": False}})
    assert gathered.interfaces is None and gathered.units is None
    assert gathered.notes["interfaces"] == "ip: not present on the host"
    assert gathered.notes["units"] == ("systemctl: exit 1: System has not been booted with systemd as init system "
                                       "(PID 1). Can't operate.")
    rows = dict(report.facts_rows(gathered))
    assert rows["interfaces"] == "unknown (ip: not present on the host)"
    assert rows["units"] == f"unknown ({gathered.notes['units']})"
    data = gathered.as_json()
    assert data["interfaces"] is None and data["units"] is None
    assert data["notes"]["interfaces"] == "ip: not present on the host"


def test_an_answer_that_lists_nothing_is_still_an_answer() -> None:
    recorded = json.loads((FIXTURES / "units" / "systemd252-none-installed.json").read_text())["units"]
    gathered = _answered({
        "interfaces": {"exit": 0, "stdout": "[]", "stderr": "", "missing": False, "timed_out": False},
        "units": {"exit": recorded["exit"], "stdout": recorded["stdout"], "stderr": recorded["stderr"],
                  "missing": False, "timed_out": False}})
    assert gathered.interfaces == () and gathered.units and "interfaces" not in gathered.notes
    rows = dict(report.facts_rows(gathered))
    assert (rows["interfaces"], rows["units"]) == ("-", "not installed")
