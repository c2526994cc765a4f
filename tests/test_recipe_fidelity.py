"""What a Spark Arena recipe says survives the way in and the way back (issue 53, points 4, 5 and 7), on the
registry's own files (tests/fixtures/recipes/spark-arena/, sources.json naming each one's repository, path
and commit). Where no snapshot of the registry holds a case (a flag given twice, a secret or a line break in
`env`), the test changes one thing in a real file and says so."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from provision import catalog, inventory, lab, report, vllm_wheel
from provision import recipes as recipes_module
from provision.errors import InventoryError, RecipeError
from provision.recipes import sparkarena
from tests.conftest import FIXTURES as ALL_FIXTURES
from tests.test_render import _state, contexts_of, exec_start

FIXTURES = ALL_FIXTURES / "recipes" / "spark-arena"
SOURCES = json.loads((FIXTURES / "sources.json").read_text(encoding="utf-8"))
# Qwen3.6-35B-A3B (a hybrid model) with DFlash: no prefix-caching flag, a chat template inside the image,
# a mod, min_nodes 2 and no max_nodes.
DFLASH = "qwen3.6-35b-a3b-fp8-dflash-vllm.yaml"
# DeepSeek-V4-Flash: build_args, a mod, min_nodes 2, a container named by no release, --enable-prefix-caching.
DEEPSEEK = "deepseek4-flash-fp8-vllm.yaml"
SECRET = "sk-recipe-0123456789abcdef"  # what a careless recipe ships; it must appear nowhere


def text_of(name: str) -> str:
    assert SOURCES[name]["repository"] == "spark-arena/recipe-registry" and len(SOURCES[name]["commit"]) == 40
    return (FIXTURES / name).read_text(encoding="utf-8")


def read(text: str, name: str = DFLASH, overrides: dict[str, Any] | None = None) -> sparkarena.Imported:
    return sparkarena.read(text, name, Path(name).stem, overrides)


def everything_said(imported: sparkarena.Imported) -> str:
    """All an import shows or keeps: its JSON, its printed report, and our recipe file where there is one."""
    console = Console(record=True, width=200)
    report.print_imported(imported, console)
    said = [report.dump_json(report.imported_json(imported)), console.export_text(), repr(imported)]
    if imported.recipe is not None:
        said.append(recipes_module.to_yaml(imported.recipe))
    return "\n".join(said)


def with_env(text: str, lines: str) -> str:
    """The file with more variables under its `env:`."""
    assert text.count("\nenv:\n") == 1
    return text.replace("\nenv:\n", "\nenv:\n" + lines)


# --- 4. The engine's own default; every value of a flag given twice; no line break in a variable ---------

def test_a_recipe_that_leaves_prefix_caching_off_leaves_it_to_vllm() -> None:
    """The DFlash recipe says nothing of the prefix cache: imported, nothing is set, and the rendered
    command says nothing either (vLLM chooses per model); every flag of it is one of vLLM's serve options."""
    imported = read(text_of(DFLASH))
    assert imported.recipe is not None, imported.refused
    values = imported.recipe.inventory_vars()
    assert "enable_prefix_caching" not in values
    assert inventory.VAR_SPECS["enable_prefix_caching"].default is None
    served = {key: value for key, value in values.items() if key not in ("engine", "server_files")}
    argv = vllm_server_argv(**served)
    assert not {"--enable-prefix-caching", "--no-enable-prefix-caching"} & set(argv)
    assert argv[argv.index("--speculative-config") + 1] == values["server_flags"]["--speculative-config"]
    options = vllm_wheel.serve_options(vllm_wheel.open_release(ALL_FIXTURES / "wheels" / "vllm-0.33.0")).options
    flags = [arg.split("=")[0] for arg in argv[argv.index("-m") + 2:] if arg.startswith("-")]
    assert [flag for flag in flags if flag not in options] == []
    # A recipe that says it, and an inventory that says it, are rendered as said.
    deepseek = read(text_of(DEEPSEEK), DEEPSEEK)
    assert deepseek.recipe is not None and deepseek.recipe.settings["enable_prefix_caching"] is True
    assert "--enable-prefix-caching" in vllm_server_argv(enable_prefix_caching=True)
    assert "--no-enable-prefix-caching" in vllm_server_argv(enable_prefix_caching=False)
    written = sparkarena.parse(sparkarena.write(imported.recipe), "out.yaml")
    assert "prefix-caching" not in written["command"]


def vllm_server_argv(**values: Any) -> list[str]:
    pair = contexts_of("spark-pair-good", **values)
    unit = next(f.content for f in _state(pair["spark-a"]).files if f.path.endswith("/vllm.service"))
    return exec_start(unit)


