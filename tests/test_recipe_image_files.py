"""Files a recipe's container image holds (a mod's reasoning-parser plugin, its chat template): named on
import as files the hosts need, refused by recipe.apply until the server_files setting gives each from
the controller, then copied to the host by the plan and named on the server's command line.

The recipe is Spark Arena's own (tests/fixtures/recipes/spark-arena/nemotron-3-nano-nvfp4-vllm.yaml,
verbatim): its mod mods/nemotron-nano fetches nano_v3_reasoning_parser.py into the container's working
directory, and its command says `--reasoning-parser-plugin nano_v3_reasoning_parser.py`. The rendered
command is held to the options vLLM's own parser registers (make_arg_parser, recorded for the contract
table's target release: tests/fixtures/wheels/vllm-<version>.parser-options.json)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import textwrap
from pathlib import Path

import pytest

from provision import contracts, inventory, plan, render, serverfiles
from provision.errors import InventoryError, RecipeError, RenderError
from provision.recipes import applying, sparkarena
from tests.test_render import _host_as_rendered, _state, contexts_of, exec_start

FIXTURES = Path(__file__).parent / "fixtures"
NEMOTRON = FIXTURES / "recipes" / "spark-arena" / "nemotron-3-nano-nvfp4-vllm.yaml"
FLAG = "--reasoning-parser-plugin"
PLUGIN = "nano_v3_reasoning_parser.py"
# A stand-in for the plugin the mod fetches (its bytes are the hub's, not held here): what matters is
# that the host gets these bytes and the server the path.
PLUGIN_TEXT = "from vllm.reasoning import ReasoningParserManager  # plugin\n"

INVENTORY = """\
hosts:
  spark-1: {address: 192.0.2.20, user: root, profile: dgx-spark}
clusters:
  nano:
    hosts: [spark-1]
    vars: {model: nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4}
"""


def imported() -> sparkarena.Imported:
    return sparkarena.read(NEMOTRON.read_bytes(), NEMOTRON.name, NEMOTRON.stem, {"engine_spec": "vllm==0.33.0"})


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "hosts.yaml").write_text(INVENTORY)
    (tmp_path / PLUGIN).write_text(PLUGIN_TEXT)
    return tmp_path


def test_the_file_inside_the_image_is_named_on_import_and_carried_as_a_file_to_give() -> None:
    result = imported()
    assert result.recipe is not None, result.refused
    values = result.recipe.inventory_vars()
    # Carried as a reference that must be filled, not as a server flag pointing at nothing.
    assert values["server_files"] == {FLAG: f"image:{PLUGIN}"}
    assert FLAG not in values.get("server_flags", {})
    why = dict(result.not_carried)[f"{FLAG} {PLUGIN}"]
    assert "file inside the container image" in why and "working directory" in why
    assert f"--set server_files='{{{FLAG}: LOCAL_FILE}}'" in why
    # ... and the mod that put it there is named too.
    assert "mod mods/nemotron-nano" in dict(result.not_carried)


@pytest.mark.parametrize(("flag", "value", "outcome"), [
    ("--chat-template", "unsloth.jinja", "file"),  # a mod's template, relative to the working directory
    ("--chat-template", "/workspace/vllm/fixed_chat_template.jinja", "file"),
    ("--chat-template", "{% for m in messages %}{{ m.content }}{% endfor %}", "flag"),  # a template inline
    # any other flag's file of the image: not one server_files places (a key, a config): not carried, said
    ("--hf-overrides-file", "/workspace/mods/fix/overrides.json", "skipped"),
    ("--ssl-keyfile", "/root/key.pem", "skipped"),
    ("--download-dir", "/root/.cache/huggingface", "flag"),  # the model cache the tool's model_dir replaces
    ("--tool-call-parser", "qwen3_coder", "flag"),  # a name, not a file
], ids=["relative-template", "absolute-template", "inline-template", "image-path", "a-key-file", "model-cache",
        "a-name"])
def test_which_values_are_files_of_the_image(flag: str, value: str, outcome: str) -> None:
    pairs = [(flag, value)]
    reading = sparkarena._Reading("test")
    settings = sparkarena._read_flags(reading, pairs, sparkarena.catalog.ENGINES["vllm"], "vllm serve", "m")
    assert (settings.get("server_files") == {flag: f"image:{value}"}) is (outcome == "file")
    assert (flag in settings.get("server_flags", {}) or flag in settings.get("extra_args", [])) is (outcome == "flag")
    skipped = dict(reading.not_carried).get(f"{flag} {value}", "")
    assert ("not a template or plugin the tool places" in skipped) is (outcome == "skipped"), reading.not_carried


def test_apply_is_refused_naming_the_flag_the_image_file_and_the_setting_to_give(folder: Path) -> None:
    inv = inventory.load(folder)
    recipe = imported().recipe
    assert recipe is not None
    with pytest.raises(RecipeError) as refused:
        applying.plan(inv, "nano", recipe, {})
    message = refused.value.message
    assert f"{FLAG} {PLUGIN}" in message and "inside the recipe's container image" in message
    assert f"--set server_files='{{{FLAG}: LOCAL_FILE}}'" in message
    assert f"`server_files: {{{FLAG}: LOCAL_FILE}}` (a path relative to the inventory file)" in message
    assert not (folder / "applied").exists()


def test_apply_passes_once_set_gives_the_file_and_the_applied_file_names_it(folder: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(folder)  # --set reads a relative path from the current directory
    inv = inventory.load(folder)
    recipe = imported().recipe
    assert recipe is not None
    overrides = inventory.parse_overrides([f"server_files={{{FLAG}: ./{PLUGIN}}}"])
    application = applying.plan(inv, "nano", recipe, overrides)
    assert application.applied.settings("spark-1").server_files == {FLAG: str(folder / PLUGIN)}
    application.path.parent.mkdir(parents=True)
    application.path.write_text(application.new_text)
    assert inventory.load(folder).settings("spark-1").server_files == {FLAG: str(folder / PLUGIN)}


def test_the_inventory_s_own_vars_give_the_file_too(folder: Path) -> None:
    """A file in a host's vars, relative to the inventory file: the host has it, the recipe passes."""
    (folder / "hosts.yaml").write_text(INVENTORY.replace(
        "profile: dgx-spark}", f"profile: dgx-spark, vars: {{server_files: {{{FLAG}: {PLUGIN}}}}}}}"))
    recipe = imported().recipe
    assert recipe is not None
    # The recipe's reference sits below the host's vars: the file given there stands.
    application = applying.plan(inventory.load(folder), "nano", recipe, {})
    assert application.applied.settings("spark-1").server_files == {FLAG: str(folder / PLUGIN)}


