"""invoke tune on the lab's cpu-2 with its llama.cpp server: the workload cut to the 256 tokens the
server serves (its settings' max_model_len: llama-server's /v1/models names none), the host as it is run
twice (the noise), trials deployed and benchmarked: one that fails on purpose (a K cache type
llama-server does not know: it refuses to start, and the rollback brings the host's own server back);
the host's own settings kept in the inventory's tuned/ folder with the spread and running, a second run
resuming from the kept trials, the plot written, the winner as a recipe.

The search, the rollback of a failed trial and what is kept are the tool's, not the engine's: they run
here on llama.cpp, whose server restarts in a second where vLLM's CPU build takes half a minute or more.
What is vLLM's own is held by the unit tests on what cpu-1's vLLM answered (tests/test_tune.py): its
/v1/models context the workload is cut to, and its words when it refuses a request longer than the
context it serves; a candidate's margin over a runner-up is held there too, on a recorded run, not bought
here with more restarts. The module removes what it kept and leaves cpu-2 as the inventory says (the
lab_llama fixture checks it)."""
from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision import inventory, lab, recipes
from tests.lab.conftest import invoke_json, on_host, run_invoke
from tests.lab.test_lab_generations import LLAMA

pytestmark = [pytest.mark.lab, pytest.mark.lab_group("lab-b")]

SPACE = """\
# A K cache type llama-server does not know: it refuses to start, whatever won before.
- {name: cache_type_k, flag: --cache-type-k, values: [nonsense]}
"""
# Its longest request (42 words, 16 tokens out) is longer than the 256 tokens served (the tiny GGUF's
# vocabulary spells most words byte by byte, about 8 tokens each): tune cuts it.
WORKLOAD = "name: lab-short\nrequests: 6\nconcurrency: [2]\nprompt_words: [3, 40]\nshared_prefix_words: 2\n" \
           "output_tokens: 16\nseed: 7\n"


@pytest.fixture(scope="module")
def files(the_lab: lab.Lab, lab_llama: inventory.Inventory,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    folder = tmp_path_factory.mktemp("tune")
    (folder / "space.yaml").write_text(SPACE)
    (folder / "workload.yaml").write_text(WORKLOAD)
    tuned = the_lab.inventory.parent / "tuned"
    shutil.rmtree(tuned, ignore_errors=True)
    yield str(folder / "space.yaml"), str(folder / "workload.yaml"), tuned
    shutil.rmtree(tuned, ignore_errors=True)  # the inventory's own settings again (lab_llama deploys them)


def tune_cpu_2(space: str, workload: str) -> tuple[int, dict, str]:
    return invoke_json("tune", "--host", "cpu-2", "--space", space, "--workload", workload, "--timeout", "300",
                       timeout=1500)


def test_tune_keeps_the_fastest_passing_settings_and_resumes(files: tuple[str, str, Path],
                                                            lab_llama: inventory.Inventory) -> None:
    space, workload, tuned = files
    code, report, text = tune_cpu_2(space, workload)
    assert code == 0, text
    unit = report["units"]["cpu-2"]
    trials = unit["trials"]
    # Cut to what the server serves, by its own count of the words; asked for more than that.
    assert unit["fit"].startswith("cut to fit the 256 tokens served (the settings' max_model_len"), unit["fit"]
    measured_workload = unit["workload"]
    assert measured_workload["prompt_words"][1] < 40 and measured_workload["output_tokens"] < 16, measured_workload
    assert unit["workload_asked"]["prompt_words"] == [3, 40], unit["workload_asked"]
    # The host as it was comes first (the server's own K cache type), then the trial that fails.
    assert len(trials) == 2 and trials[0]["settings"] == {}, text
    failed = [t for t in trials if t["outcome"] == "failed"]
    shown = json.dumps([{k: t[k] for k in ("settings", "outcome", "reason", "score")} for t in trials])
    assert len(failed) == 1 and failed[0]["settings"] == {"cache_type_k": "nonsense"}, shown
    assert "rolled back" in failed[0]["reason"] and "Unsupported cache type: nonsense" in failed[0]["reason"], failed[0]
    assert "the previous version is ready again" in failed[0]["reason"], failed[0]
    measured = [t for t in trials if t["outcome"] == "measured"]
    assert measured == [trials[0]], shown
    assert all(t["levels"][0]["succeeded"] == 6 and t["levels"][0]["itl_p95_s"] for t in measured), measured
    # The host as it is ran twice: the spread of the two is the noise every lead had to beat.
    assert len(trials[0]["repeats"]) == 1 and trials[0]["spread"] is not None, trials[0]
    decision = unit["decision"]
    assert decision["spread"] == round(trials[0]["spread"], 4) and decision["threshold"] >= max(0.02, decision["spread"])
    assert unit["winner"] == {} and decision["runner_up"] is None, decision
    assert decision["note"].startswith("the host as it is: the only trial within the bound (spread "), decision
    winner = unit["winner"]
    assert winner is not None and unit["tokens_per_s"] > 0 and unit["ok"], unit
    # Kept where the inventory reads it, with the measurement in its comments, and running.
    kept = tuned / "cpu-2.yaml"
    assert unit["tuned_file"] == str(kept) and "# Kept by `invoke tune`" in kept.read_text()
    assert f"# Margin: no runner-up within the bound; spread {trials[0]['spread'] * 100:.1f}%" in kept.read_text()
    assert unit["diff"].startswith(f"--- {kept} (kept)")
    planned = run_invoke("plan", "--cluster", "lab-llama", "--json")
    assert planned.returncode == 0 and json.loads(planned.stdout)["hosts"]["cpu-2"]["changes"] == [], planned.stdout
    unit_text = on_host(lab_llama, "cpu-2", ["systemctl", "cat", LLAMA.unit])
    assert LLAMA.context(256) in unit_text and "--cache-type-k" not in unit_text, unit_text
    assert on_host(lab_llama, "cpu-2", ["systemctl", "is-active", LLAMA.unit]).strip() == "active"
    assert Path(unit["plot"]).read_bytes()[:4] == b"\x89PNG"
    # The winner as a recipe, its figures measured by this run; the recipe tasks read it by its path.
    made = recipes.load_file(Path(unit["recipe_file"]))
    assert Path(unit["recipe_file"]).parent == tuned / "recipes" and made.name.startswith("tuned-cpu-2-"), made
    assert made.hardware.profile == "cpu" and made.settings["max_model_len"] == 256 and "port" not in made.settings
    assert made.engine == "llamacpp" and made.figures[0].metric == "throughput" and made.figures[0].value > 0
    assert all(figure.kind == "measured" and figure.tool.startswith("provision ") for figure in made.figures)
    shown = run_invoke("recipe.show", unit["recipe_file"])
    assert shown.returncode == 0 and "measured: invoke tune on cpu-2" in shown.stdout, shown.stdout + shown.stderr
    # A second run measures nothing again: every trial comes from the kept ones, the same winner.
    code, again, text = tune_cpu_2(space, workload)
    assert code == 0, text
    second = again["units"]["cpu-2"]
    assert second["winner"] == winner and all(t["resumed"] for t in second["trials"] if t["outcome"] != "skipped")
    assert {t["key"] for t in second["trials"] if t["outcome"] != "skipped"} <= {t["key"] for t in trials}
