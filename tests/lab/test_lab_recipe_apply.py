"""recipe.apply against the lab's real gate on cpu-1 (lab-cpu): a recipe for two RTX 5090s is refused
there and nothing is written; the lab's own recipe passes, is written beside the lab's inventory, and the
inventory reads it (each of its settings now from the recipe's layer, none changed). The file is removed
after: the lab's inventory is as the README's first command made it."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from provision import lab
from tests.lab.conftest import invoke_json

pytestmark = pytest.mark.lab

SEED = "deepseek-r1-distill-qwen-32b-awq-tp2-rtx5090"
LAB = "lab-cpu-tiny-llama"


@pytest.fixture
def applied_file(the_lab: lab.Lab) -> Iterator[Path]:
    path = the_lab.inventory.parent / "applied" / "lab-cpu.yaml"
    assert not path.exists(), f"{path} was left by an earlier run"
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)
        if path.parent.is_dir() and not any(path.parent.iterdir()):
            path.parent.rmdir()


def test_the_gate_refuses_a_recipe_this_host_cannot_serve_and_nothing_is_written(applied_file: Path) -> None:
    code, answer, text = invoke_json("recipe.apply", SEED, "--cluster", "lab-cpu")
    assert code == 1, text
    assert answer["gate_passed"] is False and answer["written"] is False and not applied_file.exists(), text
    gate = answer["gate"]
    assert gate["blocked"] == ["cpu-1"] or "cpu-1" in gate["errors"], gate
    changed = {change["key"]: change["after"] for change in answer["changes"]["cpu-1"]}
    assert changed["tensor_parallel_size"] == 2 and changed["model"] == "casperhansen/deepseek-r1-distill-qwen-32b-awq"
    assert any("measured on profile rtx5090; cluster lab-cpu runs cpu" in note for note in answer["notes"]), answer


def test_the_lab_s_own_recipe_passes_is_written_and_read_by_the_inventory(applied_file: Path) -> None:
    code, before, text = invoke_json("inventory")
    assert code == 0, text
    code, answer, text = invoke_json("recipe.apply", LAB, "--cluster", "lab-cpu")
    assert code == 0 and answer["gate_passed"] and answer["written"], text
    assert answer["gate"]["hosts"]["cpu-1"]["verdict"] != "blocked"
    assert answer["changes"]["cpu-1"] == [], "the lab's recipe is what lab-cpu declares: nothing changes"
    assert applied_file.is_file() and "recipe: lab-cpu-tiny-llama" in applied_file.read_text()
    code, after, text = invoke_json("inventory")
    assert code == 0, text
    host = after["hosts"]["cpu-1"]
    assert host["settings"] == before["hosts"]["cpu-1"]["settings"]
    layer = f"recipe {LAB} ({applied_file})"
    assert {host["origin"][key] for key in ("model", "engine_spec", "max_model_len", "extra_args")} == {layer}, host["origin"]
    code, again, text = invoke_json("recipe.apply", LAB, "--cluster", "lab-cpu")
    assert code == 0 and again["unchanged"] and not again["written"], text


def test_list_fits_runs_the_real_gate_on_cpu_1_for_each_recipe_of_its_profile(applied_file: Path) -> None:
    code, listed, text = invoke_json("recipe.list", "--fits", "cpu-1")
    assert code == 0, text
    fits = {item["name"]: item["fits"] for item in listed}
    assert set(fits) == {LAB}, fits  # cpu-1 plays the cpu profile: that profile's recipes only
    assert fits[LAB]["verdict"] != "blocked" and fits[LAB]["memory"] is not None, fits
    assert not applied_file.exists()  # judged, nothing written
