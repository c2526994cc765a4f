"""SGLang, the catalog's fourth engine: every command line the tool renders for it is parsed by SGLang's
own code. tests/fixtures/wheels/sglang-0.5.23/ holds, byte for byte, the files of the pinned wheel that
its argument parsing imports (sources.json names the wheel, its sha256 and each file): a child
interpreter runs sglang.srt.server_args.prepare_server_args on each line, as `sglang serve` does, and
answers what it parsed or what argparse refused (its own message). Also here: the gate's field state
(the GB10 blocker), and that what the catalog says of SGLang is what its contract rows hold."""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from provision import catalog, checks, contracts, tune
from provision.engines.sglang import SGLANG
from tests.test_render import GOLDEN, _state, contexts_of

FIXTURE = Path(__file__).parent / "fixtures" / "wheels" / "sglang-0.5.23"
SOURCES = json.loads((FIXTURE.parent / "sources.json").read_text())["releases"]["sglang-0.5.23"]
# The fields a parse answers (ServerArgs' own names).
FIELDS = ("model_path", "served_model_name", "host", "port", "tp_size", "pp_size", "enable_metrics",
          "mem_fraction_static", "context_length", "disable_radix_cache", "max_running_requests",
          "chunked_prefill_size", "kv_cache_dtype", "quantization")
PARSE = f"""
import contextlib, io, json, sys
from sglang.srt.server_args import prepare_server_args
answers = []
for argv in json.load(sys.stdin):
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            parsed = prepare_server_args(argv)
    except SystemExit as exc:
        answers.append({{"error": errors.getvalue().strip().splitlines()[-1], "status": exc.code}})
        continue
    answers.append({{"values": {{name: getattr(parsed, name) for name in {FIELDS!r}}}}})
modules = sorted({{module.__file__ for name, module in sys.modules.items()
                  if name.split(".")[0] == "sglang" and getattr(module, "__file__", None)}})
print(json.dumps({{"answers": answers, "modules": modules}}))
"""
# Cases of the gate's table, one per profile SGLang serves (a GPU, one node), with their settings.
CASES = {"rtx5090": ("rtx5090x2-tp2-awq32b-all-good", {}),
         "hopper": ("h200-no-drop-ins", {"model": "Qwen/Qwen2.5-7B-Instruct"}),
         "dgx-spark": ("spark-utilization-too-high", {"gpu_memory_utilization": 0.85})}
PIN = {"engine": "sglang", "engine_spec": "sglang==0.5.23"}


def sglang_parses(lines: tuple[tuple[str, ...], ...]) -> tuple[list[dict[str, Any]], list[str]]:
    """What SGLang's prepare_server_args made of each argument list, and the files it ran. Every line
    the module asks about is parsed in one child (importing SGLang's parser imports torch and Triton)."""
    answers, modules = _parsed()
    return [answers[line] for line in lines], modules


@functools.cache
def _parsed() -> tuple[dict[tuple[str, ...], dict[str, Any]], list[str]]:
    lines = (*rendered_lines().values(), *refused_lines())
    env = {**os.environ, "PYTHONPATH": str(FIXTURE), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-c", PARSE], input=json.dumps(lines), capture_output=True, text=True,
                          env=env, cwd=FIXTURE, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.splitlines()[-1])
    return dict(zip(lines, answer["answers"], strict=True)), answer["modules"]


def refused_lines() -> tuple[tuple[str, ...], ...]:
    """Lines SGLang must refuse: a vLLM flag kept for SGLang, and two flags of Spark Arena's SGLang recipes
    (another build's) that 0.5.23 does not have in that form."""
    return (rendered("rtx5090", server_flags={"--max-num-seqs": 64}),
            ("--model-path", "/m", "--cuda-graph-max-bs", "16"),
            ("--model-path", "/m", "--fp4-gemm-backend", "cutlass"))


