"""Every fact parser on every recorded case (tests/fixtures/facts/<fact>/<case>.json).

A case holds either the output itself ("stdout", with the command it answers, checked against the
Fact so that changing a command breaks its fixtures on purpose) or a lab machine recording's name
("machine"), whose output for that fact is used; plus the parsed value ("expected") or "error".
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from provision import facts, lab, parsers
from provision.errors import ParseError
from tests.conftest import FIXTURES

FACTS = {fact.name: fact for fact in (*facts.FACTS, facts.venv_fact("/opt/vllm/venv"))}
CASES = sorted((FIXTURES / "facts").glob("*/*.json"))


def _output(case: dict, fact: facts.Fact) -> str:
    if "machine" in case:
        recording = lab.load_machine(case["machine"])
        entries = [entry for entry in recording["outputs"] if entry["fact"] == fact.name]
        assert entries, f"{case['machine']} has no {fact.name} output"
        assert entries[0].get("argv", entries[0].get("file")) == (
            list(fact.argv) if fact.argv else fact.file), "recording made with another command"
        return str(entries[0]["stdout"])
    assert case["command"] == (list(fact.argv) if fact.argv else fact.file), \
        "the fact's command changed: re-record this fixture"
    return str(case["stdout"])


@pytest.mark.parametrize("path", CASES, ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_parser_on_recorded_output(path: Path) -> None:
    case = json.loads(path.read_text())
    fact = FACTS[path.parent.name]
    output = _output(case, fact)
    if "error" in case:
        with pytest.raises(ParseError):
            fact.parse(output)
    else:
        assert parsers.json_ready(fact.parse(output)) == case["expected"]


def test_every_fact_has_empty_garbage_and_real_cases() -> None:
    for name in FACTS:  # the venv fact included
        cases = {path.stem for path in (FIXTURES / "facts" / name).glob("*.json")}
        assert {"empty", "garbage"} <= cases, name
        assert len(cases - {"empty", "garbage"}) >= 1, f"{name} has no recorded real output"
