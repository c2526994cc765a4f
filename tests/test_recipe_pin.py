"""The pin is checked: every flag a recipe imports or applies, and the value of each choice flag
(--load-format X), judged by the contract table at the vLLM release engine_spec pins. A flag or value
that release lacks refuses (exit 2) with the range that has it; one without a row is named as not judged.

The recipes are Spark Arena's registry files, byte for byte (tests/fixtures/recipes/spark-arena/sources.json).
At the releases whose wheels are fixtures (0.33.0, 0.34.0), vLLM's own parser (the option strings
make_arg_parser registered, vllm-VERSION.parser-options.json) is held to the same verdicts."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from provision import contracts, recipes, vllm_wheel
from provision.errors import ContractError, RecipeError
from provision.recipes import applying, sparkarena

FIXTURES = Path(__file__).parent / "fixtures"
RECIPES = FIXTURES / "recipes" / "spark-arena"
WHEELS = FIXTURES / "wheels"
MINIMAX = RECIPES / "minimax-m2.7-nvfp4-vllm.yaml"  # --load-format instanttensor, --trust-remote-code
GPT_OSS = RECIPES / "openai-gpt-oss-120b-vllm.yaml"  # --attention-backend FLASHINFER, fastsafetensors


def imported(path: Path, pin: str) -> sparkarena.Imported:
    return sparkarena.read(path.read_bytes(), path.name, path.stem, {"engine_spec": pin})


def test_a_recipe_imports_at_a_release_that_has_every_flag_it_judges() -> None:
    result = imported(MINIMAX, "vllm==0.34.0")
    assert result.recipe is not None, result.refused
    flags = result.recipe.inventory_vars()["server_flags"]
    assert flags["--load-format"] == "instanttensor" and flags["--trust-remote-code"] is True
    notes = " | ".join(result.recipe.notes)
    # judged and held: no word about the flags and values with rows
    assert "--load-format" not in notes and "--trust-remote-code" not in notes
    assert "not judged: no contract row for --reasoning-parser minimax_m2 at vllm 0.34.0" in result.recipe.notes


def test_a_pin_that_lacks_a_load_format_refuses_the_import_naming_the_value_and_the_range() -> None:
    refused = imported(MINIMAX, "vllm==0.12.0")
    assert refused.recipe is None  # a registry's other recipes are still read; one file alone exits 2
    message = refused.refused
    assert message.startswith("vllm 0.12.0 has no --load-format instanttensor: the releases that have it are >0.12.0")
    assert "https://github.com/vllm-project/vllm/pull/36139" in message


def test_a_pin_that_lacks_a_flag_refuses_with_the_first_release_to_pin() -> None:
    refused = imported(GPT_OSS, "vllm==0.12.0")
    assert refused.recipe is None
    message = refused.refused
    assert "vllm 0.12.0 has no flag --attention-backend: the releases that have it are >=0.13.0" in message
    assert "pin vllm==0.13.0 or later (--set engine_spec=vllm==0.13.0)" in message
    assert "v0.13.0/vllm/engine/arg_utils.py" in message
    # and the first release it names imports
    assert imported(GPT_OSS, "vllm==0.13.0").recipe is not None


def test_a_value_older_than_the_pin_refuses_where_the_flag_itself_is_held() -> None:
    """fastsafetensors: 0.8.4's documented choices; --load-format itself from 0.4.2."""
    values = {"engine_spec": "vllm==0.8.1", "server_flags": {"--load-format": "fastsafetensors"}}
    with pytest.raises(RecipeError, match=r"vllm 0.8.1 has no --load-format fastsafetensors: .* >=0.8.4"):
        recipes.contract_notes("vllm", values)
    assert recipes.contract_notes("vllm", {**values, "engine_spec": "vllm==0.8.4"}) == []


