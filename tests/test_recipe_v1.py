"""sparkrun's default registry, spark-arena/eugr-recipes, read as sparkrun reads it (issue 65, item 2):
its `recipe_version: "1"` files (tests/fixtures/recipes/eugr/, sources.json naming the repository, path
and commit of each), their cluster_only and solo_only, a max_model_len of `auto`; and a registry of which
nothing can be read (Avarok-Cybersecurity/atlas-recipes, runtime atlas: tests/fixtures/recipes/atlas/)
is not added, with why."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from provision.errors import RecipeError
from provision.recipes import registry, sparkarena
from tests.conftest import FIXTURES as ALL_FIXTURES
from tests.test_recipe_registry import data_dir, git  # noqa: F401 (a fixture)

EUGR = ALL_FIXTURES / "recipes" / "eugr"
ATLAS = ALL_FIXTURES / "recipes" / "atlas"
ULTRA = "nemotron-3-ultra-nvfp4.yaml"  # cluster_only, tensor parallel 4, --cudagraph-capture-sizes 5 10 15 20
AUTO = "deepseek-v4-flash-0731.yaml"  # max_model_len: auto
SOLO_TP2 = "gemma4-26b-a4b-nvfp4.yaml"  # solo_only, yet tensor parallel 2
GLM = "glm-4.7-flash-awq.yaml"  # cluster_only: false, solo_only: false


def source_of(folder: Path, name: str) -> dict[str, str]:
    entry: dict[str, str] = json.loads((folder / "sources.json").read_text(encoding="utf-8"))[name]
    assert len(entry["commit"]) == 40 and entry["path"].endswith(name)
    return entry


def read(name: str) -> sparkarena.Imported:
    assert source_of(EUGR, name)["repository"] == "spark-arena/eugr-recipes"
    return sparkarena.read((EUGR / name).read_bytes(), name, Path(name).stem)


def test_a_version_1_file_is_read_as_sparkrun_reads_it() -> None:
    imported = read(ULTRA)
    assert imported.recipe is not None, imported.refused
    recipe = imported.recipe
    assert recipe.hardware.nodes == 4 and recipe.settings["tensor_parallel_size"] == 4
    assert recipe.description.startswith("vLLM serving Nemotron-3-Ultra-550B-A55B-NVFP4")
    assert any(note.startswith("recipe_version 1, read as sparkrun reads it") for note in recipe.notes)
    assert ("field name", "'Nemotron-3-Ultra-NVFP4': sparkrun names a recipe by its file, and so does the tool") \
        in imported.not_carried
    # its four capture sizes are one flag's values (item 1), as vLLM's parser takes them
    args = list(recipe.settings["extra_args"])
    assert args[args.index("--cudagraph-capture-sizes") + 1:][:4] == ["5", "10", "15", "20"]


def test_cluster_only_and_solo_only_bound_the_nodes_as_sparkrun_does() -> None:
    glm = read(GLM)  # both false: one node, no bound
    assert glm.recipe is not None and glm.recipe.hardware.nodes == 1
    text = (EUGR / GLM).read_text(encoding="utf-8").replace("cluster_only: false", "cluster_only: true")
    clustered = sparkarena.read(text, GLM, "glm")
    assert clustered.recipe is not None and clustered.recipe.hardware.nodes == 2
    solo = read(SOLO_TP2)
    assert solo.recipe is None
    assert solo.refused == ("tensor x pipeline parallel asks 2 GPUs, one a DGX Spark, and solo_only (one node, "
                            "sparkrun's recipe.py:600-605)")
    both = text.replace("solo_only: false", "solo_only: true")
    with pytest.raises(RecipeError, match="cluster_only and solo_only are both true"):
        sparkarena.read(both, GLM, "glm")
    with pytest.raises(RecipeError, match="'solo_only' must be true or false"):
        sparkarena.read(text.replace("solo_only: false", "solo_only: maybe"), GLM, "glm")


def test_max_model_len_auto_is_the_models_own_context() -> None:
    imported = read(AUTO)
    assert imported.recipe is not None, imported.refused
    assert "max_model_len" not in imported.recipe.inventory_vars()
    assert any(note.startswith("--max-model-len auto: the model's own context (its config.json)")
               for note in imported.recipe.notes)


def test_a_version_neither_1_nor_2_is_refused_by_name() -> None:
    text = (EUGR / GLM).read_text(encoding="utf-8").replace('recipe_version: "1"', 'recipe_version: "3"')
    with pytest.raises(RecipeError, match="recipe_version: '3'; this reader reads 1 and 2, as sparkrun does"):
        sparkarena.read(text, GLM, "glm")


def repository(tmp_path: Path, folder: Path, names: list[str]) -> Path:
    repo = tmp_path / folder.name
    for name in names:
        inner = repo / source_of(folder, name)["path"]
        inner.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(folder / name, inner)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "recipes")
    return repo


def test_the_default_registry_is_added_with_its_recipes(tmp_path: Path, data_dir: Path) -> None:  # noqa: F811
    origin = repository(tmp_path, EUGR, [ULTRA, AUTO, SOLO_TP2, GLM])
    added = registry.add("eugr", f"file://{origin}")
    contents = registry.read(added)
    assert sorted(item.recipe.name for item in contents.recipes) == [
        "eugr/deepseek-v4-flash-0731", "eugr/glm-4.7-flash-awq", "eugr/nemotron-3-ultra-nvfp4"]
    assert [path for path, _ in contents.refused] == [f"recipes/{SOLO_TP2}"]


def test_a_registry_of_which_nothing_can_be_read_is_not_added(tmp_path: Path, data_dir: Path) -> None:  # noqa: F811
    origin = repository(tmp_path, ATLAS, ["qwen3.5-0.8b-bf16-atlas.yaml"])
    with pytest.raises(RecipeError) as raised:
        registry.add("atlas", f"file://{origin}")
    assert raised.value.message.startswith(f"file://{origin}: none of its 1 recipe(s) can be read here, so it is "
                                           "not added; 1 refused: runtime 'atlas' has no engine here")
    assert registry.load() == [] and not (data_dir / "registries" / "atlas").exists()
