"""benchmarks/affinity.py: its pure parts (the workload, the stream reader, the counters' deltas on a
recorded llama.cpp page, the table), and the whole program in one run through a real haproxy rendered
by the tool, in front of two stand-ins for llama-server that keep a prompt cache and llama.cpp's two
counters, switching the routing between its modes with its --switch-command."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from provision import endpoints, engines, render
from tests.conftest import FIXTURES, REPO
from tests.test_router_host import free_port, haproxy_binary

SPEC = importlib.util.spec_from_file_location("bench_affinity", REPO / "benchmarks" / "affinity.py")
assert SPEC and SPEC.loader
bench = importlib.util.module_from_spec(SPEC)
sys.modules["bench_affinity"] = bench  # dataclasses look their module up by name
SPEC.loader.exec_module(bench)

LLAMACPP = engines.ENGINES["llamacpp"].metrics


# -- the pure parts -----------------------------------------------------------------------------

def test_the_counters_delta_on_a_recorded_llama_server_page() -> None:
    """llama.cpp counts computed and cached prompt tokens apart (llamacpp:prompt_tokens_total 149 ->
    202, llamacpp:prompt_tokens_cached_total 2686 -> 4488 on the recorded page): all prompt tokens are
    their sum."""
    recorded = json.loads((FIXTURES / "metrics" / "llamacpp-b10434-tiny-gguf.json").read_text())
    assert bench.cache_counts(recorded["first"], LLAMACPP) == (2686, 2686 + 149)
    cached, prompt = bench.cache_delta({"a": recorded["first"], "b": recorded["first"]},
                                       {"a": recorded["second"], "b": recorded["first"]}, LLAMACPP)
    assert (cached, prompt) == (4488 - 2686, 4488 - 2686 + 202 - 149)
    with pytest.raises(ValueError, match="llamacpp:prompt_tokens_cached_total"):
        bench.cache_counts("# nothing\nother_metric 1\n", LLAMACPP)


def test_percentiles_and_the_table_against_the_baseline() -> None:
    assert bench.percentile([], 0.5) is None
    assert bench.percentile([0.3, 0.1, 0.2], 0.5) == 0.2
    assert bench.percentile([float(v) for v in range(1, 101)], 0.95) == 95.0
    base = bench.ModeResult("least-connections", 64, 0, 300.0, 1000.0, [0.2, 0.4, 0.3])
    affinity = bench.ModeResult("prefix-affinity", 64, 1, 900.0, 1000.0, [0.1, 0.2, 0.15], ["HTTP 502: x"])
    lines = bench.table([base, affinity]).splitlines()
    assert lines[0].split()[:6] == ["mode", "requests", "failed", "prompt", "tok", "cached"]
    assert lines[1].split() == ["least-connections", "64", "0", "1000", "300", "30.0%", "1.00x",
                                "300", "ms", "1.00x", "400", "ms", "1.00x"]
    assert lines[2].split() == ["prefix-affinity", "64", "1", "1000", "900", "90.0%", "3.00x",
                                "150", "ms", "0.50x", "200", "ms", "0.50x"]
    assert bench.table([bench.ModeResult("least-connections")]).splitlines()[1].split()[5:7] == ["-", "-"]


def test_the_workload_grows_each_conversation_and_fits_a_256_token_slot_by_default() -> None:
    workload = bench.Workload()
    assert bench.words_at_last_turn(workload) + workload.max_tokens <= 220
    first = bench.messages(workload, "m", 3, [])
    third = bench.messages(workload, "m", 3, ["an answer", "another"])
    assert [m["role"] for m in third] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert third[:2] == first  # the history resent as it was
    assert len(bench.system_prompt(workload).split()) == workload.system_words
    assert all(len(m["content"].split()) == workload.turn_words for m in third if m["role"] == "user")
    # Another conversation, or the same in another mode, opens differently (no cache shared across).
    assert bench.messages(workload, "m", 4, [])[1] != first[1] != bench.messages(workload, "n", 3, [])[1]
    assert bench.messages(workload, "n", 4, [])[0] == first[0]  # one system prompt for all


def test_a_stream_gives_its_text_and_first_token_time_and_an_error_inside_it_fails() -> None:
    clock = iter([1.25, 1.5]).__next__
    lines = [b": keep-alive\n", b'data: {"choices": [{"delta": {"role": "assistant"}}]}\n',
             b'data: {"choices": [{"delta": {"content": "Hello"}}]}\n',
             b'data: {"choices": [{"delta": {"content": " there"}}]}\n', b"data: [DONE]\n"]
    assert bench.read_stream(lines, 1.0, clock) == bench.Turn(0.25, "Hello there", None)
    broken = [lines[2], b'data: {"error": {"message": "the slot was cancelled", "code": 500}}\n']
    assert bench.read_stream(broken, 1.0, iter([1.1]).__next__).error == "the slot was cancelled"
    assert bench.read_stream(lines[:3], 1.0, iter([1.1]).__next__).error == "the stream ended without [DONE]"


def test_the_switch_command_and_the_inventory_copy(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("# the lab\nhosts: {h: {address: 10.0.0.1}}\nendpoints:\n  e: {host: h, clusters: [c]}\n")
    copy = bench.inventory_with_routing(inventory, "e", "prefix-affinity")
    assert copy == tmp_path / ".inventory.routing-prefix-affinity.yaml"
    assert yaml.safe_load(copy.read_text())["endpoints"]["e"] == {"host": "h", "clusters": ["c"],
                                                                  "routing": "prefix-affinity"}
    assert inventory.read_text().startswith("# the lab\n")  # the original untouched
    assert bench.switch_argv("invoke provision --host cpu-2 --inventory '{inventory}' --tag x={routing}",
                             "least-connections", copy) == [
        "invoke", "provision", "--host", "cpu-2", "--inventory", str(copy), "--tag", "x=least-connections"]
    with pytest.raises(SystemExit, match="no endpoint 'f'"):
        bench.inventory_with_routing(inventory, "f", "prefix-affinity")


# -- the whole program, through a real haproxy ----------------------------------------------------

class LlamaServer(ThreadingHTTPServer):
    """A stand-in for llama-server: a prompt cache of every prompt it has seen with its answer (as its
    slots and --cache-ram keep them), its two prompt counters on /metrics, chat answers streamed word
    by word."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), LlamaHandler)
        self.seen: list[list[str]] = []
        self.computed = 0
        self.cached = 0
        self.lock = threading.Lock()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # haproxy's idle connections, reset when it stops

    def prompt(self, tokens: list[str], answer: list[str]) -> None:
        with self.lock:
            common = max((next((i for i, (a, b) in enumerate(zip(tokens, old)) if a != b), min(len(tokens), len(old)))
                          for old in self.seen), default=0)
            self.cached += common
            self.computed += len(tokens) - common
            self.seen.append(tokens + ["assistant", *answer])


