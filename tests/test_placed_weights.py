"""Weights placed by hand (fetch_weights false): the probe's look at the model directory, the memory fit
read from it (or from the hub for a repository id, or said to be unknown), what a weights run reports,
and the architecture a host's wheels are resolved for."""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from provision import checks, errors, facts, lab, render, run, secrets, venv, weights
from provision.host import probe
from provision.run import hub as hub_stage
from tests.conftest import FIXTURES
from tests.fakes import ok, probe_answer_from_recording
from tests.test_checks import CASES, context_for

GIB = 2**30
DIRECTORY = "/var/lib/vllm/models/Qwen/Qwen2.5-7B-Instruct"
# Four safetensors shards of about what a 7B bf16 checkpoint takes (15.2 GB in all), as sparse files.
SHARDS = {"model-00001-of-00004.safetensors": 3_945_441_440, "model-00002-of-00004.safetensors": 3_864_726_352,
          "model-00003-of-00004.safetensors": 3_864_726_424, "model-00004-of-00004.safetensors": 3_556_377_672}


def qwen_config() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / "model_configs" / "qwen2.5-7b-instruct.json").read_text())["config"]
    return data


def placed_directory(root: Path) -> Path:
    """What `hf download Qwen/Qwen2.5-7B-Instruct --local-dir DIR` leaves: the files, and its own
    .cache/huggingface bookkeeping (no part of the model). The shards are sparse files of their sizes."""
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(qwen_config()))
    (root / "tokenizer.json").write_text("{}")
    for name, size in SHARDS.items():
        with open(root / name, "wb") as handle:
            handle.truncate(size)
    (root / ".cache" / "huggingface" / "download").mkdir(parents=True)
    (root / ".cache" / "huggingface" / "download" / "config.json.metadata").write_text("x" * 99)
    return root


def test_the_probe_reads_config_json_and_sizes_and_skips_the_download_cache(tmp_path: Path) -> None:
    root = placed_directory(tmp_path / "Qwen2.5-7B-Instruct")
    seen = probe.inspect({"models": [str(root)]})["models"][str(root)]
    assert json.loads(seen["config"]) == qwen_config()
    assert seen["sizes"] == {"config.json": (root / "config.json").stat().st_size,
                             "tokenizer.json": 2, **SHARDS}
    missing = probe.inspect({"models": [str(tmp_path / "absent")]})["models"][str(tmp_path / "absent")]
    assert missing == {"exists": False, "is_dir": False}