@pytest.mark.parametrize(("value", "expected"), [
    ("{--reasoning-parser-plugin: ./absent.py}", "absent.py: no such file on this machine"),
    ("{--max-model-len: ./big.py}", "--max-model-len takes no file: it is the setting max_model_len"),
    ("{--port: ./p.py}", "is a flag the tool sets itself"),
    ("{--ssl-keyfile: ./big.py}", "--ssl-keyfile is not a flag whose file the tool places"),
    ("{--chat-template: ./big.py}", "over 1024 KiB"),
    ("{--chat-template: ./}", "not a regular file"),
    ("[a.py]", "expected a mapping of --flag: FILE"),
], ids=["missing", "takes-no-file", "owned", "a-key-file", "too-big", "a-directory", "not-a-mapping"])
def test_bad_input_is_an_inventory_error_naming_the_file_line_and_key(folder: Path, value: str,
                                                                        expected: str) -> None:
    (folder / "big.py").write_bytes(b"#" * (serverfiles.MAX_BYTES + 1))
    (folder / "hosts.yaml").write_text(INVENTORY + textwrap.dedent(f"""\
        groups:
          all:
            hosts: [spark-1]
            vars:
              server_files: {value}
        """))
    with pytest.raises(InventoryError) as bad:
        inventory.load(folder)
    assert expected in bad.value.message
    assert bad.value.file == str(folder / "hosts.yaml") and bad.value.line == 11
    assert bad.value.key == "server_files"


def test_set_of_a_missing_file_is_refused_on_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InventoryError) as bad:
        inventory.parse_overrides([f"server_files={{{FLAG}: ./absent.py}}"])
    assert bad.value.file == "command line" and f"{tmp_path / 'absent.py'}: no such file" in bad.value.message


# ---------------------------------------------------------------------------------------------
# The render and the plan: the file copied, the flag given its path on the host.

def parser_options() -> set[str]:
    """The option strings vLLM's own parser (make_arg_parser) registers in the table's target release."""
    target = contracts.load().target("vllm")
    recorded = json.loads((FIXTURES / "wheels" / f"vllm-{target}.parser-options.json").read_text())
    return set(recorded["options"])


def given_state(plugin: Path, **values: object) -> render.DesiredState:
    (ctx,) = contexts_of("rtx5090x2-tp2-awq32b-all-good", server_files={FLAG: str(plugin)}, **values).values()
    return _state(ctx)


