"""A GGUF model placed by hand (llama.cpp's one file): the probe reads its size and its header's scalar
metadata (host/gguf.py).

Seen on the H200 host: /srv/models/llama-3.1-8b-random-q4_0.gguf (4.33 GiB, Q4_0) was judged as "8B
parameters x 16 bit" with the KV cache not estimated; llama-server took 5.9 GiB with --ctx-size 8192."""
from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path

import pytest

from provision import facts, weights
from provision.host import gguf as hostgguf
from provision.host import probe
from provision.lab import tinymodel
from tests.fakes import ok

GIB = 2**30
SMALL = tinymodel.GgufShape("small", layers=2, hidden=256, ffn=512, heads=4, kv_heads=2, vocab=1000, context=1024)
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
