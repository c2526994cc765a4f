"""The server pinned near its GPUs on hosts with several NUMA nodes (provision/affinity.py), on the outputs
of real multi-socket machines. Every expected CPU list is written out by hand from the machine's own
outputs, not computed by the code under test."""
from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from provision import affinity, checks, facts, parsers, render, report
from provision.context import Context
from provision.host import probe
from tests.test_checks import recorded
from tests.test_render import contexts_of
from tests.test_topology import stdout

ESC = "rtx6000adax4-2xepyc9374f"  # ASUS ESC8000A-E12: 2x EPYC 9374F, 4x RTX 6000 Ada (fixtures name the source)

# Its GPUs as its published `nvidia-smi` table lists them (index, name, bus id, memory); the query CSV
# was not published, so the rows are rewritten from that table.
ESC_GPUS_CSV = "index, name, uuid, pci.bus_id, driver_version, compute_cap, memory.total [MiB]\n" + "".join(
    f"{index}, NVIDIA RTX 6000 Ada Generation, GPU-{index}, 00000000:{bus}:00.0, 575.51.03, 8.9, 49140\n"
    for index, bus in enumerate(("01", "41", "C1", "E1")))
# Each GPU's sysfs numa_node as the same page's `lspci -vvv` prints it ("NUMA node: 0"; lspci reads
# /sys/bus/pci/devices/ADDRESS/numa_node). Class 0x030000: lspci calls them "VGA compatible controller".
ESC_NODES = {"01": "0", "41": "0", "c1": "1", "e1": "1"}


def sysfs(nodes: dict[str, str]) -> str:
    """The probe's reading of /sys/bus/pci/devices for these GPUs: {bus: numa_node}."""
    return json.dumps({f"0000:{bus}:00.0": {"class": "0x030000", "numa_node": node, "local_cpulist": None}
                       for bus, node in nodes.items()})


ESC_SYSFS = sysfs(ESC_NODES)

NODE0 = tuple(range(32))
NODE1 = tuple(range(32, 64))
CPU0_CCD = (0, 1, 2, 3)  # lscpu -e: L3 id 0 holds CPUs 0-3 (SMT off), seven more CCDs on node 0


def esc_topology() -> parsers.CpuTopology:
    summary = parsers.parse_lscpu(stdout("lscpu", ESC))
    return dataclasses.replace(summary, cpus=parsers.parse_lscpu_extended(stdout("lscpu_cpus", ESC)))


def esc_gpus(sysfs: str = ESC_SYSFS, topo: str | None = None) -> tuple[parsers.Gpu, ...]:
    return facts.placed(parsers.parse_nvidia_smi_csv(ESC_GPUS_CSV), parsers.parse_pci_gpus(sysfs),
                        parsers.parse_nvidia_topo(topo if topo is not None else stdout("gpu_topology", ESC)))


def esc_context(**values: Any) -> Context:
    """The recorded 2x RTX 5090 gate case with the ESC8000A's CPU and GPUs in its facts. The profile stays
    rtx5090's: what these tests assert (CPUAffinity, NUMAMask, cpu.affinity) does not depend on it."""
    (ctx,) = contexts_of("rtx5090x2-tp2-awq32b-all-good", **values).values()
    return dataclasses.replace(ctx, host="esc", facts=dataclasses.replace(ctx.facts, cpu=esc_topology(),
                                                                          gpus=esc_gpus()))


def test_the_gpus_nodes_from_the_kernel_and_the_driver_agree_on_the_esc8000a() -> None:
    gpus = esc_gpus()
    assert [(gpu.index, gpu.numa_node, gpu.topo_numa_node) for gpu in gpus] == [
        (0, 0, 0), (1, 0, 0), (2, 1, 1), (3, 1, 1)]
    assert gpus[2].topo_cpus == NODE1


def test_gpus_on_node_0_pin_node_0_without_cpu_0s_ccd() -> None:
    ctx = esc_context(tensor_parallel_size=2)
    assert [gpu.index for gpu in ctx.server_gpus] == [0, 1]
    chosen = affinity.choose("auto", ctx.facts.cpu, gpus=ctx.server_gpus)
    assert chosen.cpus == tuple(cpu for cpu in NODE0 if cpu not in CPU0_CCD)
    assert chosen.numa_nodes == (0,)
    assert "NUMA node 0" in chosen.reason and "CPU 0's L3 domain left to the system" in chosen.reason
    assert affinity.placement_concerns(ctx.facts.cpu, ctx.server_gpus, chosen) == []


def test_gpus_on_node_1_pin_the_whole_of_node_1() -> None:
    ctx = esc_context(tensor_parallel_size=2, environment={"CUDA_VISIBLE_DEVICES": "2,3"})
    assert [gpu.index for gpu in ctx.server_gpus] == [2, 3]
    chosen = affinity.choose("auto", ctx.facts.cpu, gpus=ctx.server_gpus)
    assert chosen.cpus == NODE1  # node 1 does not hold CPU 0: all eight of its CCDs
    assert chosen.numa_nodes == (1,)


