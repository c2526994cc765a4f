"""bench --profile against the lab's real vLLM (cpu-1, lab-cpu): Spark Arena's v2 profile as shipped, run
with the pinned llama-benchy from this machine through cpu-1's SSH connection (the server listens on
its loopback only), cut to what the tiny model serves (256 tokens: the cut is named), its results kept
beside the recipe applied to lab-cpu. The lab reaches no book on the internet: the text llama-benchy
cuts its prompts from is served here, words of the tiny model's vocabulary. A random model cannot
answer llama-benchy's coherence question, so the run skips it, and the results name that change."""
from __future__ import annotations

import http.server
import json
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision import benchrun, lab
from provision.lab import tinymodel
from tests.lab.conftest import invoke_json, run_invoke

pytestmark = pytest.mark.lab

@pytest.fixture(scope="module")
def served(the_lab: lab.Lab) -> None:
    done = run_invoke("deploy", "--cluster", "lab-cpu", "--timeout", "420")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.fixture
def book() -> Iterator[str]:
    """A text of the tiny model's own words, served on this machine's loopback while the test runs."""
    words = [word for word in tinymodel.vocabulary() if not word.startswith("<")]
    rng = random.Random(0)
    text = " ".join(rng.choice(words) for _ in range(20000)).encode()

    class Book(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, *args: object) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Book)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/tiny-words.txt"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def applied_dir(the_lab: lab.Lab) -> Iterator[Path]:
    folder = the_lab.inventory.parent / "applied"
    assert not folder.exists(), f"{folder} was left by an earlier run"
    try:
        yield folder
    finally:
        for path in folder.glob("*"):
            path.unlink()
        if folder.exists():
            folder.rmdir()


def test_the_v2_profile_runs_cut_to_the_lab_s_model_and_is_kept_beside_its_recipe(served: None, book: str,
                                                                                   applied_dir: Path) -> None:
    code, applied, text = invoke_json("recipe.apply", "lab-cpu-tiny-llama", "--cluster", "lab-cpu")
    assert code == 0 and applied["written"], text
    code, found, text = invoke_json("bench", "--host", "cpu-1", "--profile", "spark-arena-v2", "--book-url", book,
                                    "--arg", "skip_coherence=true", timeout=1200)
    assert code == 0, text[-4000:]
    assert found["tool"] == {"name": "llama-benchy", "version": benchrun.tool_version()}
    assert found["cut"].startswith("cut to the server's context (256 tokens, 32 kept for the chat template): "
                                   "pp 2048 -> 196; tg 128 -> 28; 24 run(s) dropped"), found["cut"]
    assert found["profile"]["changed_by_command_line"] == {"skip_coherence": True}
    assert found["profile"]["name"] == "spark-arena-v2" and found["model"] == "lab/tiny-llama"
    # Depth 0 at each concurrency, in the schedule's order; each llama-benchy's own result, measured.
    assert [run["label"] for run in found["runs"]] == ["d=0 c=1", "d=0 c=10", "d=0 c=5", "d=0 c=2"]
    for run in found["runs"]:
        assert run["exit"] == 0 and run["result"]["benchmarks"], run
        measured = run["result"]["benchmarks"]
        assert all(item["concurrency"] == run["concurrency"] and item["prompt_size"] == 196 for item in measured)
    assert found["consolidated"]["max_concurrency"] == 10 and len(found["consolidated"]["benchmarks"]) == sum(
        len(run["result"]["benchmarks"]) for run in found["runs"])
    # Each row is its run's own llama-benchy figures. Decode speed may be missing: under a full suite's
    # load vLLM sent a run's every answer in one streamed chunk, and llama-benchy times decoding between
    # chunks (seen twice at concurrency 2); the table and the JSON's notes then say so.
    assert found["notes"] == [note for note in (benchrun.unmeasured_decode(found["summary"]),) if note]
    for row, run in zip(found["summary"], found["runs"], strict=True):
        shown = (row["label"], row["pp_tokens_per_s"], row["tg_tokens_per_s"], row["ttft_ms"])
        assert row["ttft_ms"] > 0, shown  # every answer's first token was timed
        for column, metric in (("pp_tokens_per_s", "pp_throughput"), ("tg_tokens_per_s", "tg_throughput")):
            means = [item[metric]["mean"] for item in run["result"]["benchmarks"] if item.get(metric)]
            assert row[column] == (round(sum(means) / len(means), 2) if means else None), shown
    # Kept beside the recipe applied to lab-cpu, the same document.
    kept = Path(found["file"])
    assert kept.parent == applied_dir and kept.name.startswith("lab-cpu-spark-arena-v2-"), kept
    assert json.loads(kept.read_text())["runs"] == found["runs"]
