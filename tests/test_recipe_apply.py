"""recipe.apply: a recipe written beside the inventory for one cluster (applied/CLUSTER.yaml), read above
the cluster's own vars and below its groups', hosts', tuned settings and the command line; what changes
on each host shown first; the gate's verdict deciding whether the file is written."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from provision import checks, inventory, recipes, run
from provision.errors import InventoryError, RecipeError
from provision.recipes import applying
from tests.test_recipes import run as cli

INVENTORY = """\
hosts:
  ws-1: {address: 192.0.2.10, user: root, profile: rtx5090}
  ws-2: {address: 192.0.2.11, user: root, profile: rtx5090}
  box: {address: 192.0.2.12, user: root, profile: cpu}
groups:
  cool:
    hosts: [ws-2]
    vars: {gpu_memory_utilization: 0.8, environment: {NCCL_DMABUF_ENABLE: "0"}}
clusters:
  coder:
    hosts: [ws-1]
    vars: {model: Qwen/Qwen2.5-Coder-32B-Instruct-AWQ, max_model_len: 16384, port: 8001}
  chat:
    hosts: [ws-2]
    vars: {model: Qwen/Qwen2.5-32B-Instruct-AWQ}
  tiny:
    hosts: [box]
    vars: {model: lab/tiny-llama}
