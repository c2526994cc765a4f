"""What the tool says, on recorded outputs: a clock that says it is the time left, exposure on a host
with no unit yet, bench's real concurrency, a tune bound that is no bound, where a refused token came from."""
from __future__ import annotations

import http.server
import json
import socket
import threading
from pathlib import Path

import pytest
from rich.progress import Progress

from provision import checks, errors, facts, report, run, secrets, tune, tune_rules, weights
from provision.lab import hub
from provision.run import carrying
from provision.run import hub as hub_stage
from provision.server import BenchReport
from tests.fakes import ok
from tests.test_checks import context_for

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize(("seconds", "said"), [(192, "3m12s left"), (45, "45s left"), (0, "0s left"),
                                               (3725, "1h02m left"), (59.2, "1m00s left"), (None, "")])
def test_the_clock_says_it_is_the_time_left(seconds: float | None, said: str) -> None:
    assert run.time_left(seconds) == said


def test_a_readiness_wait_shows_the_time_left_of_its_timeout() -> None:
    progress = Progress(carrying._TimeLeft())
    task = progress.add_task("cpu-1: waiting for /health and a completion", total=None, counts_seconds=True)
    progress.update(task, completed=408, total=600)  # what rolling's readiness bar is given
    assert str(carrying._TimeLeft().render(progress.tasks[0])) == "3m12s left"


def _facts_of(recorded: dict) -> facts.HostFacts:
    results = {name: {"exit": recorded[name]["exit"], "stdout": recorded[name]["stdout"],
                      "stderr": recorded[name]["stderr"]} for name in ("unit_security", "units")}
    return facts.facts_from_probe("h200", ok(json.dumps({"python": "3.11.2", "results": results})),
                                  [f for f in facts.FACTS if f.name in ("unit_security", "units")])


def test_facts_on_a_host_with_no_unit_yet_says_so_not_an_error() -> None:
    recorded = json.loads((FIXTURES / "units" / "systemd252-none-installed.json").read_text())
    host_facts = _facts_of(recorded)
    rows = dict(report.facts_rows(host_facts))
    assert rows["exposure"] == "no unit installed yet"
    assert "exit 1" in host_facts.notes["unit_security"]  # the note keeps what systemd-analyze said
    # A unit that is installed but that systemd-analyze did not score still shows the note.
    loaded = {**recorded, "units": {**recorded["units"], "stdout": recorded["units"]["stdout"].replace(
        "Id=vllm.service\nLoadState=not-found", "Id=vllm.service\nLoadState=loaded", 1)}}
    assert dict(report.facts_rows(_facts_of(loaded)))["exposure"].startswith("systemd-analyze: exit 1: ")


def test_bench_says_the_concurrency_it_had_not_the_one_asked(capsys: pytest.CaptureFixture[str]) -> None:
    one = BenchReport(requests=1, succeeded=1, seconds=0.5, output_tokens=16, tokens_per_s=32.0, ttft_mean_s=0.1,
                      ttft_p50_s=0.1, ttft_p90_s=0.1, latency_p50_s=0.5, ttft_p95_s=0.1, itl_p50_s=0.02,
                      itl_p95_s=0.03, server_generation_tokens=16.0, server_prefix_cache_hit_pct=None)
    report.print_bench("cpu-1", one, 4, False)
    assert "1/1 requests, concurrency 1" in capsys.readouterr().out
    report.print_bench("cpu-1", BenchReport(**{**one.__dict__, "requests": 16, "succeeded": 16}), 4, False)
    assert "16/16 requests, concurrency 4" in capsys.readouterr().out