# Each engine's rendered server (and TensorRT-LLM's options file) with the setting unset, true and false.
ENGINE_CASES = {
    "vllm": ("rtx5090x2-tp2-awq32b-all-good", {}),
    "sglang": ("rtx5090x2-tp2-awq32b-all-good", {"engine": "sglang", "engine_spec": "sglang==0.5.23"}),
    "llamacpp": ("llamacpp-cpu-gguf", {"max_model_len": 256, "served_model_name": "tiny-gguf",
                                       "venv_source": lab.LLAMA_CPP_SOURCE}),
    "trtllm": ("trtllm-rtx5090x2-nvfp4", {}),
}
# What each says per value: (unset, true, false); TensorRT-LLM's is kv_cache_config.enable_block_reuse.
PREFIX_SAID: dict[str, tuple[list[str], list[str], list[str]]] = {
    "vllm": ([], ["--enable-prefix-caching"], ["--no-enable-prefix-caching"]),
    "sglang": ([], [], ["--disable-radix-cache"]),
    "llamacpp": ([], [], ["--no-cache-prompt"]),
    "trtllm": ([], ["enable_block_reuse=True"], ["enable_block_reuse=False"]),
}
PREFIX_WORDS = {"--enable-prefix-caching", "--no-enable-prefix-caching", "--disable-radix-cache",
                "--no-cache-prompt", "enable_block_reuse=True", "enable_block_reuse=False"}


@pytest.mark.parametrize("engine", ENGINE_CASES)
def test_each_engine_says_the_prefix_cache_only_where_the_inventory_does(engine: str) -> None:
    case, base = ENGINE_CASES[engine]
    for value, expected in zip((None, True, False), PREFIX_SAID[engine], strict=True):
        (ctx,) = contexts_of(case, **base, enable_prefix_caching=value).values()
        files = _state(ctx).files
        unit = next(f.content for f in files if f.path.endswith("/" + catalog.ENGINES[engine].server_unit))
        said = exec_start(unit)
        options = [f.content for f in files if f.path.endswith("trtllm-options.yaml")]
        if options:
            kv = yaml.safe_load(options[0])["kv_cache_config"]
            said += [f"enable_block_reuse={kv['enable_block_reuse']}"] if "enable_block_reuse" in kv else []
        assert [word for word in said if word in PREFIX_WORDS] == expected, (engine, value)


def test_a_flag_given_twice_keeps_every_value() -> None:
    """No snapshot of the registry gives a flag twice (`git log -S middleware` finds none), so the DFlash
    file gets vLLM's --middleware twice: an append option ("We accept multiple --middleware arguments",
    vllm/entrypoints/common/cli_args.py, 0.33.0). Both values, in order, imported, rendered and written back."""
    text = text_of(DFLASH).replace("    --enable-auto-tool-choice \\\n",
                                   "    --enable-auto-tool-choice \\\n    --middleware site.audit \\\n"
                                   "    --middleware site.limits \\\n")
    imported = read(text)
    assert imported.recipe is not None, imported.refused
    values = imported.recipe.inventory_vars()
    assert values["extra_args"] == ("--middleware", "site.audit", "--middleware", "site.limits")
    assert "--middleware" not in values["server_flags"]
    argv = vllm_server_argv(extra_args=list(values["extra_args"]))
    assert [argv[at + 1] for at, arg in enumerate(argv) if arg == "--middleware"] == ["site.audit", "site.limits"]
    again = read(sparkarena.write(imported.recipe), "out.yaml")
    assert again.recipe is not None and again.recipe.inventory_vars()["extra_args"] == values["extra_args"]
    # A flag given twice with the first one a server flag: both move, the first first.
    twice = read(text_of(DFLASH).replace("    --enable-auto-tool-choice \\\n",
                                         "    --load-format safetensors \\\n    --enable-auto-tool-choice \\\n"))
    assert twice.recipe is not None
    assert twice.recipe.inventory_vars()["extra_args"] == ("--load-format", "safetensors",
                                                           "--load-format", "fastsafetensors")