def test_a_release_below_a_range_that_no_source_read_is_a_note_not_a_refusal() -> None:
    """0.8.2 and 0.8.3 were not read: fastsafetensors' row starts at 0.8.4, its `lacks` ends at 0.8.1;
    --max-num-seqs' row starts at the first release read (0.12.0), with nothing read before."""
    notes = recipes.contract_notes("vllm", {"engine_spec": "vllm==0.8.2", "server_flags": {
        "--load-format": "fastsafetensors"}})
    assert notes == [("not judged: vllm 0.8.2 is outside the releases read to have --load-format fastsafetensors "
                      "(>=0.8.4, https://docs.vllm.ai/en/v0.8.4/serving/engine_args.html), and no release before "
                      "those was read")]
    assert "--max-num-seqs" in recipes.contract_notes(
        "vllm", {"engine_spec": "vllm==0.11.0", "server_flags": {"--max-num-seqs": 8}})[0]


def test_a_flag_or_value_without_a_row_is_named_not_judged() -> None:
    notes = recipes.contract_notes("vllm", {"engine_spec": "vllm==0.32.0", "server_flags": {
        "--mxfp4-backend": "CUTLASS", "--tool-call-parser": "openai", "--load-format": "runai_streamer",
        "--max-num-seqs": 8}})
    assert notes == ["not judged: no contract row for --mxfp4-backend at vllm 0.32.0",
                     "not judged: no contract row for --tool-call-parser openai at vllm 0.32.0",
                     "not judged: no contract row for --load-format runai_streamer at vllm 0.32.0"]


def test_no_pin_is_judged_at_the_target_and_says_so() -> None:
    notes = recipes.contract_notes("vllm", {"server_flags": {"--enable-auto-tool-choice": True}})
    assert notes == [("not judged: no contract row for --enable-auto-tool-choice at vllm 0.34.0 "
                      "(the table's target: no version pinned)")]


def test_extra_args_are_judged_in_the_spelling_vllms_parser_reads() -> None:
    """FlexibleArgumentParser reads --max_num_seqs as --max-num-seqs, --compilation-config.mode as a key of
    --compilation-config; '--x=v' and '--x v' carry the value."""
    with pytest.raises(RecipeError, match="has no flag --attention-backend"):
        recipes.contract_notes("vllm", {"engine_spec": "vllm==0.12.0", "extra_args": ("--attention_backend", "X")})
    with pytest.raises(RecipeError, match="has no --load-format instanttensor"):
        recipes.contract_notes("vllm", {"engine_spec": "vllm==0.12.0", "extra_args": ("--load-format=instanttensor",)})
    assert recipes.contract_notes("vllm", {"engine_spec": "vllm==0.34.0",
                                           "extra_args": ("--max_num_seqs", "4", "--enforce-eager")}) == []
    assert recipes.contract_notes("vllm", {"engine_spec": "vllm==0.34.0", "extra_args": (
        "--compilation-config.cudagraph_mode", "none")}) == [
        "not judged: no contract row for --compilation-config at vllm 0.34.0"]


def test_a_variable_the_release_does_not_read_stays_a_note() -> None:
    """An ignored variable does not stop the server: it is said, not refused."""
    notes = recipes.contract_notes("vllm", {"engine_spec": "vllm==0.32.0",
                                            "environment": {"VLLM_ATTENTION_BACKEND": "FLASHINFER"}})
    assert notes == [("vllm 0.32.0 does not read VLLM_ATTENTION_BACKEND (engine_contracts.yaml: <0.15.0; "
                      "https://github.com/vllm-project/vllm/blob/v0.15.0/vllm/config/attention.py)")]


def test_apply_with_a_pin_judges_the_same_way(tmp_path: Path) -> None:
    from provision import inventory

    (tmp_path / "hosts.yaml").write_text(
        "hosts:\n  spark-a: {address: 192.0.2.10, user: root, profile: dgx-spark}\n"
        "  spark-b: {address: 192.0.2.11, user: root, profile: dgx-spark}\n"
        "clusters:\n  pair:\n    hosts: [spark-a, spark-b]\n    vars: {model: nvidia/MiniMax-M2.7-NVFP4}\n")
    inv = inventory.load(tmp_path)
    recipe = imported(MINIMAX, "vllm==0.34.0").recipe
    assert recipe is not None
    assert applying.plan(inv, "pair", recipe, {}).notes  # applies at its own pin
    with pytest.raises(RecipeError, match="vllm 0.12.0 has no --load-format instanttensor"):
        applying.plan(inv, "pair", recipe, {"engine_spec": "vllm==0.12.0"})


