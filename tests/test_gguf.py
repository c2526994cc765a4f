"""A GGUF model placed by hand (llama.cpp's one file): the probe reads its size and its header's scalar
metadata (host/gguf.py), the controller maps that metadata to config.json's keys
(kvcache.config_from_gguf), and memory.fits judges the file's real size and the KV cache its header
describes, not a guess from the model's name.

Seen on the H200 host: /srv/models/llama-3.1-8b-random-q4_0.gguf (4.33 GiB, Q4_0) was judged as "8B
parameters x 16 bit" with the KV cache not estimated; llama-server took 5.9 GiB with --ctx-size 8192."""
from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path
from typing import Any

import pytest

from provision import checks, facts, kvcache, render, secrets, weights
from provision.errors import KvError
from provision.host import gguf as hostgguf
from provision.host import probe
from provision.lab import tinymodel
from provision.run import hub as hub_stage
from tests.fakes import ok
from tests.test_checks import context_for

GIB = 2**30
SMALL = tinymodel.GgufShape("small", layers=2, hidden=256, ffn=512, heads=4, kv_heads=2, vocab=1000, context=1024)
PLACED = "/srv/models/llama-3.1-8b-random-q4_0.gguf"
TOKENIZER_ARRAYS = ["tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"]


# --- the probe: the header read on the host ------------------------------------------------------

def test_the_probe_reads_a_gguf_files_size_and_scalar_metadata_and_skips_its_arrays(tmp_path: Path) -> None:
    path = tinymodel.make_shaped_gguf(tmp_path, SMALL, "q4_0")
    seen = probe.inspect({"models": [str(path)]})["models"][str(path)]
    assert (seen["exists"], seen["is_dir"], seen["is_file"], seen["size"]) == (True, False, True,
                                                                                path.stat().st_size)
    header = seen["gguf"]
    assert (header["version"], header["tensors"], header["error"]) == (3, 3 + 9 * SMALL.layers, None)
    metadata = header["metadata"]
    assert metadata["general.architecture"] == "llama" and metadata["general.file_type"] == 2
    assert {key: metadata[f"llama.{key}"] for key in ("block_count", "embedding_length", "attention.head_count",
                                                      "attention.head_count_kv", "context_length",
                                                      "feed_forward_length")} == {
        "block_count": 2, "embedding_length": 256, "attention.head_count": 4, "attention.head_count_kv": 2,
        "context_length": 1024, "feed_forward_length": 512}
    # The tokenizer's arrays were walked past and named, never kept: what travels is scalars alone.
    assert header["skipped"] == TOKENIZER_ARRAYS
    assert not any(key in metadata for key in TOKENIZER_ARRAYS)
    assert all(isinstance(value, (int, float, str, bool)) for value in metadata.values())
    assert len(json.dumps(seen)) < 2000


def test_the_shipped_probe_reads_the_header_on_the_hosts_python3(tmp_path: Path) -> None:
    """As a host runs it: the probe's text (gguf.py shipped with it) on stdin to python3."""
    import subprocess
    import sys

    path = tinymodel.make_shaped_gguf(tmp_path, SMALL, "f16")
    spec = facts.probe_spec([], [], 5, {"models": [str(path)]})
    done = subprocess.run([sys.executable, *facts.PROBE_PYTHON[1:]], input=facts.probe_program(spec),
                          capture_output=True, text=True, timeout=60, check=False)
    gathered = facts.facts_from_probe("h", ok(done.stdout), [])
    placed = weights.placed_model(gathered, str(path))
    assert placed is not None and placed.is_file and placed.gguf_error is None
    assert placed.weight_bytes == path.stat().st_size
    assert placed.gguf is not None and placed.gguf["general.file_type"] == 1


