"""The lab's refusals and its recordings, without booting anything."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from provision import engines, facts, lab
from provision.errors import LabError


def test_lab_refuses_without_root_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lab.os, "geteuid", lambda: 1000)
    with pytest.raises(LabError, match="needs root"):
        lab.preflight()


def test_lab_refuses_without_nspawn_and_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lab.os, "geteuid", lambda: 0)
    monkeypatch.setattr(lab.shutil, "which", lambda tool: None if tool in ("systemd-nspawn", "debootstrap") else "/usr/bin/" + tool)
    with pytest.raises(LabError) as caught:
        lab.preflight()
    assert "missing systemd-nspawn, debootstrap" in str(caught.value)
    assert "apt-get install -y systemd-container debootstrap" in str(caught.value)


@pytest.mark.parametrize("host", [h for h in lab.DEFAULT_HOSTS if h.machine], ids=lambda h: h.name)
def test_every_recording_answers_the_tools_current_commands(host: lab.LabHost) -> None:
    """A recording made with an older command would be replayed to nobody: catch the drift here."""
    recording = lab.load_machine(host.machine or "")
    assert recording["profile"] == host.profile
    by_fact = {entry["fact"]: entry for entry in recording["outputs"]}
    for fact in facts.FACTS:
        entry = by_fact.get(fact.name)
        if entry is None:
            continue
        assert entry.get("argv", entry.get("file")) == (list(fact.argv) if fact.argv else fact.file)
        assert entry.get("provenance"), f"{host.machine}/{fact.name} does not say where it comes from"
    venv = by_fact.get("venv")
    if venv is not None:  # the service venv's probe, at the default venv_dir
        assert venv["argv"] == list(facts.venv_fact("/opt/vllm/venv", engines.dists()).argv), f"{host.machine}: stale venv probe"
    for needed in ("uname", "gpus", "nvidia_driver", "lscpu", "lscpu_cpus"):
        assert needed in by_fact, f"{host.machine} lacks {needed}"


def test_lab_raises_the_inotify_limit_to_fit_its_hosts_and_never_lowers_it(tmp_path, monkeypatch) -> None:
    limit = tmp_path / "max_user_instances"
    monkeypatch.setattr(lab, "INOTIFY_LIMIT", limit)
    said: list[str] = []
    limit.write_text("128\n")
    lab._ensure_inotify(21, said.append)
    assert int(limit.read_text()) == 21 * lab.INOTIFY_PER_HOST + 64 and "from 128" in said[0]
    limit.write_text("100000\n")
    lab._ensure_inotify(21, said.append)
    assert limit.read_text() == "100000\n" and len(said) == 1


def test_bench_hosts_are_plain_cpu_hosts_booted_only_when_named() -> None:
    assert len(lab.BENCH_HOSTS) == 32 and lab.BENCH_HOSTS[0].name == "bench-01"
    assert all(h.machine is None and not h.default and h.log_sessions for h in lab.BENCH_HOSTS)
    assert not {h.name for h in lab.BENCH_HOSTS} & {h.name for h in lab.DEFAULT_HOSTS}


def test_lab_down_says_what_it_leaves_and_how_to_remove_it(tmp_path, monkeypatch) -> None:
    house = tmp_path / "wheelhouse"
    monkeypatch.setenv("PROVISION_WHEELHOUSE", str(house))
    monkeypatch.setenv("PROVISION_MODEL_CONFIGS", str(tmp_path / "configs"))
    assert lab.left_in_place() == []
    (house / "x86_64-py3.11-abc").mkdir(parents=True)
    (house / "x86_64-py3.11-abc" / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"0" * 3 * 2**20)
    (line,) = lab.left_in_place()
    assert f"left in place: {house} (3 MiB of wheels" in line and f"`rm -r {house}` removes them" in line


def test_every_lab_machine_says_which_facts_it_cannot_replay() -> None:
    """A lab host shows the recorded machine, or says which facts come from this machine instead."""
    said = {host.machine: lab.not_replayed(lab.load_machine(host.machine))
            for host in lab.DEFAULT_HOSTS if host.machine}
    # The recorded H200 node replays its module list (lsmod from its verbatim /proc/modules), so the
    # nouveau check reads the node's modules, not "could not be checked" for this machine's lack of them.
    # No recording holds /proc/devices: every host reads this machine's (no NVIDIA group), said so.
    assert said["h200x2-driver580"] == ["proc_devices"] and said["dgx-spark-gb10"] == ["proc_devices"]
    # No memory or /proc/cpuinfo was recorded on the 5090 workstation: this machine's answer, said so.
    assert said["rtx5090x2-tr7960x"] == ["meminfo", "cpuinfo", "proc_devices"]
    h200 = {e["fact"]: e for e in lab.load_machine("h200x2-driver580")["outputs"]}
    from provision import parsers
    assert parsers.parse_lsmod(h200["lsmod"]["stdout"]) == parsers.parse_proc_modules(h200["modules"]["stdout"])


def test_the_keeper_replays_what_the_stand_ins_left_for_the_next_boot(tmp_path: Path) -> None:
    """A reboot applies pending.json: the new /proc/driver/nvidia/version, the new `uname -r -m`, and the
    driver version nvidia-smi reports; the record is used up."""
    from provision.lab import keeper

    inside = tmp_path / keeper.INSIDE
    (inside / "proc" / "driver" / "nvidia").mkdir(parents=True)
    (inside / "proc" / "driver" / "nvidia" / "version").write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.133.07  Fri Mar 14 13:12:07 UTC 2025\n")
    (inside / "recording.json").write_text(json.dumps([
        {"argv": ["uname", "-r", "-m"], "stdout": "6.8.0-45-generic\nx86_64\n", "exit": 0},
        {"argv": ["nvidia-smi", "--query-gpu=driver_version"], "stdout": "570.133.07\n", "exit": 0}]))
    (inside / "pending.json").write_text(json.dumps({
        "files": {"/proc/driver/nvidia/version": "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  "
                                                 "570.172.08  Release Build\n"},
        "commands": {"uname -r -m": "6.14.0-29-generic\nx86_64\n"}, "driver": "570.172.08"}))
    changed = keeper.apply_pending(tmp_path)
    assert changed == ["/proc/driver/nvidia/version", "uname -r -m"]
    recording = {entry["argv"][0]: entry["stdout"] for entry in json.loads((inside / "recording.json").read_text())}
    assert recording == {"uname": "6.14.0-29-generic\nx86_64\n", "nvidia-smi": "570.172.08\n"}
    assert "Open Kernel Module" in (inside / "proc" / "driver" / "nvidia" / "version").read_text()
    assert not (inside / "pending.json").exists() and keeper.apply_pending(tmp_path) == []


def test_a_running_host_gains_the_recordings_new_commands_and_keeps_what_it_replays() -> None:
    machine = lab.load_machine("h200x2-driver580")
    gpus = next(entry for entry in machine["outputs"] if entry["fact"] == "gpus")
    old_query = {**gpus, "argv": [gpus["argv"][0], gpus["argv"][1].removesuffix(",timestamp"), gpus["argv"][2]]}
    upgraded = {"argv": ["uname", "-r", "-m"], "stdout": "6.14.0-29-generic x86_64\n", "exit": 0}  # by the keeper
    merged = lab.merged_recording([upgraded, old_query], machine)
    assert merged[:2] == [upgraded, old_query]  # what the host held, first and unchanged
    assert gpus["argv"] in [entry["argv"] for entry in merged[2:]]
    assert ["uname", "-r", "-m"] not in [entry["argv"] for entry in merged[2:]]  # the keeper's stays the one
    assert lab.merged_recording(merged, machine) == merged  # nothing more to add


def test_a_process_already_gone_is_stopped_and_a_running_one_is_not() -> None:
    """lab.down stops what runs: a host whose nspawn ended by itself (reaped, or a zombie nobody reaps
    yet) is stopped already, and stopping it again is no error."""
    import os
    import subprocess

    running = subprocess.Popen(["sleep", "60"])
    ended = subprocess.Popen(["true"])
    os.waitid(os.P_PID, ended.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    try:
        assert not lab._exited(running.pid)
        assert lab._exited(ended.pid)
        lab._terminate(ended.pid)  # returns at once: nothing to stop
    finally:
        ended.wait()
    assert lab._exited(ended.pid)  # reaped: no such process
    lab._terminate(ended.pid)
    lab._terminate(running.pid)  # SIGTERM ends it (and _terminate reaps its own child)
    assert lab._exited(running.pid)
    running.wait(timeout=5)


def test_a_process_that_ends_while_its_stat_is_read_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading /proc/PID/stat of a process that exits meanwhile fails with ESRCH: lab.down once
    said "cpu-1: [Errno 3] No such process" and exited 1 with everything removed."""
    import os

    def ended_meanwhile(self: Path, *args: object, **kwargs: object) -> str:
        raise ProcessLookupError(3, "No such process")

    monkeypatch.setattr(lab.Path, "read_text", ended_meanwhile)
    assert lab._exited(os.getpid())  # alive for os.kill, gone by the time its stat is read


