"""What the parsers must tell about real hardware, written out by hand (not generated)."""
from __future__ import annotations

import dataclasses
import json

import pytest

from provision import affinity, lab, parsers
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


# ---------------------------------------------------------------------------------------------
# CPU affinity by core type, never by exact frequency (provision/affinity.py)


def topology(lscpu_cpus: str | None = None, *, arch: str = "x86_64", cpuinfo: str | None = None,
             models: str | None = None, core: str | None = None, atom: str | None = None,
             ) -> parsers.CpuTopology:
    """A host's CpuTopology from recorded fixtures, as facts._assemble builds it."""
    hybrid = None
    if core is not None or atom is not None:
        hybrid = parsers.HybridCpus(
            parsers.parse_cpu_list(stdout("cpu_core_cpus", core)) if core else (),
            parsers.parse_cpu_list(stdout("cpu_atom_cpus", atom)) if atom else ())
    return parsers.CpuTopology(
        arch, None, (),
        parsers.parse_lscpu_extended(stdout("lscpu_cpus", lscpu_cpus)) if lscpu_cpus else (),
        parsers.parse_cpuinfo_parts(stdout("cpuinfo", cpuinfo)) if cpuinfo else {},
        parsers.parse_lscpu_models(stdout("lscpu_models", models)) if models else {},
        hybrid)


X925 = "5-9,15-19"


def test_gb10_whose_x925_report_3900_on_both_clusters_is_pinned_by_modelname() -> None:
    gb10 = topology(arch="aarch64", models="dgx-spark-gb10-x925-3900")
    chosen = affinity.choose("auto", gb10)
    assert chosen.cpu_list == X925 and "MODELNAME" in chosen.reason and "Cortex-X925" in chosen.reason


def test_gb10_whose_x925_report_3900_and_4004_by_cluster_gets_all_ten_big_cores() -> None:
    """Cluster 0's X925 top out at 3.9 GHz, cluster 1's at 4.0: the big cores are still all ten."""
    by_part = topology("gb10-x925-3900-4004-by-cluster", arch="aarch64", cpuinfo="gb10-dell-pro-max")
    chosen = affinity.choose("auto", by_part)
    assert chosen.cpu_list == X925 and "CPU part" in chosen.reason and "0xd85" in chosen.reason
    # With neither part nor name, frequency is the last resort, by class: not 15-19 alone.
    by_speed = affinity.choose("auto", topology("gb10-x925-3900-4004-by-cluster", arch="aarch64"))
    assert by_speed.cpu_list == X925 and "frequency class (3900-4004 MHz" in by_speed.reason


def test_gb10_whose_x925_report_one_maximum_gets_the_same_cores_by_every_source() -> None:
    sources = {
        "part": topology("dgx-spark-gb10", arch="aarch64", cpuinfo="gb10-dell-pro-max"),
        "MODELNAME": topology("dgx-spark-gb10", arch="aarch64", models="dgx-spark-gb10-x925-3900"),
        "frequency class": topology("dgx-spark-gb10", arch="aarch64"),
    }
    for source, gb10 in sources.items():
        chosen = affinity.choose("auto", gb10)
        assert chosen.cpu_list == X925 and source in chosen.reason, source


def test_gb10_names_that_disagree_with_its_cpu_table_are_ignored() -> None:
    """A lab host replays recordings but runs the machine's own lscpu: a MODELNAME table for other
    CPUs than `lscpu -e` lists is not this host's, and the next source decides."""
    twelve = {cpu: name for cpu, name in parsers.parse_lscpu_models(
        stdout("lscpu_models", "dgx-spark-gb10-x925-3900")).items() if cpu < 12}
    gb10 = dataclasses.replace(topology("dgx-spark-gb10", arch="aarch64"), models=twelve)
    chosen = affinity.choose("auto", gb10)
    assert chosen.cpu_list == X925 and "frequency class" in chosen.reason


def test_intel_8p16e_13900k_class_pins_all_p_cores_not_the_two_turbo_max_cores() -> None:
    """CPUs 8-11 report 5800 MHz (Turbo Boost Max 3.0), the other P-cores 5500, the E-cores 4300."""
    maxima = {cpu.max_mhz for cpu in parsers.parse_lscpu_extended(
        stdout("lscpu_cpus", "intel-8p16e-13900k-class"))}
    assert maxima == {5800.0, 5500.0, 4300.0}
    atom = set(parsers.parse_cpu_list(stdout("cpu_atom_cpus", "intel-8p16e-13900k-class")))
    by_kernel = affinity.choose("auto", topology("intel-8p16e-13900k-class", core="intel-8p16e-13900k-class",
                                                 atom="intel-8p16e-13900k-class"))
    assert by_kernel.cpu_list == "0-15" and "/sys/devices/cpu_core/cpus" in by_kernel.reason
    by_speed = affinity.choose("auto", topology("intel-8p16e-13900k-class"))
    assert by_speed.cpu_list == "0-15" and "frequency class (5500-5800 MHz" in by_speed.reason
    for chosen in (by_kernel, by_speed):
        assert chosen.cpus is not None and not set(chosen.cpus) & atom  # never an E-core