"""
SEED = "deepseek-r1-distill-qwen-32b-awq-tp2-rtx5090"
LAB = "lab-cpu-tiny-llama"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "hosts.yaml").write_text(INVENTORY)
    return tmp_path


def recipe(name: str) -> recipes.Recipe:
    return recipes.load_recipes()[name]


def write(application: applying.Application) -> None:
    application.path.parent.mkdir(parents=True, exist_ok=True)
    application.path.write_text(application.new_text)


def test_applied_the_cluster_s_hosts_take_the_recipe_s_settings_above_the_cluster_s_own(folder: Path) -> None:
    inv = inventory.load(folder)
    application = applying.plan(inv, "coder", recipe(SEED), {})
    assert application.path == folder / "applied" / "coder.yaml" and application.old_text is None
    changed = {change.key: (change.before, change.after, change.origin) for change in application.changes["ws-1"]}
    origin = f"recipe {SEED} ({folder / 'applied' / 'coder.yaml'})"
    assert changed["model"] == ("Qwen/Qwen2.5-Coder-32B-Instruct-AWQ", "casperhansen/deepseek-r1-distill-qwen-32b-awq",
                                origin)
    assert changed["tensor_parallel_size"] == (1, 2, origin)
    assert changed["server_flags"] == ({}, {"--attention-backend": "FLASHINFER"}, origin)
    # What the recipe does not set stays the cluster's: the port, the context length.
    assert "port" not in changed and "max_model_len" not in changed and not application.kept["ws-1"]
    write(application)
    loaded = inventory.load(folder)
    settings = loaded.settings("ws-1")
    assert settings.model == "casperhansen/deepseek-r1-distill-qwen-32b-awq" and settings.port == 8001
    assert settings.origin["model"] == origin and settings.origin["port"] == "cluster coder"
    assert loaded.applied["coder"].recipe == SEED and loaded.applied["coder"].changed == ()
    # Applied again: nothing to write, nothing changes.
    again = applying.plan(loaded, "coder", recipe(SEED), {})
    assert again.unchanged and again.diff == "" and again.changes == {"ws-1": ()}
    # The other clusters are untouched.
    assert loaded.settings("ws-2").model == "Qwen/Qwen2.5-32B-Instruct-AWQ"


def test_a_group_or_a_host_keeps_what_it_sets_and_the_plan_says_so(folder: Path) -> None:
    application = applying.plan(inventory.load(folder), "chat", recipe(SEED), {"gpu_memory_utilization": 0.9})
    kept = {item.key: (item.recipe_value, item.value, item.origin) for item in application.kept["ws-2"]}
    assert kept == {"gpu_memory_utilization": (0.9, 0.8, "group cool"),
                    "environment.NCCL_DMABUF_ENABLE": ("1", "0", "group cool")}
    changed = {change.key for change in application.changes["ws-2"]}
    assert "gpu_memory_utilization" not in changed and "model" in changed


def test_set_gives_a_model_this_machine_can_serve_and_says_the_figures_are_not_its(folder: Path) -> None:
    application = applying.plan(inventory.load(folder), "chat", recipe(SEED),
                                inventory.parse_overrides(["model=lab/tiny-llama", "max_model_len=256"]))
    assert "changed:\n- model\n- max_model_len\n" in application.new_text
    assert "model_revision" not in application.new_text  # the recipe's revision is its own model's
    assert any("model lab/tiny-llama in place of the recipe's casperhansen/deepseek-r1-distill-qwen-32b-awq" in note
               for note in application.notes)
    assert any("max_model_len 256 in place of the recipe's (--set)" in note for note in application.notes)
    write(application)
    assert inventory.load(folder).applied["chat"].changed == ("model", "max_model_len")


def test_the_hardware_it_was_measured_on_is_named_where_the_cluster_differs(folder: Path) -> None:
    notes = applying.plan(inventory.load(folder), "tiny", recipe(SEED), {}).notes
    assert any("measured on profile rtx5090; cluster tiny runs cpu" in note for note in notes)
    assert not any("measured on" in note for note in applying.plan(inventory.load(folder), "tiny", recipe(LAB), {}).notes)


def test_what_cannot_be_applied_is_refused_saying_why(folder: Path) -> None:
    inv = inventory.load(folder)
    with pytest.raises(RecipeError, match="no cluster 'nope' in the inventory"):
        applying.plan(inv, "nope", recipe(SEED), {})
    with pytest.raises(RecipeError, match="the recipe's engine is vllm"):
        applying.plan(inv, "coder", recipe(SEED), {"engine": "llamacpp"})
    with pytest.raises(RecipeError, match="needs an inventory file"):
        applying.plan(inventory.Inventory(hosts={}, groups={}, clusters={}, ssh=inventory.SshSettings()),
                      "coder", recipe(SEED), {})


@pytest.mark.parametrize(("text", "message"), [
    ("cluster: nope\nrecipe: x\nvars: {}\n", "unknown cluster 'nope'"),
    ("cluster: coder\nvars: {}\n", "holds `cluster: NAME`, `recipe: NAME` and `vars"),
    ("cluster: coder\nrecipe: x\nvars: {tensor_parallel_size: -1}\n", "tensor_parallel_size"),
    ("cluster: coder\nrecipe: x\nvars: {}\nchanged: model\n", "`changed` lists setting names"),
])
def test_an_applied_file_that_does_not_read_stops_the_inventory_with_its_file(folder: Path, text: str,
                                                                               message: str) -> None:
    (folder / "applied").mkdir()
    (folder / "applied" / "bad.yaml").write_text(text)
    with pytest.raises(InventoryError, match=message) as caught:
        inventory.load(folder)
    assert "bad.yaml" in str(caught.value)


def test_two_recipes_for_one_cluster_are_refused(folder: Path) -> None:
    (folder / "applied").mkdir()
    for name in ("a", "b"):
        (folder / "applied" / f"{name}.yaml").write_text("cluster: coder\nrecipe: x\nvars: {}\n")
    with pytest.raises(InventoryError, match="a second recipe for cluster 'coder'"):
        inventory.load(folder)


# ---------------------------------------------------------------------------------------------
# The task: the gate decides (here a recorded verdict; the lab's test runs the real gate)


def finding(status: str) -> checks.Finding:
    return checks.Finding(id="gpu.count", status=status, severity="blocker", message=f"a {status}ed check",
                          fix=None if status == "pass" else "a fix")


def gated_with(status: str) -> Any:
    def gate(inv: inventory.Inventory, targets: list[inventory.Host], options: run.Options) -> run.Gated:
        assert inv.applied, "the gate judges the inventory with the recipe applied"
        names = [target.name for target in targets]
        return run.Gated(names, {name: [finding(status)] for name in names}, {}, {}, None)  # type: ignore[arg-type]
    return gate


def test_the_file_is_written_only_when_the_gate_passes(folder: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    target = folder / "applied" / "coder.yaml"
    monkeypatch.setattr(run, "gate", gated_with("fail"))
    assert cli(["recipe.apply", SEED, "--cluster", "coder", "--inventory", str(folder)]) == 1
    out = capsys.readouterr().out
    assert "not written: the gate refused a host of coder" in out and not target.exists()
    monkeypatch.setattr(run, "gate", gated_with("pass"))
    assert cli(["recipe.apply", SEED, "--cluster", "coder", "--inventory", str(folder), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"would write {target}" in out and "+recipe: " + SEED in out and not target.exists()
    assert f"deploy --cluster coder --inventory {folder}`" in out.replace("\n", "")
    assert cli(["recipe.apply", SEED, "--cluster", "coder", "--inventory", str(folder), "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["written"] and answer["gate_passed"] and target.exists()
    assert {"key": "tensor_parallel_size", "before": 1, "after": 2,
            "from": f"recipe {SEED} ({target})"} in answer["changes"]["ws-1"]
    assert answer["gate"]["hosts"]["ws-1"]["verdict"] == "ok"
    assert cli(["recipe.apply", SEED, "--cluster", "coder", "--inventory", str(folder)]) == 0
    assert f"{target}: unchanged" in capsys.readouterr().out


def test_bad_usage_exits_2_with_one_line(folder: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(run, "gate", gated_with("pass"))
    for argv, message in ((["recipe.apply", SEED, "--inventory", str(folder)], "--cluster NAME"),
                          (["recipe.apply", "no-such", "--cluster", "coder", "--inventory", str(folder)],
                           "no recipe 'no-such'"),
                          (["recipe.apply", SEED, "--cluster", "coder", "--inventory", str(folder),
                            "--set", "engine=trtllm"], "the recipe's engine is vllm")):
        assert cli(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and len(err.splitlines()) == 1, err
    assert not (folder / "applied").exists()
    assert cli(["recipe.apply", "-h"]) == 0
    assert "--dry-run" in capsys.readouterr().out


def test_the_shape_of_the_applied_file(folder: Path) -> None:
    text = applying.plan(inventory.load(folder), "tiny", recipe(LAB), {}).new_text
    body = text.split("\n", 3)[3]
    assert body.startswith("cluster: tiny\nrecipe: lab-cpu-tiny-llama\nvars:\n  engine: vllm\n"), text
    assert textwrap.dedent("""\
        # Recipe lab-cpu-tiny-llama applied to cluster tiny by recipe.apply""") in text


