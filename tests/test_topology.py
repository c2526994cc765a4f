"""What the parsers must tell about real hardware, written out by hand (not generated)."""
from __future__ import annotations

import json

from provision import lab, parsers
from tests.conftest import FIXTURES


def stdout(fact: str, case: str) -> str:
    data = json.loads((FIXTURES / "facts" / fact / f"{case}.json").read_text())
    if "machine" in data:
        recording = lab.load_machine(data["machine"])
        return next(e["stdout"] for e in recording["outputs"] if e["fact"] == fact)
    return str(data["stdout"])


def test_24_core_zen_has_four_ccds_of_six_cores_with_smt_siblings() -> None:
    cpus = parsers.parse_lscpu_extended(stdout("lscpu_cpus", "amd-24core-4ccd-smt2"))
    topology = parsers.CpuTopology("x86_64", "AuthenticAMD", (), cpus)
    assert len(cpus) == 48 and topology.threads_per_core == 2
    domains = topology.l3_domains
    assert sorted(domains) == [0, 1, 2, 3]
    assert domains[0] == (0, 1, 2, 3, 4, 5, 24, 25, 26, 27, 28, 29)
    assert domains[3] == (18, 19, 20, 21, 22, 23, 42, 43, 44, 45, 46, 47)
    assert all(cpu.max_mhz is None for cpu in cpus)  # recorded without the MAXMHZ column


def test_two_ccd_zen_splits_at_core_8_and_keeps_max_mhz() -> None:
    cpus = parsers.parse_lscpu_extended(stdout("lscpu_cpus", "amd-16core-2ccd-smt2"))
    topology = parsers.CpuTopology("x86_64", None, (), cpus)
    assert topology.l3_domains[0] == (0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)
    assert {cpu.max_mhz for cpu in cpus} == {5187.5}


def test_gb10_big_cores_agree_between_cpuinfo_parts_and_max_frequency() -> None:
    parts = parsers.parse_cpuinfo_parts(stdout("cpuinfo", "gb10-dell-pro-max"))
    x925 = sorted(cpu for cpu, part in parts.items() if part == "0xd85")
    assert x925 == [5, 6, 7, 8, 9, 15, 16, 17, 18, 19]  # not an index range: 0-4 and 10-14 are A725
    cpus = parsers.parse_lscpu_extended(stdout("lscpu_cpus", "dgx-spark-gb10"))
    assert sorted(cpu.cpu for cpu in cpus if cpu.max_mhz == 4004.0) == x925
    summary = parsers.parse_lscpu(stdout("lscpu", "gb10-dgx-spark"))
    assert summary.architecture == "aarch64"
    assert summary.model_names == ("Cortex-X925", "Cortex-A725")


def test_util_linux_dump_without_architecture_line_still_parses() -> None:
    summary = parsers.parse_lscpu(stdout("lscpu", "arm-a510-a710-a715-x3"))
    assert summary.architecture is None
    assert summary.model_names == ("Cortex-A510", "Cortex-A710", "Cortex-A715", "Cortex-X3")


def test_h200_node_gpus_driver_and_memory() -> None:
    gpus = parsers.parse_nvidia_smi_csv(stdout("gpus", "h200x2-driver580"))
    assert [(g.index, g.name, g.compute_cap, g.memory_total_mib) for g in gpus] == [
        (0, "NVIDIA H200", "9.0", 143771), (1, "NVIDIA H200", "9.0", 143771)]
    assert {(g.pcie_gen_max, g.pcie_width_max) for g in gpus} == {(5, 16)}
    driver = parsers.parse_nvidia_version(stdout("nvidia_driver", "h200x2-driver580"))
    assert (driver.version, driver.flavour, driver.arch) == ("580.159.04", "open", "x86_64")
    memory = parsers.parse_meminfo(stdout("meminfo", "h200x2-driver580"))
    assert memory.total == 263998500 * 1024


def test_gb10_reports_no_framebuffer_memory_and_compute_12_1() -> None:
    (gpu,) = parsers.parse_nvidia_smi_csv(stdout("gpus", "dgx-spark-gb10"))
    assert gpu.compute_cap == "12.1" and gpu.memory_total_mib is None and gpu.memory_used_mib is None
    na = parsers.parse_nvidia_smi_csv(stdout("gpus", "gb10-memory-na-with-units"))
    assert na[0].memory_total_mib is None and na[0].utilization_pct == 0 and na[0].temperature_c == 35


def test_driver_flavours_are_told_apart() -> None:
    proprietary = parsers.parse_nvidia_version(stdout("nvidia_driver", "x86-proprietary-580-truenas"))
    assert (proprietary.flavour, proprietary.version, proprietary.arch) == (
        "proprietary", "580.173.02", "x86_64")
    open_arm = parsers.parse_nvidia_version(stdout("nvidia_driver", "gb10-open-580-173"))
    assert (open_arm.flavour, open_arm.arch) == ("open", "aarch64")


def test_pcie_link_narrower_than_its_maximum_is_visible() -> None:
    gpus = parsers.parse_nvidia_smi_csv(stdout("gpus", "rtx5060ti-x2-pcie-gen3-x8"))
    assert (gpus[1].pcie_width_current, gpus[1].pcie_width_max) == (8, 16)


def test_spark_cx7_twins_and_hgx_rails() -> None:
    links = parsers.parse_ibdev2netdev(stdout("rdma", "dgx-spark-gb10"))
    assert {link.device for link in links if link.up} == {"roceP2p1s0f1", "rocep1s0f1"}
    rails = parsers.parse_ibdev2netdev(stdout("rdma", "hgx-8rail-infiniband"))
    assert len([rail for rail in rails if rail.netdev.startswith("ibp")]) == 8


def test_systemctl_show_in_systemd_own_property_order() -> None:
    units = parsers.parse_systemctl_show(stdout("units", "debian12-systemd252-lab-host"))
    assert units["vllm.service"].load_state == "not-found"
    assert units["vllm.service"].unit_file_state is None
    assert units["ssh.service"].active_state == "active" and units["ssh.service"].restarts == 0