def test_intel_hybrid_lists_of_another_machine_are_ignored() -> None:
    """The kernel documentation's Alder Lake lists (24 CPUs) do not describe a 32-CPU host."""
    host = topology("intel-8p16e-13900k-class", core="alder-lake-8p8e", atom="alder-lake-8p8e")
    chosen = affinity.choose("auto", host)
    assert chosen.cpu_list == "0-15" and "frequency class" in chosen.reason


def test_intel_hybrid_without_p_core_list_never_pins_e_cores_alone() -> None:
    e_cores_only = dataclasses.replace(
        topology("intel-8p16e-13900k-class", atom="intel-8p16e-13900k-class"),
        hybrid=parsers.HybridCpus((), tuple(range(16, 32))))
    chosen = affinity.choose("auto", e_cores_only)
    assert chosen.cpus is not None and not set(chosen.cpus) & set(range(16, 32))


def test_zen5_9950x_cppc_maxima_inside_a_ccd_never_split_it() -> None:
    """Preferred cores report 5700 MHz, the others down to 4920: one class, so one whole CCD."""
    zen5 = topology("ryzen9-9950x-2ccd-cppc-maxima")
    assert len({cpu.max_mhz for cpu in zen5.cpus if cpu.l3 == 0}) == 4
    chosen = affinity.choose("auto", zen5)
    assert chosen.cpu_list == "8-15,24-31" and "L3 domain 1" in chosen.reason


@pytest.mark.parametrize("fixture,expected", [
    ("amd-24core-4ccd-smt2", "6-11,30-35"),
    ("amd-16core-2ccd-smt2", "8-15,24-31"),
    ("h200x2-driver580", None),
])
def test_multi_ccd_zen_and_single_l3_hosts_are_unchanged(fixture: str, expected: str | None) -> None:
    chosen = affinity.choose("auto", topology(fixture))
    assert chosen.cpu_list == expected
    assert ("L3 domain" in chosen.reason) if expected else ("no pinning" in chosen.reason)


def _recorded_maxima(case: dict) -> dict[int, float]:
    """{cpu: max MHz} from core-ranker's table or from `lstopo --cpukinds` (cpuset masks)."""
    maxima: dict[int, float] = {}
    if case["format"] == "core-ranker":
        for line in case["stdout"].splitlines()[2:]:
            _, cpus, _, mhz = (cell.strip() for cell in line.split("|"))
            maxima.update({int(cpu): float(mhz) for cpu in cpus.split(",")})
    else:
        kinds = case["stdout"].split("CPU kind #")[1:]
        for kind in kinds:
            words = kind.split()
            words_mask = words[words.index("cpuset") + 1].split(",")  # 32-bit words, highest first
            mask = int("".join(word.removeprefix("0x") for word in words_mask), 16)
            mhz = float(words[-1])
            maxima.update({bit: mhz for bit in range(mask.bit_length()) if mask >> bit & 1})
    return maxima


@pytest.mark.parametrize("case", sorted(p.stem for p in (FIXTURES / "cpu_maxima").glob("*.json")))
def test_frequency_classes_split_at_gaps_not_at_each_maximum(case: str) -> None:
    """Real per-CPU maxima: Intel TBM 3.0, CPPC rankings and Zen 5c stay inside their class."""
    data = json.loads((FIXTURES / "cpu_maxima" / f"{case}.json").read_text())
    classes = affinity.frequency_classes(_recorded_maxima(data))
    assert [sorted(group) for group in classes] == [sorted(group) for group in data["expected_classes"]]


def test_threadripper_7975wx_cppc_spread_of_17_percent_is_still_one_class() -> None:
    data = json.loads((FIXTURES / "cpu_maxima" / "amd-threadripper-pro-7975wx.json").read_text())
    maxima = _recorded_maxima(data)
    assert min(maxima.values()) / max(maxima.values()) < affinity.FREQUENCY_GAP  # wide, but no gap
    assert len(affinity.frequency_classes(maxima)) == 1