def server_args(exec_start: str) -> tuple[str, ...]:
    """The arguments after `python -m sglang.launch_server` in a rendered ExecStart line."""
    argv = shlex.split(exec_start.removeprefix("ExecStart="))
    assert argv[1:3] == ["-m", "sglang.launch_server"], argv
    return tuple(argv[3:])


def rendered(profile: str, **values: object) -> tuple[str, ...]:
    """The arguments rendered for the profile's case, its settings and `values` over them."""
    case, base = CASES[profile]
    (ctx,) = contexts_of(case, **{**PIN, **base, **values}).values()
    unit = next(f.content for f in _state(ctx).files if f.path.endswith("/sglang.service"))
    return server_args(next(line for line in unit.splitlines() if line.startswith("ExecStart=")))


def rendered_lines() -> dict[str, tuple[str, ...]]:
    """The golden units' lines, each profile's default line, with the prefix cache off, and with each value
    of its tune space."""
    lines = {f"golden {path.parent.name}": server_args(next(line for line in path.read_text().splitlines()
                                                            if line.startswith("ExecStart=")))
             for path in sorted(GOLDEN.glob("*/sglang.service"))}
    assert lines, "no golden SGLang unit"
    for profile in CASES:
        lines[f"{profile}"] = rendered(profile)
        lines[f"{profile} no prefix cache, 8k context"] = rendered(profile, enable_prefix_caching=False,
                                                                   max_model_len=8192)
        for dimension in tune.load_space(None, profile, "sglang"):
            for value in dimension.values:
                values = ({"server_flags": {dimension.flag: value}} if dimension.flag
                          else {str(dimension.setting): value})
                lines[f"{profile} tune {dimension.name}={value}"] = rendered(profile, **values)
    return lines


def test_the_fixture_is_the_files_sources_json_names_and_the_parser_runs_only_them() -> None:
    assert SOURCES["wheel"] == "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl" and len(SOURCES["sha256"]) == 64
    held = sorted(path.relative_to(FIXTURE).as_posix() for path in FIXTURE.rglob("*") if path.is_file())
    assert held == sorted(SOURCES["files"])
    _, modules = sglang_parses(refused_lines()[1:2])
    assert modules and all(Path(module).is_relative_to(FIXTURE) for module in modules), modules
    assert contracts.load().target("sglang") == "0.5.23"


def test_every_rendered_sglang_line_is_parsed_by_sglang_s_own_code() -> None:
    lines = rendered_lines()
    answers, _ = sglang_parses(tuple(lines.values()))
    refused = {name: answer["error"] for name, answer in zip(lines, answers, strict=True) if "error" in answer}
    assert not refused, refused
    parsed = dict(zip(lines, (answer["values"] for answer in answers), strict=True))
    ws = parsed["rtx5090"]
    assert ws["tp_size"] == 2 and ws["pp_size"] == 1 and ws["host"] == "127.0.0.1" and ws["port"] == 8000
    assert ws["enable_metrics"] is True and ws["disable_radix_cache"] is False
    assert ws["model_path"].startswith("/var/lib/vllm/models/") and ws["served_model_name"]
    assert parsed["dgx-spark"]["mem_fraction_static"] == 0.85
    off = parsed["hopper no prefix cache, 8k context"]
    assert off["disable_radix_cache"] is True and off["context_length"] == 8192
    assert parsed["rtx5090 tune max_running_requests=128"]["max_running_requests"] == 128
    assert parsed["dgx-spark tune kv_cache_dtype=fp8_e4m3"]["kv_cache_dtype"] == "fp8_e4m3"
    assert parsed["hopper tune gpu_memory_utilization=0.88"]["mem_fraction_static"] == 0.88


def test_sglang_s_parser_refuses_what_it_lacks_in_its_own_words() -> None:
    """The judge can fail: a vLLM flag kept for SGLang, and the cuda-graph spelling of Spark Arena's
    SGLang recipes (another build's), which 0.5.23 splits into -decode and -prefill."""
    answers, _ = sglang_parses(refused_lines())
    assert answers[0]["status"] == 2 and "unrecognized arguments: --max-num-seqs 64" in answers[0]["error"]
    assert answers[1]["status"] == 2 and "ambiguous option: --cuda-graph-max-bs could match" in answers[1]["error"]
    assert answers[2]["status"] == 2 and "argument --fp4-gemm-backend: invalid choice: 'cutlass'" in answers[2]["error"]


