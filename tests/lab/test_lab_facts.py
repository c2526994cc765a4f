"""Facts from real lab hosts over real SSH: one execution each, strict host keys, failures reported."""
from __future__ import annotations

import dataclasses
import json
import platform
from pathlib import Path

import pytest

from provision import facts, inventory, lab, parsers, remote
from provision.errors import HostKeyError
from tests.lab.conftest import run_invoke

pytestmark = pytest.mark.lab


def recorded(machine: str, fact: str) -> str:
    return next(e["stdout"] for e in lab.load_machine(machine)["outputs"] if e["fact"] == fact)


@pytest.mark.parametrize("name", ["ws-5090", "spark-a", "h200"])
def test_facts_over_ssh_are_the_replayed_machine_in_one_execution(
        name: str, lab_inventory: inventory.Inventory) -> None:
    host = lab_inventory.host(name)
    runner = remote.SshRunner(host, lab_inventory.ssh)
    try:
        gathered = facts.gather(runner, paths=["/opt/vllm/venv"])
        channels = runner.connection.transport._channel_counter  # channels opened on this connection
    finally:
        runner.close()
    assert runner.executions == 1 and channels == 1
    machine = lab.DEFAULT_HOSTS[[h.name for h in lab.DEFAULT_HOSTS].index(name)].machine
    assert machine is not None
    # The replayed readings, marked as the recording's (their timestamp is far older than the probe).
    assert gathered.gpus and all(gpu.recorded for gpu in gathered.gpus)
    assert tuple(dataclasses.replace(gpu, recorded=None) for gpu in gathered.gpus) == parsers.parse_nvidia_smi_csv(
        recorded(machine, "gpus"))
    assert gathered.driver == parsers.parse_nvidia_version(recorded(machine, "nvidia_driver"))
    assert gathered.kernel == parsers.parse_uname(recorded(machine, "uname")).release
    assert gathered.systemd_is_pid1  # the real systemd of the lab host, not a recording
    # /proc/devices is not replayed: a container reads its machine's, which has no NVIDIA group.
    assert gathered.device_groups == parsers.parse_proc_devices(Path("/proc/devices").read_text())
    assert gathered.units["vllm.service"].load_state in ("loaded", "not-found")  # real systemd answers
    assert any(addr.startswith(host.address + "/") for i in gathered.interfaces for addr in i.addresses)


def test_cli_facts_json_for_the_rtx5090_workstation(the_lab: lab.Lab) -> None:
    done = run_invoke("facts", "--host", "ws-5090", "--json")
    assert done.returncode == 0, done.stderr
    ws = json.loads(done.stdout)["hosts"]["ws-5090"]
    assert [gpu["name"] for gpu in ws["gpus"]] == ["NVIDIA GeForce RTX 5090"] * 2
    assert {gpu["compute_cap"] for gpu in ws["gpus"]} == {"12.0"}
    assert ws["driver"] == {"version": "570.133.07", "flavour": "open", "arch": "x86_64"}
    assert ws["kernel"] == "6.14.0-29-generic" and ws["os"]["id"] == "ubuntu"
    l3 = {cpu["l3"] for cpu in ws["cpu"]["cpus"]}
    assert len(ws["cpu"]["cpus"]) == 48 and l3 == {0, 1, 2, 3}


def test_cli_facts_for_the_spark_pair_reads_meminfo_not_nvidia_smi(the_lab: lab.Lab) -> None:
    done = run_invoke("facts", "--cluster", "lab-spark", "--json")
    assert done.returncode == 0, done.stderr
    hosts = json.loads(done.stdout)["hosts"]
    assert set(hosts) == {"spark-a", "spark-b"}
    for spark in hosts.values():
        assert spark["gpus"][0]["memory_total_mib"] is None
        assert spark["memory"]["total"] == 125513720 * 1024  # the replayed /proc/meminfo
        assert spark["cpu"]["parts"]["5"] == "0xd85"
        assert [link["netdev"] for link in spark["rdma"] if link["up"]] == ["enP2p1s0f1np1", "enp1s0f1np1"]