def test_the_lab_secrets_hold_the_hub_token_and_an_api_key_made_once(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """lab-llama-b and the lab-tiny endpoint listen on the lab network: the gate wants an API key there.
    The lab's secrets file holds one, so the tool sends it with nothing in the environment; a file made
    before it gains one, its hub token kept."""
    import stat

    import yaml

    from provision import secrets

    monkeypatch.setenv("PROVISION_LAB_DIR", str(tmp_path / "lab"))
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    the_lab = lab.Lab()
    the_lab.hub_root.mkdir(parents=True)
    the_lab._ensure_secrets()
    made = yaml.safe_load(the_lab.secrets_file.read_text())
    assert made["hf_token"].startswith("hf_lab_") and made["api_key"].startswith("sk-lab-")
    assert stat.S_IMODE(the_lab.secrets_file.stat().st_mode) == 0o600
    assert made["hf_token"] in json.loads((the_lab.hub_root / "tokens.json").read_text())
    held = secrets.load(str(the_lab.secrets_file))  # as the tool reads it (a 0600 file)
    assert (held.hf_token, held.api_key) == (made["hf_token"], made["api_key"])
    the_lab._ensure_secrets()
    assert yaml.safe_load(the_lab.secrets_file.read_text()) == made  # made once
    the_lab.secrets_file.write_text(f"hf_token: {made['hf_token']}\n")  # a lab from before the key
    the_lab._ensure_secrets()
    again = yaml.safe_load(the_lab.secrets_file.read_text())
    assert again["hf_token"] == made["hf_token"] and again["api_key"].startswith("sk-lab-")


def test_removing_named_hosts_stops_and_forgets_only_those(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lab.remove, which benchmarks/run.py stops the bench hosts it booted with: each named host is
    stopped and leaves the state, the known hosts and the lab inventory; the other hosts stay."""
    import yaml

    monkeypatch.setenv("PROVISION_LAB_DIR", str(tmp_path / "lab"))
    the_lab = lab.Lab()
    the_lab.dir.mkdir(parents=True)
    stopped: list[str] = []
    monkeypatch.setattr(the_lab, "_stop_one", lambda name, record: stopped.append(record["netns"]))
    names = ["cpu-1", "bench-01", "bench-02"]
    the_lab._save({"hosts": {name: {"address": the_lab.address(n), "host_key": f"ssh-ed25519 KEY{n}", "profile": "cpu",
                                    "machine": None} for n, name in enumerate(names)}})
    the_lab.remove(["bench-01", "bench-02"])
    assert stopped == ["plab-bench-01", "plab-bench-02"]
    assert list(the_lab.state()["hosts"]) == ["cpu-1"]
    assert list(yaml.safe_load(the_lab.inventory.read_text())["hosts"]) == ["cpu-1"]
    assert the_lab.known_hosts.read_text() == f"{the_lab.address(0)} ssh-ed25519 KEY0\n"


def test_lab_changes_are_one_at_a_time_across_processes_and_reentrant_within_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROVISION_LAB_CACHE", str(tmp_path / "cache"))
    instance = lab.Lab()
    other = ("import fcntl, sys\nwith open(sys.argv[1], 'a') as handle:\n"
             "    try:\n        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)\n    except BlockingIOError:\n"
             "        sys.exit(3)\n")
    lock_file = str(tmp_path / "cache" / "lab.lock")
    with instance.locked():
        with instance.locked():  # reset holds it and calls up
            held = subprocess.run([sys.executable, "-c", other, lock_file], check=False)
        assert held.returncode == 3  # another process (a second test worker) waits
    free = subprocess.run([sys.executable, "-c", other, lock_file], check=False)
    assert free.returncode == 0


def test_lab_files_are_replaced_whole_and_left_alone_when_unchanged(tmp_path: Path) -> None:
    target = tmp_path / "inventory.yaml"
    lab._write_if_changed(target, "hosts: {}\n")
    first = target.stat()
    lab._write_if_changed(target, "hosts: {}\n")
    assert target.stat().st_ino == first.st_ino and target.stat().st_mtime_ns == first.st_mtime_ns
    lab._write_if_changed(target, "hosts: {a: {}}\n")
    assert target.read_text() == "hosts: {a: {}}\n" and target.stat().st_ino != first.st_ino  # renamed over
    secret = tmp_path / "secrets.yaml"
    lab._write_if_changed(secret, "api_key: k\n", mode=0o600)
    assert secret.stat().st_mode & 0o777 == 0o600 and not list(tmp_path.glob("*.tmp"))
