"""verify.nccl: the pure parsers on NCCL's log recorded on a real 2x H200 node, the bandwidth figures,
the launch plans (one host; two nodes with their own interfaces), and the task's usage errors.

tests/fixtures/nccl/<hardware>.json holds what the task kept with --log-dir on that machine (`answer`),
the launch it made, and the summary it printed (`expected`); ...-with-nccl-tests.json also holds
all_reduce_perf's output from the same machine and session (`reference`). Cases built by hand below say so.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from provision import context, facts, inventory, nccl, parsers, report
from provision.errors import ParseError, ProvisionError
from provision.profiles import load_profiles
from tests.conftest import FIXTURES, REPO
from tests.fakes import FakeRunner, ok

CASES = sorted((FIXTURES / "nccl").glob("*.json"))
H200 = json.loads((FIXTURES / "nccl" / "h200x2-nvswitch-driver580-vm.json").read_text())
H200_VS_NCCL_TESTS = json.loads((FIXTURES / "nccl" / "h200x2-nvswitch-driver580-vm-with-nccl-tests.json").read_text())
PROFILES = load_profiles()


def _launch(case: dict[str, Any]) -> nccl.NodeLaunch:
    spec = case["launch"]
    return nccl.NodeLaunch(host="local", node_rank=spec["node_rank"], nnodes=spec["nnodes"], nproc=spec["nproc"],
                           rank_offset=spec["rank_offset"], world_size=spec["world_size"],
                           master_addr=spec["master_addr"], master_port=spec["master_port"],
                           python=case["expected"]["python"]["local"], env=spec["env"])


@pytest.mark.parametrize("path", CASES, ids=lambda path: path.stem)
def test_recorded_answer_gives_the_printed_summary(path: Path) -> None:
    case = json.loads(path.read_text())
    answer = nccl.parse_answer("local", case["answer"])
    run = nccl.summarize("local", [_launch(case)], [answer])
    shown = run.as_json()
    # What the task printed when it was recorded, key for key; keys added since are held below.
    assert {key: shown[key] for key in case["expected"]} == case["expected"]
    assert shown["nccl_reads"]["local"] == {
        "NCCL_DMABUF_ENABLE": {"rendered": "1", "read": "1", "verdict": "read"},
        "NCCL_NVLS_ENABLE": {"rendered": "0", "read": "0", "verdict": "read"}}  # the hopper profile's two
    assert shown["findings"] == []


def test_h200_log_transport_and_settings() -> None:
    answer = nccl.parse_answer("local", H200["answer"])
    log = nccl.parse_nccl_log("\n".join(rank.log for rank in answer.ranks))
    assert log.version == "2.28.9+cuda13.0"
    assert log.transports == {"P2P/CUMEM": 48}  # 24 channels, each way
    assert {(link.source, link.target) for link in log.links} == {(0, 1), (1, 0)}
    assert log.paths == ("NVL/PIX",) and log.nvswitch and log.nvlink_gbs == 370.8
    assert log.environment["NCCL_NVLS_ENABLE"] == "0" and log.nvls_channels == 0
    assert (log.nranks, log.nnodes) == (2, 1)
    assert nccl.describe_transport(log) == "P2P/CUMEM over NVLink through NVSwitch (48 channel connections)"


def test_h200_bandwidth_rows() -> None:
    rows = H200["expected"]["results"]
    assert [row["bytes"] for row in rows] == [1 << (20 + i) for i in range(11)]
    assert all(row["wrong"] == 0 for row in rows)
    big = rows[-1]  # 1 GiB: n = 2, so busbw = algbw
    assert big["busbw_gbs"] == big["algbw_gbs"] == pytest.approx(2**30 / (big["time_us"] * 1e-6) / 1e9, rel=1e-3)
    assert 300 < H200["expected"]["peak_busbw_gbs"] < 480  # NV18: 18 links x 26.562 GB/s = 478 GB/s


# The benchmark that sets verify.nccl beside nccl-tests on a GPU machine reads all_reduce_perf's table.
_SPEC = importlib.util.spec_from_file_location("nccl_tests", REPO / "benchmarks" / "nccl_tests.py")
assert _SPEC and _SPEC.loader
NCCL_TESTS = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(NCCL_TESTS)
_all_reduce_perf = NCCL_TESTS.parse_all_reduce_perf


@pytest.mark.parametrize("reference", H200_VS_NCCL_TESTS["reference"], ids=lambda ref: ref["command"].split(" -f 2 ")[1])
def test_h200_figures_agree_with_all_reduce_perf(reference: dict[str, str]) -> None:
    """The same sizes, run minutes apart on one machine: within 10 % of nccl-tests from 2 MiB up."""
    ours = {row["bytes"]: row["busbw_gbs"] for row in H200_VS_NCCL_TESTS["expected"]["results"]}
    theirs = _all_reduce_perf(reference["output"])
    assert sorted(theirs) == sorted(ours) == [1 << (20 + i) for i in range(11)]
    assert H200_VS_NCCL_TESTS["expected"]["timing"] == "cuda-events"
    assert not any(row.get("late") for row in H200_VS_NCCL_TESTS["expected"]["results"])
    for size, busbw in ours.items():
        out_of_place = theirs[size][0]
        if size >= 2 << 20:
            assert busbw == pytest.approx(out_of_place, rel=0.10), size
        if size >= 32 << 20:
            assert busbw == pytest.approx(out_of_place, rel=0.02), size
    # At 1 MiB nccl-tests is host-bound when one thread drives both GPUs (-g 2): 1 MiB takes nearly as
    # long as 2 MiB there, half as long here. With one thread per GPU (-t 2 -g 1) it comes within 12 %.
    times = {size: size / (busbw * 1e9) for size, busbw in ours.items()}
    their_times = {size: size / (bw[0] * 1e9) for size, bw in theirs.items()}
    assert times[1 << 20] < 0.55 * times[2 << 20]
    if " -g 2" in reference["command"]:
        assert their_times[1 << 20] > 0.75 * their_times[2 << 20]
    else:
        assert ours[1 << 20] == pytest.approx(theirs[1 << 20][0], rel=0.12)


def test_a_late_size_is_kept_shown_and_explained(capsys: pytest.CaptureFixture[str]) -> None:
    # Built from the real answer: the 1 MiB row marked late, as the program marks a batch that the GPU
    # reached before the host had queued it all.
    data = json.loads(H200_VS_NCCL_TESTS["answer"])
    data["result"]["rows"][0]["late"] = True
    answer = nccl.parse_answer("local", json.dumps(data))
    run = nccl.summarize("local", [_launch(H200_VS_NCCL_TESTS)], [answer])
    assert [row.bytes for row in run.late] == [1 << 20]
    results = run.as_json()["results"]
    assert results[0]["late"] is True and "late" not in results[1]
    report.print_runs(["local"], {"local": run}, {})
    assert "at 1 MiB the GPU ran ahead of the host" in capsys.readouterr().out
    # An answer from the program before it timed this way has neither `timing` nor `late`.
    old = nccl.summarize("local", [_launch(H200)], [nccl.parse_answer("local", H200["answer"])])
    assert old.timing is None and not old.late and "timing" not in old.as_json()


# Lines in the formats other NCCL versions and transports print (built by hand, not recorded here).
NET_LOG = """\
node-a:11:40 [0] NCCL INFO NCCL version 2.27.3+cuda12.9
node-a:11:40 [0] NCCL INFO Using network IB
node-a:11:40 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0
node-a:11:40 [0] NCCL INFO Pattern 4, crossNic 0, nChannels 2, bw 24.000000/24.000000, type LOC/NET, sameChannels 1
node-a:11:41 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0/GDRDMA
node-a:11:41 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA
node-a:11:41 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[0] [send] via NET/Socket/1
node-a:11:41 [0] NCCL WARN NET/IB : Got async event : port error
"""
LEGACY_LOG = """\
host:1:1 [0] NCCL INFO Channel 00 : 0[3000] -> 1[4000] via P2P/IPC/read
host:1:1 [0] NCCL INFO Channel 01 : 0[3000] -> 1[4000] via SHM/direct/direct
some line of the program's own
"""


def test_network_and_legacy_lines() -> None:
    log = nccl.parse_nccl_log(NET_LOG)
    assert log.network == "IB" and (log.nranks, log.nnodes) == (2, 2)
    assert log.transports == {"NET/IB/0/GDRDMA": 2, "NET/Socket/1": 1}
    assert {link.direction for link in log.links} == {"send", "receive"}
    assert log.warnings == ("NET/IB : Got async event : port error",)
    described = nccl.describe_transport(log)
    assert "NET/IB/0/GDRDMA (InfiniBand/RoCE, GPUDirect RDMA)" in described and "(TCP sockets)" in described
    legacy = nccl.parse_nccl_log(LEGACY_LOG)
    assert legacy.transports == {"P2P/IPC/read": 1, "SHM/direct/direct": 1}
    assert "through host memory" in nccl.describe_transport(legacy)


@pytest.mark.parametrize("text", ["", "garbage\nnot nccl at all\n", "NCCL_DEBUG=INFO\n"], ids=["empty", "garbage", "no-info"])
def test_log_without_nccl_lines_is_a_parse_error(text: str) -> None:
    with pytest.raises(ParseError):
        nccl.parse_nccl_log(text)


@pytest.mark.parametrize("text", ["", "garbage", H200["answer"][: len(H200["answer"]) // 2], '{"python": "3"}'],
                         ids=["empty", "garbage", "truncated", "no-ranks"])
def test_bad_answers_are_parse_errors(text: str) -> None:
    with pytest.raises(ParseError):
        nccl.parse_answer("local", text)


def _with_rank(answer_text: str, **changes: Any) -> nccl.NodeAnswer:
    data = json.loads(answer_text)
    data["ranks"][1].update(changes)
    return nccl.parse_answer("local", json.dumps(data))


def test_a_failed_or_hung_rank_fails_the_test_with_its_log_tail() -> None:
    # Built from the real answer: rank 1's exit and log replaced.
    failed = _with_rank(H200["answer"], exit=1, log="Traceback (most recent call last):\n"
                        "torch.distributed.DistBackendError: NCCL error: unhandled system error\n")
    with pytest.raises(ProvisionError, match=r"local rank 1: exit 1: .*unhandled system error"):
        nccl.summarize("local", [_launch(H200)], [failed])
    hung = _with_rank(H200["answer"], exit=124, timed_out=True)
    with pytest.raises(ProvisionError, match="rank 1: timed out"):
        nccl.summarize("local", [_launch(H200)], [hung])


def test_sizes_and_bus_bandwidth() -> None:
    assert nccl.parse_size("1M") == 1 << 20 and nccl.parse_size("512K") == 512 << 10
    assert nccl.parse_size("2G") == 2 << 30 and nccl.parse_size("4096") == 4096 and nccl.parse_size("8KiB") == 8192
    for bad in ("", "1X", "-1M", "2"):
        with pytest.raises(ValueError):
            nccl.parse_size(bad)
    assert nccl.sizes_between(1 << 20, 1 << 30) == tuple(1 << (20 + i) for i in range(11))
    assert nccl.sizes_between(6, 6) == (4,)  # whole float32s
    with pytest.raises(ValueError):
        nccl.sizes_between(2 << 20, 1 << 20)
    assert [nccl.bus_factor(n) for n in (1, 2, 4, 8, 16)] == [0.0, 1.0, 1.5, 1.75, 1.875]
    row = nccl.bandwidth(1 << 30, 1 << 28, 0.004, 8)
    assert (row.algbw_gbs, row.busbw_gbs, row.time_us) == (268.44, 469.76, 4000.0)
    assert nccl.human_size(1 << 30) == "1 GiB" and nccl.human_size(8192) == "8 KiB" and nccl.human_size(12) == "12 B"


# ---------------------------------------------------------------------------------------------
# Launch plans


def _recorded_h200() -> facts.HostFacts:
    recording = json.loads((FIXTURES / "recordings" / "h200x2-nvswitch-driver580-vm.json").read_text())
    gpus = next(entry for entry in recording["outputs"] if entry["fact"] == "gpus")
    return facts.HostFacts(host="local", gpus=parsers.parse_nvidia_smi_csv(gpus["stdout"]))


def _inventory(text: str, tmp_path: Path) -> inventory.Inventory:
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    return inventory.load(path)


def test_one_host_runs_every_gpu_in_the_rendered_environment(tmp_path: Path) -> None:
    inv = _inventory("hosts:\n  h200: {address: 10.0.0.5, profile: hopper, vars: {environment: "
                     "{NCCL_NVLS_ENABLE: '0', HF_TOKEN: hf_secret_value, NCCL_DEBUG: WARN}}}\n", tmp_path)
    host_facts = dataclasses.replace(_recorded_h200(), host="h200")
    ctx = context.contexts(inv, {"h200": host_facts}, {})["h200"]
    [launch] = nccl.plan_host(ctx, port=29511)
    assert (launch.nproc, launch.world_size, launch.master_addr, launch.master_port) == (2, 2, "127.0.0.1", 29511)
    assert launch.python == "python3"  # no venv on the host yet
    assert launch.env["NCCL_NVLS_ENABLE"] == "0" and launch.env["NCCL_DMABUF_ENABLE"] == "1"  # the profile's
    assert launch.env["NCCL_DEBUG"] == "INFO"  # the test needs NCCL's INFO log, whatever the inventory says
    assert launch.env["HF_HOME"] == "/var/lib/vllm/hf"
    # The environment (a token included) travels on stdin, never in argv.
    runner = FakeRunner("h200", lambda argv, stdin: ok(H200["answer"], argv))
    answer = nccl.run_node(runner, launch, launch.spec([1 << 20], 2, 1, 60))
    [(argv, stdin)] = runner.calls
    assert argv == ["python3", "-"] and "hf_secret_value" not in " ".join(argv)
    assert stdin is not None and "hf_secret_value" in stdin and stdin.rstrip().endswith("))")
    assert answer.result is not None and answer.result["world_size"] == 2

    with_venv = dataclasses.replace(host_facts, venv=parsers.VenvInfo("3.12.3", None, "2.11.0+cu130", "13.0",
                                                                      "sm_90", "2.28.9"))
    ctx = context.contexts(inv, {"h200": with_venv}, {})["h200"]
    assert nccl.plan_host(ctx)[0].python == "/opt/vllm/venv/bin/python"
    empty_venv = dataclasses.replace(host_facts, venv=parsers.VenvInfo("3.12.3", None, None, None, None, None))
    assert nccl.plan_host(context.contexts(inv, {"h200": empty_venv}, {})["h200"])[0].python == "python3"
    one_gpu = dataclasses.replace(host_facts, gpus=host_facts.gpus[:1])
    one = context.contexts(inv, {"h200": one_gpu}, {})["h200"]
    with pytest.raises(ProvisionError) as named_host:
        nccl.plan_host(one)
    assert str(named_host.value) == ("h200: one GPU, nothing to all-reduce across (test a multi-node cluster "
                                     "with --cluster)")
    # Named with --cluster (a cluster of this one node): the hint is not the flag that was just given.
    with pytest.raises(ProvisionError) as named_cluster:
        nccl.plan_host(one, cluster="solo")
    assert "--cluster" not in str(named_cluster.value)
    assert str(named_cluster.value) == ("h200: one GPU, nothing to all-reduce across (cluster solo has this one "
                                        "node: add nodes with GPUs to it (on its cluster network), or test a host "
                                        "with several GPUs with --host)")
    with pytest.raises(ProvisionError, match=r"\(--gpus 1 of its 2: leave --gpus out, or ask for 2 or more\)"):
        nccl.plan_host(ctx, gpus=1)
    with pytest.raises(ProvisionError, match="no GPU to test"):
        nccl.plan_host(context.contexts(inv, {"h200": dataclasses.replace(host_facts, gpus=())}, {})["h200"])
    with pytest.raises(ProvisionError, match="--gpus 4 but the host has 2"):
        nccl.plan_host(ctx, gpus=4)


PAIR = """\
hosts:
  node-a: {address: 10.0.0.1, profile: hopper}
  node-b: {address: 10.0.0.2, profile: hopper}