def test_a_variable_with_a_line_break_is_refused_at_import_and_in_the_inventory() -> None:
    """No snapshot's `env` holds a line break: the DFlash file with one such variable added."""
    imported = read(with_env(text_of(DFLASH), '  VLLM_LOGGING_PREFIX: "first\\nsecond"\n'))
    assert imported.recipe is None
    assert imported.refused == ("env VLLM_LOGGING_PREFIX holds a line break: an environment file holds one "
                                "variable a line")
    assert "VLLM_LOGGING_PREFIX" not in imported.settings.get("environment", {})
    with pytest.raises(InventoryError) as raised:
        inventory.validate_vars({"environment": {"A_NAME": f"{SECRET}\ntwo"}}, source="inv.yaml", entity="host h")
    assert raised.value.key == "environment" and "A_NAME holds a line break" in raised.value.message
    assert SECRET not in str(raised.value)  # a value may be a secret: never shown


# --- 5. A secret in a recipe is refused, and kept nowhere -------------------------------------------------

@pytest.mark.parametrize("variable", ["VLLM_API_KEY", "LLAMA_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",
                                      "OPENAI_API_KEY", "WANDB_SECRET"])
def test_a_recipe_that_ships_a_secret_is_refused_and_the_secret_is_kept_nowhere(variable: str) -> None:
    """The DFlash file with a secret added to its env, given literally and through a default."""
    for lines, defaults in ((f'  {variable}: "{SECRET}"\n', ""), (f'  {variable}: "{{key}}"\n', f"  key: {SECRET}\n")):
        text = with_env(text_of(DFLASH), lines).replace("\ndefaults:\n", "\ndefaults:\n" + defaults)
        imported = read(text)
        assert imported.recipe is None
        assert imported.refused.startswith(f"env {variable} is ")
        assert "publishes a secret" in imported.refused
        assert variable not in imported.settings.get("environment", {})
        assert SECRET not in everything_said(imported)


def test_a_key_on_the_command_line_or_in_an_unused_default_is_shown_nowhere() -> None:
    """The DFlash file whose command gives vLLM's --api-key from a default, a hub token given as
    --hf-token=VALUE, and a default no placeholder uses: refused as the variable is, its values shown nowhere
    (not in the expanded command, the placeholders, what was read, what was not carried)."""
    text = text_of(DFLASH).replace("\ndefaults:\n", f"\ndefaults:\n  api_key: {SECRET}\n  hub_token: {SECRET}x\n")
    assert text.count("vllm serve {model}") == 1
    text = text.replace("vllm serve {model}", f"vllm serve {{model}} --api-key {{api_key}} --hf-token={SECRET}y")
    imported = read(text)
    assert imported.recipe is None and "--api-key is a flag the tool sets itself" in imported.refused
    assert "--api-key" in imported.command and "--hf-token=(a secret: not shown)" in imported.command
    assert imported.placeholders["api_key"] == "(a secret: not shown)"
    assert ("default hub_token: (a secret: not shown)", "no placeholder of the command or env uses it") \
        in imported.not_carried
    assert SECRET not in everything_said(imported)


@pytest.mark.parametrize(("given", "says"), [
    (f"--hf-token {SECRET}", "--hf-token carries a credential (vLLM's --hf-token)"),
    (f"--hf-token={SECRET}", "--hf-token carries a credential (vLLM's --hf-token)"),
    (f"--hf_token {SECRET}", "--hf_token carries a credential (vLLM's --hf-token)"),
    (f"--speculative-config '{{\"method\": \"eagle\", \"hf_token\": \"{SECRET}\"}}'",
     "--speculative-config's JSON value holds 'hf_token', a credential"),
], ids=["flag-value", "flag-equals", "underscore-spelling", "inside-a-json-value"])
def test_a_hub_token_on_the_command_line_is_refused_with_the_secrets_file_named(given: str, says: str) -> None:
    """A recipe whose `vllm serve` carries the hub token imported with exit 0 and the token went into
    server_flags, the unit's ExecStart and /proc/PID/cmdline: now refused, naming the secrets file's
    hf_token (the 0600 environment file), the token shown nowhere."""
    text = text_of(DFLASH)
    assert text.count("vllm serve {model}") == 1
    imported = read(text.replace("vllm serve {model}", f"vllm serve {{model}} {given}"))
    assert imported.recipe is None, imported.recipe
    assert says in imported.refused, imported.refused
    if "JSON" in says:
        assert "give a hub token as the secrets file's hf_token" in imported.refused
    else:
        assert "give it as the secrets file's hf_token (the tool writes it as HF_TOKEN into the service's 0600 " \
               "environment file)" in imported.refused
    assert SECRET not in everything_said(imported)


def test_an_empty_secret_variable_is_not_carried_and_the_recipe_imports() -> None:
    imported = read(with_env(text_of(DFLASH), '  HF_TOKEN: ""\n'))
    assert imported.recipe is not None, imported.refused
    assert "HF_TOKEN" not in imported.recipe.inventory_vars()["environment"]
    assert any(what == "env HF_TOKEN" for what, _ in imported.not_carried)


