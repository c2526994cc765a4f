"""A tiny random Llama, made on the spot, so the lab serves a real model with vLLM's CPU build.

Random weights in safetensors (numpy, no torch needed on the controller) and a word-level tokenizer
built with `tokenizers`: about 1 MB. head_dim 64, since the CPU attention backend refuses 16.
It answers nonsense, quickly: what the lab needs to prove the server, health, completions and metrics.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WORDS = [
    "the", "a", "an", "and", "or", "of", "to", "in", "on", "for", "with", "is", "are", "was", "be",
    "it", "this", "that", "we", "you", "they", "he", "she", "model", "server", "node", "cluster",
    "gpu", "cpu", "memory", "token", "cache", "prefix", "batch", "request", "reply", "fast",
    "slow", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "red",
    "green", "blue", "black", "white", "hot", "cold", "run", "walk", "read", "write", "open",
    "close", "start", "stop", "up", "down", "left", "right", "yes", "no", "hello", "world"
]
SPECIAL = ["<unk>", "<s>", "</s>"]
CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
    "head_dim": 64, "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "float32",
    "bos_token_id": 1, "eos_token_id": 2,
}


def vocabulary() -> dict[str, int]:
    return {token: index for index, token in enumerate(SPECIAL + list(dict.fromkeys(WORDS)))}


def model_config() -> dict[str, Any]:
    """The tiny Llama's config.json."""
    return {**CONFIG, "vocab_size": len(vocabulary())}


def make(directory: Path, seed: int = 0) -> Path:
    """Write config.json, model.safetensors and the tokenizer files into `directory`."""
    import numpy as np
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers

    directory.mkdir(parents=True, exist_ok=True)
    vocab = vocabulary()
    config = model_config()
    hidden, inter, heads, kv = config["hidden_size"], config["intermediate_size"], 4, 2
    head_dim = config["head_dim"]
    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    tensors = {"model.embed_tokens.weight": weight(len(vocab), hidden),
               "model.norm.weight": np.ones(hidden, np.float32), "lm_head.weight": weight(len(vocab), hidden)}
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}"
        tensors.update({
            f"{prefix}.self_attn.q_proj.weight": weight(heads * head_dim, hidden),
            f"{prefix}.self_attn.k_proj.weight": weight(kv * head_dim, hidden),
            f"{prefix}.self_attn.v_proj.weight": weight(kv * head_dim, hidden),
            f"{prefix}.self_attn.o_proj.weight": weight(hidden, heads * head_dim),
            f"{prefix}.mlp.gate_proj.weight": weight(inter, hidden),
            f"{prefix}.mlp.up_proj.weight": weight(inter, hidden),
            f"{prefix}.mlp.down_proj.weight": weight(hidden, inter),
            f"{prefix}.input_layernorm.weight": np.ones(hidden, np.float32),
            f"{prefix}.post_attention_layernorm.weight": np.ones(hidden, np.float32),
        })
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    (directory / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": 512, "clean_up_tokenization_spaces": False,
        # A chat model's template, as every served chat model has (vLLM answers /v1/chat/completions only
        # with one): the messages' texts, one a line.
        "chat_template": CHAT_TEMPLATE}))
    (directory / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
    for path in directory.iterdir():
        path.chmod(0o644)  # safetensors writes 0600; the service user must read the weights
    return directory


CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}\n{% endfor %}"
AWQ_CONFIG: dict[str, Any] = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
                              "version": "gemm", "modules_to_not_convert": None}


