"""Recipe registries (provision/recipes/registry.py, `invoke registry.*`): a git repository of real
Spark Arena recipe files (tests/fixtures/recipes/spark-arena, each with its repository and commit in
sources.json), made here and reached by a file:// URL (no test reaches the network), cloned with this
machine's git into a data directory of the test's own."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from provision.errors import RecipeError
from provision.recipes import registry
from tests.test_recipes import FIXTURES, run

QWEN = "qwen3-coder-next-int4-autoround-vllm.yaml"
GPT_OSS = "openai-gpt-oss-120b-vllm.yaml"
MULTI_NODE_SGLANG = "minimax-m3-v0-nvfp4-4x.yaml"  # refused: SGLang is served on one node
PROFILE = "spark-arena-v2.yaml"  # the registry's benchmark profile: no recipe
EXPERIMENTAL = FIXTURES.parent / "spark-arena-experimental"  # the same file name under experimental-recipes/


def git(cwd: Path, *argv: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid", "HOME": str(cwd), "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", *argv], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "data"
    monkeypatch.setenv("PROVISION_DATA_DIR", str(where))
    return where


@pytest.fixture
def origin(tmp_path: Path) -> Path:
    """A registry laid out as Spark Arena's: recipes in folders, a benchmark profile, two commits ahead
    of nothing yet (the tests add them)."""
    repo = tmp_path / "recipe-registry"
    (repo / "official-recipes" / "qwen3-coder-next").mkdir(parents=True)
    (repo / "experimental-recipes" / "minimax-m3").mkdir(parents=True)
    (repo / "benchmarking").mkdir()
    shutil.copy(FIXTURES / QWEN, repo / "official-recipes" / "qwen3-coder-next" / QWEN)
    shutil.copy(FIXTURES / MULTI_NODE_SGLANG, repo / "experimental-recipes" / "minimax-m3" / MULTI_NODE_SGLANG)
    shutil.copy(Path("provision/benchprofiles") / PROFILE, repo / "benchmarking" / PROFILE)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "recipes")
    return repo


def test_add_clones_reads_and_keeps_the_commit_every_recipe_was_read_at(data_dir: Path, origin: Path) -> None:
    added = registry.add("arena", f"file://{origin}")
    head = git(origin, "rev-parse", "HEAD")
    assert added.commit == head and (data_dir / "registries" / "arena" / ".git").is_dir()
    assert registry.load() == [added]  # kept in the data directory's index
    contents = registry.read(added)
    assert [item.recipe.name for item in contents.recipes] == ["arena/qwen3-coder-next-int4-autoround-vllm"]
    listed = contents.recipes[0]
    assert listed.path == f"official-recipes/qwen3-coder-next/{QWEN}"
    # where it was read travels with the recipe: the URL, the commit and the file
    assert f"file://{origin} at {head}: {listed.path}" in listed.recipe.source
    assert listed.recipe.inventory_vars()["model"] == "Intel/Qwen3-Coder-Next-int4-AutoRound"
    assert [path for path, _ in contents.refused] == [f"experimental-recipes/minimax-m3/{MULTI_NODE_SGLANG}"]
    assert "serves SGLang on one node" in contents.refused[0][1]
    assert contents.not_recipes == ((f"benchmarking/{PROFILE}", "names no model: not a recipe"),)
    assert registry.find("arena/qwen3-coder-next-int4-autoround-vllm") == listed.recipe
    with pytest.raises(RecipeError, match="minimax-m3-v0-nvfp4-4x.yaml is not imported: the tool serves SGLang"):
        registry.find("arena/minimax-m3-v0-nvfp4-4x")
    with pytest.raises(RecipeError, match="no recipe 'arena/nothing' in registry arena"):
        registry.find("arena/nothing")


def test_update_checks_out_what_the_remote_holds_now_and_names_what_changed(data_dir: Path, origin: Path) -> None:
    before = registry.add("arena", f"file://{origin}")
    assert [result.unchanged for result in registry.update() if isinstance(result, registry.Updated)] == [True]
    shutil.copy(FIXTURES / GPT_OSS, origin / "official-recipes" / GPT_OSS)
    (origin / "experimental-recipes" / "minimax-m3" / MULTI_NODE_SGLANG).unlink()
    git(origin, "add", "-A")
    git(origin, "commit", "-q", "-m", "gpt-oss; minimax gone")
    [result] = registry.update(["arena"])
    assert isinstance(result, registry.Updated) and result.before == before.commit
    assert result.registry.commit == git(origin, "rev-parse", "HEAD") != before.commit
    assert set(result.changed) == {("A", f"official-recipes/{GPT_OSS}"),
                                   ("D", f"experimental-recipes/minimax-m3/{MULTI_NODE_SGLANG}")}
    assert registry.load()[0].commit == result.registry.commit  # the index keeps the new commit
    contents = registry.read(registry.load()[0])
    assert sorted(item.recipe.name for item in contents.recipes) == [
        "arena/openai-gpt-oss-120b-vllm", "arena/qwen3-coder-next-int4-autoround-vllm"]
    assert all(result.registry.commit in item.recipe.source for item in contents.recipes)
    assert contents.refused == ()


def test_one_registry_that_cannot_be_fetched_never_hides_the_others(
        data_dir: Path, origin: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    second = tmp_path / "second"
    shutil.copytree(origin, second)
    registry.add("gone", f"file://{second}")
    registry.add("arena", f"file://{origin}")
    shutil.rmtree(second)
    shutil.copy(FIXTURES / GPT_OSS, origin / GPT_OSS)
    git(origin, "add", "-A")
    git(origin, "commit", "-q", "-m", "gpt-oss")
    assert run(["registry.update", "--json"]) == 1
    gone, arena = json.loads(capsys.readouterr().out)
    assert "git fetch origin HEAD failed (exit 128)" in gone["error"] and "does not appear to be a git repository" \
        in gone["error"], gone
    assert arena["name"] == "arena" and arena["changed"] == [{"status": "A", "path": GPT_OSS}]
    assert registry.named("arena").commit == git(origin, "rev-parse", "HEAD")


def test_add_refuses_bad_input_and_leaves_nothing_behind(data_dir: Path, origin: Path, tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="a registry's name is lowercase"):
        registry.add("Spark Arena", f"file://{origin}")
    for url in ("https://someone:ghp_secret@github.com/spark-arena/recipe-registry",
                "https://ghp_secret@github.com/spark-arena/recipe-registry",  # a token as the user
                "ssh://git:secret@example.invalid/registry.git"):
        with pytest.raises(RecipeError, match="holds a password or token"):
            registry.add("arena", url)
    empty = tmp_path / "empty"
    (empty / "benchmarking").mkdir(parents=True)
    shutil.copy(Path("provision/benchprofiles") / PROFILE, empty / "benchmarking" / PROFILE)
    git(empty, "init", "-q", "-b", "main")
    git(empty, "add", "-A")
    git(empty, "commit", "-q", "-m", "no recipes")
    with pytest.raises(RecipeError, match="holds no recipe .* in 1 YAML file"):
        registry.add("empty", f"file://{empty}")
    assert registry.load() == [] and not any((data_dir / "registries").iterdir())
    registry.add("arena", f"file://{origin}")
    with pytest.raises(RecipeError, match="registry 'arena' exists already"):
        registry.add("arena", f"file://{origin}")
    assert registry.name_of("https://github.com/spark-arena/recipe-registry.git") == "recipe-registry"
    assert registry.name_of("git@github.com:scitrera/oss-spark-run.git") == "oss-spark-run"


def test_remove_deletes_the_clone_and_the_entry(data_dir: Path, origin: Path) -> None:
    registry.add("arena", f"file://{origin}")
    assert registry.remove("arena").name == "arena"
    assert registry.load() == [] and not (data_dir / "registries" / "arena").exists()
    with pytest.raises(RecipeError, match="no registry 'arena'"):
        registry.remove("arena")


def test_recipe_list_shows_the_registries_recipes_beside_the_shipped_ones(
        data_dir: Path, origin: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["registry.add", f"file://{origin}", "--name", "arena", "--json"]) == 0
    added = json.loads(capsys.readouterr().out)
    assert added["recipes"] == ["arena/qwen3-coder-next-int4-autoround-vllm"] and len(added["refused"]) == 1
    assert run(["recipe.list", "--json"]) == 0
    listed = {item["name"]: item["from"] for item in json.loads(capsys.readouterr().out)}
    assert listed["lab-cpu-tiny-llama"] == "shipped"
    assert listed["arena/qwen3-coder-next-int4-autoround-vllm"] == {
        "registry": "arena", "url": f"file://{origin}", "commit": git(origin, "rev-parse", "HEAD"),
        "path": f"official-recipes/qwen3-coder-next/{QWEN}"}
    assert run(["recipe.list", "--registry", "shipped", "--json"]) == 0
    assert all(item["from"] == "shipped" for item in json.loads(capsys.readouterr().out))
    assert run(["recipe.list"]) == 0
    out = capsys.readouterr().out
    assert "arena/qwen3-coder-next-int4-autoround-vllm" in out
    assert "registry arena at " in out and "1 recipe file(s) refused, not listed" in out
    assert run(["recipe.show", "arena/qwen3-coder-next-int4-autoround-vllm"]) == 0
    assert f"file://{origin} at " in capsys.readouterr().out
    assert run(["registry.list"]) == 0
    out = capsys.readouterr().out
    assert f"arena: experimental-recipes/minimax-m3/{MULTI_NODE_SGLANG} refused: the tool serves SGLang" in out
    assert run(["registry.add", "-h"]) == 0
    assert "registry.add [--options]" in capsys.readouterr().out
    assert run(["registry.remove", "arena"]) == 0
    assert "removed registry arena" in capsys.readouterr().out


def test_a_registry_s_own_format_recipe_names_no_file_of_this_machine(data_dir: Path, origin: Path) -> None:
    """A recipe someone else wrote may say which files it needs (image:PATH), never copy one of ours."""
    from provision import recipes

    lab = recipes.to_mapping(recipes.load_recipes()["lab-cpu-tiny-llama"])
    for name, files in (("takes", {"--chat-template": "/etc/passwd"}),
                        ("needs", {"--chat-template": "image:/workspace/t.jinja"})):
        (origin / f"{name}.yaml").write_text(yaml.safe_dump(
            {**lab, "name": name, "settings": {**lab["settings"], "server_files": files}}))
    git(origin, "add", "-A")
    git(origin, "commit", "-q", "-m", "ours")
    contents = registry.read(registry.add("arena", f"file://{origin}"))
    assert "arena/needs" in [item.recipe.name for item in contents.recipes]
    refused = dict(contents.refused)
    assert "server_files --chat-template name files of this machine" in refused["takes.yaml"], refused


def test_one_broken_registry_never_hides_the_others_or_the_shipped_recipes(
        data_dir: Path, origin: Path, capsys: pytest.CaptureFixture[str]) -> None:
    registry.add("arena", f"file://{origin}")
    registry.add("gone", f"file://{origin}")
    shutil.rmtree(data_dir / "registries" / "gone")
    assert run(["recipe.list", "--json"]) == 1
    captured = capsys.readouterr()
    names = {item["name"] for item in json.loads(captured.out)}
    assert {"lab-cpu-tiny-llama", "arena/qwen3-coder-next-int4-autoround-vllm"} <= names
    assert "error: registry 'gone': its clone" in captured.err and "is gone" in captured.err
    assert run(["registry.list"]) == 1
    assert "arena" in capsys.readouterr().out


def test_concurrent_changes_keep_every_registry(data_dir: Path, origin: Path) -> None:
    """add reads the index, clones, and writes it back: runs at once wait for each other, none is lost."""
    import threading

    errors: list[BaseException] = []

    def add(name: str) -> None:
        try:
            registry.add(name, f"file://{origin}")
        except BaseException as exc:  # noqa: BLE001 - the thread's failure is the test's
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(name,)) for name in ("one", "two", "three")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and sorted(item.name for item in registry.load()) == ["one", "three", "two"]


def test_recipes_are_labelled_with_the_commit_their_clone_holds(data_dir: Path, origin: Path) -> None:
    """An update cut short after its checkout, before the index was written: the clone's commit is told."""
    added = registry.add("arena", f"file://{origin}")
    shutil.copy(FIXTURES / GPT_OSS, origin / GPT_OSS)
    git(origin, "add", "-A")
    git(origin, "commit", "-q", "-m", "gpt-oss")
    clone = data_dir / "registries" / "arena"
    git(clone, "fetch", "-q", "--depth", "1", "origin", "HEAD")
    git(clone, "checkout", "-q", "--detach", "FETCH_HEAD")
    contents = registry.read(registry.load()[0])
    new = git(origin, "rev-parse", "HEAD")
    assert registry.load()[0].commit == added.commit != new
    assert contents.registry.commit == new and all(new in item.recipe.source for item in contents.recipes)


