"""Published benchmark profiles: Spark Arena's v2 profile as shipped (provision/benchprofiles, the
registry's bytes; where they were read and their sha256 in sources.json beside them), read as sparkrun
reads it, cut to a server's context, and each run's arguments judged by llama-benchy's own parser (the
pinned release, the bench and test extras)."""
from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import pytest
from invoke.program import Program

from provision import benchprofile, benchprofiles, benchrun
from provision.benchprofile import Target
from provision.errors import BenchProfileError
from tests.conftest import REPO

PROFILES = REPO / "provision" / "benchprofiles"
V2 = PROFILES / "spark-arena-v2.yaml"
SOURCES = json.loads((PROFILES / "sources.json").read_text())
TARGET = Target("http://127.0.0.1:41234/v1", "lab/tiny-llama", "tiny-llama", "/tmp/work/tokenizer.json",
                "http://10.231.77.1:8930/corpus/book.txt")


def test_the_shipped_profiles_are_the_published_bytes_and_say_where_they_were_read() -> None:
    """Byte for byte: no line of ours in the file; its repository, path, full commit and sha256 beside it."""
    assert set(SOURCES) == {path.name for path in PROFILES.glob("*.yaml")} == {"spark-arena-v2.yaml"}
    for file, record in SOURCES.items():
        assert set(record) == {"repository", "path", "commit", "sha256"}, file
        assert record["repository"] == "spark-arena/recipe-registry" and record["path"] == f"benchmarking/{file}"
        assert re.fullmatch(r"[0-9a-f]{40}", record["commit"]), record["commit"]
        assert hashlib.sha256((PROFILES / file).read_bytes()).hexdigest() == record["sha256"], file
    # The registry's file opens with its own first key: the provenance lives in sources.json only.
    assert V2.read_text().startswith("framework: llama-benchy\n")
    shipped = benchprofile.shipped()
    assert shipped["spark-arena-v2"].commit == SOURCES["spark-arena-v2.yaml"]["commit"]
    profile = benchprofile.named("spark-arena-v2")
    assert profile.published == shipped["spark-arena-v2"]
    assert profile.about == (f"Spark Arena Benchmark Profile v2 (published as spark-arena/recipe-registry "
                             f"benchmarking/spark-arena-v2.yaml at commit {shipped['spark-arena-v2'].commit})")


def test_a_shipped_profile_whose_bytes_differ_from_the_record_is_refused(tmp_path: Path) -> None:
    published = benchprofile.shipped()["spark-arena-v2"]
    edited = tmp_path / "spark-arena-v2.yaml"
    edited.write_bytes(b"# a comment of ours\n" + V2.read_bytes())  # the old shape: the registry's file plus a line
    with pytest.raises(BenchProfileError, match=f"not the file published as .* at commit {published.commit}"):
        benchprofile.load(edited, published)
    assert benchprofile.load(edited).args == benchprofile.load(V2).args  # as a user's file, it reads


@pytest.mark.parametrize(("records", "message"), [
    ({}, "each needs exactly one"),
    ({"spark-arena-v2.yaml": {**SOURCES["spark-arena-v2.yaml"], "commit": "7aff4a2"}}, "a full sha (40 hex)"),
    ({"spark-arena-v2.yaml": {**SOURCES["spark-arena-v2.yaml"], "sha256": None}}, "sha256: 64 hex"),
    ({"spark-arena-v2.yaml": {"repository": "spark-arena/recipe-registry"}}, "must be {repository, path"),
], ids=["no record", "short commit", "no sha256", "fields missing"])
def test_a_sources_record_that_does_not_say_where_a_file_is_from_is_refused(
        monkeypatch: pytest.MonkeyPatch, records: dict[str, object], message: str) -> None:
    monkeypatch.setattr(benchprofiles, "sources", lambda: records)
    with pytest.raises(BenchProfileError, match=re.escape(message)) as caught:
        benchprofile.named("spark-arena-v2")
    assert "sources.json" in str(caught.value)


def test_the_v2_profile_is_read_as_sparkrun_runs_it_its_schedule_in_order() -> None:
    profile = benchprofile.load(V2)
    assert profile.name == "spark-arena-v2" and profile.description == "Spark Arena Benchmark Profile v2"
    assert len(profile.runs) == 28 and profile.runs[0].label == "d=8192 c=5" and profile.runs[-1].label == "d=100000 c=10"
    assert {(run.depth, run.concurrency) for run in profile.runs} == {
        (depth, concurrency) for depth in (0, 4096, 8192, 16384, 32768, 65535, 100000) for concurrency in (1, 2, 5, 10)}
    assert profile.runs[0].args == {"depth": [8192], "pp": [2048], "tg": [128], "concurrency": [5],
                                    "enable_prefix_caching": True, "runs": 3}
    # `runs` is llama-benchy's --runs: each run's test measured 3 times, not the schedule run 3 times.
    assert profile.repetitions == 3 and all(run.repetitions == 3 for run in profile.runs)