def test_a_directory_holding_one_gguf_model_has_its_header_read(tmp_path: Path) -> None:
    path = tinymodel.make_shaped_gguf(tmp_path / "m", SMALL, "q4_0")
    (tmp_path / "m" / "README.md").write_text("x")
    seen = probe.inspect({"models": [str(tmp_path / "m")]})["models"][str(tmp_path / "m")]
    assert seen["gguf_file"] == path.name and seen["gguf"]["metadata"]["llama.block_count"] == 2
    host_facts = dataclasses.replace(facts.HostFacts(host="h"), models={"/m": seen})
    placed = weights.placed_model(host_facts, "/m")
    assert placed is not None and placed.gguf_file == f"/m/{path.name}"
    assert placed.weight_bytes == path.stat().st_size  # the README is no weight
    tinymodel.make_shaped_gguf(tmp_path / "m", SMALL, "f16")  # two models: which one is served is not known
    seen = probe.inspect({"models": [str(tmp_path / "m")]})["models"][str(tmp_path / "m")]
    assert "gguf" not in seen and "gguf_file" not in seen


def _header(*entries: bytes, keys: int | None = None, version: int = 3) -> bytes:
    count = len(entries) if keys is None else keys
    return b"GGUF" + struct.pack("<IQQ", version, 0, count) + b"".join(entries)


def _text(value: str) -> bytes:
    data = value.encode()
    return struct.pack("<Q", len(data)) + data


def _u32(key: str, value: int) -> bytes:
    return _text(key) + struct.pack("<II", 4, value)


@pytest.mark.parametrize("content, error", [
    (b"", "not a GGUF file (it starts with b'')"),
    (b"GGU", "not a GGUF file (it starts with b'GGU')"),
    (b"PK\x03\x04" + b"\0" * 60, "not a GGUF file (it starts with b'PK\\x03\\x04')"),
    (_header(version=1), "GGUF version 1 is not read"),
    (b"GGUF" + struct.pack(">IQQ", 3, 0, 1), "GGUF version 50331648 is not read"),  # big endian
    (b"GGUF\x03\x00\x00", "the file ends inside the version"),
    (_header(_u32("a.block_count", 32), keys=2), "the file ends inside a key's length"),
    (_header(_u32("a.block_count", 32))[:-2], "the file ends inside the value of a.block_count"),
    (_header(_text("k") + struct.pack("<I", 13)), "k has a value of unknown type 13"),
    (_header(_text("k") + struct.pack("<IIQ", 9, 8, 10**12)), "array k claims 1000000000000 strings"),
    (_header(_text("k") + struct.pack("<IIQ", 9, 4, 1000)), "the file ends inside array k"),
    (_header(_text("k") + struct.pack("<IIQ", 9, 99, 1)), "array k holds values of unknown type 99"),
    (_header(struct.pack("<Q", 2**63)), "a key's length claims 9223372036854775808 bytes"),
    (_header(keys=2**40), "the file ends inside a key's length"),
], ids=["empty", "short", "a-zip", "version-1", "big-endian", "truncated-version", "a-key-missing",
        "truncated-value", "unknown-type", "absurd-array", "truncated-array", "unknown-element", "absurd-key",
        "absurd-key-count"])
def test_garbage_and_truncated_files_give_an_error_not_a_crash(tmp_path: Path, content: bytes, error: str) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    answer = hostgguf.read_gguf(str(path))
    assert answer["error"] is not None and answer["error"].startswith(error), answer["error"]


def test_what_was_found_before_the_file_ends_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(_header(_text("general.architecture") + struct.pack("<I", 8) + _text("llama"),
                             _u32("llama.block_count", 32), keys=3))
    answer = hostgguf.read_gguf(str(path))
    assert answer["metadata"] == {"general.architecture": "llama", "llama.block_count": 32}
    assert answer["error"] == "the file ends inside a key's length (at byte 102)"
    assert hostgguf.read_gguf(str(tmp_path / "absent.gguf"))["error"].startswith("FileNotFoundError")


def test_every_truncation_of_a_real_file_is_an_answer(tmp_path: Path) -> None:
    """Cut anywhere in its header, the made file never makes the reader raise."""
    whole = tinymodel.make_shaped_gguf(tmp_path, SMALL, "q4_0").read_bytes()[:20_000]
    cut = tmp_path / "cut.gguf"
    for end in range(0, 20_000, 7):
        cut.write_bytes(whole[:end])
        answer = hostgguf.read_gguf(str(cut))
        assert answer["error"], end