def test_the_vllm_command_names_the_host_path_and_the_plan_copies_the_file(tmp_path: Path) -> None:
    plugin = tmp_path / PLUGIN
    plugin.write_text(PLUGIN_TEXT)
    # A server_flags or extra_args value of the same flag is replaced, never doubled.
    state = given_state(plugin, server_flags={FLAG: "/elsewhere.py"}, extra_args=[FLAG, "/other.py"])
    host_path = f"/etc/provision/files/server/{PLUGIN}"
    argv = exec_start(next(f.content for f in state.files if f.path.endswith("/vllm.service")))
    assert argv.count(FLAG) == 1 and argv[argv.index(FLAG) + 1] == host_path
    flags = {word.split("=")[0] for word in argv[argv.index("-m") + 2:] if word.startswith("-")}
    assert flags <= parser_options(), sorted(flags - parser_options())
    copied = next(f for f in state.files if f.path == host_path)
    assert (copied.content, copied.owner, copied.group, copied.mode) == (PLUGIN_TEXT, "root", "root", 0o644)
    assert copied.restarts == ("vllm.service",)
    assert {(d.path, d.owner, d.mode) for d in state.directories} >= {
        ("/etc/provision", "root", 0o755), ("/etc/provision/files", "root", 0o755),
        ("/etc/provision/files/server", "root", 0o755)}
    # A host without the file: the plan writes it (with its content) and restarts the running server.
    host = _host_as_rendered(state)
    files = {path: found for path, found in host.files.items() if path != host_path}
    changes = plan.build(state, dataclasses.replace(host, files=files))
    assert [(c.kind, c.target) for c in changes] == [("file", host_path), ("restart", "vllm.service")]
    assert changes[0].data["content"] == PLUGIN_TEXT and changes[0].reason == "missing"


def test_an_unchanged_host_plans_nothing_for_the_file_and_a_changed_file_restarts(tmp_path: Path) -> None:
    plugin = tmp_path / PLUGIN
    plugin.write_text(PLUGIN_TEXT)
    state = given_state(plugin)
    host = _host_as_rendered(state)
    assert plan.build(state, host) == []
    plugin.write_text(PLUGIN_TEXT + "# fixed\n")
    changed = given_state(plugin)
    changes = plan.build(changed, host)
    digest = hashlib.sha256((PLUGIN_TEXT + "# fixed\n").encode()).hexdigest()[:12]
    assert [(c.kind, c.target) for c in changes] == [("file", f"/etc/provision/files/server/{PLUGIN}"),
                                                     ("restart", "vllm.service")]
    assert digest in changes[0].reason


def test_a_file_no_longer_given_is_removed_from_the_host(tmp_path: Path) -> None:
    plugin = tmp_path / PLUGIN
    plugin.write_text(PLUGIN_TEXT)
    host = _host_as_rendered(given_state(plugin))
    host = dataclasses.replace(host, dirs={**host.dirs, "/etc/provision/files/server": [PLUGIN]})
    (ctx,) = contexts_of("rtx5090x2-tp2-awq32b-all-good").values()
    state = _state(dataclasses.replace(ctx, facts=host))
    assert f"/etc/provision/files/server/{PLUGIN}" in state.absent_files
    removed = [change for change in plan.build(state, host) if change.kind == "remove"]
    assert [(change.target, change.reason) for change in removed] == [
        (f"/etc/provision/files/server/{PLUGIN}", "a file server_files no longer gives")]


def test_the_probe_asks_for_the_file_and_its_folders(folder: Path) -> None:
    from provision.run import gating

    (folder / "hosts.yaml").write_text(INVENTORY.replace("vars: {", f"vars: {{server_files: {{{FLAG}: {PLUGIN}}}, "))
    inv = inventory.load(folder)
    ask = gating.probe_ask(inv, "spark-1", inv.settings("spark-1"))
    assert {f"/etc/provision/files/server/{PLUGIN}", "/etc/provision", "/etc/provision/files",
            "/etc/provision/files/server"} <= set(ask.inspect["files"])
    assert "/etc/provision/files/server" in ask.inspect["dirs"]


def test_a_file_not_given_is_never_rendered(tmp_path: Path) -> None:
    """Past recipe.apply (a reference kept in the inventory by hand): the render refuses, naming it."""
    (ctx,) = contexts_of("rtx5090x2-tp2-awq32b-all-good", server_files={FLAG: f"image:{PLUGIN}"}).values()
    with pytest.raises(RenderError, match=f"{FLAG} {PLUGIN}.*server_files"):
        _state(ctx)


def test_generations_record_the_placed_files_so_a_rollback_puts_them_back(tmp_path: Path) -> None:
    """The files server_files places are in the scope a generation records (and a rollback restores)."""
    from provision import run, services

    plugin = tmp_path / PLUGIN
    plugin.write_text("# plugin\n")
    settings = inventory.Settings.of(inventory.validate_vars(
        {"model": "a/b", "server_files": {FLAG: str(plugin)}}, source="t", entity="host h"))
    scope = run.scope_of(settings, services.HOST)
    assert f"{serverfiles.FILES_DIR}/server/{PLUGIN}" in scope.files
    assert set(render.managed_paths_of(services.HOST)) <= set(scope.files)