class LlamaHandler(BaseHTTPRequestHandler):
    server: LlamaServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *_: object) -> None:
        pass

    def send(self, body: bytes, kind: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/metrics":
            self.send(f"# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total {self.server.computed}\n"
                      f"llamacpp:prompt_tokens_cached_total {self.server.cached}\n".encode(), "text/plain")
        else:
            self.send(b'{"data": [{"id": "tiny"}]}')

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        tokens = [word for message in body["messages"] for word in [message["role"], *message["content"].split()]]
        answer = [f"word{index}" for index in range(body["max_tokens"])]
        self.server.prompt(tokens, answer)
        events = [{"choices": [{"delta": {"content": f"{word} "}}]} for word in answer]
        stream = b"".join(b"data: " + json.dumps(event).encode() + b"\n\n" for event in events) + b"data: [DONE]\n\n"
        self.send(stream, "text/event-stream")


@pytest.fixture()
def endpoint(tmp_path: Path) -> Iterator[dict[str, Any]]:
    haproxy_binary()
    replicas = [LlamaServer(), LlamaServer()]
    for replica in replicas:
        threading.Thread(target=replica.serve_forever, daemon=True).start()
    port = free_port()
    plan = endpoints.EndpointPlan("bench", "here", "127.0.0.1", port, 60.0, tuple(
        endpoints.Replica(f"r{index}", "here", "127.0.0.1", replica.server_address[1], "tiny")
        for index, replica in enumerate(replicas, 1)))
    config = tmp_path / "haproxy.cfg"
    for routing in bench.MODES:  # what the switch command puts in place, by the inventory copy's routing
        (tmp_path / f"{routing}.cfg").write_text(render.router_config(
            "here", [dataclasses.replace(plan, routing=routing)], keys=False,
            admin_socket=str(tmp_path / "admin.sock")))
    shutil.copy(tmp_path / "least-connections.cfg", config)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("endpoints:\n  bench: {host: here, clusters: [a, b]}\n")
    process = subprocess.Popen(["haproxy", "-W", "-f", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Up before the first switch: a master not yet started would die of the SIGUSR2 it reloads on.
        deadline = time.monotonic() + 10
        while bench.get(f"http://127.0.0.1:{port}/v1/models", None, timeout=1)[0] != 200:
            assert process.poll() is None and time.monotonic() < deadline, "haproxy did not start"
            time.sleep(0.05)
        yield {"url": f"http://127.0.0.1:{port}", "replicas": replicas, "inventory": inventory, "config": config,
               "master": process.pid, "folder": tmp_path}
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)
        for replica in replicas:
            replica.shutdown()
            replica.server_close()


SWITCH = ("import shutil, os, signal, sys, time, yaml; routing = yaml.safe_load(open(sys.argv[1]))['endpoints']"
          "['bench']['routing']; shutil.copy(os.path.join(sys.argv[2], routing + '.cfg'), sys.argv[3]); "
          "os.kill(int(sys.argv[4]), signal.SIGUSR2); time.sleep(1)")


def test_one_run_measures_both_modes_and_affinity_finds_the_history_cached(endpoint: dict[str, Any],
                                                                         tmp_path: Path) -> None:
    figures = tmp_path / "figures.json"
    switch = " ".join([sys.executable, "-c", json.dumps(SWITCH), "{inventory}", str(endpoint["folder"]),
                       str(endpoint["config"]), str(endpoint["master"])])
    started = time.monotonic()
    bench.main(["--url", endpoint["url"], "--model", "tiny", "--api-key-env", "NO_SUCH_KEY_VARIABLE",
                *[arg for replica in endpoint["replicas"]
                  for arg in ("--metrics", f"http://127.0.0.1:{replica.server_address[1]}/metrics")],
                "--inventory", str(endpoint["inventory"]), "--endpoint", "bench", "--switch-command", switch,
                "--json", str(figures)])
    assert time.monotonic() - started < 30
    found = json.loads(figures.read_text())
    modes = {row["mode"]: row for row in found["modes"]}
    assert list(modes) == list(bench.MODES)
    for row in modes.values():
        assert (row["requests"], row["failures"]) == (16 * 4, 0), row
        assert row["ttft_p50_s"] is not None and row["ttft_p95_s"] >= row["ttft_p50_s"]
    # Affinity: every turn finds its conversation's history; least connections only where it lands
    # where the turn before did.
    assert modes["prefix-affinity"]["cached_share"] > 0.85  # of at most 87%: each turn's question is new
    assert modes["prefix-affinity"]["cached_share"] > modes["least-connections"]["cached_share"] + 0.05
    assert not list(endpoint["inventory"].parent.glob(".inventory.routing-*"))  # the copies removed
    assert os.environ.get("NO_SUCH_KEY_VARIABLE") is None
