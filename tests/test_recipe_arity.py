"""A recipe's flag that takes several values keeps every one of them, through the import, the rendered
unit and the export (issue 65, item 1). How many values a flag takes is vLLM's own: the nargs its serve
parser gives each option, read from the release's wheel (provision/vllm_wheel.py, on the verbatim files of
tests/fixtures/wheels/) and kept in the contract table's `arity` (provision/engine_contracts.yaml).

The case is Spark Arena's DFlash recipe (tests/fixtures/recipes/spark-arena/, sources.json) with one line
added, `--cudagraph-capture-sizes 1 2 4 8 16 24 32`, as community DFlash recipes give it: no snapshot of
the registries holds that line in a recipe of this format. The rendered line is also among
tests/test_render.py rendered_lines(), which the lab's contract test (tests/lab/test_lab_contract_vllm.py)
hands to vLLM's own serve parser in the lab's venv."""
from __future__ import annotations

from pathlib import Path

import pytest

from provision import contracts, vllm_wheel
from provision.recipes import sparkarena
from tests.conftest import FIXTURES as ALL_FIXTURES
from tests.test_recipe_fidelity import DFLASH, text_of, vllm_server_argv

SIZES = ("1", "2", "4", "8", "16", "24", "32")
WHEELS = ALL_FIXTURES / "wheels"


def with_sizes(text: str, sizes: tuple[str, ...] = SIZES) -> str:
    """The DFlash recipe's command with `--cudagraph-capture-sizes SIZES` after its -pp line."""
    line = "    -pp {pipeline_parallel}"
    assert text.count(line) == 1
    return text.replace(line, line + " \\\n    --cudagraph-capture-sizes " + " ".join(sizes))


def imported_sizes() -> sparkarena.Imported:
    return sparkarena.read(with_sizes(text_of(DFLASH)), DFLASH, Path(DFLASH).stem)


def served_values(values: dict[str, object]) -> dict[str, object]:
    """A recipe's inventory values as an inventory gives them (lists, not tuples), less its engine and the
    files inside the image (a chat template the user gives)."""
    return {key: list(value) if isinstance(value, tuple) else value for key, value in values.items()
            if key not in ("engine", "server_files")}


def after(argv: list[str] | tuple[str, ...], flag: str) -> list[str]:
    """The words after `flag` up to the next flag."""
    start = list(argv).index(flag) + 1
    end = next((at for at in range(start, len(argv)) if argv[at].startswith("--")), len(argv))
    return list(argv[start:end])


def test_the_contract_tables_arity_is_what_the_target_wheels_parser_gives() -> None:
    """The table's arity is the nargs vLLM's own code gives each option of the target release, not a
    list kept by hand: a list field is nargs "+", a field whose kwargs the release deletes nargs from
    (--allowed-origins, --middleware's append) takes one, bool | str | None is "?"."""
    table = contracts.load()
    target = table.target("vllm")
    read = vllm_wheel.serve_options(vllm_wheel.open_release(WHEELS / f"vllm-{target}")).arity
    assert dict(table.arity("vllm")) == dict(read)
    assert read["--cudagraph-capture-sizes"] == "+" and read["--served-model-name"] == "+"
    assert read["--hf-token"] == "?"
    for one in ("--allowed-origins", "--middleware", "--max-num-seqs", "--enable-prefix-caching"):
        assert one not in read, one


def test_a_flag_with_seven_values_is_imported_rendered_and_exported_with_all_seven() -> None:
    imported = imported_sizes()
    assert imported.recipe is not None, imported.refused
    assert not [what for what, _ in imported.not_carried if what.startswith("argument ")], imported.not_carried
    values = imported.recipe.inventory_vars()
    assert after(values["extra_args"], "--cudagraph-capture-sizes") == list(SIZES)
    argv = vllm_server_argv(**served_values(values))
    assert after(argv, "--cudagraph-capture-sizes") == list(SIZES)
    written = sparkarena.parse(sparkarena.write(imported.recipe), "out.yaml")
    assert after(sparkarena.tokens(written["command"]), "--cudagraph-capture-sizes") == list(SIZES)
    again = sparkarena.read(sparkarena.write(imported.recipe), "out.yaml", "out")
    assert again.recipe is not None and again.recipe.settings["extra_args"] == imported.recipe.settings["extra_args"]


def test_a_one_value_flag_still_leaves_a_stray_word_named() -> None:
    """--max-num-seqs takes one value: a second word after it is still a stray positional, named."""
    text = with_sizes(text_of(DFLASH)).replace("--cudagraph-capture-sizes 1 2", "--max-num-seqs 8 9")
    imported = sparkarena.read(text, DFLASH, Path(DFLASH).stem)
    assert ("argument 9", "a positional argument after the model: vllm serve takes one") in imported.not_carried


@pytest.mark.parametrize("nargs", ["", "x", "1", 3])
def test_the_table_refuses_an_arity_that_is_no_nargs(nargs: object) -> None:
    from provision.errors import ContractError

    with pytest.raises(ContractError, match="arity"):
        contracts.parse({"engines": {"vllm": {"target": "0.34.0", "packages": ["vllm"],
                                              "arity": {"--x": nargs}}}, "rows": []}, "test")
