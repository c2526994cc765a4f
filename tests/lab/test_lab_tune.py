"""invoke tune on the lab's cpu-1 with real vLLM (the CPU build): the workload cut to the 256 tokens the
server serves (its /v1/models), the host as it is run twice (the noise), trials deployed and benchmarked:
one whose context is shorter than the prompts (the server refuses them: the verdict carries its words),
one that fails on purpose (a context longer than the model's: vLLM refuses to start); the host's own
settings kept in the inventory's tuned/ folder with the spread and running, a second run resuming from
the kept trials, the plot written. Three restarts and a rollback: a candidate's margin over a runner-up
is held by the unit tests on a recorded run (tests/test_tune.py), not bought here with two more restarts.
The module removes what it kept and leaves cpu-1 as the inventory says (restores_lab_cpu checks it)."""
from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision import inventory, lab, recipes
from tests.lab.conftest import invoke_json, on_host, run_invoke

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("restores_lab_cpu")]

SPACE = """\
# 64 tokens: shorter than the prompts, which the server then refuses (HTTP 400, and why); then a context
# longer than the model's 512 positions: vLLM refuses to start, whatever won before.
- {name: max_model_len, setting: max_model_len, values: [64, 100000]}
"""
# Its longest request (310 words, 16 tokens out) is longer than the 256 tokens served: tune cuts it.
WORKLOAD = "name: lab-short\nrequests: 6\nconcurrency: [2]\nprompt_words: [30, 300]\nshared_prefix_words: 10\n" \
           "output_tokens: 16\nseed: 7\n"


@pytest.fixture(scope="module")
def files(the_lab: lab.Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    folder = tmp_path_factory.mktemp("tune")
    (folder / "space.yaml").write_text(SPACE)
    (folder / "workload.yaml").write_text(WORKLOAD)
    tuned = the_lab.inventory.parent / "tuned"
    shutil.rmtree(tuned, ignore_errors=True)
    yield str(folder / "space.yaml"), str(folder / "workload.yaml"), tuned
    shutil.rmtree(tuned, ignore_errors=True)  # the inventory's own settings again (restores_lab_cpu deploys them)


def tune_cpu_1(space: str, workload: str) -> tuple[int, dict, str]:
    return invoke_json("tune", "--host", "cpu-1", "--space", space, "--workload", workload, "--timeout", "300",
                       timeout=1500)


def test_tune_keeps_the_fastest_passing_settings_and_resumes(files: tuple[str, str, Path],
                                                            lab_inventory: inventory.Inventory) -> None:
    space, workload, tuned = files
    code, report, text = tune_cpu_1(space, workload)
    assert code == 0, text
    unit = report["units"]["cpu-1"]
    trials = unit["trials"]
    # Cut to what the server serves, by its own count of the words; asked for more than that.
    assert unit["fit"].startswith("cut to fit the 256 tokens served (the server's /v1/models"), unit["fit"]
    measured_workload = unit["workload"]
    assert measured_workload["prompt_words"][1] < 300 and measured_workload["output_tokens"] < 16, measured_workload
    assert unit["workload_asked"]["prompt_words"] == [30, 300], unit["workload_asked"]
    # The host as it was comes first (its context length, 256, is one of the dimensions).
    assert len(trials) == 3 and trials[0]["settings"] == {"max_model_len": 256}, text
    failed = [t for t in trials if t["outcome"] == "failed"]
    shown = json.dumps([{k: t[k] for k in ("settings", "outcome", "reason", "score")} for t in trials])
    assert len(failed) == 1 and failed[0]["settings"].get("max_model_len") == 100000, shown
    assert "rolled back" in failed[0]["reason"] and "max_model_len" in failed[0]["reason"], failed[0]
    assert "the previous version is ready again" in failed[0]["reason"], failed[0]
    short = [t for t in trials if t["settings"].get("max_model_len") == 64]
    assert len(short) == 1 and short[0]["outcome"] == "measured" and short[0]["score"] is None, shown
    assert "request(s) failed: HTTP 400: " in short[0]["verdict"] and "maximum context length is 64" in \
        short[0]["verdict"], short[0]["verdict"]
    measured = [t for t in trials if t["outcome"] == "measured" and t not in short]
    assert all(t["levels"][0]["succeeded"] == 6 and t["levels"][0]["itl_p95_s"] for t in measured), measured
    # The host as it is ran twice: the spread of the two is the noise every lead had to beat.
    assert len(trials[0]["repeats"]) == 1 and trials[0]["spread"] is not None, trials[0]
    decision = unit["decision"]
    assert decision["spread"] == round(trials[0]["spread"], 4) and decision["threshold"] >= max(0.02, decision["spread"])
    assert unit["winner"] == {"max_model_len": 256} and decision["runner_up"] is None, decision
    assert decision["note"].startswith("the host as it is: the only trial within the bound (spread "), decision
    winner = unit["winner"]
    assert winner is not None and unit["tokens_per_s"] > 0 and unit["ok"], unit
    # Kept where the inventory reads it, with the measurement in its comments, and running.
    kept = tuned / "cpu-1.yaml"
    assert unit["tuned_file"] == str(kept) and "# Kept by `invoke tune`" in kept.read_text()
    assert f"# Margin: no runner-up within the bound; spread {trials[0]['spread'] * 100:.1f}%" in kept.read_text()
    assert unit["diff"].startswith(f"--- {kept} (kept)")
    planned = run_invoke("plan", "--cluster", "lab-cpu", "--json")
    assert planned.returncode == 0 and json.loads(planned.stdout)["hosts"]["cpu-1"]["changes"] == [], planned.stdout
    unit_text = on_host(lab_inventory, "cpu-1", ["systemctl", "cat", "vllm.service"])
    assert "--max-model-len 256" in unit_text and "--max-num-seqs" not in unit_text, unit_text
    assert on_host(lab_inventory, "cpu-1", ["systemctl", "is-active", "vllm.service"]).strip() == "active"
    assert Path(unit["plot"]).read_bytes()[:4] == b"\x89PNG"
    # The winner as a recipe, its figures measured by this run; the recipe tasks read it by its path.
    made = recipes.load_file(Path(unit["recipe_file"]))
    assert Path(unit["recipe_file"]).parent == tuned / "recipes" and made.name.startswith("tuned-cpu-1-"), made
    assert made.hardware.profile == "cpu" and made.settings["max_model_len"] == 256 and "port" not in made.settings
    assert (made.engine_version or "").startswith("0.32.0") and made.figures[0].metric == "throughput" and made.figures[0].value > 0
    assert all(figure.kind == "measured" and figure.tool.startswith("provision ") for figure in made.figures)
    shown = run_invoke("recipe.show", unit["recipe_file"])
    assert shown.returncode == 0 and "measured: invoke tune on cpu-1" in shown.stdout, shown.stdout + shown.stderr
    # A second run measures nothing again: every trial comes from the kept ones, the same winner.
    code, again, text = tune_cpu_1(space, workload)
    assert code == 0, text
    second = again["units"]["cpu-1"]
    assert second["winner"] == winner and all(t["resumed"] for t in second["trials"] if t["outcome"] != "skipped")
    assert {t["key"] for t in second["trials"] if t["outcome"] != "skipped"} <= {t["key"] for t in trials}

