"""The command line starts without the machinery its tasks use: `invoke --list`, `-h` and a typo answer
before SSH, tables, templates, the hub client or the pipeline are imported (each task imports them when
it runs). Structural, not timed: the time itself is measured by benchmarks (docs/speed.md)."""
from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("paramiko", "fabric", "rich", "jinja2", "huggingface_hub", "cryptography", "matplotlib", "numpy")
LIGHT = {"provision", "provision.cli", "provision.config", "provision.errors", "provision.taskargs",
         "provision.tasks", "provision.cluster_tasks", "provision.prepare_tasks", "provision.tune_tasks",
         "provision.verify_tasks", "provision.init_tasks", "provision.recipe_tasks", "provision.hints",
         "provision.metrics_tasks",
         # the shipped benchmark profiles' sources (standard library only): bench's help names their commits
         "provision.benchprofiles"}


def test_loading_the_tasks_imports_none_of_what_they_run() -> None:
    roots = ("provision", *HEAVY)
    probe = ("import json, sys, provision.cli; "
             f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {roots!r})))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    loaded = set(json.loads(done.stdout))
    assert not {m for m in loaded if m.split(".")[0] in HEAVY}, loaded
    assert {m for m in loaded if m.startswith("provision")} <= LIGHT, loaded - LIGHT


def test_every_task_still_answers_help() -> None:
    from provision.cli import ns

    names = sorted(ns.task_names)
    assert {"facts", "check", "deploy", "tune", "status", "bench", "verify.nccl", "lab.up"} <= set(names)
    for name in ("tune", "verify.nccl", "deploy", "init"):
        done = subprocess.run([sys.executable, "-m", "invoke", "--search-root", ".", name, "-h"],
                              capture_output=True, text=True, check=False)
        assert done.returncode == 0 and "Options:" in done.stdout, done.stdout + done.stderr