def test_the_catalog_s_sglang_flags_and_metrics_are_rows_of_its_release() -> None:
    table, entry = contracts.load(), catalog.ENGINES["sglang"]
    flags = set(table.names("sglang", "flag", "0.5.23"))
    assert {flag for flag in entry.owned_flags if flag != "--model"} <= flags  # --model: --model-path's alias
    assert set(rendered("hopper", enable_prefix_caching=False)) & {arg for arg in flags} >= {
        "--model-path", "--served-model-name", "--host", "--port", "--tp-size", "--enable-metrics",
        "--disable-radix-cache"}
    assert set(entry.metrics.read) <= set(table.names("sglang", "metric", "0.5.23"))
    assert SGLANG.concurrency_flag in flags


def _finding(ctx: Any, rule: str) -> checks.Finding:
    return next(finding for finding in checks.evaluate(ctx) if finding.id == rule)


def test_gb10_is_refused_below_the_release_whose_kernels_carry_sm_121() -> None:
    (old,) = contexts_of("spark-utilization-too-high", engine="sglang", engine_spec="sglang==0.5.22",
                         gpu_memory_utilization=0.85).values()
    blocked = _finding(old, "known.sglang-gb10-no-sm121-kernels")
    assert blocked.status == "fail" and blocked.severity == "blocker"
    assert "sglang #29317" in blocked.message and "sglang==0.5.23" in (blocked.fix or "")
    (pinned,) = contexts_of("spark-utilization-too-high", engine="sglang", engine_spec="sglang==0.5.23",
                            gpu_memory_utilization=0.85).values()
    assert _finding(pinned, "known.sglang-gb10-no-sm121-kernels").status == "pass"
    (fa3,) = contexts_of("spark-utilization-too-high", engine="sglang", engine_spec="sglang==0.5.23",
                         gpu_memory_utilization=0.85, extra_args=["--attention-backend", "fa3"]).values()
    assert _finding(fa3, "known.sglang-aarch64-no-fa3").status == "fail"
    (ws,) = contexts_of("rtx5090x2-tp2-awq32b-all-good", engine="sglang", engine_spec="sglang==0.5.22").values()
    assert "known.sglang-gb10-no-sm121-kernels" not in {finding.id for finding in checks.evaluate(ws)
                                                         if finding.status != "skip"}


@pytest.mark.parametrize("case, expected", [
    ("cpu-host", "SGLang's CPU backend needs a CPU build of sgl-kernel"),
    ("spark-pair-good", "the tool serves SGLang on one node; this cluster has 2 nodes"),
])
def test_what_the_tool_does_not_serve_with_sglang_is_refused_by_the_gate(case: str, expected: str) -> None:
    ctx = next(iter(contexts_of(case, **PIN).values()))
    failed = [finding.message for finding in checks.evaluate(ctx) if finding.status == "fail"]
    assert any(expected in message for message in failed), failed


def test_sglang_is_given_no_api_key_and_so_listens_on_loopback_only() -> None:
    """SGLang takes its key only in argv or a --config file and logs it at start: the tool gives it none,
    and the gate blocks a listener beyond loopback even where the secrets hold a key."""
    (ctx,) = contexts_of("rtx5090x2-tp2-awq32b-all-good", **PIN, bind_host="0.0.0.0").values()
    keyed = dataclasses.replace(ctx, api_key_set=True)
    found = _finding(keyed, "config.api_key")
    assert found.status == "fail" and "logs it in clear at start" in found.message
    assert "--api-key" not in rendered("rtx5090") and catalog.owned_flag("--api-key=x") is not None
    (loopback,) = contexts_of("rtx5090x2-tp2-awq32b-all-good", **PIN).values()
    assert _finding(loopback, "config.api_key").status == "pass"
