"""One run of a profile as benchrun starts it: the pinned llama-benchy, through benchlaunch, against an
OpenAI-compatible server on this machine's loopback that streams its answers the way vLLM does and
refuses a request without the key. What it shows: the key reaches llama-benchy through the environment
and no process's argv holds it; llama-benchy's own JSON result is read back; a failing run is kept
with its exit and output's end; the shipped profile's `runs` is how often llama-benchy measures each
test, and its results say where the profile was published. The real engine is the lab's test
(tests/lab/test_lab_bench_profile.py)."""
from __future__ import annotations

import dataclasses
import http.server
import json
import os
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from provision import benchprofile, benchrun, inventory, report
from provision.benchprofile import Target
from provision.lab import tinymodel
from provision.runner import Result
from tests.fakes import FakeRunner, JsonAnswers

KEY = "bench-secret-4242"
WORDS = [word for word in tinymodel.vocabulary() if not word.startswith("<")]


class Server(JsonAnswers):
    """/v1/models, /v1/chat/completions (streamed as server-sent events, usage last) and a book."""

    seen: ClassVar[list[str]] = []  # the Authorization headers, and each process's argv read while it ran
    argvs: ClassVar[list[str]] = []
    whole: ClassVar[bool] = False  # each answer in one chunk, as vLLM sends a request's merged outputs

    def do_GET(self) -> None:
        if self.path.endswith("/book.txt"):
            text = " ".join(WORDS[i % len(WORDS)] for i in range(5000)).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)
            return
        self.answer(200, {"object": "list", "data": [{"id": "tiny-llama", "object": "model"}]})

    def do_POST(self) -> None:
        Server.seen.append(self.headers.get("Authorization", ""))
        Server.argvs.extend(_argvs())
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            self.answer(401, {"error": "unauthorized"})
            return
        prompt = sum(len(message["content"].split()) for message in body["messages"])
        tokens = int(body.get("max_tokens") or 1)
        if not body.get("stream"):
            self.answer(200, {"choices": [{"message": {"role": "assistant", "content": "word"}}],
                             "usage": {"prompt_tokens": prompt, "completion_tokens": 1}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for chunk in ([tokens] if Server.whole else [1] * tokens):  # one token every 5 ms, as an engine decodes
            time.sleep(0.005 * chunk)
            delta = {"choices": [{"delta": {"content": "word " * chunk}}]}
            self.wfile.write(f"data: {json.dumps(delta)}\n\n".encode())
            self.wfile.flush()
        usage = {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": tokens}}
        self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())


def _argvs() -> list[str]:
    """Every process's command line on this machine now: where a key passed in argv would show."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                found.append(Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                pass
    return found


@pytest.fixture
def served() -> Iterator[str]:
    Server.seen, Server.argvs, Server.whole = [], [], False
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def one_run(base: str, tmp_path: Path, key: str | None) -> dict[str, Any]:
    tinymodel.make(tmp_path / "model")
    profile = benchprofile.from_mapping({"framework": "llama-benchy", "args": {
        "pp": [64], "tg": [8], "depth": [0], "concurrency": [2], "runs": 1, "skip_coherence": True}}, "t.yaml", "t")
    target = Target(f"{base}/v1", "lab/tiny-llama", "tiny-llama", str(tmp_path / "model" / "tokenizer.json"),
                    f"{base}/book.txt")
    return benchrun._one(profile.runs[0], target, key, tmp_path / "run-01")


def test_a_run_measures_through_llama_benchy_with_the_key_outside_argv(served: str, tmp_path: Path) -> None:
    item = one_run(served, tmp_path, KEY)
    assert item["exit"] == 0 and item["output_tail"] is None, item
    result = item["result"]
    assert result["version"] == benchrun.tool_version() and result["model"] == "lab/tiny-llama"
    (measured,) = result["benchmarks"]
    assert (measured["concurrency"], measured["prompt_size"], measured["response_size"]) == (2, 64, 8)
    assert measured["tg_throughput"]["mean"] > 0 and measured["e2e_ttft"]["mean"] > 0
    assert Server.seen and set(Server.seen) == {f"Bearer {KEY}"}
    launched = [line for line in Server.argvs if "provision.benchlaunch" in line]
    assert launched and not any(KEY in line for line in Server.argvs), launched
    (row,) = benchrun.rows_of({"runs": [item]})
    assert row["label"] == "d=0 c=2" and row["pp"] == [64] and row["tg_tokens_per_s"] == round(
        measured["tg_throughput"]["mean"], 2)


def test_answers_sent_whole_have_no_decode_speed_and_the_table_says_why(
        served: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM merges a request's outputs while its API server is behind, and sends them as one chunk (the
    lab's tiny model on a loaded CPU): llama-benchy's own code then measures no decode speed."""
    Server.whole = True
    item = one_run(served, tmp_path, KEY)
    (measured,) = item["result"]["benchmarks"]
    assert measured["tg_throughput"] is None and measured["e2e_ttft"]["mean"] > 0, measured
    (row,) = benchrun.rows_of({"runs": [item]})
    assert row["tg_tokens_per_s"] is None and row["ttft_ms"] > 0
    assert benchrun.unmeasured_decode([row, {**row, "label": "d=0 c=1", "tg_tokens_per_s": 9.5}]) == (
        "decode tok/s not measured for d=0 c=2: each answer arrived in one streamed chunk (or was one token), "
        "and llama-benchy times decoding between chunks")
    assert benchrun.unmeasured_decode([{**row, "exit": 1}]) is None  # a failed run says why in its own output
    document = {"measured": "now", "profile": {"name": "p", "description": "d"}, "tool": {"name": "llama-benchy",
                "version": benchrun.tool_version()}, "runs": [item]}
    report.print_bench_profile(document, str(tmp_path / "kept.json"), False)
    assert "decode tok/s not measured for d=0 c=2" in " ".join(capsys.readouterr().out.split())
    report.print_bench_profile(document, str(tmp_path / "kept.json"), True)
    assert json.loads(capsys.readouterr().out)["notes"] == [benchrun.unmeasured_decode([row])]


def test_the_runs_consolidate_as_sparkrun_uploads_them_failed_ones_left_out(served: str, tmp_path: Path) -> None:
    good = one_run(served, tmp_path / "a", KEY)
    refused = one_run(served, tmp_path / "b", None)
    merged = benchrun.consolidated([good, refused, good])
    assert merged["model"] == "lab/tiny-llama" and merged["max_concurrency"] == 2
    assert merged["benchmarks"] == good["result"]["benchmarks"] * 2


def test_a_run_the_server_refuses_is_kept_with_its_exit_and_output(served: str, tmp_path: Path) -> None:
    item = one_run(served, tmp_path, None)  # no key: every request is refused
    assert item["exit"] != 0 or not (item["result"] or {}).get("benchmarks"), item
    assert item["output_tail"] and any("401" in line or "failed" in line.lower() for line in item["output_tail"]), item


class ModelFiles(FakeRunner):
    """A host whose model directory holds the tiny model's tokenizer.json (a copy from `folder`)."""

    def __init__(self, folder: Path) -> None:
        super().__init__("cpu-1", lambda argv, stdin: Result(" ".join(argv), 0, "", "", 0.0))
        self.folder = folder

    def get(self, remote_path: str, local: Path) -> None:
        shutil.copyfile(self.folder / Path(remote_path).name, local)


@pytest.mark.parametrize("changed", [[], ["runs=2"]], ids=["as published", "runs changed"])
def test_the_shipped_profile_measures_each_test_as_often_as_its_runs_says_and_names_its_commit(
        served: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], changed: Sequence[str]) -> None:
    """runs is llama-benchy's --runs: one process per schedule entry, each test measured that many times
    (its result holds each measurement), never the schedule over again."""
    tinymodel.make(tmp_path / "model")
    (tmp_path / "hosts.yaml").write_text("hosts:\n  cpu-1: {address: 10.0.0.5, profile: cpu}\nclusters:\n"
                                         "  a: {hosts: [cpu-1], vars: {model: lab/tiny-llama, fetch_weights: false, "
                                         "served_model_name: tiny-llama}}\n")
    settings = inventory.load(tmp_path).settings("cpu-1", {"max_model_len": 160})
    files = ModelFiles(tmp_path / "model")
    port = int(served.rsplit(":", 1)[1])
    target = benchrun.Served(files, "127.0.0.1", port, "tiny-llama", files, settings, "host cpu-1")
    shipped = benchprofile.with_args(benchprofile.named("spark-arena-v2"),
                                     {"skip_coherence": True, **benchprofile.parse_args(changed)})
    profile = dataclasses.replace(shipped, schedule=((0, 2),))  # one entry of its schedule: one process
    said: list[str] = []
    (tmp_path / "work").mkdir()
    measured = benchrun.run_profile(target, KEY, profile, tmp_path / "work", f"{served}/book.txt", said.append)
    assert measured.ok, measured.document["runs"]
    repetitions = 2 if changed else 3  # the published file's runs: 3, else the --arg
    document = measured.document
    (run,) = document["runs"]
    assert f"[1/1] d=0 c=2: pp [112] tg [16], {repetitions} repetition(s) ..." in said
    (row,) = run["result"]["benchmarks"]
    # At concurrency 2 llama-benchy keeps one batch throughput per repetition (the warm-up is not kept).
    assert len(row["tg_throughput"]["values"]) == len(row["pp_throughput"]["values"]) == repetitions
    published = benchprofile.shipped()["spark-arena-v2"]
    assert document["profile"]["published"] == dataclasses.asdict(published)
    assert document["profile"]["repetitions"] == repetitions
    assert published.commit in document["profile"]["description"]
    assert document["profile"]["description"].startswith("Spark Arena Benchmark Profile v2 (published as "
                                                         "spark-arena/recipe-registry benchmarking/spark-arena-v2.yaml")
    report.print_bench_profile(document, str(tmp_path / "kept.json"), False)
    printed = " ".join(capsys.readouterr().out.split())
    assert "profile spark-arena-v2: Spark Arena Benchmark Profile v2" in printed and published.commit in printed
