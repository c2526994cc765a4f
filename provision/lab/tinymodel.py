"""A tiny random Llama, made on the spot, so the lab serves a real model with vLLM's CPU build.

Random weights in safetensors (numpy, no torch needed on the controller) and a word-level tokenizer
built with `tokenizers`: about 1 MB. head_dim 64, since the CPU attention backend refuses 16.
It answers nonsense, quickly: what the lab needs to prove the server, health, completions and metrics.
"""
from __future__ import annotations

import json
import os
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
AWQ_CONFIG = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm",
              "modules_to_not_convert": None}


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
SHAPES = {"llama-3.1-8b": GgufShape("llama-3.1-8b", 32, 4096, 14336, 32, 8, 128256, 131072, 500000.0)}
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


def main(argv: list[str] | None = None) -> int:
    """`python3 -m provision.lab.tinymodel DIR --shape llama-3.1-8b --type q4_0`: one shaped GGUF file."""
    import argparse

    parser = argparse.ArgumentParser(prog="python3 -m provision.lab.tinymodel", description=main.__doc__)
    parser.add_argument("directory", type=Path)
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--type", dest="file_type", choices=sorted(FILE_TYPES), required=True)
    parser.add_argument("--seed", type=int, default=4)
    args = parser.parse_args(argv)
    made = make_shaped_gguf(args.directory, SHAPES[args.shape], args.file_type, args.seed)
    print(made)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
