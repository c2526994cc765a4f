"""The GPU run's report (benchmarks/gpu_host.py --report): the figures of benchmarks/results/gpu-h200.md come
from the kept run file, the served decode rate set against llama-bench's tg128 of the same run."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).parents[1]
SPEC = importlib.util.spec_from_file_location("gpu_host", REPO / "benchmarks" / "gpu_host.py")
assert SPEC and SPEC.loader
gpu_host = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(gpu_host)
RUN = json.loads((REPO / "benchmarks" / "results" / "gpu-h200-run.json").read_text())["calls"]


def test_llama_bench_rows_are_read_per_file_flash_attention_and_test() -> None:
    rows = gpu_host.llama_bench_rows(RUN)
    assert len(rows) == 8  # two files x FA off/on x pp512/tg128
    tg_q4_on, _ = rows[("llama-3.1-8b-random-q4_0.gguf", 1, "tg128")]
    tg_q4_off, _ = rows[("llama-3.1-8b-random-q4_0.gguf", 0, "tg128")]
    assert 300 < tg_q4_on < 310 and tg_q4_off < tg_q4_on


def test_the_report_sets_the_served_decode_rate_against_tg128_and_says_the_model_is_random() -> None:
    text = gpu_host.report(RUN)
    assert text.startswith("_model: Llama-3.1-8B's shape") and "text is noise" in text
    rows = {line.split("|")[1].strip(): line.split("|") for line in text.splitlines() if ".gguf" in line}
    assert rows["llama-3.1-8b-random-q4_0.gguf"][5].strip() == "0.86"
    assert rows["llama-3.1-8b-random-f16.gguf"][5].strip() == "0.93"
    results = (REPO / "benchmarks" / "results" / "gpu-h200.md").read_text()
    assert text in results, "benchmarks/results/gpu-h200.md holds the report as the program prints it"
