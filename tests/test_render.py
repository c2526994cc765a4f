"""Rendering: golden files for the two seed systems, systemd quoting, affinity, and the plan's logic."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from provision import affinity, checks, parsers, plan, render
from provision.facts import HostFacts
from provision.parsers import UnitState
from tests.conftest import FIXTURES
from tests.test_checks import CASES, context_for
from tests.test_topology import stdout

GOLDEN = FIXTURES / "render"


def seed_states() -> dict[str, render.DesiredState]:
    ws_case = next(c for c in CASES if c[0] == "rtx5090x2-tp2-awq32b-all-good")
    (ws,) = context_for(ws_case).values()
    ws = dataclasses.replace(ws, host="ws-5090")
    pair = context_for(next(c for c in CASES if c[0] == "spark-pair-good"))
    return {
        "rtx5090x2-tp2-awq": render.desired_state(ws, checks.resolutions(checks.evaluate(ws))),
        "spark-pair-head": render.desired_state(pair["spark-a"], checks.resolutions(checks.evaluate(pair["spark-a"]))),
        "spark-pair-worker": render.desired_state(pair["spark-b"], checks.resolutions(checks.evaluate(pair["spark-b"]))),
    }


@pytest.mark.parametrize("case", ["rtx5090x2-tp2-awq", "spark-pair-head", "spark-pair-worker"])
def test_rendered_files_match_golden(case: str) -> None:
    state = seed_states()[case]
    folder = GOLDEN / case
    if os.environ.get("PROVISION_REGOLD") == "1":  # regenerate after a deliberate template change
        folder.mkdir(parents=True, exist_ok=True)
        for wanted in state.files:
            (folder / Path(wanted.path).name).write_text(wanted.content)
    expected = {path.name for path in folder.iterdir()}
    assert {Path(wanted.path).name for wanted in state.files} == expected
    for wanted in state.files:
        assert wanted.content == (folder / Path(wanted.path).name).read_text(), wanted.path


def test_workstation_unit_has_the_seed_settings() -> None:
    state = seed_states()["rtx5090x2-tp2-awq"]
    env = next(f for f in state.files if f.path == render.ENV_FILE)
    unit = next(f for f in state.files if f.path.endswith("vllm.service"))
    assert (env.mode, env.owner) == (0o600, "root") and unit.mode == 0o644
    for line in ('NCCL_DMABUF_ENABLE="1"', 'NCCL_P2P_LEVEL="PCI"', 'PYTORCH_ALLOC_CONF=', 'PYTORCH_CUDA_ALLOC_CONF='):
        assert line in env.content
    assert "CPUAffinity=6-11,30-35" in unit.content  # one whole CCD, not CPU 0's, SMT siblings included
    assert "--tensor-parallel-size 2" in unit.content and "--quantization" not in unit.content
    assert "Restart=on-failure" in unit.content and "StartLimitBurst=5" in unit.content


def test_spark_pair_runs_ray_and_serves_from_the_head() -> None:
    states = seed_states()
    assert states["spark-pair-head"].units == (render.RAY_HEAD_UNIT, render.SERVER_UNIT)
    assert states["spark-pair-worker"].units == (render.RAY_WORKER_UNIT,)
    head_unit = next(f for f in states["spark-pair-head"].files if f.path.endswith("/vllm.service"))
    assert "--distributed-executor-backend ray" in head_unit.content
    assert "CPUAffinity=5-9,15-19" in head_unit.content  # the X925 cores
    worker_env = next(f for f in states["spark-pair-worker"].files if f.path == render.ENV_FILE).content
    assert 'NCCL_SOCKET_IFNAME="enP2p1s0f1np1"' in worker_env and 'VLLM_HOST_IP="192.168.100.11"' in worker_env
    assert 'TRITON_PTXAS_PATH="/usr/local/cuda/bin/ptxas"' in worker_env


def test_systemd_quoting() -> None:
    assert render.systemd_quote("plain") == "plain"
    assert render.systemd_quote("a b") == '"a b"'
    assert render.systemd_quote('say "hi"') == '"say \\"hi\\""'
    assert render.systemd_quote("50%") == "50%%" and render.systemd_quote("$HOME") == "$$HOME"
    with pytest.raises(render.RenderError):
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
    with pytest.raises(affinity.AffinityError):
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
    from provision import remote

    key = "sk-lab-0123456789abcdef"
    remote.register_secret(key)
    ws_case = next(c for c in CASES if c[0] == "rtx5090x2-tp2-awq32b-all-good")
    (ws,) = context_for(ws_case).values()
    state = render.desired_state(ws, (), api_key=key)
    holding = [f for f in state.files if key in f.content]
    assert [(f.path, f.mode, f.owner) for f in holding] == [(render.ENV_FILE, 0o600, "root")]
    assert f'VLLM_API_KEY="{key}"' in holding[0].content
    changes = plan.build(state, HostFacts(host="ws-5090"))
    env_change = next(c for c in changes if c.target == render.ENV_FILE)
    assert key not in env_change.diff and remote.MASK in env_change.diff