def test_since_is_the_first_release_a_range_names() -> None:
    table = contracts.load()
    assert table.row("vllm", "flag", "--attention-backend").since() == "0.13.0"  # type: ignore[union-attr]
    assert table.row("vllm", "value", "--load-format=instanttensor").since() is None  # type: ignore[union-attr]


def test_choices_must_be_flags() -> None:
    with pytest.raises(ContractError, match="choices must be a list of flags"):
        contracts.parse({"engines": {"vllm": {"target": "0.34.0", "packages": ["vllm"], "choices": ["load"]}},
                         "rows": []}, "t.yaml")


def _parser_options(version: str) -> set[str]:
    return set(json.loads((WHEELS / f"vllm-{version}.parser-options.json").read_text())["options"])


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_vllms_own_parser_agrees_with_the_rows_on_every_imported_flag(version: str) -> None:
    """Every flag the fixtures' vLLM recipes carry: where a row speaks at the wheel's version, vLLM's
    own parser (its registered option strings) has the flag exactly when the row says so."""
    table = contracts.load()
    spoken = 0
    for path in sorted(RECIPES.glob("*.yaml")):
        try:
            result = imported(path, f"vllm=={version}")
        except RecipeError as exc:  # refused: the refusal must be a flag the parser lacks too
            pytest.fail(f"{path.name} refused at {version}: {exc.message}")
        if result.recipe is None or result.engine != "vllm":
            continue
        options = _parser_options(version)
        for flag, _ in recipes._flags_of(result.recipe.inventory_vars()):
            name = recipes.spelt("vllm", flag)
            verdict = table.accepts("vllm", "flag", name, version)
            if verdict is not None:
                spoken += 1
                assert verdict == (name in options), (path.name, name)
    assert spoken >= 5


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_every_value_row_held_at_a_wheel_is_a_name_that_wheel_defines(version: str) -> None:
    """A value row that holds at 0.33.0/0.34.0 names a value the wheel's own source lists (the load
    formats of model_loader/__init__.py, the literals of the config the flag sets)."""
    release = vllm_wheel.Release(WHEELS / f"vllm-{version}")
    where = {"--load-format": "vllm/model_executor/model_loader/__init__.py",
             "--kv-cache-dtype": "vllm/config/cache.py", "--dtype": "vllm/config/model.py",
             "--attention-backend": "vllm/v1/attention/backends/registry.py"}
    table = contracts.load()
    rows = [row for row in table.of("vllm", "value") if row.holds(version)]
    assert rows
    for row in rows:
        flag, value = row.name.split("=", 1)
        assert flag in table.engines["vllm"].choices and flag in _parser_options(version), row.name
        text = release.text(where[flag]) or ""
        assert f'"{value}"' in text or f"{value} =" in text, (row.name, where[flag])


def test_apply_judges_the_release_each_host_will_run_not_only_the_recipe_s_pin(tmp_path: Path) -> None:
    """A host's own engine_spec sits above the recipe: the flags are judged at the release it pins."""
    from provision import inventory

    (tmp_path / "hosts.yaml").write_text(
        "hosts:\n  spark-a: {address: 192.0.2.10, user: root, profile: dgx-spark,"
        " vars: {engine_spec: vllm==0.12.0}}\n"
        "clusters:\n  one:\n    hosts: [spark-a]\n    vars: {model: openai/gpt-oss-120b}\n")
    inv = inventory.load(tmp_path)
    recipe = imported(GPT_OSS, "vllm==0.13.0").recipe
    assert recipe is not None
    with pytest.raises(RecipeError, match="host spark-a: vllm 0.12.0 has no flag --attention-backend"):
        applying.plan(inv, "one", recipe, {})
    # the same host pinned to a release that has it: applied
    (tmp_path / "hosts.yaml").write_text((tmp_path / "hosts.yaml").read_text().replace("0.12.0", "0.13.0"))
    assert applying.plan(inventory.load(tmp_path), "one", recipe, {}).applied.settings("spark-a").engine_spec \
        == "vllm==0.13.0"
