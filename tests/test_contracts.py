"""The engine contracts table: it loads, every row has a source, and a malformed row is refused by name."""
from __future__ import annotations

import pytest
import yaml

from provision import contracts
from provision.errors import ContractError
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
