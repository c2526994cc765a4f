"""Every runtime of sparkrun's the tool serves, read from real recipe files (tests/fixtures/recipes/<repository>/,
copied byte for byte; sources.json names each one's repository, path and commit): vLLM, SGLang and llama.cpp
from sparkrun's own recipes (scitrera/oss-spark-run), TensorRT-LLM from the recipes sparkrun's own tests give
(no trtllm recipe file exists in sparkrun's repositories or Spark Arena's registry; sources.json says which
test). Each: the engine, the settings and server flags read, what is named as not carried, and the flags
kept checked against the engine's own option list. Then the files that lack recipe_version, runtime or
command, read as sparkrun fills them in and saying so. No network."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from provision import catalog
from provision.recipes import sparkarena

FIXTURES = Path(__file__).parent / "fixtures"
SPARKRUN = FIXTURES / "recipes" / "oss-spark-run"
SPARKRUN_TESTS = FIXTURES / "recipes" / "sparkrun-tests"
ARENA = FIXTURES / "recipes" / "spark-arena"
HOST = ("--host 0.0.0.0", sparkarena.HOST_NOTE)


def imported(path: Path, text: str | None = None) -> sparkarena.Imported:
    return sparkarena.read(path.read_bytes() if text is None else text, path.name, path.stem)


def named(result: sparkarena.Imported) -> dict[str, str]:
    return dict(result.not_carried)


@pytest.mark.parametrize("folder", [SPARKRUN, SPARKRUN_TESTS], ids=lambda path: path.name)
def test_every_fixture_names_its_repository_path_and_commit(folder: Path) -> None:
    sources = json.loads((folder / "sources.json").read_text(encoding="utf-8"))
    assert sorted(sources) == sorted(path.name for path in folder.glob("*.yaml"))
    for name, source in sources.items():
        assert re.fullmatch(r"[0-9a-f]{40}", source["commit"]), name
        assert source["repository"] in ("scitrera/oss-spark-run", "spark-arena/sparkrun"), name
        if folder == SPARKRUN:
            assert source["path"].endswith("/" + name), name


def test_vllm() -> None:
    result = imported(SPARKRUN / "qwen3-1.7b-vllm.yaml")
    assert result.engine == "vllm" and result.recipe is not None, result.refused
    assert dict(result.settings) == {
        "served_model_name": "qwen3-1.7b", "gpu_memory_utilization": 0.3, "tensor_parallel_size": 1, "port": 8000,
        "server_flags": {"--reasoning-parser": "deepseek_r1", "--trust-remote-code": True}}
    said = named(result)
    assert said[HOST[0]] == HOST[1]
    assert "its engine version cannot be known" in said["container scitrera/dgx-spark-vllm:0.16.0-t5"]
    assert result.recipe.model == "Qwen/Qwen3-1.7B" and result.recipe.hardware.nodes == 1


def test_sglang() -> None:
    result = imported(SPARKRUN / "qwen3-1.7b-sglang.yaml")
    assert result.engine == "sglang" and result.recipe is not None, result.refused
    assert result.command[:3] == ("python3", "-m", "sglang.launch_server")
    assert dict(result.settings) == {
        "served_model_name": "qwen3-1.7b", "gpu_memory_utilization": 0.3, "tensor_parallel_size": 1, "port": 8000,
        "server_flags": {"--reasoning-parser": "deepseek-r1", "--trust-remote-code": True}}
    said = named(result)
    assert said["--model-path Qwen/Qwen3-1.7B"] == "the model is the recipe's own field"
    assert said[HOST[0]] == HOST[1]
    assert "engine_spec=sglang==X.Y.Z" in said["container scitrera/dgx-spark-sglang:0.5.8-t5"]


def llama_server_options() -> set[str]:
    """Every option b11434's llama-server --help lists (the release the tool builds)."""
    help_text = json.loads((FIXTURES / "engines" / "llama-server-b11434-help.json").read_text())["stdout"]
    found: set[str] = set()
    for line in help_text.splitlines():
        if line.startswith("-"):
            names = re.split(r"(?<![,\s])\s{2,}", line.strip())[0]
            found.update(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", names))
    return found


def test_llama_cpp() -> None:
    result = imported(SPARKRUN / "qwen3-1.7b-llama-cpp.yaml")
    assert result.engine == "llamacpp" and result.recipe is not None, result.refused
    assert result.command[0] == "llama-server"
    # -hf REPO:QUANT is the repository and the files sparkrun fetches for that quant
    assert result.recipe.model == "Qwen/Qwen3-1.7B-GGUF"
    values = result.recipe.inventory_vars()
    assert values["engine"] == "llamacpp" and values["model_files"] == ("*Q8_0*",)
    # --ctx-size is llama-server's whole context; max_model_len is a slot's (engines/llamacpp.py SLOTS)
    assert dict(result.settings) == {
        "port": 8000, "max_model_len": 8192, "model_files": ["*Q8_0*"],
        "server_flags": {"--flash-attn": "on", "--jinja": True, "--no-mmap": True}}
    assert any("--ctx-size 8192 is llama-server's whole context" in note for note in result.recipe.notes)
    said = named(result)
    assert said["-hf Qwen/Qwen3-1.7B-GGUF:Q8_0"] == "the model is the recipe's own field"
    assert said["--n-gpu-layers 99"].startswith("the tool offloads every layer")
    assert said["--no-webui"].startswith("the tool renders --no-ui itself")
    assert said[HOST[0]] == HOST[1]
    # What is kept is llama-server's own: every flag b11434 lists, but --no-mmap, the spelling its
    # --load-mode replaced (b11434's --help no longer lists it)
    kept = set(result.settings["server_flags"])
    assert kept - llama_server_options() == {"--no-mmap"}


def test_llama_cpp_slots_and_context() -> None:
    text = (SPARKRUN / "qwen3-1.7b-llama-cpp.yaml").read_text(encoding="utf-8")
    shared = imported(SPARKRUN / "x.yaml", text.replace("--jinja", "--jinja --parallel 2 -hff Qwen3-1.7B-Q8_0.gguf"))
    assert shared.recipe is not None, shared.refused
    assert shared.settings["max_model_len"] == 4096 and shared.settings["concurrent_sequences"] == 2
    assert shared.settings["model_files"] == ["Qwen3-1.7B-Q8_0.gguf"]
    relative = imported(SPARKRUN / "x.yaml", text.replace("Qwen/Qwen3-1.7B-GGUF:Q8_0", "models/q.gguf"))
    assert relative.recipe is None and "relative path" in relative.refused


def test_llama_cpp_across_nodes_is_refused_saying_what_was_read() -> None:
    result = imported(SPARKRUN / "qwen3.5-397b-gguf-q3km-llama-cpp.yaml")
    assert result.recipe is None and result.engine == "llamacpp"
    assert result.refused.startswith("the tool serves llama.cpp on one node, and this recipe asks 2 DGX Spark hosts")
    assert result.settings["model_files"] == ["*Q3_K_M*"] and result.settings["max_model_len"] == 262144


def trtllm_options() -> set[str]:
    release = json.loads((FIXTURES / "engines" / "trtllm-serve-v1.2.0.json").read_text())
    return {name for option in release["options"] for name in option["names"]}


def test_trtllm() -> None:
    result = imported(SPARKRUN_TESTS / "trtllm-template.yaml")
    assert result.engine == "trtllm" and result.recipe is not None, result.refused
    assert result.command == ("trtllm-serve", "nvidia/model", "--port", "8355", "--tp_size", "2")
    assert dict(result.settings) == {"port": 8355, "tensor_parallel_size": 2}
    assert result.recipe.hardware.nodes == 2  # one GB10 a node: tp 2 is two Sparks, over MPI
    assert named(result)["field name"].endswith(": sparkrun names a recipe by its file, and so does the tool")
    structured = imported(SPARKRUN_TESTS / "trtllm-structured.yaml")
    assert structured.recipe is not None, structured.refused
    assert structured.settings["server_flags"] == {"--max_num_tokens": 32768}
    assert named(structured)["--backend pytorch"] == catalog.ENGINES["trtllm"].recipe_skips["--backend"]
    # every flag read is an option of trtllm-serve 1.2.0 (click refuses any other)
    read = set(structured.settings["server_flags"]) | {
        flag for flag, setting in catalog.ENGINES["trtllm"].recipe_flags.items() if setting in structured.settings}
    assert read <= trtllm_options()
    assert sparkarena.container_version("nvcr.io/nvidia/tensorrt-llm/release:1.2.0rc6", "trtllm") == "1.2.0rc6"
    assert sparkarena.container_version("nvcr.io/nvidia/tensorrt-llm/release:latest", "trtllm") is None


def test_a_file_lacking_recipe_version_runtime_and_command_is_read_as_sparkrun_fills_them_in() -> None:
    text = (SPARKRUN / "qwen3-1.7b-vllm.yaml").read_text(encoding="utf-8")
    bare = text.replace("runtime: vllm\n", "").split("command:")[0]
    assert "recipe_version" not in bare and "runtime" not in bare and "command" not in bare
    result = imported(SPARKRUN / "x.yaml", bare)
    assert result.engine == "vllm" and result.recipe is not None, result.refused
    assumed = dict(result.assumed)
    assert assumed["recipe_version"].endswith("(sparkrun's default: src/sparkrun/core/recipe.py:578)")
    assert assumed["runtime"].startswith("vllm: the file gives none, nor a command (sparkrun's default: ")
    assert assumed["command"].startswith(
        "`vllm serve {model} -tp {tensor_parallel} --port {port} --host {host} --gpu-memory-utilization "
        "{gpu_memory_utilization} --served-model-name {served_model_name}`")
    # the defaults the written command used, read the same: nothing dropped unsaid
    assert dict(result.settings) == {"tensor_parallel_size": 1, "port": 8000, "gpu_memory_utilization": 0.3,
                                     "served_model_name": "qwen3-1.7b"}
    assert not [what for what in named(result) if what.startswith("default ")]
    assert sum(note.startswith("assumed ") for note in result.recipe.notes) == 3
    # no runtime, a command: its first words name the runtime, as sparkrun's hints do
    hinted = imported(SPARKRUN / "x.yaml",
                      (SPARKRUN / "qwen3-1.7b-llama-cpp.yaml").read_text(encoding="utf-8").replace("runtime: llama-cpp\n", ""))
    assert hinted.engine == "llamacpp" and hinted.recipe is not None, hinted.refused
    assert dict(hinted.assumed)["runtime"].startswith("llama-cpp: the file gives none, and its command starts as")
    # a version sparkrun does not read (it reads "1" and "2") is refused
    with pytest.raises(sparkarena.RecipeError):
        sparkarena.read('recipe_version: "3"\n' + bare, "x.yaml", "x")


@pytest.mark.parametrize("runtime", ["vllm-distributed", "vllm-ray"])
def test_sparkrun_s_own_vllm_runtimes_are_vllm_across_nodes(runtime: str) -> None:
    """sparkrun's vllm-distributed and vllm-ray (its RECIPES.md "Runtime resolution"): the same `vllm serve`
    command over several nodes, launched here by the tool itself. Spark Arena's gpt-oss recipe with its
    runtime renamed, and asked for two nodes; and with no command, written as sparkrun's vLLM runtimes do."""
    text = (ARENA / "openai-gpt-oss-120b-vllm.yaml").read_text(encoding="utf-8")
    assert text.count("runtime: vllm\n") == 1
    named_so = text.replace("runtime: vllm\n", f"runtime: {runtime}\n").replace("max_nodes: 1", "max_nodes: 2") \
        .replace("tensor_parallel: 1", "tensor_parallel: 2")
    result = imported(ARENA / "x.yaml", named_so)
    assert result.engine == "vllm" and result.recipe is not None, result.refused
    assert result.recipe.hardware.nodes == 2 and result.recipe.settings["tensor_parallel_size"] == 2
    assert any("runs on 2 DGX Spark hosts" in note for note in result.recipe.notes)
    generated = imported(ARENA / "x.yaml", named_so.split("command:")[0])
    assert generated.recipe is not None, generated.refused
    assert dict(generated.assumed)["command"].startswith("`vllm serve {model} -tp {tensor_parallel}")
