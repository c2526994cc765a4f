"""Will the model and its context fit? Weights, the KV cache for `max_model_len` and a stated allowance, per
GPU, from the model's config.json and the hub's file sizes (or, for a GGUF file placed by hand, its
header's metadata mapped to config.json's keys, config_from_gguf, and its size on the host). Pure: the
gate (memory.fits), the plan and status read it.

KV bytes per token on one GPU = 2 (K and V) x layers on that GPU x KV heads on that GPU x head_dim x the
KV dtype's bytes. Under tensor parallelism each GPU holds KV heads / TP of them (at least one: vLLM
replicates a KV head when there are fewer heads than GPUs); under pipeline parallelism the largest stage's
layers. Multi-head latent attention (DeepSeek V2/V3, Kimi K2) keeps one latent of kv_lora_rank +
qk_rope_head_dim per layer and token instead, the same on every TP rank. A sliding-window layer holds at
most its window per sequence; a linear-attention or state-space layer holds a fixed state per sequence,
which is not counted (the estimate says so).
"""
from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from provision import datafiles
from provision.context import EXPERT_KEYS, flag_value
from provision.errors import KvError

GIB = 2**30
# Per GPU, on top of weights and KV cache: the CUDA context and NCCL's buffers (about 0.5-1 GiB), the
# activations of one profiling forward pass of max_num_batched_tokens, and CUDA graphs. An allowance, not
# a measurement: `invoke status` shows the running server's own KV capacity beside this estimate.
RUNTIME_ALLOWANCE_BYTES = 2 * GIB
# Fewer full-length sequences than this at once and the server queues the fifth long conversation: the
# gate warns (a chat server on a workstation typically serves a handful of users).
MIN_CONCURRENT_SEQUENCES = 4

_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1,
                "fp8_e5m2": 1, "fp8_inc": 1, "fp8_ds_mla": 1}
_NO_KV_LAYERS = ("linear_attention", "mamba", "mamba2", "conv", "recurrent")
# What transformers' config classes assume where a config.json leaves a key out (Gemma3TextConfig: every
# sixth layer global, 128k positions); the model's own config.json is read through these.
_CONFIG_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {"sliding_window_pattern": 6, "max_position_embeddings": 131072},
}


@dataclass(frozen=True)
class ModelShape:
    """What the KV cache of a model depends on, read from its config.json."""

    model_type: str
    layers: int
    full_layers: int  # layers whose KV grows with the context
    sliding_layers: int  # layers that keep at most `sliding_window` tokens
    sliding_window: int | None
    kv_heads: int
    head_dim: int
    dtype: str  # the checkpoint's dtype as vLLM serves it ("auto": float32 checkpoints in 16 bit)
    mla_width: int | None  # kv_lora_rank + qk_rope_head_dim, for multi-head latent attention
    experts: int | None  # routed experts (MoE): weights only, the KV cache does not depend on them
    max_position_embeddings: int | None
    notes: tuple[str, ...] = ()  # where the figure is an estimate, and why

    @property
    def attention(self) -> str:
        if self.mla_width:
            return "MLA"
        if self.sliding_layers:
            return "sliding window" if not self.full_layers else "full + sliding window"
        return "GQA" if self.kv_heads > 1 else "MQA"


