"""The shaped GGUF maker (provision/lab/tinymodel.py): a model with a real model's shape and random weights,
whose compute per token is that model's, so its served throughput is a real figure for the shape."""
from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from provision.lab import tinymodel

SMALL = tinymodel.GgufShape("small", layers=2, hidden=256, ffn=512, heads=4, kv_heads=2, vocab=1000, context=1024)


def test_the_llama_3_1_8b_shape_has_its_parameter_count() -> None:
    """8,030,261,248 parameters: what llama-bench printed for the file made on the H200 (and Meta's 8.03 B)."""
    plan = tinymodel._shaped_tensors(tinymodel.SHAPES["llama-3.1-8b"], "q4_0")
    assert sum(max(rows, 1) * columns for _name, rows, columns, _kind in plan) == 8_030_261_248


@pytest.mark.parametrize("file_type, matrix, output", [("f16", "F16", "F16"), ("q4_0", "Q4_0", "Q6_K")])
def test_a_shaped_file_is_a_gguf_of_that_shape_and_type(tmp_path: Path, file_type: str, matrix: str,
                                                          output: str) -> None:
    path = tinymodel.make_shaped_gguf(tmp_path, SMALL, file_type)
    assert path.name == f"small-random-{file_type}.gguf" and not list(tmp_path.glob("*.partial"))
    reader = gguf.GGUFReader(str(path))
    fields = {name: reader.fields[name] for name in ("llama.block_count", "llama.embedding_length",
                                                      "llama.attention.head_count_kv", "general.file_type")}
    assert [int(field.parts[field.data[0]][0]) for field in fields.values()] == [
        2, 256, 2, tinymodel.FILE_TYPES[file_type]]
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    assert len(tensors) == 3 + 9 * SMALL.layers
    assert tensors["blk.1.ffn_down.weight"].tensor_type.name == matrix
    assert list(tensors["blk.1.ffn_down.weight"].shape) == [SMALL.ffn, SMALL.hidden]  # ggml order: columns first
    assert tensors["output.weight"].tensor_type.name == output
    assert tensors["output_norm.weight"].tensor_type.name == "F32"
    tokens = reader.fields["tokenizer.ggml.tokens"]
    assert len(tokens.data) == SMALL.vocab


def test_every_token_of_the_shaped_vocabulary_is_distinct_printable_text() -> None:
    """No byte tokens: whatever the random model says is valid UTF-8 (llama-server sends it as is)."""
    tokens = tinymodel._shaped_vocabulary(128256)
    assert len(tokens) == len(set(tokens)) == 128256
    assert not any(token.startswith("<0x") for token in tokens)
    assert {"\u2581the", "a", "\u2581a"} <= set(tokens)


def test_an_unknown_file_type_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="one of f16, q4_0"):
        tinymodel.make_shaped_gguf(tmp_path, SMALL, "q8_0")
