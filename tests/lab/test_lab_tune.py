"""invoke tune on the lab's cpu-1 with real vLLM (the CPU build): trials deployed and benchmarked, one that
fails on purpose (a context longer than the model's: vLLM refuses to start), the winner kept in the
inventory's tuned/ folder and running, a second run resuming from the kept trials, the plot written.
The module removes what it kept and leaves cpu-1 as the inventory says (restores_lab_cpu checks it)."""
from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision import inventory, lab
from tests.lab.conftest import invoke_json, on_host, run_invoke

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("restores_lab_cpu")]

SPACE = """\
- {name: max_num_seqs, flag: --max-num-seqs, values: [2, 8]}
# A context longer than the model's 512 positions: vLLM refuses to start, whatever won before.
- {name: max_model_len, setting: max_model_len, values: [100000]}
"""
WORKLOAD = "name: lab-short\nrequests: 6\nconcurrency: [2]\nprompt_words: [10, 20]\nshared_prefix_words: 10\n" \
           "output_tokens: 8\nseed: 7\n"


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
    # The host as it was comes first (its context length, 256, is one of the dimensions).
    assert len(trials) >= 3 and trials[0]["settings"] == {"max_model_len": 256}, text
    failed = [t for t in trials if t["outcome"] == "failed"]
    shown = json.dumps([{k: t[k] for k in ("settings", "outcome", "reason", "score")} for t in trials])
    assert len(failed) == 1 and failed[0]["settings"].get("max_model_len") == 100000, shown
    assert "rolled back" in failed[0]["reason"] and "max_model_len" in failed[0]["reason"], failed[0]
    assert "the previous version is ready again" in failed[0]["reason"], failed[0]
    measured = [t for t in trials if t["outcome"] == "measured"]
    assert all(t["levels"][0]["succeeded"] == 6 and t["levels"][0]["itl_p95_s"] for t in measured), measured
    winner = unit["winner"]
    assert winner is not None and unit["tokens_per_s"] > 0 and unit["ok"], unit
    # Kept where the inventory reads it, with the measurement in its comments, and running.
    kept = tuned / "cpu-1.yaml"
    assert unit["tuned_file"] == str(kept) and "# Kept by `invoke tune`" in kept.read_text()
    assert unit["diff"].startswith(f"--- {kept} (kept)")
    planned = run_invoke("plan", "--cluster", "lab-cpu", "--json")
    assert planned.returncode == 0 and json.loads(planned.stdout)["hosts"]["cpu-1"]["changes"] == [], planned.stdout
    unit_text = on_host(lab_inventory, "cpu-1", ["systemctl", "cat", "vllm.service"])
    if "max_num_seqs" in winner:
        assert f"--max-num-seqs {winner['max_num_seqs']}" in unit_text
    assert on_host(lab_inventory, "cpu-1", ["systemctl", "is-active", "vllm.service"]).strip() == "active"
    assert Path(unit["plot"]).read_bytes()[:4] == b"\x89PNG"
    # A second run measures nothing again: every trial comes from the kept ones, the same winner.
    code, again, text = tune_cpu_1(space, workload)
    assert code == 0, text
    second = again["units"]["cpu-1"]
    assert second["winner"] == winner and all(t["resumed"] for t in second["trials"] if t["outcome"] != "skipped")
    assert {t["key"] for t in second["trials"] if t["outcome"] != "skipped"} <= {t["key"] for t in trials}