def _int(config: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def shape_of(config: Mapping[str, Any]) -> ModelShape:
    """config.json -> ModelShape. Multimodal configs keep the language model under "text_config"."""
    if not isinstance(config, Mapping):
        raise KvError("config.json is not a JSON object")
    nested = config.get("text_config")
    text: Mapping[str, Any] = nested if isinstance(nested, Mapping) else config
    text = {**_CONFIG_DEFAULTS.get(str(text.get("model_type")), {}), **text}
    layers = _int(text, "num_hidden_layers", "n_layer", "num_layers")
    heads = _int(text, "num_attention_heads", "n_head")
    if layers is None or heads is None:
        raise KvError("config.json names no num_hidden_layers or num_attention_heads")
    kv_heads = _int(text, "num_key_value_heads", "multi_query_group_num") or heads
    head_dim = _int(text, "head_dim")
    if head_dim is None:
        hidden = _int(text, "hidden_size", "n_embd")
        if hidden is None:
            raise KvError("config.json names neither head_dim nor hidden_size")
        head_dim = hidden // heads
    mla = None
    if _int(text, "kv_lora_rank"):
        mla = int(text["kv_lora_rank"]) + (_int(text, "qk_rope_head_dim") or 0)
    dtype = str(text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or config.get("dtype")
                or "bfloat16")
    full, sliding, window, notes = _layer_kinds(text, layers)
    experts = _int(text, *EXPERT_KEYS)
    return ModelShape(model_type=str(text.get("model_type") or config.get("model_type") or "?"), layers=layers,
                      full_layers=full, sliding_layers=sliding, sliding_window=window, kv_heads=kv_heads,
                      head_dim=head_dim, dtype=dtype, mla_width=mla, experts=experts,
                      max_position_embeddings=_int(text, "max_position_embeddings", "n_positions"),
                      notes=tuple(notes))


# GGUF architectures (general.architecture) whose llama.cpp KV cache is the plain one config.json's keys
# describe: every layer full attention, K and V of key_length (else embedding_length / head_count) per KV
# head. Others (sliding windows, per-layer head counts, MLA, state-space layers) are not mapped: the gate
# says the KV cache was not estimated, and why, rather than a wrong figure.
GGUF_ARCHITECTURES = ("llama", "mistral3", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "granite", "granitemoe",
                      "olmo2", "internlm2")
# llama.cpp keeps its KV cache in f16 whatever the weights' type (--cache-type-k/-v change it: not read).
GGUF_KV_DTYPE = "float16"


def config_from_gguf(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """A GGUF header's scalar metadata (host/gguf.py) -> the config.json keys shape_of reads:
    {"general.architecture": "llama", "llama.block_count": 32, "llama.attention.head_count_kv": 8, ...}
    -> {"model_type": "llama", "num_hidden_layers": 32, "num_key_value_heads": 8, ...}. KvError names
    what is missing, or the architecture it does not map."""
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise KvError("the GGUF header names no general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise KvError(f"the GGUF architecture {arch!r} is not one whose KV cache is estimated "
                      f"({', '.join(GGUF_ARCHITECTURES)})")

    def number(key: str) -> int | None:
        value = metadata.get(f"{arch}.{key}")
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    layers, heads, hidden = number("block_count"), number("attention.head_count"), number("embedding_length")
    if layers is None or heads is None:
        raise KvError(f"the GGUF header names no {arch}.block_count or {arch}.attention.head_count")
    key_length, value_length = number("attention.key_length"), number("attention.value_length")
    if key_length and value_length and key_length != value_length:
        raise KvError(f"the GGUF header's K and V widths differ ({key_length}, {value_length}): not estimated")
    config: dict[str, Any] = {"model_type": arch, "num_hidden_layers": layers, "num_attention_heads": heads,
                              "torch_dtype": GGUF_KV_DTYPE}
    mapped = {"hidden_size": hidden, "num_key_value_heads": number("attention.head_count_kv"),
              "head_dim": key_length or value_length, "max_position_embeddings": number("context_length"),
              "intermediate_size": number("feed_forward_length"), "num_experts": number("expert_count")}
    config.update({key: value for key, value in mapped.items() if value is not None})
    return config


def _layer_kinds(text: Mapping[str, Any], layers: int) -> tuple[int, int, int | None, list[str]]:
    """(full layers, sliding layers, window, notes) from layer_types, Gemma 3's pattern, Qwen 2's
    max_window_layers or a model-wide sliding_window."""
    window = _int(text, "sliding_window")
    types = text.get("layer_types")
    notes: list[str] = []
    if isinstance(types, list) and len(types) == layers:
        sliding = sum(1 for kind in types if kind == "sliding_attention")
        stateful = sum(1 for kind in types if kind in _NO_KV_LAYERS)
        if stateful:
            notes.append(f"{stateful} linear-attention/state-space layers keep a fixed state per sequence, "
                         "not counted")
        return layers - sliding - stateful, sliding, window if sliding else None, notes
    interval = _int(text, "full_attention_interval")
    if interval:  # Qwen3-Next: one full-attention layer in every `interval`, linear attention between
        full = layers // interval
        notes.append(f"{layers - full} linear-attention layers keep a fixed state per sequence, not counted")
        return full, 0, None, notes
    if window is None:
        return layers, 0, None, notes
    pattern = _int(text, "sliding_window_pattern")
    if pattern:  # Gemma 3: every pattern-th layer is global
        full = layers // pattern
        return full, layers - full, window, notes
    if str(text.get("model_type")) == "gemma2":  # local and global layers alternate
        return layers - layers // 2, layers // 2, window, notes
    if text.get("use_sliding_window") is False:  # Qwen 2 names a window it does not use
        return layers, 0, None, notes
    first_sliding = _int(text, "max_window_layers")
    if text.get("use_sliding_window") is True and first_sliding is not None and first_sliding < layers:
        return first_sliding, layers - first_sliding, window, notes
    if window >= (_int(text, "max_position_embeddings") or window + 1):
        return layers, 0, None, notes  # a window as long as the context is no window
    notes.append("sliding_window without a per-layer list: every layer taken as windowed (Mistral 7B v0.1)")
    return 0, layers, window, notes


def kv_dtype(shape: ModelShape, args: Sequence[str] = ()) -> tuple[str, int]:
    """The KV cache's dtype and bytes: --kv-cache-dtype where given (fp8 variants: 1 byte), else the
    served dtype: --dtype, else the checkpoint's, float32 checkpoints served in 16 bit (vLLM's "auto")."""
    cache = (flag_value(args, "--kv-cache-dtype") or "auto").lower()
    if cache != "auto":
        return cache, _DTYPE_BYTES.get(cache, 1 if cache.startswith("fp8") else 2)
    served = (flag_value(args, "--dtype") or "auto").lower()
    if served == "auto":
        served = "bfloat16" if shape.dtype in ("float32", "float") else shape.dtype
    return served, _DTYPE_BYTES.get(served, 2)


@dataclass(frozen=True)
class Estimate:
    """One GPU's memory under this model, parallelism and context length. Bytes unless named otherwise."""

    budget: int  # what vLLM may take on this GPU (gpu_memory_utilization of it, or the unified-memory rule)
    weights: int  # this GPU's share of the weights
    allowance: int  # RUNTIME_ALLOWANCE_BYTES (0 where the KV space is set apart, as on vLLM's CPU build)
    kv_dtype: str
    kv_per_token: int  # every KV layer on this GPU as if full
    max_model_len: int
    kv_per_sequence: int  # one sequence of max_model_len (sliding layers bounded by their window)
    notes: tuple[str, ...] = ()

    @property
    def kv_budget(self) -> int:
        return self.budget - self.weights - self.allowance

    @property
    def fits(self) -> bool:
        return self.kv_budget >= self.kv_per_sequence

    @property
    def concurrent_sequences(self) -> float:
        return self.kv_budget / self.kv_per_sequence if self.kv_per_sequence else math.inf

    @property
    def context_tokens(self) -> int:
        """Tokens of KV the rest holds, every KV layer counted as full: what vLLM's blocks x block size
        give (its own "KV cache size" log line rounds to whole requests of max_model_len)."""
        return max(0, self.kv_budget) // self.kv_per_token if self.kv_per_token else 0

    def as_evidence(self) -> dict[str, Any]:
        return {"budget_gib": round(self.budget / GIB, 2), "weights_gib": round(self.weights / GIB, 2),
                "allowance_gib": round(self.allowance / GIB, 2), "kv_budget_gib": round(self.kv_budget / GIB, 2),
                "kv_dtype": self.kv_dtype, "kv_bytes_per_token": self.kv_per_token,
                "max_model_len": self.max_model_len,
                "kv_per_sequence_gib": round(self.kv_per_sequence / GIB, 3),
                "context_tokens": self.context_tokens,
                "concurrent_sequences": round(self.concurrent_sequences, 2), "notes": list(self.notes)}


@dataclass(frozen=True)
class Layout:
    """How one model is spread: tensor and pipeline parallel sizes."""

    tensor_parallel: int = 1
    pipeline_parallel: int = 1


def per_layer_token_bytes(shape: ModelShape, layout: Layout, kv_bytes: int) -> int:
    if shape.mla_width:
        return shape.mla_width * kv_bytes  # one latent per token, every TP rank holds all of it
    heads = max(1, shape.kv_heads // layout.tensor_parallel)
    return 2 * heads * shape.head_dim * kv_bytes


def _stage_layers(count: int, layout: Layout) -> int:
    return math.ceil(count / layout.pipeline_parallel)


def sequence_bytes(shape: ModelShape, layout: Layout, kv_bytes: int, tokens: int) -> int:
    """KV bytes one sequence of `tokens` takes on one GPU."""
    per_layer = per_layer_token_bytes(shape, layout, kv_bytes)
    window = min(tokens, shape.sliding_window or tokens)
    return per_layer * (_stage_layers(shape.full_layers, layout) * tokens
                        + _stage_layers(shape.sliding_layers, layout) * window)


def estimate(shape: ModelShape, layout: Layout, *, weights_total: int, budget: int, max_model_len: int,
             args: Sequence[str] = (), allowance: int = RUNTIME_ALLOWANCE_BYTES) -> Estimate:
    dtype, kv_bytes = kv_dtype(shape, args)
    per_layer = per_layer_token_bytes(shape, layout, kv_bytes)
    kv_layers = _stage_layers(shape.full_layers, layout) + _stage_layers(shape.sliding_layers, layout)
    return Estimate(budget=budget, weights=weights_total // (layout.tensor_parallel * layout.pipeline_parallel),
                    allowance=allowance, kv_dtype=dtype, kv_per_token=per_layer * kv_layers,
                    max_model_len=max_model_len,
                    kv_per_sequence=sequence_bytes(shape, layout, kv_bytes, max_model_len), notes=shape.notes)


def largest_context(shape: ModelShape, layout: Layout, kv_bytes: int, kv_budget: int, step: int = 256) -> int:
    """The largest max_model_len (a multiple of `step`) whose one sequence fits in `kv_budget`; 0 if none."""
    if kv_budget <= 0:
        return 0
    low, high = 0, max(step, kv_budget // max(1, per_layer_token_bytes(shape, layout, kv_bytes)) + step)
    while high - low > 1:  # sequence_bytes grows with tokens: bisect on it
        middle = (low + high) // 2
        if sequence_bytes(shape, layout, kv_bytes, middle) <= kv_budget:
            low = middle
        else:
            high = middle
    return low // step * step


# ---------------------------------------------------------------------------------------------
# The shapes the package ships: starter_models.yaml, read by `init` (its suggestions) and by the gate
# (memory.fits, where neither the host nor the hub gave the model's config.json), so the two agree.

MODELS_FILE = "starter_models.yaml"


@dataclass(frozen=True)
class KnownModel:
    model: str
    contexts: tuple[int, ...]  # max_model_len values `init` tries, longest first
    config: Mapping[str, Any]  # the config.json keys the KV estimate reads
    source: str  # where that config.json is published


@functools.cache
def known_models() -> tuple[KnownModel, ...]:
    """starter_models.yaml (package data); every entry must say where it comes from."""
    text = (resources.files("provision") / MODELS_FILE).read_text(encoding="utf-8")
    data = datafiles.load(text)
    models = []
    for entry in data["models"]:
        if not entry.get("source") or not entry.get("verified"):
            raise ValueError(f"{MODELS_FILE}: {entry.get('model')} lacks its source or how it was verified")
        models.append(KnownModel(str(entry["model"]), tuple(int(n) for n in entry["contexts"]),
                                 dict(entry["config"]), str(entry["source"])))
    return tuple(models)


def known_model(model: str | None) -> KnownModel | None:
    """The shipped shape of `model` (a hub repository id, as the inventory names it), or None."""
    return next((known for known in known_models() if known.model == model), None)