def test_the_bounds_stop_the_walk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(_header(*(_u32(f"k{index}", index) for index in range(10))))
    monkeypatch.setattr(hostgguf, "MAX_GGUF_KEYS", 4)
    answer = hostgguf.read_gguf(str(path))
    assert answer["error"] == "more than 4 keys: stopped there" and len(answer["metadata"]) == 4
    monkeypatch.setattr(hostgguf, "MAX_GGUF_KEYS", 4096)
    monkeypatch.setattr(hostgguf, "MAX_GGUF_BYTES", 64)
    answer = hostgguf.read_gguf(str(path))
    assert answer["error"].startswith("the header is longer than 0 MiB") and len(answer["metadata"]) == 2
    long_string = _text("general.description") + struct.pack("<I", 8) + _text("x" * 5000)
    path.write_bytes(_header(long_string, _u32("llama.block_count", 2)))
    monkeypatch.setattr(hostgguf, "MAX_GGUF_BYTES", 64 << 20)
    answer = hostgguf.read_gguf(str(path))
    assert answer == {"version": 3, "tensors": 0, "keys": 2, "metadata": {"llama.block_count": 2},
                      "skipped": ["general.description"], "error": None}


# --- the mapping: GGUF metadata -> config.json's keys ---------------------------------------------

def llama_8b_metadata() -> dict[str, Any]:
    shape = tinymodel.SHAPES["llama-3.1-8b"]
    return {"general.architecture": "llama", "general.file_type": 2, "llama.block_count": shape.layers,
            "llama.embedding_length": shape.hidden, "llama.attention.head_count": shape.heads,
            "llama.attention.head_count_kv": shape.kv_heads, "llama.context_length": shape.context,
            "llama.feed_forward_length": shape.ffn, "llama.rope.dimension_count": 128}


def test_llama_metadata_maps_to_the_config_json_keys_and_its_shape() -> None:
    config = kvcache.config_from_gguf(llama_8b_metadata())
    assert config == {"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32,
                      "torch_dtype": "float16", "hidden_size": 4096, "num_key_value_heads": 8,
                      "max_position_embeddings": 131072, "intermediate_size": 14336}
    shape = kvcache.shape_of(config)
    assert (shape.layers, shape.kv_heads, shape.head_dim, shape.attention) == (32, 8, 128, "GQA")
    est = kvcache.estimate(shape, kvcache.Layout(), weights_total=0, budget=GIB, max_model_len=8192)
    assert est.kv_dtype == "float16" and est.kv_per_token == 2 * 32 * 8 * 128 * 2 == 128 * 1024


def test_another_architecture_maps_the_same_way_with_its_own_prefix_and_key_length() -> None:
    """Qwen3-30B-A3B's header: head_dim 128 is key_length, not 2048 / 32."""
    metadata = {"general.architecture": "qwen3moe", "qwen3moe.block_count": 48, "qwen3moe.embedding_length": 2048,
                "qwen3moe.attention.head_count": 32, "qwen3moe.attention.head_count_kv": 4,
                "qwen3moe.attention.key_length": 128, "qwen3moe.attention.value_length": 128,
                "qwen3moe.context_length": 40960, "qwen3moe.expert_count": 128}
    shape = kvcache.shape_of(kvcache.config_from_gguf(metadata))
    assert (shape.layers, shape.kv_heads, shape.head_dim, shape.experts) == (48, 4, 128, 128)


@pytest.mark.parametrize("metadata, why", [
    ({}, "the GGUF header names no general.architecture"),
    ({"general.architecture": "mamba", "mamba.block_count": 64}, "the GGUF architecture 'mamba' is not one"),
    ({"general.architecture": "gemma3"}, "the GGUF architecture 'gemma3' is not one"),
    ({"general.architecture": "llama", "llama.embedding_length": 4096},
     "the GGUF header names no llama.block_count or llama.attention.head_count"),
    ({"general.architecture": "qwen2", "qwen2.block_count": 2, "qwen2.attention.head_count": 2,
      "qwen2.attention.key_length": 192, "qwen2.attention.value_length": 128}, "the GGUF header's K and V"),
], ids=["no-architecture", "state-space", "sliding-window", "no-layers", "k-and-v-differ"])
def test_what_cannot_be_mapped_says_why(metadata: dict[str, Any], why: str) -> None:
    with pytest.raises(KvError, match=why.replace("(", r"\(")):
        kvcache.config_from_gguf(metadata)