def test_a_profile_without_runs_gets_llama_benchy_s_default_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("framework: llama-benchy\nargs: {pp: [64]}\n")
    profile = benchprofile.load(path)
    assert "runs" not in profile.args and profile.repetitions == benchprofile.DEFAULT_RUNS
    assert "--runs" not in benchprofile.argv(profile.runs[0], TARGET, "r.json")
    for bad in ("0", "three", "true", "[2]"):
        path.write_text(f"framework: llama-benchy\nargs: {{pp: [64], runs: {bad}}}\n")
        with pytest.raises(BenchProfileError, match="args.runs .* must be a whole number of at least 1"):
            benchprofile.load(path)


def test_without_a_schedule_every_depth_runs_with_every_concurrency_depth_first(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("framework: llama-benchy\nargs: {pp: [512], tg: [32], depth: [0, 1024], concurrency: [1, 4], runs: 2}\n")
    profile = benchprofile.load(path)
    assert [run.label for run in profile.runs] == ["d=0 c=1", "d=0 c=4", "d=1024 c=1", "d=1024 c=4"]
    assert profile.runs[0].args["runs"] == 2


@pytest.mark.parametrize("run", benchprofile.load(V2).runs, ids=lambda run: run.label)
def test_each_run_s_arguments_are_what_llama_benchy_s_own_parser_reads(monkeypatch: pytest.MonkeyPatch,
                                                                        run: benchprofile.Run) -> None:
    from llama_benchy.config import BenchmarkConfig

    line = benchprofile.argv(run, TARGET, "/tmp/work/run-01.json")
    assert "--api-key" not in line
    monkeypatch.setattr(sys, "argv", ["llama-benchy", *line, "--api-key", "secret"])
    config = BenchmarkConfig.from_args()
    assert (config.base_url, config.model, config.served_model_name) == (TARGET.base_url, "lab/tiny-llama", "tiny-llama")
    assert (config.tokenizer, config.book_url) == (TARGET.tokenizer, TARGET.book_url)
    assert (config.pp_counts, config.tg_counts, config.depths, config.concurrency_levels) == (
        [2048], [128], [run.depth], [run.concurrency])
    # The profile's runs: 3 is said, not left to llama-benchy's default (the same number today).
    assert line[line.index("--runs") + 1] == "3" and config.num_runs == run.repetitions == 3
    assert config.enable_prefix_caching is True
    assert (config.result_format, config.save_result, config.api_key) == ("json", "/tmp/work/run-01.json", "secret")


def test_a_small_server_gets_the_profile_cut_to_its_context_and_the_cut_says_what() -> None:
    runs, cut = benchprofile.cut(benchprofile.load(V2).runs, 256)
    assert cut is not None and cut.cut
    assert [run.label for run in runs] == ["d=0 c=1", "d=0 c=10", "d=0 c=5", "d=0 c=2"]  # the schedule's order
    assert all(run.args["pp"] == [196] and run.args["tg"] == [28] and run.tokens() <= 256 - 32 for run in runs)
    assert len(cut.dropped) == 24 and "d=100000 c=10" in cut.dropped
    assert cut.words() == ("cut to the server's context (256 tokens, 32 kept for the chat template): "
                                  "pp 2048 -> 196; tg 128 -> 28; 24 run(s) dropped (at depth 4096, 8192, 16384, "
                                  "32768, 65535, 100000)")
    whole, none_cut = benchprofile.cut(benchprofile.load(V2).runs, 131072)
    assert len(whole) == 28 and none_cut is not None and not none_cut.cut
    assert none_cut.words() == "as published (the server's context, 131072 tokens, holds every run)"
    mid, some = benchprofile.cut(benchprofile.load(V2).runs, 40960)
    assert {run.depth for run in mid} == {0, 4096, 8192, 16384, 32768} and some is not None and not some.shrunk
    unknown, no_cut = benchprofile.cut(benchprofile.load(V2).runs, None)
    assert len(unknown) == 28 and no_cut is None


@pytest.mark.parametrize(("text", "message"), [
    ("framework: vllm-bench\nargs: {pp: [1]}\n", "this tool runs llama-benchy profiles only"),
    ("framework: llama-benchy\nargs: {pp: [1]}\nextras: 1\n", "unknown key(s) extras"),
    ("framework: llama-benchy\nargs: {base_url: http://x}\n", "args.base_url: this tool sets it"),
    ("framework: llama-benchy\nargs: {api_key: k}\n", "args.api_key: this tool sets it"),
    ("framework: llama-benchy\nargs: {pp: [two]}\n", "args.pp must be a list of whole numbers"),
    ("framework: llama-benchy\nargs: {pp: [1]}\nschedule: [{depth: 0}]\n", "schedule entry 1 must be"),
    ("framework: llama-benchy\nargs: {pp: [1]}\nschedule: {depth: 0}\n", "'schedule' must be a list"),
    ("- a list\n", "a mapping with framework and args"),
])
def test_a_profile_that_cannot_run_here_is_refused_saying_why(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(BenchProfileError, match=re.escape(message)) as caught:
        benchprofile.load(path)
    assert "bad.yaml" in str(caught.value)


def test_a_profile_nothing_of_which_fits_is_refused_before_anything_runs(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("framework: llama-benchy\nargs: {pp: [2048], tg: [128], depth: [8192]}\n")
    runs, cut = benchprofile.cut(benchprofile.load(path).runs, 256)
    assert runs == () and cut is not None and cut.dropped == ("d=8192 c=1",)


def test_the_installed_llama_benchy_is_the_pinned_one() -> None:
    pinned = next(line for line in (REPO / "pyproject.toml").read_text().splitlines() if line.startswith("bench = "))
    assert f'"llama-benchy=={benchrun.tool_version()}"' in pinned


def test_an_arg_changed_on_the_command_line_is_held_to_the_same_rules_and_named() -> None:
    profile = benchprofile.with_args(benchprofile.named("spark-arena-v2"),
                                     benchprofile.parse_args(["skip_coherence=true", "runs=1"]))
    assert profile.changed == {"skip_coherence": True, "runs": 1}
    assert all(run.args["skip_coherence"] is True and run.repetitions == 1 for run in profile.runs)
    line = benchprofile.argv(profile.runs[0], TARGET, "r.json")
    assert "--skip-coherence" in line and line[line.index("--runs") + 1] == "1"
    assert profile.published == benchprofile.named("spark-arena-v2").published  # still says where it is from
    with pytest.raises(BenchProfileError, match="this tool sets it"):
        benchprofile.with_args(profile, {"api_key": "k"})
    with pytest.raises(BenchProfileError, match="--arg expects KEY=VALUE"):
        benchprofile.parse_args(["skip_coherence"])


def test_the_shipped_v2_profile_is_found_by_name_and_a_file_by_its_path(tmp_path: Path) -> None:
    shipped = benchprofile.named("spark-arena-v2")
    assert shipped.runs == benchprofile.load(V2).runs and shipped.args == benchprofile.load(V2).args
    path = tmp_path / "spark-arena-v2.yaml"
    path.write_text("framework: llama-benchy\nargs: {pp: [64]}\n")
    mine = benchprofile.named(str(path))  # a file by its path comes first
    assert mine.args["pp"] == [64] and mine.published is None and mine.about.endswith(f"(read from {path})")
    with pytest.raises(BenchProfileError, match="shipped: spark-arena-v2"):
        benchprofile.named("spark-arena-v9")


def test_bench_help_names_each_shipped_profile_with_the_commit_it_was_read_at(
        capsys: pytest.CaptureFixture[str]) -> None:
    from provision.cli import ns

    try:
        Program(namespace=ns, name="provision", binary="provision").run(
            ["provision", "bench", "--profile", "spark-arena-v2", "-h"])
    except SystemExit as exc:
        assert not exc.code
    helped = capsys.readouterr().out
    flat = re.sub(r"-\s+", "-", " ".join(helped.split()))  # as wrapped for the terminal, joined again
    for file, record in SOURCES.items():
        assert (f"{file.removesuffix('.yaml')} (read from {record['repository']} {record['path']} at commit "
                f"{record['commit']})") in flat, flat
    assert "--runs" in flat


def test_a_profile_measures_a_host_s_server_or_an_endpoint_through_its_router(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Where each is reached (over which host's connection, at which address and port), whose files give
    the tokenizer, and where the results are kept: the connections the task makes, recorded."""
    from provision import inventory, remote
    from tests.fakes import FakeRunner
    from tests.test_rollback import ENDPOINT_INVENTORY

    (tmp_path / "hosts.yaml").write_text(ENDPOINT_INVENTORY.replace("drain_timeout: 30", "drain_timeout: 30, port: 9000"))
    inv = inventory.load(tmp_path)
    opened: list[str] = []

    def connect(host: inventory.Host, ssh: inventory.SshSettings, **_: object) -> FakeRunner:
        opened.append(host.name)
        return FakeRunner(host.name, lambda argv, stdin: None)  # type: ignore[arg-type,return-value]

    monkeypatch.setattr(remote, "connect", connect)
    with benchrun.connected(inv, "cpu-1", None, {"max_model_len": 128}) as served:
        assert (served.runner.host, served.address, served.port, served.files.host) == ("cpu-1", "127.0.0.1", 8000, "cpu-1")
        assert served.settings.max_model_len == 128 and served.what == "host cpu-1"
    with benchrun.connected(inv, None, "tiny", {}) as served:
        assert (served.runner.host, served.port, served.files.host) == ("cpu-2", 9000, "cpu-1")
        assert served.served_name == "lab/tiny-llama" and served.what.startswith("endpoint tiny (lab/tiny-llama: 2 replica(s)")
    assert opened == ["cpu-1", "cpu-2", "cpu-1"]
    assert benchrun.kept_path(inv, None, "tiny", "v2").parent == tmp_path / "bench"
    assert benchrun.kept_path(inv, None, "tiny", "v2").name.startswith("endpoint-tiny-v2-")
    assert benchrun.kept_path(inv, "cpu-1", None, "v2").name.startswith("cpu-1-v2-")