# ---------------------------------------------------------------------------------------------
# --fits HOST and show --host: each recipe judged on a host by the gate, nothing written


def memory_gate(inv: inventory.Inventory, targets: list[inventory.Host], options: run.Options,
                pool: object = None) -> run.Gated:
    """The gate's answer where the recipe asks two GPUs of a host that has them: the memory finding says
    how it fits (recorded verdicts; the lab's test runs the real gate)."""
    names = [target.name for target in targets]
    JUDGED.append(options.resolve_wheels)
    assert options.overrides["model"], "each recipe's settings are judged as --set gives them"
    fits = checks.Finding(id="memory.fits", status="pass", severity="blocker",
                          message=f"fits: {options.overrides['model']} with 3.1 GiB of KV cache a GPU")
    return run.Gated(names, {name: [fits] for name in names}, {}, {}, None)  # type: ignore[arg-type]


JUDGED: list[bool] = []  # each gate's resolve_wheels


def test_list_fits_judges_the_host_s_profile_recipes_on_it(folder: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(run, "gate", memory_gate)
    JUDGED.clear()
    assert cli(["recipe.list", "--fits", "ws-1", "--inventory", str(folder), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [item["name"] for item in listed] == [SEED]  # ws-1 is an rtx5090: that profile's recipes
    fit = listed[0]["fits"]
    assert fit["host"] == "ws-1" and fit["verdict"] == "ok" and fit["memory"]["message"].startswith(
        "fits: casperhansen/deepseek-r1-distill-qwen-32b-awq")
    assert cli(["recipe.show", SEED, "--host", "ws-1", "--inventory", str(folder)]) == 0
    assert "on ws-1: ok; memory: fits: casperhansen/deepseek-r1-distill-qwen-32b-awq" in capsys.readouterr().out
    # a list judges many recipes without resolving each one's wheels; one recipe shown is judged whole
    assert JUDGED == [False, True]
    assert cli(["recipe.list", "--fits", "nope", "--inventory", str(folder)]) == 2
    assert "nope" in capsys.readouterr().err
    assert not (folder / "applied").exists()


def test_apply_says_what_the_import_left_out_where_the_user_decides(
        folder: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 65, item 5: Spark Arena's official Qwen3-Coder-Next recipe (tests/fixtures/recipes/spark-arena,
    sources.json) relies on a mod (a patch of vLLM inside its container) and names its container by no
    release. Applied, the dry run, its --json and the file written each say both."""
    from provision.recipes import sparkarena
    from tests.test_recipes import FIXTURES as ARENA

    source = json.loads((ARENA / "sources.json").read_text())["qwen3-coder-next-int4-autoround-vllm.yaml"]
    assert source["path"].startswith("official-recipes/")
    imported = sparkarena.read((ARENA / "qwen3-coder-next-int4-autoround-vllm.yaml").read_bytes(), "qwen.yaml",
                               "qwen", {})
    assert imported.recipe is not None
    given = tmp_path_factory.mktemp("recipe") / "qwen.yaml"  # outside the inventory's folder
    given.write_text(recipes.to_yaml(imported.recipe))
    monkeypatch.setattr(run, "gate", gated_with("pass"))
    argv = ["recipe.apply", str(given), "--cluster", "coder", "--inventory", str(folder)]
    assert cli([*argv, "--dry-run", "--json"]) == 0
    mods, pin = json.loads(capsys.readouterr().out)["dropped"]
    assert mods.startswith("mods mods/fix-qwen3-next-autoround: the recipe's patches of vllm inside its container")
    assert pin.startswith("engine pin: the recipe names no vllm release and nothing pins one on ws-1")
    assert pin.endswith("--set engine_spec=vllm==X.Y.Z")
    assert cli([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "not carried: mods mods/fix-qwen3-next-autoround" in out and "not carried: engine pin:" in out
    assert not (folder / "applied" / "coder.yaml").exists()
    assert cli(argv) == 0
    assert "not carried: mods" in capsys.readouterr().out
    header = [line for line in (folder / "applied" / "coder.yaml").read_text().splitlines() if line.startswith("#")]
    assert any(line.startswith("# Not carried: mods mods/fix-qwen3-next-autoround: the recipe's patches of vllm")
               for line in header), header
    assert any(line.startswith("# Not carried: engine pin: the recipe names no vllm release") for line in header)
    # A pin given: only the mods are left to say.
    assert cli([*argv, "--dry-run", "--json", "--set", "engine_spec=vllm==0.20.0"]) == 0
    assert [item.split(":")[0] for item in json.loads(capsys.readouterr().out)["dropped"]] == [
        "mods mods/fix-qwen3-next-autoround"]


def test_a_registry_s_file_given_to_apply_points_to_recipe_import(
        folder: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 65, item 7: a Spark Arena v2 file (tests/fixtures/recipes/spark-arena, sources.json) and a
    community file that names no recipe_version (sparkrun reads it as v2; tests/fixtures/recipes/community)
    given where a recipe of the tool's own is read: exit 2, naming recipe.import, not the keys it lacks."""
    from tests.conftest import FIXTURES as ALL_FIXTURES

    monkeypatch.setattr(run, "gate", gated_with("pass"))
    community = ALL_FIXTURES / "recipes" / "community" / "glm-5.3-flash-exl3-2.05bpw-dflash2-vllm-gitcommit90.yaml"
    bare = tmp_path_factory.mktemp("community") / "no-version.yaml"  # outside the inventory's folder
    bare.write_text(community.read_text().replace('recipe_version: "2"\n', ""))
    arena = ALL_FIXTURES / "recipes" / "spark-arena" / "qwen3-coder-next-int4-autoround-vllm.yaml"
    for given in (arena, bare):
        for argv in (["recipe.apply", str(given), "--cluster", "coder", "--inventory", str(folder)],
                     ["recipe.show", str(given)], ["recipe.export", str(given)]):
            assert cli(argv) == 2, argv
            err = capsys.readouterr().err
            assert "a sparkrun recipe (Spark Arena's format), not one of this tool's: import it first" in err, err
            assert f"recipe.import {given} --output RECIPE.yaml" in err and "unknown key" not in err, err
    assert not (folder / "applied").exists()