# --- the gate -------------------------------------------------------------------------------------

def h200_llamacpp(models: dict[str, Any], **values: Any) -> checks.Finding:
    """memory.fits on the recorded H200 host (143771 MiB per GPU, hopper's gpu_memory_utilization 0.9)
    serving PLACED with llama.cpp, after the placed-weights step (the hub never asked)."""
    settings = {"engine": "llamacpp", "model": PLACED, "fetch_weights": False, "max_model_len": 8192, **values}
    (ctx,) = context_for(("gguf", "h200x2-driver580", "hopper", settings, None, None, {})).values()
    assert render.model_path(ctx.settings) == PLACED
    assert ctx.visible_gpus[0].memory_total_mib == 143771 and ctx.settings.gpu_memory_utilization == 0.9
    ctx = dataclasses.replace(ctx, facts=dataclasses.replace(ctx.facts, models=models))
    (ctx,) = hub_stage.with_placed_weights({"h": ctx}, secrets.Secrets(), {"h"}).values()
    found = checks.memory_fits(ctx)
    assert found is not None
    return found


def placed_q4_0(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """Llama-3.1-8B's shape in Q4_0 as the probe sees it: the real header, the real size (sparse)."""
    path = tinymodel.make_shaped_header(tmp_path, tinymodel.SHAPES["llama-3.1-8b"], "q4_0")
    return path, {PLACED: probe.inspect({"models": [str(path)]})["models"][str(path)]}


def test_a_placed_8b_q4_0_file_is_judged_by_its_size_and_header(tmp_path: Path) -> None:
    path, models = placed_q4_0(tmp_path)
    assert round(path.stat().st_size / GIB, 2) == 4.34  # llama-quantize's Q4_0 of Llama-3.1-8B: 4.33 GiB
    found = h200_llamacpp(models)
    ev = found.evidence
    assert found.status == "pass", found.message
    assert ev["weights_from"] == "the GGUF file's size on the host"
    assert ev["config_from"] == f"the GGUF header of {PLACED}"
    assert ev["weights_gib"] == round(path.stat().st_size / GIB, 2)
    assert (ev["kv_dtype"], ev["kv_bytes_per_token"], ev["max_model_len"]) == ("float16", 128 * 1024, 8192)
    assert ev["kv_per_sequence_gib"] == 1.0  # 128 KiB x 8192 tokens
    assert ev["budget_gib"] == round(143771 * 2**20 * 0.9 / GIB, 2)
    # llama.cpp's four slots (concurrent_sequences unset), each holding 8192 tokens of its own.
    assert (ev["slots"], ev["slot_tokens"], ev["kv_per_slot_gib"], ev["kv_all_slots_gib"]) == (4, 8192, 1.0, 4.0)
    assert "4 slots x 8,192 tokens need 4.0 GiB of KV cache" in found.message
    # llama-server measured 5.9 GiB on the H200 with one --ctx-size 8192 for all its slots (before each
    # had its own): weights and one 8192-token KV land under it (its compute buffers and the CUDA context
    # are the rest), and the allowance on top keeps the estimate above it.
    assert 5.0 < ev["weights_gib"] + ev["kv_per_sequence_gib"] < 5.9 < \
        ev["weights_gib"] + ev["kv_per_sequence_gib"] + ev["allowance_gib"]
    assert "8B parameters x 16 bit" not in json.dumps(ev)


def test_with_max_model_len_unset_each_slot_holds_the_models_context(tmp_path: Path) -> None:
    """--ctx-size 0 with a split KV cache: llama.cpp's fit step takes the training context (131072, the
    GGUF's llama.context_length) x the slots (common/fit.cpp at b11434), 16 GiB a slot here."""
    _, models = placed_q4_0(tmp_path)
    found = h200_llamacpp(models, max_model_len=None)
    ev = found.evidence
    assert found.status == "pass", found.message
    assert (ev["slots"], ev["slot_tokens"], ev["kv_per_slot_gib"], ev["kv_all_slots_gib"]) == (4, 131072, 16.0, 64.0)
    assert ev["max_model_len_from"] == ("max_model_len not set: each slot holds the model's context "
                                        "(131,072 tokens; --ctx-size 0)")
    assert ev["context_tokens"] == 4 * 131072  # the server's KV cache, as status shows it beside its own


@pytest.mark.parametrize(("values", "slots", "tokens", "fix"), [
    # 120.02 GiB of KV budget: 7 slots of 16 GiB, or 8 slots of 15.0 GiB (122,880 tokens, a multiple of 256)
    ({"max_model_len": None, "concurrent_sequences": 8}, 8, 131072,
     "--set concurrent_sequences=7 (7 slots of 131,072 tokens) or --set max_model_len=122880 (8 slots of 122,880 tokens)"),
    ({"max_model_len": 65536, "concurrent_sequences": 16}, 16, 65536,
     "--set concurrent_sequences=15 (15 slots of 65,536 tokens) or --set max_model_len=61440 (16 slots of 61,440 tokens)"),
    ({"max_model_len": None, "concurrent_sequences": 64}, 64, 131072,
     "--set concurrent_sequences=7 (7 slots of 131,072 tokens) or --set max_model_len=15360 (64 slots of 15,360 tokens)"),
], ids=["8-slots-of-the-models-context", "16-slots-of-64k", "64-slots-of-the-models-context"])
def test_slots_that_do_not_all_fit_are_refused_naming_the_most_slots_and_the_longest_context(
        tmp_path: Path, values: dict[str, Any], slots: int, tokens: int, fix: str) -> None:
    """Every slot's KV cache is allocated at start: one more slot than fits fails the server, not one
    request. The fix names both ways out, each of which the same rule then passes."""
    _, models = placed_q4_0(tmp_path)
    found = h200_llamacpp(models, **values)
    ev = found.evidence
    assert found.status == "fail" and found.severity == "blocker", found.message
    assert (ev["slots"], ev["slot_tokens"]) == (slots, tokens)
    assert f"{slots} slots x {tokens:,} tokens need {ev['kv_all_slots_gib']:.1f} GiB of KV cache" in found.message
    assert found.fix == fix
    for way in fix.split(" or "):
        key, value = way.split()[1].split("=")
        assert h200_llamacpp(models, **{**values, key: int(value)}).status == "pass", way


def test_a_context_too_long_for_one_slot_names_only_the_length_that_fits(tmp_path: Path) -> None:
    _, models = placed_q4_0(tmp_path)
    found = h200_llamacpp(models, max_model_len=1_048_576)  # 128 GiB a slot, 120 GiB left
    assert found.status == "fail" and found.evidence["slots_that_fit"] == 0
    assert found.fix == "--set max_model_len=245760 (4 slots of 245,760 tokens)"  # 30 GiB a slot


def test_an_unmapped_architecture_keeps_the_files_size_and_says_why(tmp_path: Path) -> None:
    _, models = placed_q4_0(tmp_path)
    seen = dict(models[PLACED])
    seen["gguf"] = {**seen["gguf"], "metadata": {**seen["gguf"]["metadata"], "general.architecture": "rwkv7"}}
    found = h200_llamacpp({PLACED: seen})
    assert (found.status, found.severity) == ("fail", checks.INFO)  # the weights fit; the KV cache: unknown
    assert found.message.startswith("could not be judged: the KV cache was not estimated (the GGUF header of ")
    assert found.evidence["weights_from"] == "the GGUF file's size on the host"
    assert found.evidence["kv_cache"] == (f"not estimated: the GGUF header of {PLACED}: the GGUF architecture "
                                          f"'rwkv7' is not one whose KV cache is estimated "
                                          f"({', '.join(kvcache.GGUF_ARCHITECTURES)})")


def test_a_file_that_is_not_gguf_is_said(tmp_path: Path) -> None:
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"<html>not found</html>")
    found = h200_llamacpp({PLACED: probe.inspect({"models": [str(bogus)]})["models"][str(bogus)]})
    assert found.evidence["weights_from"].startswith("estimated from the name")  # nothing better is known
    assert f"{PLACED} is a file, not a model directory, and the GGUF header of {PLACED} on the host cannot be " \
        "read: not a GGUF file (it starts with b'<htm')" in found.message
