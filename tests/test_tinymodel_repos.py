"""Shaped Hugging Face repositories (provision/lab/tinymodel.py, make_shaped_repo): a model's shape with random
weights, in bf16 or AutoAWQ's 4-bit GEMM layout, laid out as save_pretrained writes a repository for vLLM."""
from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer

from provision.lab import tinymodel

TINY = tinymodel.SHAPES["llama-tiny"]
HEAD_DIM = TINY.hidden // TINY.heads


def header(path: Path) -> tuple[dict[str, Any], int]:
    """A safetensors file's header (without __metadata__) and where its data starts."""
    with open(path, "rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        found: dict[str, Any] = json.loads(handle.read(length))
    found.pop("__metadata__")
    return found, 8 + length


def expected_tensors(form: str) -> dict[str, tuple[str, list[int]]]:
    """Every tensor name of the tiny shape's repository: (dtype, shape)."""
    floats = "BF16" if form == "bf16" else "F16"
    linears = {"self_attn.q_proj": (TINY.hidden, TINY.heads * HEAD_DIM),
               "self_attn.k_proj": (TINY.hidden, TINY.kv_heads * HEAD_DIM),
               "self_attn.v_proj": (TINY.hidden, TINY.kv_heads * HEAD_DIM),
               "self_attn.o_proj": (TINY.heads * HEAD_DIM, TINY.hidden),
               "mlp.gate_proj": (TINY.hidden, TINY.ffn), "mlp.up_proj": (TINY.hidden, TINY.ffn),
               "mlp.down_proj": (TINY.ffn, TINY.hidden)}
    tensors = {"model.embed_tokens.weight": (floats, [TINY.vocab, TINY.hidden]),
               "lm_head.weight": (floats, [TINY.vocab, TINY.hidden]), "model.norm.weight": (floats, [TINY.hidden])}
    for layer in range(TINY.layers):
        prefix = f"model.layers.{layer}."
        tensors[prefix + "input_layernorm.weight"] = (floats, [TINY.hidden])
        tensors[prefix + "post_attention_layernorm.weight"] = (floats, [TINY.hidden])
        for module, (inputs, outputs) in linears.items():
            if form == "bf16":
                tensors[f"{prefix}{module}.weight"] = (floats, [outputs, inputs])  # nn.Linear: [out, in]
            else:
                # What vLLM's AWQ linear method allocates to load each linear layer into
                # (AWQLinearMethod.create_weights; BaseAWQLinearMethod in 0.26's auto_awq.py), pack factor
                # 32 / 4 = 8, group 128: qweight int32 [in, out / 8], qzeros int32 [in / 128, out / 8],
                # scales in the model's float16 [in / 128, out].
                tensors[f"{prefix}{module}.qweight"] = ("I32", [inputs, outputs // 8])
                tensors[f"{prefix}{module}.qzeros"] = ("I32", [inputs // 128, outputs // 8])
                tensors[f"{prefix}{module}.scales"] = ("F16", [inputs // 128, outputs])
    return tensors


@pytest.mark.parametrize("form", tinymodel.REPO_FORMS)
def test_every_tensor_of_the_index_is_in_its_shard_with_its_dtype_and_shape(tmp_path: Path, form: str) -> None:
    path = tinymodel.make_shaped_repo(tmp_path, TINY, form, shard_bytes=600_000)
    assert path == tmp_path / f"llama-tiny-random-{form}" and not list(tmp_path.glob("*.partial"))
    index = json.loads((path / "model.safetensors.index.json").read_text())
    shards = sorted(path.glob("model-*.safetensors"))
    assert len(shards) > 1
    assert [shard.name for shard in shards] == [f"model-{number:05d}-of-{len(shards):05d}.safetensors"
                                                for number in range(1, len(shards) + 1)]
    expected = expected_tensors(form)
    assert set(index["weight_map"]) == set(expected) and set(index["weight_map"].values()) == {
        shard.name for shard in shards}
    total = 0
    for shard in shards:
        found, data_start = header(shard)
        assert {name for name, file in index["weight_map"].items() if file == shard.name} == set(found)
        for name, info in found.items():
            assert (info["dtype"], info["shape"]) == expected[name], name
        end = max(info["data_offsets"][1] for info in found.values())
        assert shard.stat().st_size == data_start + end
        total += end
    assert index["metadata"] == {"total_size": total}
    assert all(stat.S_IMODE(file.stat().st_mode) == 0o644 for file in path.iterdir())


@pytest.mark.parametrize("form", tinymodel.REPO_FORMS)
def test_the_config_is_llama_3_1_s_at_the_shape_s_sizes(tmp_path: Path, form: str) -> None:
    path = tinymodel.make_shaped_repo(tmp_path, TINY, form)
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["intermediate_size"], config["head_dim"],
            config["num_attention_heads"], config["num_key_value_heads"], config["vocab_size"],
            config["max_position_embeddings"]) == (2, 256, 512, 64, 4, 2, 1000, 1024)
    assert config["rope_scaling"]["rope_type"] == "llama3" and config["tie_word_embeddings"] is False
    assert config["torch_dtype"] == {"bf16": "bfloat16", "awq": "float16"}[form]
    if form == "awq":
        assert config["quantization_config"] == tinymodel.AWQ_CONFIG
        assert json.loads((path / "quant_config.json").read_text()) == tinymodel.AWQ_CONFIG
    else:
        assert "quantization_config" not in config and not (path / "quant_config.json").exists()
    try:
        from transformers import AutoConfig
    except ImportError:  # not a test dependency: the JSON above is what vLLM reads
        return
    loaded = AutoConfig.from_pretrained(path)
    assert (loaded.num_hidden_layers, loaded.head_dim, loaded.num_key_value_heads) == (2, 64, 2)


def test_the_8b_shape_s_config_has_llama_3_1_8b_s_values() -> None:
    config = tinymodel.shaped_config(tinymodel.SHAPES["llama-3.1-8b"], "bf16")
    assert (config["num_hidden_layers"], config["hidden_size"], config["intermediate_size"], config["head_dim"],
            config["num_attention_heads"], config["num_key_value_heads"], config["vocab_size"],
            config["max_position_embeddings"], config["rope_theta"], config["rms_norm_eps"]) == (
        32, 4096, 14336, 128, 32, 8, 128256, 131072, 500000.0, 1e-5)
    assert config["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def test_the_8b_bf16_shards_are_the_size_of_meta_s_files() -> None:
    """The four files of meta-llama/Llama-3.1-8B(-Instruct) on the hub, to the byte (their sizes as the hub
    lists them): the same tensors, split and laid out as save_pretrained and safetensors do it. Their
    data is 16,060,522,496 bytes, the index's total_size: 8,030,261,248 parameters of 2 bytes."""
    shards = tinymodel._shards(tinymodel._repo_tensors(tinymodel.SHAPES["llama-3.1-8b"], "bf16"),
                               tinymodel.SHARD_BYTES)
    data = [sum(tinymodel._nbytes(size, dtype) for _name, size, dtype in shard) for shard in shards]
    files = [len(tinymodel._safetensors_header(shard)[0]) + size for shard, size in zip(shards, data)]
    assert files == [4_976_698_672, 4_999_802_720, 4_915_916_176, 1_168_138_808]
    assert sum(data) == 16_060_522_496


def test_the_8b_awq_repository_is_5_7_gb_in_two_shards() -> None:
    """4-bit linear layers (with a float16 scale and a 4-bit zero point per 128 weights), float16 embeddings
    and output matrix."""
    shards = tinymodel._shards(tinymodel._repo_tensors(tinymodel.SHAPES["llama-3.1-8b"], "awq"),
                               tinymodel.SHARD_BYTES)
    data = [sum(tinymodel._nbytes(size, dtype) for _name, size, dtype in shard) for shard in shards]
    assert data == [4_677_181_440, 1_050_673_152]


def test_the_tokenizer_has_the_shape_s_vocabulary_and_a_chat_template(tmp_path: Path) -> None:
    path = tinymodel.make_shaped_repo(tmp_path, TINY, "bf16")
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == TINY.vocab
    encoded = tokenizer.encode("hello world, the model")
    assert encoded.tokens == ["<s>", "\u2581hello", "\u2581world", ",", "\u2581the", "\u2581model"]
    assert tokenizer.decode(encoded.ids) == "hello world, the model"
    config = json.loads((path / "tokenizer_config.json").read_text())
    assert config["chat_template"] == tinymodel.CHAT_TEMPLATE
    assert (config["bos_token"], config["eos_token"]) == ("<s>", "</s>")
    assert [tokenizer.token_to_id(token) for token in ("<s>", "</s>")] == [1, 2]
    assert json.loads((path / "generation_config.json").read_text()) == {"bos_token_id": 1, "eos_token_id": 2}


def test_one_shard_is_model_safetensors_without_an_index(tmp_path: Path) -> None:
    """As save_pretrained writes a model under its shard size."""
    path = tinymodel.make_shaped_repo(tmp_path, TINY, "bf16")
    assert (path / "model.safetensors").exists()
    assert not (path / "model.safetensors.index.json").exists() and not list(path.glob("model-*"))
    assert set(header(path / "model.safetensors")[0]) == set(expected_tensors("bf16"))


def test_a_shard_is_byte_for_byte_what_safetensors_writes(tmp_path: Path) -> None:
    path = tinymodel.make_shaped_repo(tmp_path, TINY, "awq")
    made = path / "model.safetensors"
    save_file(load_file(str(made)), str(tmp_path / "again.safetensors"), metadata={"format": "pt"})
    assert (tmp_path / "again.safetensors").read_bytes() == made.read_bytes()


def test_awq_weights_dequantize_to_a_layer_that_keeps_its_input_s_size(tmp_path: Path) -> None:
    """w = (q - z) * s as AutoAWQ's GEMM layout defines it: zero points 7 or 8 (q's mean is 7.5), small positive
    float16 scales: w's standard deviation about 0.58 / sqrt(in_features), so 32 layers stay finite in float16."""
    tensors = load_file(str(tinymodel.make_shaped_repo(tmp_path, TINY, "awq") / "model.safetensors"))
    shifts = np.arange(0, 32, 4, dtype=np.uint32)

    def nibbles(packed: Any) -> Any:
        return ((packed.view(np.uint32)[..., None] >> shifts) & 15).astype(np.float32)

    base = "model.layers.1.mlp.down_proj"
    weights, zeros = nibbles(tensors[base + ".qweight"]), nibbles(tensors[base + ".qzeros"])
    scales = tensors[base + ".scales"]
    assert set(np.unique(zeros)) == {7, 8} and len(np.unique(weights)) == 16
    assert scales.dtype == np.float16 and (scales > 0).all() and float(scales.max()) < 0.01
    dense = (weights.reshape(TINY.ffn, -1) - np.repeat(zeros.reshape(TINY.ffn // 128, -1), 128, 0)) * np.repeat(
        scales.astype(np.float32), 128, 0)
    assert dense.std() * TINY.ffn**0.5 == pytest.approx(0.58, rel=0.1)
    assert abs(dense.mean()) < 0.05 * dense.std()
    assert (tensors["model.norm.weight"] == 1).all() and tensors["lm_head.weight"].dtype == np.float16


def test_the_command_line_writes_a_repository_or_a_gguf_and_prints_it(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert tinymodel.main([str(tmp_path), "--shape", "llama-tiny", "--type", "awq"]) == 0
    assert capsys.readouterr().out == f"{tmp_path / 'llama-tiny-random-awq'}\n"
    assert (tmp_path / "llama-tiny-random-awq" / "model.safetensors").exists()
    assert tinymodel.main([str(tmp_path), "--shape", "llama-tiny", "--type", "q4_0"]) == 0
    assert capsys.readouterr().out == f"{tmp_path / 'llama-tiny-random-q4_0.gguf'}\n"


def test_a_repository_made_again_replaces_the_first(tmp_path: Path) -> None:
    first = tinymodel.make_shaped_repo(tmp_path, TINY, "awq", shard_bytes=600_000)
    again = tinymodel.make_shaped_repo(tmp_path, TINY, "awq")
    assert again == first and not list(again.glob("model-*")) and (again / "model.safetensors").exists()


def test_an_unknown_form_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="one of bf16, awq"):
        tinymodel.make_shaped_repo(tmp_path, TINY, "gptq")
    assert not list(tmp_path.iterdir())