def test_the_probe_says_why_config_json_is_not_read(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.gguf").write_bytes(b"GGUF")
    seen = probe.inspect({"models": [str(tmp_path / "m")]})["models"][str(tmp_path / "m")]
    assert (seen["config"], seen["config_error"], seen["sizes"]) == (None, "missing", {"model.gguf": 4})
    if os.geteuid() != 0:  # root reads any file: the case needs a user who cannot
        (tmp_path / "m" / "config.json").write_text("{}")
        (tmp_path / "m" / "config.json").chmod(0)
        seen = probe.inspect({"models": [str(tmp_path / "m")]})["models"][str(tmp_path / "m")]
        assert "Permission denied" in seen["config_error"]


def facts_with(models: dict[str, Any]) -> facts.HostFacts:
    (ctx,) = context_for(workstation_case()).values()
    return dataclasses.replace(ctx.facts, models=models)


@pytest.mark.parametrize("seen,present,error", [
    ({"exists": False, "is_dir": False}, False, f"{DIRECTORY} does not exist on the host"),
    ({"exists": True, "is_dir": False}, False, f"{DIRECTORY} is not a directory on the host"),
    ({"exists": True, "is_dir": True, "sizes": {}, "config": None, "config_error": "missing"}, True,
     f"no config.json in {DIRECTORY} on the host"),
    ({"exists": True, "is_dir": True, "sizes": {"config.json": 9}, "config": "{trunc", "truncated": False}, True,
     f"{DIRECTORY}/config.json on the host is not JSON"),
    ({"exists": True, "is_dir": True, "sizes": {"config.json": 2}, "config": "[]"}, True,
     f"{DIRECTORY}/config.json on the host is not a JSON object"),
], ids=["absent", "a-file", "no-config", "truncated-json", "json-list"])
def test_placed_model_says_what_is_wrong(seen: dict[str, Any], present: bool, error: str) -> None:
    placed = weights.placed_model(facts_with({DIRECTORY: seen}), DIRECTORY)
    assert placed is not None and placed.config is None
    assert placed.present is present and (placed.config_error or "").startswith(error)
    assert weights.placed_model(facts_with({}), DIRECTORY) is None  # not inspected: nothing to say


def workstation_case(**values: Any) -> tuple[Any, ...]:
    """The recorded 2x RTX 5090 workstation serving Qwen2.5-7B-Instruct at TP 2, 32k context."""
    case = next(c for c in CASES if c[0] == "rtx5090x2-tp2-awq32b-all-good")
    name, machine, profile, base, change, peers, expected = case
    settings = {**base, "model": "Qwen/Qwen2.5-7B-Instruct", "max_model_len": 32768, **values}
    return name, machine, profile, settings, change, peers, expected


def hub_snapshot() -> weights.Snapshot:
    files = [weights.WeightFile(name, size, "sha256:" + "0" * 64) for name, size in SHARDS.items()]
    files.append(weights.WeightFile("config.json", 663, "git-sha1:" + "0" * 40))
    return weights.Snapshot("Qwen/Qwen2.5-7B-Instruct", "main", "a" * 40, tuple(files))


def gated(values: dict[str, Any], models: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
          hub: run.HubAnswer | None = None) -> tuple[checks.Finding, list[run.HubKey]]:
    """memory.fits as the gate judges it after the placed-weights step (hub answers given, never fetched)."""
    asked: list[run.HubKey] = []

    def answer(key: run.HubKey, held: secrets.Secrets) -> run.HubAnswer:
        asked.append(key)
        assert hub is not None, "the hub was asked where the host had the answer"
        return hub

    monkeypatch.setattr(hub_stage, "_ask_hub", answer)
    monkeypatch.setattr(hub_stage, "_kept", lambda key, token: None)
    (ctx,) = context_for(workstation_case(**values)).values()
    ctx = dataclasses.replace(ctx, facts=dataclasses.replace(ctx.facts, models=models))
    (ctx,) = hub_stage.with_placed_weights({"h": ctx}, secrets.Secrets(), {"h"}).values()
    found = checks.memory_fits(ctx)
    assert found is not None
    return found, asked


def probe_view(tmp_path: Path) -> dict[str, Any]:
    root = placed_directory(tmp_path / "placed")
    return {DIRECTORY: probe.inspect({"models": [str(root)]})["models"][str(root)]}


def test_weights_placed_by_hand_get_the_fit_a_fetched_model_gets(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    placed, asked = gated({"fetch_weights": False}, probe_view(tmp_path), monkeypatch)
    assert asked == []  # config.json and the sizes came from the host: the hub was not asked
    (fetched,) = context_for(workstation_case()).values()
    snapshot = hub_snapshot()
    fetched = dataclasses.replace(fetched, model_config=qwen_config(), weights_bytes=snapshot.weight_bytes)
    from_hub = checks.memory_fits(fetched)
    assert from_hub is not None and placed.status == from_hub.status == "pass"
    figures = ("weights_gib", "kv_bytes_per_token", "kv_budget_gib", "context_tokens", "concurrent_sequences",
               "max_model_len", "kv_dtype", "attention", "budget_gib")
    assert {k: placed.evidence[k] for k in figures} == {k: from_hub.evidence[k] for k in figures}
    # Worked by hand: 28 layers x (4 KV heads / TP 2) x head_dim 3584/28 x K and V x 2 bytes = 28 KiB.
    assert placed.evidence["kv_bytes_per_token"] == 28 * (4 // 2) * 128 * 2 * 2
    assert placed.evidence["weights_gib"] == round(sum(SHARDS.values()) / 2 / GIB, 2)
    assert placed.evidence["config_from"] == f"{DIRECTORY}/config.json on the host"
    assert placed.evidence["weights_from"] == f"file sizes in {DIRECTORY} on the host"
    assert from_hub.evidence["config_from"] == "the hub"


def test_a_repository_id_without_files_on_the_host_asks_the_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    empty = {DIRECTORY: {"exists": False, "is_dir": False}}
    found, asked = gated({"fetch_weights": False}, empty, monkeypatch, hub=(hub_snapshot(), qwen_config()))
    assert [key[0] for key in asked] == ["Qwen/Qwen2.5-7B-Instruct"]
    assert found.status == "pass"
    assert found.evidence["weights_from"] == "hub file sizes of Qwen/Qwen2.5-7B-Instruct"
    assert found.evidence["config_from"].startswith("the hub (Qwen/Qwen2.5-7B-Instruct@aaaaaaaaaaaa;")
    assert f"{DIRECTORY} does not exist on the host" in found.evidence["config_from"]


def test_neither_the_host_nor_the_hub_is_said_not_left_silent(monkeypatch: pytest.MonkeyPatch) -> None:
    empty = {DIRECTORY: {"exists": True, "is_dir": True, "sizes": {}, "config": None, "config_error": "missing"}}
    refused = "no model repository 'Qwen/Qwen2.5-7B-Instruct' on https://hub.internal (a private one needs hf_token)"
    found, _ = gated({"fetch_weights": False}, empty, monkeypatch, hub=(errors.WeightsError(refused), None))
    # The name gives a size (7B x 16 bit) and the package ships this model's shape (what init reads):
    # the KV cache is estimated from it, and the evidence says why neither the host nor the hub gave one.
    assert found.status == "pass"
    assert found.evidence["config_from"] == (
        "the shape shipped in provision/starter_models.yaml (read from "
        f"https://huggingface.co/Qwen/Qwen2.5-7B-Instruct/blob/main/config.json; no config.json in {DIRECTORY} "
        f"on the host; the hub: {refused})")
    path = "/srv/models/my-finetune"
    found, asked = gated({"fetch_weights": False, "model": path}, {path: {"exists": False, "is_dir": False}},
                         monkeypatch)
    assert asked == []  # a path is no repository id
    assert (found.status, found.severity) == ("fail", checks.WARNING)
    assert found.message == (f"could not be estimated: {path} does not exist on the host, and the model is a "
                             "path, not a hub repository id")
    assert f"place the model's config.json and weights in {path}" in (found.fix or "")


def test_a_weights_run_says_what_was_not_fetched(tmp_path: Path) -> None:
    (ctx,) = context_for(workstation_case(fetch_weights=False)).values()
    assert render.model_path(ctx.settings) == DIRECTORY
    host_facts = facts_with(probe_view(tmp_path))
    note = weights.not_fetched(ctx.settings, weights.placed_model(host_facts, DIRECTORY))
    assert note == f"not fetched: fetch_weights is false; 6 file(s) placed by hand in {DIRECTORY}"
    bare = facts_with({DIRECTORY: {"exists": False, "is_dir": False}})
    assert weights.not_fetched(ctx.settings, weights.placed_model(bare, DIRECTORY)) == \
        f"not fetched: fetch_weights is false; none present in {DIRECTORY}"
    (fetching,) = context_for(workstation_case()).values()
    assert weights.not_fetched(fetching.settings, None) is None  # the tool fetches it: the manifest speaks


def spark_replayed_on_x86_64() -> facts.HostFacts:
    """The DGX Spark recording's `uname -r -m` (aarch64) answered on a host whose python3 runs x86_64."""
    answer = json.loads(probe_answer_from_recording(lab.load_machine("dgx-spark-gb10"), python="3.11.2"))
    answer["machine"] = "x86_64"
    return facts.facts_from_probe("spark-a", ok(json.dumps(answer)))


def test_wheels_are_resolved_for_the_interpreters_architecture_not_unames() -> None:
    replayed = spark_replayed_on_x86_64()
    assert (replayed.arch, replayed.python_machine, replayed.wheel_arch) == ("aarch64", "x86_64", "x86_64")
    answer = json.loads(probe_answer_from_recording(lab.load_machine("dgx-spark-gb10")))
    real = facts.facts_from_probe("spark-a", ok(json.dumps(answer)))  # a probe from before "machine"
    assert (real.arch, real.python_machine, real.wheel_arch) == ("aarch64", None, "aarch64")
    assert facts.probe_answer(json.dumps(probe.collect({})))["machine"] == os.uname().machine


def test_the_plan_resolves_the_hub_venv_for_the_interpreters_architecture(monkeypatch: pytest.MonkeyPatch) -> None:
    case = next(c for c in CASES if c[0] == "spark-pair-good")
    ctx = context_for(case)["spark-a"]
    ctx = dataclasses.replace(ctx, facts=dataclasses.replace(spark_replayed_on_x86_64(), disks=ctx.facts.disks),
                              snapshot=hub_snapshot())
    asked: list[tuple[str, str]] = []

    def resolve(requirements: Any, local: Any, arch: str, python: str, **kwargs: Any) -> venv.Wheelhouse:
        asked.append((arch, python))
        raise errors.WheelhouseError("stop here: the architecture asked for is what this test is about")

    monkeypatch.setattr(venv, "resolve", resolve)
    with pytest.raises(errors.WheelhouseError):
        run.host_plan(ctx, [], "weights")
    assert asked == [("x86_64", "3.11.2")]