def test_a_tuned_file_says_no_bound_where_none_was_given() -> None:
    unit = tune.Unit("cpu-1", ("cpu-1",))
    trial = tune_rules.Trial("k", {"max_num_seqs": 64}, "measured", "", (tune_rules.Level(4, 120.0, 0.1, 0.2, 0.03, 16, 16),))
    unbounded = tune.tuned_text(unit, {}, trial, None, tune_rules.Workload(), tune_rules.Slo())
    assert "# Bound: TTFT p95 no bound, ITL p95 no bound." in unbounded and "any" not in unbounded
    bounded = tune.tuned_text(unit, {}, trial, None, tune_rules.Workload(), tune_rules.Slo(ttft_p95_ms=500))
    assert "# Bound: TTFT p95 <= 500 ms, ITL p95 no bound." in bounded


def test_a_gated_model_refused_names_where_the_token_came_from(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "config.json").write_text("{}")
    hub.publish(tmp_path / "hub", "lab/gated", tmp_path / "files", gated=True)
    hub.allow_token(tmp_path / "hub", "hf_granted")
    server = hub.serve(tmp_path / "hub", "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("HF_TOKEN", "hf_not_granted")
    held = secrets.load(None)
    try:
        with pytest.raises(errors.WeightsError) as refused:
            weights.resolve("lab/gated", "main", (), endpoint, held.hf_token, held.sources.get("hf_token"))
    finally:
        server.shutdown()
    assert str(refused.value).startswith("lab/gated is gated and the token from the environment (HF_TOKEN) has no "
                                         "access to it")
    assert "hf_not_granted" not in str(refused.value)


def _hub_verdict(endpoint: str, model: str) -> tuple[BaseException, checks.Finding]:
    """What the hub answered for `model` at `endpoint` (asked as a plan asks it), and model.hub's finding."""
    key = (model, "main", (), endpoint)
    answer, _ = hub_stage._ask_hub(key, secrets.Secrets())
    assert isinstance(answer, errors.WeightsError)
    (ctx,) = context_for(("ws", "h200x2-driver580", "hopper", {"model": model, "hf_endpoint": endpoint},
                          None, None, {})).values()
    return answer, checks.model_hub(hub_stage._refused(ctx, answer))


def test_a_hub_that_gives_no_answer_is_blamed_on_the_network_not_the_model() -> None:
    with socket.socket() as probe:  # a port nothing listens on once closed: the connection is refused
        probe.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{probe.getsockname()[1]}"
    answer, found = _hub_verdict(endpoint, "lab/tiny")
    assert isinstance(answer, errors.HubUnreachable)
    assert found.blocks and found.message.startswith(f"cannot reach {endpoint} for lab/tiny: ")
    assert found.fix == (f"the hub at {endpoint} gave no answer to this machine (the controller asks it, not the "
                         "host): check its network and DNS, a proxy (HTTPS_PROXY / https_proxy in the environment, "
                         "NO_PROXY for a local mirror), or set hf_endpoint to a mirror it can reach (HF_ENDPOINT)")


def test_a_hub_that_answers_no_such_model_is_blamed_on_the_model(tmp_path: Path) -> None:
    server = hub.serve(tmp_path / "hub", "127.0.0.1", 0)  # a hub that holds no repository: 404
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        answer, found = _hub_verdict(endpoint, "lab/missing")
    finally:
        server.shutdown()
    assert not isinstance(answer, errors.HubUnreachable)
    assert found.message == f"no model repository 'lab/missing' on {endpoint} (a private one needs hf_token)"
    assert found.fix == "fix model / model_revision in the inventory, or hf_token in its secrets file"


class _Gateway(http.server.BaseHTTPRequestHandler):
    """What a proxy or load balancer answers when it cannot reach the hub behind it."""

    def do_GET(self) -> None:
        self.send_response(502, "Bad Gateway")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_gateway_error_is_no_answer_from_the_hub() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(errors.HubUnreachable) as caught:
            weights.resolve("lab/tiny", "main", (), endpoint, None)
    finally:
        server.shutdown()
        server.server_close()
    assert str(caught.value) == f"no answer from {endpoint} for lab/tiny: HTTP 502 Bad Gateway"