def test_a_short_name_is_the_official_recipe_an_experimental_one_only_when_asked_for(
        data_dir: Path, origin: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 65, item 4: Spark Arena holds qwen3-coder-next-int4-autoround-vllm.yaml both under
    official-recipes/ and experimental-recipes/eugr-vllm/ (another recipe: no fp8 KV cache, no
    max-num-seqs 128). experimental-recipes/ sorts first; sparkrun hides that part of the registry."""
    source = json.loads((EXPERIMENTAL / "sources.json").read_text())[QWEN]
    assert source["repository"] == "spark-arena/recipe-registry" and source["path"].startswith("experimental-recipes/")
    (origin / "experimental-recipes" / "eugr-vllm").mkdir()
    shutil.copy(EXPERIMENTAL / QWEN, origin / "experimental-recipes" / "eugr-vllm" / QWEN)
    git(origin, "add", "-A")
    git(origin, "commit", "-q", "-m", "the experimental recipe of the same name")
    registry.add("arena", f"file://{origin}")
    official = registry.find("arena/qwen3-coder-next-int4-autoround-vllm")
    assert official.inventory_vars()["server_flags"]["--kv-cache-dtype"] == "fp8"
    assert f"official-recipes/qwen3-coder-next/{QWEN}" in official.source
    asked = registry.find("arena/experimental-recipes/eugr-vllm/qwen3-coder-next-int4-autoround-vllm")
    assert "--kv-cache-dtype" not in asked.inventory_vars()["server_flags"]
    assert f"experimental-recipes/eugr-vllm/{QWEN}" in asked.source

    # Only the experimental file left: the short name is refused, naming the one that asks for it.
    (origin / "official-recipes" / "qwen3-coder-next" / QWEN).unlink()
    git(origin, "add", "-A")
    git(origin, "commit", "-q", "-m", "official gone")
    registry.update(["arena"])
    with pytest.raises(RecipeError, match="only an experimental recipe, which is taken only when asked for by its "
                                          "path: arena/experimental-recipes/eugr-vllm/qwen3-coder-next"):
        registry.find("arena/qwen3-coder-next-int4-autoround-vllm")

    # Two folders outside the experimental ones hold it: neither is picked, both are named, exit 2.
    for folder in ("official-recipes/a", "official-recipes/b"):
        (origin / folder).mkdir(parents=True)
        shutil.copy(FIXTURES / QWEN, origin / folder / QWEN)
    git(origin, "add", "-A")
    git(origin, "commit", "-q", "-m", "two")
    registry.update(["arena"])
    assert run(["recipe.show", "arena/qwen3-coder-next-int4-autoround-vllm"]) == 2
    err = capsys.readouterr().err
    assert "'arena/qwen3-coder-next-int4-autoround-vllm' is ambiguous" in err
    assert all(name in err for name in ("arena/official-recipes/a/qwen3-coder-next-int4-autoround-vllm",
                                        "arena/official-recipes/b/qwen3-coder-next-int4-autoround-vllm",
                                        ("arena/experimental-recipes/eugr-vllm/qwen3-coder-next-int4-autoround-vllm"
                                         " (experimental)"))), err

    # One of them less deep (eugr's recipes/NAME.yaml beside recipes/3x-spark-cluster/NAME.yaml): it has the name.
    shutil.copy(FIXTURES / QWEN, origin / "official-recipes" / QWEN)
    git(origin, "add", "-A")
    git(origin, "commit", "-q", "-m", "a flat one")
    registry.update(["arena"])
    assert f"official-recipes/{QWEN}" in registry.find("arena/qwen3-coder-next-int4-autoround-vllm").source


COMMUNITY = FIXTURES.parent / "community"
COMMUNITY_COMMIT = "cce4f1418c72542433759d7842100cd2f1219763"


def test_the_community_registry_as_it_holds_them(data_dir: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """spark-arena/community-recipe-registry at one commit, every YAML file of it in its place
    (tests/fixtures/recipes/community, sources.json: its path there), added as a user adds it: every
    recipe read, none refused, its sparkrun index (.sparkrun/registry.yaml) counted as no recipe."""
    sources = json.loads((COMMUNITY / "sources.json").read_text(encoding="utf-8"))
    held = {name: source["path"] for name, source in sources.items() if source["commit"] == COMMUNITY_COMMIT}
    assert len(held) == 8 and {source["repository"] for source in sources.values()} == {
        "spark-arena/community-recipe-registry"}
    repo = tmp_path / "community-recipe-registry"
    for name, path in held.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(COMMUNITY / name, repo / path)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "community-recipe-registry at cce4f14")
    assert run(["registry.add", f"file://{repo}", "--name", "community", "--json"]) == 0
    added = json.loads(capsys.readouterr().out)
    assert added["recipes"] == sorted(f"community/{Path(path).stem}" for path in held.values()
                                      if path.startswith("recipes/"))
    assert len(added["recipes"]) == 7 and added["refused"] == []
    assert added["not_recipes"] == [{"path": ".sparkrun/registry.yaml", "why": "names no model: not a recipe"}]


def test_recipe_list_leaves_experimental_recipes_out_unless_asked_with_all(
        data_dir: Path, origin: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """sparkrun's `list` hides the experimental part of a registry (its .sparkrun/registry.yaml: visible:
    false) unless given --all: so does recipe.list, counting them below the table with the command that
    lists them, which works as printed."""
    import shlex

    (origin / "experimental-recipes" / "eugr-vllm").mkdir()
    shutil.copy(EXPERIMENTAL / QWEN, origin / "experimental-recipes" / "eugr-vllm" / QWEN)
    git(origin, "add", "-A")
    git(origin, "commit", "-q", "-m", "an experimental recipe that can be read")
    registry.add("arena", f"file://{origin}")
    official, experimental = "arena/qwen3-coder-next-int4-autoround-vllm", \
        "arena/experimental-recipes/eugr-vllm/qwen3-coder-next-int4-autoround-vllm"

    for argv in (["recipe.list"], ["recipe.list", "--registry", "arena"]):
        assert run(argv) == 0
        out = capsys.readouterr().out
        assert official in out and experimental not in out, out
        said = [line for line in out.splitlines() if "experimental recipe(s)" in line]
        assert said and said[0].startswith("1 experimental recipe(s) of the registries not listed (`"), out
        hint = shlex.split(said[0].split("`")[1])
        assert hint[1:] == [*argv, "--all"], hint  # the list's own options, then --all
        assert run(hint[1:]) == 0
        out = capsys.readouterr().out
        assert official in out and experimental in out and "(experimental)" in out
        assert "experimental recipe(s)" not in out

    assert run(["recipe.list", "--json"]) == 0
    listed = {item["name"]: item["experimental"] for item in json.loads(capsys.readouterr().out)}
    assert listed[official] is False and listed["lab-cpu-tiny-llama"] is False and experimental not in listed
    assert run(["recipe.list", "--all", "--json"]) == 0
    listed = {item["name"]: item["experimental"] for item in json.loads(capsys.readouterr().out)}
    assert listed[experimental] is True and listed[official] is False
    assert run(["recipe.list", "-h"]) == 0
    assert "--all" in capsys.readouterr().out
    assert run(["recipe.show", experimental]) == 0  # taken by its path, listed or not
