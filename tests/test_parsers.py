"""Every fact parser on every recorded case (tests/fixtures/facts/<fact>/<case>.json).

A case holds either the output itself ("stdout", with the command it answers, checked against the
Fact so that changing a command breaks its fixtures on purpose) or a lab machine recording's name
("machine"), whose output for that fact is used; plus the parsed value ("expected") or "error". A
venv recorded at another path than the default venv_dir names it ("venv_dir").
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from provision import engines, facts, lab, parsers
from provision.errors import ParseError
from tests.conftest import FIXTURES

FACTS = {fact.name: fact for fact in (*facts.FACTS, facts.venv_fact("/opt/vllm/venv", engines.dists()))}
CASES = sorted((FIXTURES / "facts").glob("*/*.json"))


# nvidia-smi query fields asked for after some recordings were made (their readings are None there).
LATER_GPU_FIELDS = ("power.draw", "power.limit", "timestamp")


def _output(case: dict, fact: facts.Fact) -> str:
    if "machine" in case:
        recording = lab.load_machine(case["machine"])
        entries = [entry for entry in recording["outputs"] if entry["fact"] == fact.name]
        assert entries, f"{case['machine']} has no {fact.name} output"
        assert _source(entries[0]) == _source(_wanted(fact)), "recording made with another command"
        return str(entries[0]["stdout"])
    if case.get("recorded_with_earlier_program"):
        # A program whose output format did not change (the case says how it differed): the
        # interpreter and its flags must still be the fact's own.
        asked = facts.venv_fact(case["venv_dir"], engines.dists()) if case.get("venv_dir") else fact
        assert asked.argv and case["command"][:2] == list(asked.argv[:2]), "re-record this fixture"
    elif case.get("recorded_before_timestamp"):
        # nvidia-smi's query before its later fields (power.draw, power.limit, timestamp) were asked for:
        # the same columns less those (the parser reads columns by the header).
        wanted = list(_wanted(fact)["argv"])
        fields = [field for field in wanted[1].removeprefix("--query-gpu=").split(",") if field not in LATER_GPU_FIELDS]
        wanted[1] = "--query-gpu=" + ",".join(fields)
        assert case["command"] == wanted, "re-record this fixture"
    elif case.get("venv_dir"):  # a venv recorded where it was, not at the default venv_dir
        wanted = facts.venv_fact(case["venv_dir"], engines.dists())
        assert case["command"] == _source(_wanted(wanted)), "the fact's command changed: re-record this fixture"
    else:
        assert case["command"] == _source(_wanted(fact)), "the fact's command changed: re-record this fixture"
    return str(case["stdout"])


def _wanted(fact: facts.Fact) -> dict:
    """The fact's source in a recording's terms: argv, file or tree."""
    tree = fact.tree and {"pattern": fact.tree.pattern, "read": list(fact.tree.read), "where": dict(fact.tree.where)}
    return {"argv": list(fact.argv) if fact.argv else None, "file": fact.file, "tree": tree}


def _source(entry: dict) -> object:
    """An entry's argv, file or {"tree": ...}: what a fixture's "command" holds."""
    return entry.get("argv") or entry.get("file") or {"tree": entry.get("tree")}


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


def test_venv_sm_targets_in_numeric_order_on_a_real_cu130_torch() -> None:
    """torch 2.11.0+cu130 answers a plain 'sm_75 ... sm_120' list; capabilities sort as numbers."""
    case = json.loads((FIXTURES / "facts" / "venv" / "h200x2-nvswitch-driver580-vm.json").read_text())
    info = parsers.parse_venv_probe(case["stdout"])
    assert info.sm_targets == ("7.5", "8.0", "8.6", "9.0", "10.0", "12.0")
    gencode = parsers.VenvInfo("3.12.3", None, None, None,
                               "-gencode compute=compute_90a,code=sm_90a -gencode compute=compute_120,code=sm_120",
                               None)
    assert gencode.sm_targets == ("9.0", "12.0")


def test_a_real_h200_node_recording_assembles_into_facts() -> None:
    """Every output recorded on the 2x H200 VM, through the probe's answer, as `invoke facts` reads it."""
    from tests.fakes import ok, probe_answer_from_recording

    recording = json.loads((FIXTURES / "recordings" / "h200x2-nvswitch-driver580-vm.json").read_text())
    wanted = {*FACTS} - {"venv"}
    answer = probe_answer_from_recording({"outputs": [o for o in recording["outputs"] if o["fact"] in wanted]})
    # The facts added after this recording was made (MODELNAME, the x86 hybrid lists) are left out.
    recorded = [fact for fact in facts.FACTS if fact.name in {o["fact"] for o in recording["outputs"]}]
    gathered = facts.facts_from_probe("h200", ok(answer), recorded)
    assert (gathered.kernel, gathered.arch, gathered.init) == ("6.18.44-fc-v657-gpu", "x86_64", "process_api")
    assert gathered.driver is not None and (gathered.driver.version, gathered.driver.flavour) == ("580.159.04", "open")
    assert [(g.name, g.compute_cap, g.memory_total_mib) for g in gathered.gpus] == [("NVIDIA H200", "9.0", 143771)] * 2
    assert gathered.cpu is not None and len(gathered.cpu.cpus) == 32 and gathered.cpu.l3_domains == {0: tuple(range(32))}
    assert gathered.modules == frozenset({"nvidia", "nvidia_uvm"}) and gathered.ptxas_cuda == "13.0"
    # The tools this VM lacks are notes, not failures.
    assert set(gathered.notes) == {"lsmod", "units", "rdma", "interfaces"}
    assert all("not present on the host" in note for note in gathered.notes.values())