clusters:
  pair: {hosts: [node-b, node-a], head: node-a, vars: {tensor_parallel_size: 4}}
"""


def _pair_facts() -> dict[str, facts.HostFacts]:
    base = _recorded_h200()
    mgmt_a = parsers.Interface("eno1", True, 1500, None, ("10.0.0.1/24",))
    mgmt_b = parsers.Interface("eno1", True, 1500, None, ("10.0.0.2/24",))
    return {
        "node-a": dataclasses.replace(base, host="node-a", interfaces=(
            mgmt_a, parsers.Interface("ens1f0np0", True, 9000, None, ("192.168.50.1/24",)))),
        "node-b": dataclasses.replace(base, host="node-b", interfaces=(
            mgmt_b, parsers.Interface("enp65s0np0", True, 9000, None, ("192.168.50.2/24",))),
            rdma=(parsers.RdmaLink("mlx5_0", 1, "enp65s0np0", True),)),
    }


def test_two_nodes_each_with_its_own_interface(tmp_path: Path) -> None:
    inv = _inventory(PAIR, tmp_path)
    contexts = context.contexts(inv, _pair_facts(), inventory.parse_overrides(["cluster_network=192.168.50.0/24"]))
    launches = nccl.plan_cluster([contexts["node-b"], contexts["node-a"]], "node-a", port=29600)
    assert [launch.host for launch in launches] == ["node-a", "node-b"]  # the head holds rank 0
    head, worker = launches
    assert (head.node_rank, head.rank_offset, worker.node_rank, worker.rank_offset) == (0, 0, 1, 2)
    assert head.world_size == worker.world_size == 4 and head.nnodes == worker.nnodes == 2
    # The rendezvous is the head's address on the cluster network, not its SSH address.
    assert head.master_addr == worker.master_addr == "192.168.50.1" and worker.master_port == 29600
    assert (head.env["NCCL_SOCKET_IFNAME"], head.env["GLOO_SOCKET_IFNAME"]) == ("ens1f0np0", "ens1f0np0")
    assert (worker.env["NCCL_SOCKET_IFNAME"], worker.env["GLOO_SOCKET_IFNAME"]) == ("enp65s0np0", "enp65s0np0")
    assert worker.env["NCCL_IB_HCA"] == "mlx5_0" and "NCCL_IB_HCA" not in head.env
    assert worker.env["NCCL_NVLS_ENABLE"] == "0" and worker.env["NCCL_DEBUG"] == "INFO"
    spec = worker.spec([1 << 20], 5, 1, 300)
    assert (spec["rank_offset"], spec["nproc"], spec["world_size"], spec["master_addr"]) == (2, 2, 4, "192.168.50.1")
    assert "json.loads" in nccl.program(spec) and "\ndef main(" in nccl.program(spec)


def test_a_node_off_the_cluster_network_is_refused(tmp_path: Path) -> None:
    inv = _inventory(PAIR, tmp_path)
    pair = _pair_facts()
    pair["node-b"] = dataclasses.replace(pair["node-b"], interfaces=pair["node-b"].interfaces[:1])
    contexts = context.contexts(inv, pair, inventory.parse_overrides(["cluster_network=192.168.50.0/24"]))
    with pytest.raises(ProvisionError, match="node-b has no interface on the cluster network"):
        nccl.plan_cluster(list(contexts.values()), "node-a")
    pair = _pair_facts()
    pair["node-a"] = dataclasses.replace(pair["node-a"], interfaces=pair["node-a"].interfaces[:1])
    contexts = context.contexts(inv, pair, inventory.parse_overrides(["cluster_network=192.168.50.0/24"]))
    with pytest.raises(ProvisionError, match="node-a: no interface on the cluster network"):
        nccl.plan_cluster(list(contexts.values()), "node-a")


def test_summary_of_two_nodes_keeps_each_nodes_environment(tmp_path: Path) -> None:
    inv = _inventory(PAIR, tmp_path)
    contexts = context.contexts(inv, _pair_facts(), inventory.parse_overrides(["cluster_network=192.168.50.0/24"]))
    launches = nccl.plan_cluster(list(contexts.values()), "node-a")
    data = json.loads(H200["answer"])  # rank 0's measurements stand in for the head's; the worker has none
    data["ranks"] = [dict(rank, log=NET_LOG if rank["rank"] == 0 else "") for rank in data["ranks"]]
    head = nccl.parse_answer("node-a", json.dumps(data))
    worker = nccl.parse_answer("node-b", json.dumps({**data, "node_rank": 1, "result": None, "ranks": [
        dict(rank, rank=rank["rank"] + 2, log="") for rank in data["ranks"]]}))
    run = nccl.summarize("pair", launches, [head, worker])
    assert run.hosts == ("node-a", "node-b") and run.gpus_per_node == (2, 2)
    assert run.environment["node-b"]["NCCL_SOCKET_IFNAME"] == "enp65s0np0"
    assert run.environment["node-a"]["MASTER_ADDR"] == "192.168.50.1"
    assert "HF_HOME" not in run.environment["node-a"]  # only NCCL/GLOO/TP/MASTER/CUDA/PYTORCH variables shown
    assert run.log.network == "IB"


def test_service_env_undoes_the_env_file_quoting() -> None:
    assert nccl._unquote('"a\\"b\\\\c"') == 'a"b\\c'
    assert nccl._unquote('"expandable_segments:False"') == "expandable_segments:False"


# ---------------------------------------------------------------------------------------------
# The host program itself, with gloo on CPU where torch is installed (it is not in the test venv)


def test_host_program_runs_ranks_and_answers_json() -> None:
    pytest.importorskip("torch")
    spec = {"nproc": 2, "rank_offset": 0, "world_size": 2, "node_rank": 0, "nnodes": 1, "master_addr": "127.0.0.1",
            "master_port": 29733, "env": {}, "sizes": [4096, 65536], "iters": 2, "warmup": 1, "timeout": 120,
            "init_timeout": 60, "backend": "gloo"}
    done = subprocess.run([sys.executable, "-"], input=nccl.program(spec), capture_output=True, text=True,
                          timeout=180, check=True)
    answer = nccl.parse_answer("local", done.stdout)
    assert [rank.exit for rank in answer.ranks] == [0, 0]
    assert answer.result is not None and [row["wrong"] for row in answer.result["rows"]] == [0, 0]
    assert answer.result["timing"] == "wall-clock"  # gloo: no CUDA events, the host's clock
    assert all(row["seconds"] > 0 and "late" not in row for row in answer.result["rows"])


# ---------------------------------------------------------------------------------------------
# The task's usage errors (exit 2, nothing contacted)


def _invoke(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True,
                          text=True, check=False, timeout=60)


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    inv = tmp_path / "inventory.yaml"
    inv.write_text(PAIR)
    neither = _invoke("verify.nccl", "--inventory", str(inv))
    assert neither.returncode == 2 and "--host" in neither.stderr
    both = _invoke("verify.nccl", "--inventory", str(inv), "--host", "node-a", "--cluster", "pair")
    assert both.returncode == 2
    size = _invoke("verify.nccl", "--inventory", str(inv), "--host", "node-a", "--min-bytes", "1X")
    assert size.returncode == 2 and "not a size" in size.stderr
    unknown = _invoke("verify.nccl", "--inventory", str(inv), "--cluster", "nope")
    assert unknown.returncode == 2 and "unknown cluster 'nope'" in unknown.stderr
    helped = _invoke("verify.nccl", "-h")
    assert helped.returncode == 0 and "--log-dir" in helped.stdout and "--cluster" in helped.stdout


# One H200 (a VM), NCCL 2.28.9: host/nccl.py's main() run directly on one GPU, once with values like the
# rendered ones and once with values NCCL cannot use (tests/fixtures/nccl-env/, each with its notes).
ENV_CASES = FIXTURES / "nccl-env"


def _env_case(name: str) -> tuple[dict[str, Any], nccl.NcclRun]:
    case = json.loads((ENV_CASES / f"h200x1-driver580-vm-{name}.json").read_text())
    spec = case["launch"]
    launch = nccl.NodeLaunch(host="h200", node_rank=0, nnodes=1, nproc=1, rank_offset=0, world_size=1,
                             master_addr=spec["master_addr"], master_port=spec["master_port"],
                             python="/opt/torch/.venv/bin/python3", env=spec["env"])
    return case, nccl.summarize("h200", [launch], [nccl.parse_answer("h200", case["answer"])])


def test_every_variable_nccl_logged_reading_is_matched_to_the_rendered_one() -> None:
    _case, run = _env_case("rendered-like")
    assert {read.name: read.verdict for read in run.reads["h200"]} == {
        "NCCL_CUMEM_ENABLE": "read", "NCCL_DMABUF_ENABLE": "read", "NCCL_IB_HCA": "read",  # "NCCL_IB_HCA set to"
        "NCCL_NVLS_ENABLE": "read", "NCCL_P2P_LEVEL": "read", "NCCL_SOCKET_IFNAME": "read"}
    assert "NCCL_DEBUG" not in {read.name for read in run.reads["h200"]}  # the check's own, not rendered
    assert run.findings == ()
    assert run.as_json()["nccl_reads"]["h200"]["NCCL_P2P_LEVEL"] == {"rendered": "NVL", "read": "NVL", "verdict": "read"}


def test_a_value_nccl_ignores_or_reads_as_another_is_a_finding() -> None:
    _case, run = _env_case("odd-values")
    verdicts = {read.name: read.verdict for read in run.reads["h200"]}
    assert verdicts == {"NCCL_DMABUF_ENABLE": "read as 0", "NCCL_IGNORE_CPU_AFFINITY": "read as 0",
                        "NCCL_NVLS_ENABLE": "read", "NCCL_P2P_LEVEL": "not read", "NCCL_SOCKET_IFNAME": "read"}
    findings = run.findings
    assert len(findings) == 3 and all(finding.startswith("h200: ") for finding in findings)
    assert any("NCCL_P2P_LEVEL=NVLINK is rendered but NCCL did not say it read it" in f for f in findings)
    assert any("NCCL_DMABUF_ENABLE=true is rendered but NCCL read it as 0" in f for f in findings)
    assert run.as_json()["findings"] == list(findings)


def test_the_findings_are_printed_under_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    _case, run = _env_case("odd-values")
    report.print_runs(["h200"], {"h200": run}, {})
    printed = " ".join(capsys.readouterr().out.split())
    assert "NCCL on h200: NCCL_DMABUF_ENABLE read as 0," in printed and "NCCL_P2P_LEVEL not read" in printed
    assert "finding: h200: NCCL_P2P_LEVEL=NVLINK is rendered but NCCL did not say it read it" in printed


def test_an_integer_is_compared_as_nccl_reads_it() -> None:
    assert nccl.EnvironmentRead("NCCL_NVLS_ENABLE", "0x1", "1").taken  # strtoll with base 0
    assert not nccl.EnvironmentRead("NCCL_NVLS_ENABLE", "1", "0").taken
    assert nccl.EnvironmentRead("NCCL_P2P_LEVEL", "PHB", None).verdict == "not read"


def test_the_benchmark_sets_the_recorded_run_beside_all_reduce_perf() -> None:
    """benchmarks/nccl_tests.py's table on the two-H200 recording: our busbw over nccl-tests' per size."""
    reference = next(ref for ref in H200_VS_NCCL_TESTS["reference"] if "-t 2 -g 1" in ref["command"])
    rows = H200_VS_NCCL_TESTS["expected"]["results"]
    table = NCCL_TESTS.comparison(rows, _all_reduce_perf(reference["output"]))
    assert len(table) == 2 + len(rows)
    one_mib = table[2].split(" | ")
    assert one_mib[0] == "| 1 MiB" and float(one_mib[1]) == rows[0]["busbw_gbs"]
    assert float(one_mib[4].rstrip(" |")) == pytest.approx(rows[0]["busbw_gbs"] / float(one_mib[2]), abs=1e-3)
    run = nccl.summarize("local", [_launch(H200_VS_NCCL_TESTS)],
                         [nccl.parse_answer("local", H200_VS_NCCL_TESTS["answer"])]).as_json()
    assert NCCL_TESTS.nccl_environment(run) == {"NCCL_DMABUF_ENABLE": "1", "NCCL_NVLS_ENABLE": "0"}
    assert NCCL_TESTS.reads(run)[2:] == ["| local | NCCL_DMABUF_ENABLE | 1 | 1 | read |",
                                         "| local | NCCL_NVLS_ENABLE | 0 | 0 | read |"]