def test_gpus_split_across_sockets_bind_the_union_and_the_gate_says_so() -> None:
    ctx = esc_context(tensor_parallel_size=4)
    chosen = affinity.choose("auto", ctx.facts.cpu, gpus=ctx.server_gpus)
    assert chosen.cpus == tuple(cpu for cpu in NODE0 + NODE1 if cpu not in CPU0_CCD)
    assert chosen.numa_nodes == (0, 1)
    finding = checks.cpu_affinity(ctx)
    assert (finding.status, finding.severity) == ("fail", checks.WARNING)
    assert "span NUMA nodes 0, 1" in finding.message and "CUDA_VISIBLE_DEVICES" in (finding.fix or "")
    assert finding.evidence["gpu_numa_nodes"] == {0: 0, 1: 0, 2: 1, 3: 1}
    assert finding.evidence["numa_mask"] == [0, 1]


def test_an_explicit_cpu_list_on_the_other_socket_is_warned_about() -> None:
    ctx = esc_context(tensor_parallel_size=2, environment={"CUDA_VISIBLE_DEVICES": "GPU-2,GPU-3"},
                      cpu_affinity="0-15")
    finding = checks.cpu_affinity(ctx)
    assert finding.status == "fail" and finding.severity == checks.WARNING
    assert "sit on NUMA node 0, away from the GPUs' node 1" in finding.message


def test_the_rendered_unit_pins_every_cpu_and_memory_on_the_gpus_node() -> None:
    ctx = esc_context(tensor_parallel_size=2, environment={"CUDA_VISIBLE_DEVICES": "2,3"})
    unit = next(f.content for f in render.desired_state(ctx).files if f.path.endswith("/vllm.service"))
    pinned = affinity.expand(re.search(r"^CPUAffinity=(.+)$", unit, re.MULTILINE).group(1))  # type: ignore[union-attr]
    assert pinned == NODE1
    assert all(cpu.node == 1 for cpu in esc_topology().cpus if cpu.cpu in pinned)
    assert re.search(r"^NUMAPolicy=bind$", unit, re.MULTILINE) and re.search(r"^NUMAMask=1$", unit, re.MULTILINE)
    assert "# the CPUs of NUMA node 1, where GPUs 2,3 sit" in unit


def test_a_gpu_whose_node_nobody_reports_falls_back_to_one_ccd_and_warns() -> None:
    unknown = sysfs(dict.fromkeys(ESC_NODES, "-1"))
    old_format = stdout("gpu_topology", "v100x8-2xxeon5118-no-numa-column")  # no NUMA Affinity column
    gpus = esc_gpus(unknown, old_format)[:2]
    assert [gpu.node for gpu in gpus] == [None, None]
    chosen = affinity.choose("auto", esc_topology(), gpus=gpus)
    assert chosen.cpus == (24, 25, 26, 27)  # lscpu -e: L3 id 1, the first L3 domain without CPU 0
    concerns = affinity.placement_concerns(esc_topology(), gpus, chosen)
    assert len(concerns) == 1 and "is not known" in concerns[0][0]


def test_the_kernel_and_the_driver_disagreeing_is_warned_about() -> None:
    gpus = esc_gpus(sysfs({**ESC_NODES, "c1": "0"}))
    assert (gpus[2].numa_node, gpus[2].topo_numa_node, gpus[2].node) == (0, 1, 0)  # the kernel's is used
    concerns = affinity.placement_concerns(esc_topology(), gpus[2:], affinity.choose("auto", esc_topology(), gpus=gpus[2:]))
    assert any("the kernel puts it on NUMA node 0, nvidia-smi topo -m on node 1" in what for what, _ in concerns)


def test_both_rtx_4090d_on_the_second_xeon_pin_node_1_from_the_lscpu_summary_alone() -> None:
    """A report with plain lscpu and topo -m of one machine (2x Xeon 8481C): no per-CPU table, so the node
    lists of the summary decide, whole nodes (one L3 per socket)."""
    topology = parsers.parse_lscpu(stdout("lscpu", "rtx4090dx2-2xxeon8481c"))
    topo = parsers.parse_nvidia_topo(stdout("gpu_topology", "rtx4090dx2-2xxeon8481c-node1"))
    base = parsers.parse_nvidia_smi_csv(ESC_GPUS_CSV)[:2]
    gpus = facts.placed(base, (), topo)
    chosen = affinity.choose("auto", topology, gpus=gpus)
    assert chosen.cpus == tuple(range(56, 112)) + tuple(range(168, 224))
    assert chosen.numa_nodes == (1,)