def test_cli_facts_local_are_this_machines_real_facts() -> None:
    done = run_invoke("facts", "--host", "local", "--json")
    assert done.returncode == 0, done.stderr
    local = json.loads(done.stdout)["hosts"]["local"]
    assert local["arch"] == platform.machine()
    assert local["kernel"] == platform.release()


def host_with_known_hosts(lab_inventory: inventory.Inventory, known_hosts: Path) -> tuple[
        inventory.Host, inventory.SshSettings]:
    settings = inventory.SshSettings(known_hosts=str(known_hosts), key_file=lab_inventory.ssh.key_file,
                                     connect_timeout=5)
    return lab_inventory.host("cpu-1"), settings


def test_unknown_host_key_is_refused_then_accepted_only_when_asked(
        lab_inventory: inventory.Inventory, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    host, settings = host_with_known_hosts(lab_inventory, known)
    with pytest.raises(HostKeyError, match=r"unknown host key ssh-ed25519 SHA256:\S+ .*--accept-new-host-keys"):
        remote.SshRunner(host, settings).run(["true"])
    assert not known.exists()
    accepting = remote.SshRunner(host, settings, accept_new_host_keys=True)
    assert accepting.run(["true"]).ok
    accepting.close()
    assert known.read_text().startswith(f"{host.address} ssh-ed25519 ")
    again = remote.SshRunner(host, settings)  # recorded: strict checking now passes
    assert again.run(["true"]).ok
    again.close()


def test_changed_host_key_is_refused_even_with_accept_new(
        lab_inventory: inventory.Inventory, tmp_path: Path, the_lab: lab.Lab) -> None:
    other = the_lab.state()["hosts"]["spark-b"]["host_key"]  # a real key, of another host
    known = tmp_path / "known_hosts"
    known.write_text(f"{lab_inventory.host('cpu-1').address} {other}\n")
    host, settings = host_with_known_hosts(lab_inventory, known)
    with pytest.raises(HostKeyError, match=r"CHANGED .*ssh-keygen -R"):
        remote.SshRunner(host, settings, accept_new_host_keys=True).run(["true"])


def test_one_dead_host_never_hides_the_others(the_lab: lab.Lab, tmp_path: Path) -> None:
    document = the_lab.inventory.read_text()
    dead = str(the_lab.network.network_address + 250)  # on the lab subnet, nobody there
    path = tmp_path / "inventory.yaml"
    path.write_text(document.replace("hosts:\n", f"hosts:\n  ghost: {{address: {dead}, profile: cpu}}\n", 1)
                    .replace("connect_timeout: 10", "connect_timeout: 3"))
    done = run_invoke("facts", "--inventory", str(path), "--host", "ghost", "--host", "cpu-1",
                      "--host", "spark-a", "--json")
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert set(report["hosts"]) == {"cpu-1", "spark-a"}
    assert report["errors"]["ghost"].startswith("ghost: unreachable")


def test_lab_up_again_changes_nothing_and_status_sees_every_host(the_lab: lab.Lab) -> None:
    # The default hosts: those booted only when named (ws-broken, cpu-3, bench-NN) are the other test
    # group's, booted, rebooted and removed meanwhile.
    default = {host.name for host in lab.DEFAULT_HOSTS if host.default}
    before = {name: record["pid"] for name, record in the_lab.state()["hosts"].items() if name in default}
    the_lab.up(progress=lambda line: None)
    after = {name: record["pid"] for name, record in the_lab.state()["hosts"].items() if name in default}
    assert before == after and set(before) == default
    rows = [row for row in the_lab.status() if row["host"] in default]
    assert {row["host"] for row in rows} == default
    assert all(row["sshd"] == "answers" and row["process"] == "running" for row in rows)