def test_the_inventory_refuses_an_engines_api_key_variable_and_export_writes_no_secret() -> None:
    for name in ("VLLM_API_KEY", "LLAMA_API_KEY"):
        with pytest.raises(InventoryError) as raised:
            inventory.validate_vars({"environment": {name: SECRET}}, source="inv.yaml", entity="host h")
        assert raised.value.key == "environment" and "secrets file" in raised.value.message
        assert SECRET not in str(raised.value)
    imported = read(text_of(DFLASH))
    assert imported.recipe is not None
    ours = recipes_module.to_mapping(imported.recipe)
    keyed = {**ours, "settings": {**ours["settings"], "environment": {"VLLM_API_KEY": SECRET}}}
    with pytest.raises(RecipeError, match="VLLM_API_KEY") as refused:  # so export never loads it
        recipes_module.from_mapping(keyed, "ours.yaml")
    assert SECRET not in str(refused.value)
    tokened = recipes_module.from_mapping(
        {**ours, "settings": {**ours["settings"], "environment": {"HF_TOKEN": SECRET}}}, "ours.yaml")
    with pytest.raises(RecipeError, match="HF_TOKEN") as refused:
        sparkarena.write(tokened)
    assert SECRET not in str(refused.value)


# --- 7. What the import named is kept in our file and written back as it was -----------------------------

KEPT = ("container", "mods", "build_args", "min_nodes", "max_nodes")


@pytest.mark.parametrize("name", [DEEPSEEK, DFLASH, "qwen3.5-397b-a17b-int4-autoround-2x-vllm.yaml",
                                  "openai-gpt-oss-120b-vllm.yaml"])
def test_export_gives_back_what_the_import_named(name: str) -> None:
    """Imported, written as our YAML, read back, exported to v2: the container, mods, build_args,
    min_nodes and max_nodes are the original file's (a field it lacks stays absent)."""
    original = sparkarena.parse(text_of(name), name)
    imported = read(text_of(name), name)
    assert imported.recipe is not None, imported.refused
    ours = recipes_module.to_yaml(imported.recipe)
    back = recipes_module.from_mapping(yaml.safe_load(ours), "ours.yaml")
    assert back == imported.recipe and back.upstream["format"] == "spark-arena-v2"
    exported = sparkarena.parse(sparkarena.write(back), "out.yaml")
    assert {key: exported.get(key) for key in KEPT} == {key: original.get(key) for key in KEPT}
    again = read(sparkarena.write(back), "out.yaml")
    assert again.recipe is not None and again.recipe.hardware.nodes == imported.recipe.hardware.nodes


def test_node_bounds_a_file_lacks_stay_absent_and_a_count_moved_out_of_them_is_written_as_it_is() -> None:
    """gpt-oss-120b's file without its `max_nodes: 1` (sparkrun's own: from 1 up); then asked 2 GPUs by --set."""
    text = text_of("openai-gpt-oss-120b-vllm.yaml")
    assert text.count("max_nodes: 1\n") == 1
    bare = read(text.replace("max_nodes: 1\n", ""), "bare.yaml")
    assert bare.recipe is not None
    written = sparkarena.parse(sparkarena.write(bare.recipe), "x")
    assert "min_nodes" not in written and "max_nodes" not in written
    wider = read(text, "wider.yaml")
    assert wider.recipe is not None
    moved = recipes_module.from_mapping({**recipes_module.to_mapping(wider.recipe), "hardware": {
        **recipes_module.to_mapping(wider.recipe)["hardware"], "nodes": 2}}, "x.yaml")
    written = sparkarena.parse(sparkarena.write(moved), "x")
    assert (written["min_nodes"], written["max_nodes"]) == (2, 2)  # not the kept max_nodes 1 it outgrew


def test_the_chat_template_inside_the_image_is_written_back_and_the_container_yields_to_a_pin() -> None:
    imported = read(text_of(DFLASH))
    assert imported.recipe is not None
    assert imported.recipe.upstream["files"] == {"--chat-template": "fixed_chat_template.jinja"}
    command = sparkarena.tokens(sparkarena.parse(sparkarena.write(imported.recipe), "x")["command"])
    assert command[command.index("--chat-template") + 1] == "fixed_chat_template.jinja"
    given = sparkarena.parse(sparkarena.write(imported.recipe, "example/vllm:1"), "x")
    assert given["container"] == "example/vllm:1" and given["mods"] == ["mods/fix-qwen3.6-chat-template"]
    pinned = read(text_of(DFLASH), overrides={"engine_spec": "vllm==0.33.0"})
    assert pinned.recipe is not None
    written = sparkarena.write(pinned.recipe)
    assert sparkarena.parse(written, "x")["container"] == "vllm/vllm-openai:v0.33.0"
    assert "replaces the container ghcr.io/spark-arena/dgx-vllm-eugr-nightly:latest" in written.splitlines()[0]