def make_awq(directory: Path, seed: int = 1) -> Path:
    """A repository shaped like an AWQ checkpoint: the tiny Llama's config with a quantization_config,
    and each linear layer as AutoAWQ's GEMM layout stores it (qweight/qzeros int32 holding eight 4-bit
    values, float16 scales per group of 128 inputs)."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    make(directory, seed)
    dense = load_file(str(directory / "model.safetensors"))
    rng = np.random.default_rng(seed)
    packed: dict[str, np.ndarray] = {}
    for name, tensor in dense.items():
        if name.startswith("model.layers.") and name.endswith("_proj.weight"):
            out_features, in_features = tensor.shape
            base = name[: -len(".weight")]
            groups = max(1, in_features // AWQ_CONFIG["group_size"])
            packed[f"{base}.qweight"] = rng.integers(0, 2**31, (in_features, out_features // 8), dtype=np.int32)
            packed[f"{base}.qzeros"] = rng.integers(0, 2**31, (groups, out_features // 8), dtype=np.int32)
            packed[f"{base}.scales"] = (rng.random((groups, out_features)) * 0.01).astype(np.float16)
        else:
            packed[name] = tensor.astype(np.float16)
    save_file(packed, str(directory / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((directory / "config.json").read_text())
    config.update(torch_dtype="float16", quantization_config=AWQ_CONFIG)
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    (directory / "quant_config.json").write_text(json.dumps(AWQ_CONFIG))
    for path in directory.iterdir():
        path.chmod(0o644)
    return directory


def make_gguf(directory: Path, seed: int = 2, context: int = 256) -> Path:
    """A tiny random Llama as one GGUF file (llama.cpp's format), written with the `gguf` package.

    The SentencePiece vocabulary has every byte token (any prompt tokenizes) and the lab's words. A
    constant component of the residual stream (dimension 0: set in every embedding, written by no layer)
    meets an output row that is negative for bytes and specials and positive for words, so the model only
    ever says words: a random byte would be invalid UTF-8, which llama-server refuses to send.
    """
    import gguf
    import numpy as np

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    hidden, inter, layers, heads, kv_heads = 64, 128, 2, 4, 2
    head_dim = hidden // heads
    specials = ["<unk>", "<s>", "</s>"]
    byte_tokens = [f"<0x{value:02X}>" for value in range(256)]
    words = ["\u2581" + word for word in dict.fromkeys(WORDS)]
    tokens = specials + byte_tokens + words
    not_words = len(specials) + len(byte_tokens)

    def weights(*shape: int) -> Any:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    writer = gguf.GGUFWriter(str(directory / "tiny-llama-f32.gguf"), "llama")
    writer.add_name("tiny-llama-gguf")
    writer.add_context_length(context)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(inter)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(0)  # all F32
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * not_words + [-float(index) for index in range(len(words))])
    writer.add_token_types([2, 3, 3] + [6] * len(byte_tokens) + [1] * len(words))  # unknown, control, byte, normal
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    embedding = weights(len(tokens), hidden)
    embedding[:, 0] = 10.0
    output = weights(len(tokens), hidden)
    output[:not_words, 0], output[not_words:, 0] = -5.0, 1.0
    writer.add_tensor("token_embd.weight", embedding)
    writer.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    writer.add_tensor("output.weight", output)
    for block in range(layers):
        attention_out, ffn_down = weights(hidden, hidden), weights(hidden, inter)
        attention_out[0, :], ffn_down[0, :] = 0.0, 0.0  # no layer writes dimension 0
        for name, tensor in (("attn_norm", np.ones(hidden, np.float32)), ("ffn_norm", np.ones(hidden, np.float32)),
                             ("attn_q", weights(hidden, hidden)), ("attn_k", weights(kv_heads * head_dim, hidden)),
                             ("attn_v", weights(kv_heads * head_dim, hidden)), ("attn_output", attention_out),
                             ("ffn_gate", weights(inter, hidden)), ("ffn_up", weights(inter, hidden)),
                             ("ffn_down", ffn_down)):
            writer.add_tensor(f"blk.{block}.{name}.weight", tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    (directory / "README.md").write_text("A tiny random Llama in GGUF, made by the lab for llama.cpp's server.\n")
    return directory


def make_gguf_long(directory: Path) -> Path:
    """tiny-gguf's weights trained (by its header) for 2,048 tokens: room for multi-turn chats, whose
    template costs about a token a character in this vocabulary (benchmarks/affinity.py in the lab)."""
    made = make_gguf(directory, seed=2, context=2048)
    (made / "README.md").write_text("A tiny random Llama in GGUF with a 2,048-token context, made by the lab.\n")
    return made


def make_gguf_b(directory: Path) -> Path:
    """A second tiny GGUF (other random weights): the second model beside the first on one lab host."""
    made = make_gguf(directory, seed=3)
    (made / "README.md").write_text("A second tiny random Llama in GGUF, made by the lab for llama.cpp's server.\n")
    return made


@dataclass(frozen=True)
class GgufShape:
    """The shape of a Llama-architecture model: what its compute per token and its memory depend on."""

    name: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int
    context: int
    rope_base: float = 10000.0


# Llama-3.1-8B's shape (its config.json on the hub: 32 layers, hidden 4096, intermediate 14336, 32 heads,
# 8 KV heads, vocabulary 128256, 131072 positions, rope_theta 500000): 8.03 B parameters.
# llama-tiny: the same architecture at a size a unit test writes in milliseconds (head_dim 64; every
# linear layer's input a multiple of AWQ's group of 128, every output a multiple of 8).
SHAPES = {"llama-3.1-8b": GgufShape("llama-3.1-8b", 32, 4096, 14336, 32, 8, 128256, 131072, 500000.0),
          "llama-tiny": GgufShape("llama-tiny", 2, 256, 512, 4, 2, 1000, 1024, 500000.0)}
# The file types a shaped model is written in (llama.cpp's LLAMA_FTYPE numbers): every matrix in F16; or
# Q4_0 matrices with the output matrix in Q6_K, as llama-quantize's Q4_0 writes them (its size is then
# the 4.33 GiB published llama.cpp benchmarks name for "llama 8B Q4_0"). Norms stay F32.
FILE_TYPES = {"f16": 1, "q4_0": 2}


def make_shaped_gguf(directory: Path, shape: GgufShape, file_type: str, seed: int = 4) -> Path:
    """A GGUF file of `shape` with random weights, written tensor by tensor (an 8B model in F16 is 15 GiB:
    never held in memory whole). Its text is noise; its compute per token is the real shape's, so the
    throughput it is served at is a real figure for that shape.

    The vocabulary (SentencePiece, no byte tokens) has the lab's words, every printable ASCII character
    alone and after a word boundary, then filler words up to the shape's size: any ASCII prompt
    tokenizes, and every token the model says is valid UTF-8. Quantized blocks are random bytes with a
    fixed small scale (valid blocks of the type, values of about the size a trained model's have)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    path = directory / f"{shape.name}-random-{file_type}.gguf"
    partial = path.with_name(path.name + ".partial")  # renamed once whole: a file half written is no model
    writer, plan = _shaped_header(partial, shape, file_type)
    noise = (rng.standard_normal(1 << 22) * 0.02).astype(np.float16)
    for _name, rows, columns, kind in plan:
        writer.write_tensor_data(_random_tensor(rng, noise, rows, columns, kind))
    writer.close()
    partial.chmod(0o644)
    partial.rename(path)
    return path


def make_shaped_header(directory: Path, shape: GgufShape, file_type: str) -> Path:
    """What make_shaped_gguf writes, less the tensor data: the same header (metadata, tokenizer, tensor
    infos), the file then extended, sparse, to the size the whole file has. A stand-in of an 8B
    model's file in a test's temporary directory: readers of the header and of the size see the real
    ones, and no disk is spent on weights."""
    path = directory / f"{shape.name}-header-{file_type}.gguf"
    writer, plan = _shaped_header(path, shape, file_type)
    writer.close()
    import gguf

    align = writer.data_alignment
    data = sum(gguf.GGUFWriter.ggml_pad(_tensor_bytes(rows, columns, kind), align)
               for _name, rows, columns, kind in plan)
    os.truncate(path, gguf.GGUFWriter.ggml_pad(path.stat().st_size, align) + data)
    return path


def _tensor_bytes(rows: int, columns: int, kind: str) -> int:
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    return max(rows, 1) * columns // block * size


def _shaped_header(path: Path, shape: GgufShape, file_type: str) -> tuple[Any, list[tuple[str, int, int, str]]]:
    """A GGUFWriter at `path` with the shape's metadata, tokenizer and tensor infos written: (writer, the
    tensors it awaits, in order)."""
    import gguf
    import numpy as np

    if file_type not in FILE_TYPES:
        raise ValueError(f"file type {file_type!r}: one of {', '.join(FILE_TYPES)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tokens = _shaped_vocabulary(shape.vocab)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"{shape.name} shape, random weights")
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(shape.hidden // shape.heads)
    writer.add_rope_freq_base(shape.rope_base)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(shape.vocab)
    writer.add_file_type(FILE_TYPES[file_type])
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * 3 + [-float(index) for index in range(len(tokens) - 3)])
    writer.add_token_types([2, 3, 3] + [1] * (len(tokens) - 3))  # unknown, control, control, normal...
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    plan = _shaped_tensors(shape, file_type)
    for name, rows, columns, kind in plan:
        shape_of = (rows, columns) if rows else (columns,)
        writer.add_tensor_info(name, shape_of, np.dtype(np.float32 if kind == "F32" else np.float16),
                               _tensor_bytes(rows, columns, kind), raw_dtype=gguf.GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    return writer, plan


def _shaped_vocabulary(size: int) -> list[str]:
    characters = [chr(code) for code in range(33, 127)]
    known = ["<unk>", "<s>", "</s>", "\u2581", *("\u2581" + word for word in dict.fromkeys(WORDS)),
             *characters, *("\u2581" + character for character in characters)]
    known = list(dict.fromkeys(known))
    return known + [f"\u2581w{index}" for index in range(size - len(known))]


def _shaped_tensors(shape: GgufShape, file_type: str) -> list[tuple[str, int, int, str]]:
    """(name, rows, columns, ggml type) in llama.cpp's names; rows 0 for a vector."""
    matrix = "F16" if file_type == "f16" else "Q4_0"
    output = "F16" if file_type == "f16" else "Q6_K"
    head_dim = shape.hidden // shape.heads
    tensors = [("token_embd.weight", shape.vocab, shape.hidden, matrix), ("output_norm.weight", 0, shape.hidden, "F32"),
               ("output.weight", shape.vocab, shape.hidden, output)]
    for block in range(shape.layers):
        prefix = f"blk.{block}."
        tensors += [(prefix + "attn_norm.weight", 0, shape.hidden, "F32"),
                    (prefix + "ffn_norm.weight", 0, shape.hidden, "F32"),
                    (prefix + "attn_q.weight", shape.hidden, shape.hidden, matrix),
                    (prefix + "attn_k.weight", shape.kv_heads * head_dim, shape.hidden, matrix),
                    (prefix + "attn_v.weight", shape.kv_heads * head_dim, shape.hidden, matrix),
                    (prefix + "attn_output.weight", shape.hidden, shape.hidden, matrix),
                    (prefix + "ffn_gate.weight", shape.ffn, shape.hidden, matrix),
                    (prefix + "ffn_up.weight", shape.ffn, shape.hidden, matrix),
                    (prefix + "ffn_down.weight", shape.hidden, shape.ffn, matrix)]
    return tensors


def _random_tensor(rng: Any, noise: Any, rows: int, columns: int, kind: str) -> Any:
    """One tensor's bytes: ones for a norm, a random window of `noise` for F16, random blocks for Q4_0 and
    Q6_K with their scale fields set (Q4_0: f16 d first, then 16 bytes of 4-bit values, one block per 32
    weights; Q6_K: 128 + 64 bytes of 6-bit values, 16 int8 sub-scales, f16 d last, one per 256)."""
    import numpy as np

    if kind == "F32":
        return np.ones(columns, np.float32)
    count = rows * columns
    if kind == "F16":
        start = int(rng.integers(0, noise.size))
        return np.resize(np.roll(noise, -start), count).reshape(rows, columns)
    if kind == "Q4_0":
        blocks = rng.integers(0, 256, (count // 32, 18), dtype=np.uint8)
        blocks[:, 0:2] = np.frombuffer(np.float16(0.0025).tobytes(), np.uint8)
    else:  # Q6_K
        blocks = rng.integers(0, 256, (count // 256, 210), dtype=np.uint8)
        blocks[:, 192:208] = 8
        blocks[:, 208:210] = np.frombuffer(np.float16(0.02 / (8 * 18)).tobytes(), np.uint8)
    return blocks.reshape(rows, -1)


# The forms a shaped Hugging Face repository is written in: bf16, as Meta publishes Llama-3.1-8B; awq,
# each decoder layer's linear layers 4-bit in AutoAWQ's GEMM layout, everything else float16, as
# AutoAWQ writes its checkpoints.
REPO_FORMS = ("bf16", "awq")
# save_pretrained's default max_shard_size, "5GB": 5 * 10**9 bytes of tensor data a shard.
SHARD_BYTES = 5 * 10**9
# Llama-3.1's rope_scaling (its config.json on the hub): frequencies stretched for 131072 positions.
LLAMA3_ROPE_SCALING: dict[str, Any] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
_ITEM_BYTES = {"I32": 4, "BF16": 2, "F16": 2}
# safetensors writes a file's tensors by dtype (its Dtype enum, last first: I32, BF16, F16), then by name.
_DTYPE_ORDER = {"I32": 0, "BF16": 1, "F16": 2}
_ONE_BITS = {"BF16": 0x3F80, "F16": 0x3C00}  # 1.0 in each 16-bit float
_DENSE_STD = 0.02  # Llama's initializer_range
Tensors = list[tuple[str, tuple[int, ...], str]]  # (name, shape, safetensors dtype)


def _linear_layers(shape: GgufShape) -> list[tuple[str, int, int]]:
    """(module, in_features, out_features) of one decoder layer, in a Llama's state-dict order."""
    head_dim = shape.hidden // shape.heads
    return [("self_attn.q_proj", shape.hidden, shape.heads * head_dim),
            ("self_attn.k_proj", shape.hidden, shape.kv_heads * head_dim),
            ("self_attn.v_proj", shape.hidden, shape.kv_heads * head_dim),
            ("self_attn.o_proj", shape.heads * head_dim, shape.hidden),
            ("mlp.gate_proj", shape.hidden, shape.ffn), ("mlp.up_proj", shape.hidden, shape.ffn),
            ("mlp.down_proj", shape.ffn, shape.hidden)]


def _repo_tensors(shape: GgufShape, form: str) -> Tensors:
    """(name, shape, safetensors dtype) of every tensor, in the order save_pretrained meets them.

    awq: each linear layer as AutoAWQ's WQLinear_GEMM stores it, and as vLLM's AWQ linear method
    (AutoAWQLinearMethod.create_weights) allocates it to load into: qweight int32 [in, out / 8] (eight
    4-bit weights of one input along the outputs), qzeros int32 [in / 128, out / 8] (eight 4-bit zero
    points), scales float16 [in / 128, out]."""
    if form not in REPO_FORMS:
        raise ValueError(f"form {form!r}: one of {', '.join(REPO_FORMS)}")
    floats = "BF16" if form == "bf16" else "F16"
    group, pack = int(AWQ_CONFIG["group_size"]), 32 // int(AWQ_CONFIG["bits"])
    tensors: Tensors = [("model.embed_tokens.weight", (shape.vocab, shape.hidden), floats)]
    for layer in range(shape.layers):
        prefix = f"model.layers.{layer}."
        for module, inputs, outputs in _linear_layers(shape):
            if form == "bf16":
                tensors.append((f"{prefix}{module}.weight", (outputs, inputs), floats))
                continue
            if inputs % group or outputs % pack:
                raise ValueError(f"{shape.name}: {module} is {inputs} x {outputs}; AWQ needs inputs a multiple "
                                 f"of {group} and outputs a multiple of {pack}")
            tensors += [(f"{prefix}{module}.qweight", (inputs, outputs // pack), "I32"),
                        (f"{prefix}{module}.qzeros", (inputs // group, outputs // pack), "I32"),
                        (f"{prefix}{module}.scales", (inputs // group, outputs), "F16")]
        tensors += [(f"{prefix}input_layernorm.weight", (shape.hidden,), floats),
                    (f"{prefix}post_attention_layernorm.weight", (shape.hidden,), floats)]
    return tensors + [("model.norm.weight", (shape.hidden,), floats),
                      ("lm_head.weight", (shape.vocab, shape.hidden), floats)]


def _nbytes(shape: tuple[int, ...], dtype: str) -> int:
    count = 1
    for size in shape:
        count *= size
    return count * _ITEM_BYTES[dtype]


def _shards(tensors: Tensors, limit: int) -> list[Tensors]:
    """The tensors split as huggingface_hub's split_torch_state_dict_into_shards splits a state dict (what
    save_pretrained calls): in order, a new shard when the next tensor would take this one past `limit`;
    a tensor larger than `limit` alone in its own."""
    shards: list[Tensors] = []
    current: Tensors = []
    current_bytes = 0
    for tensor in tensors:
        size = _nbytes(tensor[1], tensor[2])
        if size > limit:
            shards.append([tensor])
            continue
        if current_bytes + size > limit:
            shards.append(current)
            current, current_bytes = [], 0
        current.append(tensor)
        current_bytes += size
    if current:
        shards.append(current)
    return shards


def shaped_config(shape: GgufShape, form: str) -> dict[str, Any]:
    """The config.json of a shaped repository: Llama-3.1-8B's (its keys and rope scaling) with the shape's
    sizes; awq adds the quantization_config AutoAWQ writes."""
    if form not in REPO_FORMS:
        raise ValueError(f"form {form!r}: one of {', '.join(REPO_FORMS)}")
    # Llama-3.1's scaling; a shorter shape's pre-extension length kept under its own (transformers warns
    # otherwise), 8192 for the 8B shape's 131072
    rope_scaling = {**LLAMA3_ROPE_SCALING, "original_max_position_embeddings": min(
        LLAMA3_ROPE_SCALING["original_max_position_embeddings"], shape.context // 8)}
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
        "attention_dropout": 0.0, "mlp_bias": False, "hidden_act": "silu", "initializer_range": _DENSE_STD,
        "hidden_size": shape.hidden, "intermediate_size": shape.ffn, "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads, "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.hidden // shape.heads, "vocab_size": shape.vocab,
        "max_position_embeddings": shape.context, "rope_theta": shape.rope_base,
        "rope_scaling": rope_scaling, "rms_norm_eps": 1e-5, "pretraining_tp": 1,
        "tie_word_embeddings": False, "use_cache": True, "bos_token_id": 1, "eos_token_id": 2,
        "torch_dtype": "bfloat16" if form == "bf16" else "float16"}
    if form == "awq":
        config["quantization_config"] = dict(AWQ_CONFIG)
    return config


class _Noise:
    """Random tensor bytes, a chunk at a time (no tensor is ever whole in memory).

    On a CUDA GPU (NVIDIA's driver there, torch importable and a device present) dense weights and
    packed 4-bit weights are drawn there with torch. Otherwise with numpy, the way make_shaped_gguf
    draws F16 tensors: a dense tensor is a run through a buffer of normal noise from a random start
    (numpy's normal draws are about ten times slower than copying, and torch's on a CPU no faster),
    packed weights random words. The same seed gives other values on a GPU than without one.

    Values: dense weights normal, std 0.02; norms 1. AWQ weights w = (q - z) * s: q uniform in 0..15,
    zero points z 7 or 8 at random (centred on q's mean 7.5), scales s uniform in [0.5, 1.5) /
    (8 sqrt(in_features)), so w has a standard deviation of about 0.58 / sqrt(in_features) and a
    linear layer keeps its input's size: with norms of ones, 32 layers stay far inside float16's range."""

    CHUNK = 1 << 25  # elements drawn at once
    WINDOW = (1 << 22) + 7  # numpy's noise buffer: not a multiple of a row, so rows do not repeat in step

    def __init__(self, seed: int) -> None:
        import numpy as np

        self.np = np
        self.rng = np.random.default_rng(seed)
        self.windows: dict[str, Any] = {}
        self.torch: Any = None
        if not any(Path(path).exists() for path in ("/dev/nvidiactl", "/proc/driver/nvidia")):
            return  # no NVIDIA driver, no CUDA device: spare torch's import (seconds)
        try:
            import torch
        except ImportError:
            return
        if torch.cuda.is_available():
            self.torch = torch
            self.generator = torch.Generator(device="cuda")
            self.generator.manual_seed(seed)

    def chunks(self, name: str, shape: tuple[int, ...], dtype: str) -> Iterator[Any]:
        """The tensor's bytes in order, as arrays (each a buffer a file's write takes)."""
        np = self.np
        count = _nbytes(shape, dtype) // _ITEM_BYTES[dtype]
        spans = [(start, min(self.CHUNK, count - start)) for start in range(0, count, self.CHUNK)]
        if name.endswith("norm.weight"):
            yield np.full(count, _ONE_BITS[dtype], np.uint16)
        elif name.endswith(".qzeros"):
            for _start, size in spans:  # each 4-bit field 7 + (0 or 1): no carry between fields
                yield np.uint32(0x77777777) + (self.rng.integers(0, 1 << 32, size, dtype=np.uint32)
                                               & np.uint32(0x11111111))
        elif name.endswith(".scales"):
            base = 1.0 / (8.0 * (shape[0] * int(AWQ_CONFIG["group_size"])) ** 0.5)
            for _start, size in spans:
                yield (base * (0.5 + self.rng.random(size, dtype=np.float32))).astype(np.float16)
        elif name.endswith(".qweight"):
            for _start, size in spans:
                if self.torch is not None:
                    words = self.torch.empty(size * 4, dtype=self.torch.uint8, device="cuda")
                    yield words.random_(generator=self.generator).cpu().numpy()
                else:
                    yield self.rng.integers(0, 1 << 32, size, dtype=np.uint32)
        elif self.torch is not None:
            torch = self.torch
            kind = torch.bfloat16 if dtype == "BF16" else torch.float16
            for _start, size in spans:
                values = torch.randn(size, dtype=kind, device="cuda", generator=self.generator).mul_(_DENSE_STD)
                yield values.cpu().view(torch.int16).numpy()
        else:
            window = self._window(dtype)
            at, left = int(self.rng.integers(0, window.size)), count
            while left:
                size = min(left, window.size - at)
                yield window[at:at + size]
                at, left = 0, left - size

    def _window(self, dtype: str) -> Any:
        if dtype not in self.windows:
            np = self.np
            noise = self.rng.standard_normal(self.WINDOW, dtype=np.float32) * np.float32(_DENSE_STD)
            # bfloat16: a float32's upper half
            self.windows[dtype] = ((noise.view(np.uint32) >> 16).astype(np.uint16) if dtype == "BF16"
                                   else noise.astype(np.float16))
        return self.windows[dtype]


def _safetensors_header(tensors: Tensors) -> tuple[bytes, Tensors]:
    """A safetensors file's first bytes for `tensors`, byte for byte as the safetensors package writes them
    (the header's length, then its JSON without spaces, padded with spaces to 8 bytes; tensors by dtype,
    then name), and the tensors in the order their data follows."""
    ordered = sorted(tensors, key=lambda tensor: (_DTYPE_ORDER[tensor[2]], tensor[0]))
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape, dtype in ordered:
        size = _nbytes(shape, dtype)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text, ordered


def _write_safetensors(path: Path, tensors: Tensors, noise: _Noise) -> None:
    """One safetensors file, its data streamed from `noise`."""
    header, ordered = _safetensors_header(tensors)
    with open(path, "wb") as handle:
        handle.write(header)
        for name, shape, dtype in ordered:
            written = 0
            for chunk in noise.chunks(name, shape, dtype):
                handle.write(chunk)
                written += chunk.nbytes
            if written != _nbytes(shape, dtype):
                raise AssertionError(f"{name}: {written} bytes written, {_nbytes(shape, dtype)} planned")


def _write_shaped_tokenizer(directory: Path, shape: GgufShape) -> None:
    """tokenizer.json (a WordLevel model over _shaped_vocabulary: the shape's vocabulary size, SentencePiece's
    word-boundary mark, punctuation split off, <s> put first as Llama's tokenizer does) and its configs."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    tokens = _shaped_vocabulary(shape.vocab)
    tokenizer = Tokenizer(models.WordLevel(vocab={token: index for index, token in enumerate(tokens)},
                                           unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True),
        pre_tokenizers.Punctuation()])
    tokenizer.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIAL])
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                             special_tokens=[("<s>", 1)])
    tokenizer.save(str(directory / "tokenizer.json"))
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    added = {str(index): {"content": token, "lstrip": False, "normalized": False, "rstrip": False,
                          "single_word": False, "special": True} for index, token in enumerate(SPECIAL)}
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", **special, "added_tokens_decoder": added,
        "model_max_length": shape.context, "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE}, indent=2) + "\n")
    (directory / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def make_shaped_repo(directory: Path, shape: GgufShape, form: str, seed: int = 4,
                     shard_bytes: int = SHARD_BYTES) -> Path:
    """A Hugging Face repository of `shape` with random weights, as `DIRECTORY/<shape>-random-<form>`:
    config.json, generation_config.json, the weights as save_pretrained shards them (several shards:
    model-0000X-of-0000N.safetensors and model.safetensors.index.json; one: model.safetensors) and a
    tokenizer of the shape's vocabulary size. Its text is noise; its compute per token is the shape's.

    form: bf16 (as Meta publishes Llama-3.1-8B: 16.06 GB for that shape) or awq (AutoAWQ's 4-bit GEMM
    checkpoint: 5.73 GB). Written a chunk at a time into `<name>.partial`, renamed once whole (a
    repository made before under the name is replaced); every file 0644, for a service user."""
    import shutil

    tensors = _repo_tensors(shape, form)
    path = directory / f"{shape.name}-random-{form}"
    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    noise = _Noise(seed)
    shards = _shards(tensors, shard_bytes)
    weight_map: dict[str, str] = {}
    for number, shard in enumerate(shards, 1):
        name = "model.safetensors" if len(shards) == 1 else f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        _write_safetensors(partial / name, shard, noise)
        weight_map.update((tensor[0], name) for tensor in shard)
    if len(shards) > 1:  # as save_pretrained writes the index: sorted keys, indent 2
        index = {"metadata": {"total_size": sum(_nbytes(shape_of, dtype) for _name, shape_of, dtype in tensors)},
                 "weight_map": weight_map}
        (partial / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    (partial / "config.json").write_text(json.dumps(shaped_config(shape, form), indent=2, sort_keys=True) + "\n")
    (partial / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}, indent=2)
                                                    + "\n")
    if form == "awq":
        (partial / "quant_config.json").write_text(json.dumps(AWQ_CONFIG, indent=2) + "\n")
    _write_shaped_tokenizer(partial, shape)
    (partial / "README.md").write_text(f"{shape.name}'s shape with random weights ({form}): its output is noise; "
                                       "its compute per token is that model's.\n")
    for file in partial.iterdir():
        file.chmod(0o644)
    partial.chmod(0o755)
    if path.exists():
        shutil.rmtree(path)
    partial.rename(path)
    return path


def main(argv: list[str] | None = None) -> int:
    """`python3 -m provision.lab.tinymodel DIR --shape llama-3.1-8b --type q4_0`: one shaped GGUF file
    (--type f16 or q4_0), or a shaped Hugging Face repository DIR/<shape>-random-<type> (--type bf16 or
    awq). Prints the path made."""
    import argparse

    parser = argparse.ArgumentParser(prog="python3 -m provision.lab.tinymodel", description=main.__doc__)
    parser.add_argument("directory", type=Path)
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--type", dest="file_type", choices=[*FILE_TYPES, *REPO_FORMS], required=True)
    parser.add_argument("--seed", type=int, default=4)
    args = parser.parse_args(argv)
    if args.file_type in REPO_FORMS:
        made = make_shaped_repo(args.directory, SHAPES[args.shape], args.file_type, args.seed)
    else:
        made = make_shaped_gguf(args.directory, SHAPES[args.shape], args.file_type, args.seed)
    print(made)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