def test_a_one_node_vm_keeps_todays_choice() -> None:
    """Recorded on a 2x H200 VM: sysfs says -1, nvidia-smi topo -m says node 0, lscpu one node."""
    vm = recorded("h200x2-driver580", pci_gpus=stdout("pci_gpus", "h200x2-nvswitch-driver580-vm"),
                  gpu_topology=stdout("gpu_topology", "h200x2-nvswitch-driver580-vm"))
    assert vm.gpus is not None
    # The recorded machine's bus ids (00:06.0, 00:07.0) are the VM's own, so both sources apply.
    assert [(gpu.numa_node, gpu.topo_numa_node, gpu.local_cpus) for gpu in vm.gpus] == [
        (None, 0, tuple(range(32))), (None, 0, tuple(range(32)))]
    chosen = affinity.choose("auto", vm.cpu, gpus=vm.gpus)
    assert chosen.cpus is None and chosen.numa_nodes is None  # one L3 domain, one node: as before
    assert affinity.placement_concerns(vm.cpu, vm.gpus, chosen) == []


def test_facts_show_each_gpus_node() -> None:
    rows = dict(report.facts_rows(esc_context().facts))
    assert rows["gpus"] == "4x NVIDIA RTX 6000 Ada Generation (sm 8.9, 49140 MiB); NUMA node: GPU 0-1 on 0, GPU 2-3 on 1"


def test_the_probe_reads_a_sysfs_like_tree_and_keeps_only_matching_devices(tmp_path: Path) -> None:
    for name, values in {"0000:c1:00.0": {"vendor": "0x10de", "class": "0x030000", "numa_node": "1",
                                          "local_cpulist": "32-63"},
                         "0000:c1:00.1": {"vendor": "0x10de", "class": "0x040300", "numa_node": "1",
                                          "local_cpulist": "32-63"},
                         "0000:00:14.0": {"vendor": "0x8086", "class": "0x0c0330", "numa_node": "0"}}.items():
        (tmp_path / name).mkdir()
        for attribute, value in values.items():
            (tmp_path / name / attribute).write_text(value + "\n")
    answer = probe._read_tree({"pattern": f"{tmp_path}/*", "read": ["class", "numa_node", "local_cpulist"],
                               "where": {"vendor": "0x10de"}})
    assert parsers.parse_pci_gpus(answer["stdout"]) == (
        parsers.PciGpu(address="0000:c1:00.0", numa_node=1, local_cpus=NODE1),)
    assert "0000:00:14.0" not in answer["stdout"]


def test_facts_import_without_fabric_so_the_recorder_runs_on_bare_gpu_hosts() -> None:
    blocker = ("import importlib.abc, sys\n"
               "class Block(importlib.abc.MetaPathFinder):\n"
               "    def find_spec(self, name, path, target=None):\n"
               "        if name.split('.')[0] in ('paramiko', 'fabric', 'invoke', 'rich'):\n"
               "            raise ImportError('not on a bare GPU host: ' + name)\n"
               "sys.meta_path.insert(0, Block())\n"
               "import provision.facts\n")
    done = subprocess.run([sys.executable, "-c", blocker], check=False, capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("visible,expected", [("3,1", [3, 1]), ("GPU-2", [2]), ("1,7,2", [1]), ("", [])])
def test_cuda_visible_devices_narrows_the_servers_gpus_as_cuda_reads_it(visible: str, expected: list[int]) -> None:
    ctx = esc_context(tensor_parallel_size=4, environment={"CUDA_VISIBLE_DEVICES": visible})
    assert [gpu.index for gpu in ctx.server_gpus] == expected


@pytest.mark.parametrize("node,expected", [
    (0, (3, 4, 5, 51, 52, 53)),  # node 0's second CCX (L3 id 1): CPU 0's (0-2,48-50) is left out
    (5, (30, 31, 32, 33, 34, 35, 78, 79, 80, 81, 82, 83)),  # both CCXs of node 5
])
def test_four_nodes_per_socket_pin_the_gpus_node_with_smt_siblings(node: int, expected: tuple[int, ...]) -> None:
    """A real dual EPYC 7451 (util-linux's dump: 8 nodes, two CCXs each, siblings 48 apart). The dump has
    no GPUs: one is placed on a node here."""
    topology = parsers.CpuTopology("x86_64", "AuthenticAMD", (), parsers.parse_lscpu_extended(
        stdout("lscpu_cpus", "epyc7451-2socket-8node")))
    gpu = facts.placed(parsers.parse_nvidia_smi_csv(ESC_GPUS_CSV)[:1], parsers.parse_pci_gpus(sysfs({"01": str(node)})), {})
    chosen = affinity.choose("auto", topology, gpus=gpu)
    assert chosen.cpus == expected and chosen.numa_nodes == (node,)