@pytest.mark.parametrize(("upstream", "said"), [
    ({"format": "docker-compose"}, "upstream 'format' is one of spark-arena-v2"),
    ({"format": "spark-arena-v2", "volumes": ["/x"]}, "unknown key 'volumes'"),
    ({"format": "spark-arena-v2", "min_nodes": 0}, "upstream 'min_nodes' must be a positive integer"),
    ({"format": "spark-arena-v2", "mods": [1]}, "upstream 'mods' must be a string or a list of strings"),
    ({"format": "spark-arena-v2", "unread": ["pre_exec"]}, "upstream 'unread' must be a mapping of field names"),
    ("spark-arena-v2", "'upstream' must be a mapping"),
])
def test_an_upstream_that_breaks_its_format_is_refused(upstream: Any, said: str) -> None:
    imported = read(text_of(DFLASH))
    assert imported.recipe is not None
    with pytest.raises(RecipeError, match=said):
        recipes_module.from_mapping({**recipes_module.to_mapping(imported.recipe), "upstream": upstream}, "x.yaml")


# --- Issue 65, item 6: what the import does not read goes back out as it came ------------------------------

COMMUNITY = ALL_FIXTURES / "recipes" / "community"
GLM = "glm-5.3-flash-exl3-2.05bpw-dflash2-vllm-gitcommit90.yaml"


def test_an_export_gives_back_the_fields_the_import_did_not_read() -> None:
    """The community registry's GLM-5.3 recipe (tests/fixtures/recipes/community, sources.json) holds
    sparkrun fields the reader has no use for: executor_config (entrypoint "" clears the image's own),
    pre_exec (its patches), distribution_config (the drafter's pin), and metadata besides the description.
    Imported, kept as our file and exported again, each is as the registry's file has it."""
    source = json.loads((COMMUNITY / "sources.json").read_text())[GLM]
    assert source["repository"] == "spark-arena/community-recipe-registry" and len(source["commit"]) == 40
    text = (COMMUNITY / GLM).read_text(encoding="utf-8")
    original = yaml.safe_load(text)
    imported = read(text, GLM)
    assert imported.recipe is not None
    said = dict(imported.not_carried)["field pre_exec"]
    assert said.endswith("(kept as it is, and written back by `recipe.export --format spark-arena`)"), said
    kept = recipes_module.from_mapping(yaml.safe_load(recipes_module.to_yaml(imported.recipe)), "glm.yaml")
    exported = sparkarena.parse(sparkarena.write(kept), "exported.yaml")
    for field in ("executor_config", "pre_exec", "distribution_config", "metadata", "container"):
        assert exported[field] == original[field], field
    assert exported["executor_config"]["entrypoint"] == ""
    again = read(sparkarena.write(kept), "again.yaml")
    assert again.recipe is not None and again.recipe.upstream == imported.recipe.upstream


def test_a_field_the_import_does_not_read_that_holds_a_secret_s_name_is_not_kept() -> None:
    """The GLM-5.3 file with one line added under its executor_config: a token variable for the container."""
    text = (COMMUNITY / GLM).read_text(encoding="utf-8")
    assert text.count("  user: root") == 1
    imported = read(text.replace("  user: root", f"  user: root\n  environment: {{HF_TOKEN: {SECRET}}}"), GLM)
    assert imported.recipe is not None and "executor_config" not in imported.recipe.upstream["unread"]
    said = dict(imported.not_carried)["field executor_config"]
    assert "holding HF_TOKEN, a secret's name: neither kept nor written back" in said, said
    assert SECRET not in everything_said(imported) and SECRET not in sparkarena.write(imported.recipe)
    in_metadata = read(text.replace("  maintainer:", f"  api_key: {SECRET}\n  maintainer:"), GLM)
    assert in_metadata.recipe is not None and "api_key" not in in_metadata.recipe.upstream["metadata"]
    assert dict(in_metadata.not_carried)["metadata api_key"].startswith("a secret's name: neither kept")
    assert SECRET not in everything_said(in_metadata) and SECRET not in sparkarena.write(in_metadata.recipe)
