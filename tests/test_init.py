"""`init` and running with no inventory: the profile chosen from recorded machines' GPUs, the model the
gate's memory.fits rule lets through, the written file (loads, validates, never overwrites), and
`facts --host local` on this machine (no GPU here) with no inventory anywhere."""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from provision import checks, errors, facts, inventory, lab, starter
from provision.profiles import load_profiles
from tests.fakes import ok, probe_answer_from_recording

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
PROFILES = load_profiles()


def recorded(machine: str, **outputs: str) -> facts.HostFacts:
    """A recorded machine's facts (lab recordings; the H200 node's own recording); `outputs` replace
    what the named facts printed."""
    path = FIXTURES / "recordings" / f"{machine}.json"
    recording = json.loads(path.read_text()) if path.exists() else lab.load_machine(machine)
    answer = json.loads(probe_answer_from_recording(recording, python="3.12.3"))
    for name, stdout in outputs.items():
        answer["results"][name] = {"exit": 0, "stdout": stdout, "stderr": "", "missing": False, "timed_out": False}
    return facts.facts_from_probe(machine, ok(json.dumps(answer)))


# ---------------------------------------------------------------------------------------------
# The profile, from the GPUs


@pytest.mark.parametrize(("machine", "profile", "gpus"), [
    ("rtx5090x2-tr7960x", "rtx5090", 2),
    ("rtx5090x1-kernel68-proprietary", "rtx5090", 1),
    ("dgx-spark-gb10", "dgx-spark", 1),
    ("h200x2-driver580", "hopper", 2),
    ("h200x2-nvswitch-driver580-vm", "hopper", 2),  # recorded verbatim on a real H200 node
], ids=lambda value: str(value))
def test_the_profile_is_the_one_whose_gpu_the_host_has(machine: str, profile: str, gpus: int) -> None:
    found = recorded(machine)
    choice = starter.choose_profile(found, PROFILES)
    assert choice.profile is not None and choice.profile.name == profile, choice.reason
    assert choice.reason.startswith(f"{gpus} x ")
    # The gate agrees: its compute-capability rule passes for the chosen profile on these facts.
    ctx = starter._context(machine, choice.profile, found, {}, {})
    assert checks.gpu_compute_capability(ctx).status == checks.PASS


def other_gpus(machine: str, **values: Any) -> facts.HostFacts:
    """A recorded machine whose GPU rows are changed (the recordings hold no GPU of another kind with
    its name and compute capability): e.g. an L40S is compute capability 8.9 (NVIDIA's CUDA GPU table)."""
    found = recorded(machine)
    return dataclasses.replace(found, gpus=tuple(dataclasses.replace(gpu, **values) for gpu in found.gpus or ()))


def test_a_gpu_no_profile_is_for_is_unsupported_and_says_why() -> None:
    l40s = other_gpus("h200x2-nvswitch-driver580-vm", name="NVIDIA L40S", compute_cap="8.9")
    choice = starter.choose_profile(l40s, PROFILES)
    assert choice.profile is None
    assert choice.reason.startswith("unsupported: NVIDIA L40S (compute capability 8.9) matches no profile")
    assert "hopper (compute capability 9.0)" in choice.reason


def test_mixed_gpus_are_unsupported() -> None:
    found = recorded("rtx5090x2-tr7960x")
    first, second = found.gpus or ()
    mixed = dataclasses.replace(found, gpus=(first, dataclasses.replace(second, name="NVIDIA H200", compute_cap="9.0")))
    assert starter.choose_profile(mixed, PROFILES).reason.startswith("unsupported: mixed GPUs")


def test_a_gb10_on_an_x86_host_is_not_taken_for_a_spark() -> None:
    gb10_on_x86 = dataclasses.replace(recorded("dgx-spark-gb10"), arch="x86_64")
    choice = starter.choose_profile(gb10_on_x86, PROFILES)
    assert choice.profile is None
    assert "dgx-spark, which is for aarch64 hosts, not x86_64" in choice.reason


def test_unreadable_gpus_and_no_gpu_differ() -> None:
    garbage = recorded("rtx5090x2-tr7960x", gpus="<html>502</html>\n")
    assert garbage.gpus is None and starter.choose_profile(garbage, PROFILES).profile is None
    none = dataclasses.replace(recorded("rtx5090x2-tr7960x"), gpus=())
    choice = starter.choose_profile(none, PROFILES)
    assert choice.profile is not None and choice.profile.name == "cpu"


# ---------------------------------------------------------------------------------------------
# The model, through the gate's memory.fits


@pytest.mark.parametrize(("machine", "model", "length"), [
    # 2 x 32 GiB: 72B AWQ over TP 2 leaves room for 4 sequences only at 8k.
    ("rtx5090x2-tr7960x", "Qwen/Qwen2.5-72B-Instruct-AWQ", 8192),
    ("rtx5090x1-kernel68-proprietary", "Qwen/Qwen2.5-32B-Instruct-AWQ", 8192),
    # 128 GB unified: the 16-bit 72B (about 155 GB) does not fit; its AWQ form does at full length.
    ("dgx-spark-gb10", "Qwen/Qwen2.5-72B-Instruct-AWQ", 32768),
    ("h200x2-nvswitch-driver580-vm", "Qwen/Qwen2.5-72B-Instruct", 32768),
], ids=lambda value: str(value))
def test_the_model_is_the_first_known_one_memory_fits_passes(machine: str, model: str, length: int) -> None:
    found = recorded(machine)
    choice = starter.choose_profile(found, PROFILES)
    assert choice.profile is not None
    tp = len(found.gpus or ())
    suggestion = starter.suggest_model(machine, choice.profile, found, tp)
    assert (suggestion.model, suggestion.max_model_len) == (model, length), suggestion.reason
    assert "sequences of" in suggestion.reason  # the rule's own summary
    # Every (model, length) tried before it, the rule does not pass: it is the first, not any.
    for known in starter.known_models():
        for tried in known.contexts:
            if (known.model, tried) == (model, length):
                return
            ctx = starter._context(machine, choice.profile, found, {"model": known.model, "max_model_len": tried,
                                                                    "tensor_parallel_size": tp}, known.config)
            assert checks.memory_fits(ctx).status != checks.PASS, (known.model, tried)
    pytest.fail(f"{model} at {length} is not in the known list")


def test_nothing_fits_a_small_gpu_and_the_file_says_to_name_one() -> None:
    # One 16 GB sm_120 card (RTX 5060 Ti 16 GB: 16311 MiB): the rtx5090 profile's compute capability.
    two = other_gpus("rtx5090x2-tr7960x", name="NVIDIA GeForce RTX 5060 Ti", memory_total_mib=16311)
    small = dataclasses.replace(two, gpus=(two.gpus or ())[:1])
    choice = starter.choose_profile(small, PROFILES)
    assert choice.profile is not None and choice.profile.name == "rtx5090"
    item = starter.starter(starter.Target("ws", "192.0.2.10"), small, PROFILES)
    assert item.suggestion is not None and item.suggestion.model is None
    assert "no model of the known list fits" in item.suggestion.reason
    assert "      # model: ORG/NAME  # no model of the known list fits" in starter.render([item], starter.SshChoice(),
                                                                                    "provision init")


def test_the_known_models_say_where_their_shape_comes_from() -> None:
    models = starter.known_models()
    assert [m.model for m in models][:1] == ["Qwen/Qwen2.5-72B-Instruct"]
    assert all(m.source.startswith("https://huggingface.co/") for m in models)
    qwen7 = next(m for m in models if m.model == "Qwen/Qwen2.5-7B-Instruct")
    fixture = json.loads((FIXTURES / "model_configs" / "qwen2.5-7b-instruct.json").read_text())["config"]
    assert {key: fixture[key] for key in qwen7.config} == dict(qwen7.config)


# ---------------------------------------------------------------------------------------------
# The file


def starters_of(*machines: str) -> dict[str, starter.Starter]:
    result = {}
    for number, machine in enumerate(machines):
        target = starter.Target(machine, f"192.0.2.{10 + number}", "admin", 2222 if number else 22)
        result[machine] = starter.starter(target, recorded(machine), PROFILES)
    return result


def invoke(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_written_inventory_loads_validates_and_holds_what_was_chosen(tmp_path: Path) -> None:
    machines = ("rtx5090x2-tr7960x", "dgx-spark-gb10", "h200x2-nvswitch-driver580-vm")
    chosen = starters_of(*machines)
    out = tmp_path / "site" / "hosts.yaml"
    done = starter.write(machines, chosen, {}, out, starter.SshChoice(key_file="/keys/id_ed25519"), "provision init")
    assert done.ok and out.read_text() == done.text
    for line in done.text.splitlines():
        assert "#" in line, f"a line without its comment: {line!r}"
    inv = inventory.load(out)
    assert {name: inv.hosts[name].profile.name for name in machines} == {
        "rtx5090x2-tr7960x": "rtx5090", "dgx-spark-gb10": "dgx-spark", "h200x2-nvswitch-driver580-vm": "hopper"}
    assert inv.ssh.key_file == "/keys/id_ed25519"
    assert (inv.hosts["dgx-spark-gb10"].address, inv.hosts["dgx-spark-gb10"].user,
            inv.hosts["dgx-spark-gb10"].port) == ("192.0.2.11", "admin", 2222)
    spark = inv.settings("dgx-spark-gb10")
    assert (spark.model, spark.tensor_parallel_size, spark.max_model_len) == \
        ("Qwen/Qwen2.5-72B-Instruct-AWQ", 1, 32768)
    assert inv.settings("rtx5090x2-tr7960x").tensor_parallel_size == 2
    shown = invoke("inventory", "--inventory", str(out), "--json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    hosts = json.loads(shown.stdout)["hosts"]
    assert hosts["h200x2-nvswitch-driver580-vm"]["settings"]["tensor_parallel_size"] == 2


def test_an_unsupported_host_is_left_out_with_its_reason_and_the_rest_is_written(tmp_path: Path) -> None:
    chosen = starters_of("dgx-spark-gb10")
    l40s = starter.starter(starter.Target("l40s", "192.0.2.99"),
                           other_gpus("h200x2-driver580", name="NVIDIA L40S", compute_cap="8.9"), PROFILES)
    done = starter.write(("dgx-spark-gb10", "l40s"), {**chosen, "l40s": l40s}, {}, tmp_path / "h.yaml",
                         starter.SshChoice(), "provision init")
    assert done.ok and "  # not written: unsupported: NVIDIA L40S" in (done.text or "")
    assert set(inventory.load(tmp_path / "h.yaml").hosts) == {"dgx-spark-gb10"}
    alone = starter.write(("l40s",), {"l40s": l40s}, {}, tmp_path / "none.yaml", starter.SshChoice(), "x")
    assert not alone.ok and not (tmp_path / "none.yaml").exists()
    assert alone.why_not == "no host has hardware a profile is for: nothing written"


def test_init_refuses_to_overwrite_and_changes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "hosts.yaml"
    out.write_text("# mine\n")
    before = out.stat()
    with pytest.raises(errors.OutputExists, match="exists; init never overwrites"):
        starter.write(("dgx-spark-gb10",), starters_of("dgx-spark-gb10"), {}, out, starter.SshChoice(), "x")
    assert out.read_text() == "# mine\n" and out.stat().st_mtime_ns == before.st_mtime_ns
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hosts.yaml"]  # no temporary left
    done = invoke("init", "--host", "local", "--output", str(out), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"error: {out}: exists; init never overwrites a file: nothing changed" in done.stderr
    assert out.read_text() == "# mine\n"


@pytest.mark.parametrize(("text", "target"), [
    ("local", starter.Target("local", None)),
    ("192.0.2.10", starter.Target("192.0.2.10", "192.0.2.10")),
    ("ws=admin@ws.example:2222", starter.Target("ws", "ws.example", "admin", 2222)),
    ("fd00::2", starter.Target("fd00--2", "fd00::2")),
])
def test_targets_on_the_command_line(text: str, target: starter.Target) -> None:
    assert starter.parse_target(text) == target


@pytest.mark.parametrize("text", ["", "a@b@c", "host:99999", "host:x"])
def test_a_bad_target_is_bad_usage(text: str) -> None:
    with pytest.raises(inventory.InventoryError):
        starter.parse_target(text)


# ---------------------------------------------------------------------------------------------
# This machine, with no inventory anywhere


def no_inventory_env(tmp_path: Path) -> dict[str, str]:
    """No $PROVISION_INVENTORY or $PROVISION_LAB, and a lab directory with nothing in it (a lab this
    checkout brought up would be the default in it: config.inventory_lookup)."""
    env = {key: value for key, value in os.environ.items() if key not in ("PROVISION_INVENTORY", "PROVISION_LAB")}
    env["PROVISION_LAB_DIR"] = str(tmp_path / "no-lab")
    env["COLUMNS"] = "200"
    return env


def test_facts_of_this_machine_need_no_inventory(tmp_path: Path) -> None:
    done = invoke("facts", "--host", "local", "--json", cwd=tmp_path, env=no_inventory_env(tmp_path))
    assert done.returncode == 0, done.stderr
    local: dict[str, Any] = json.loads(done.stdout)["hosts"]["local"]
    assert (local["kernel"], local["arch"]) == (platform.release(), platform.machine())
    assert local["memory"]["total"] > 0
    # No GPU on this machine: an empty list and the reason, not an error.
    assert local["gpus"] == [] and "nvidia-smi" in local["notes"]["gpus"]
    table = invoke("facts", "--host", "local", cwd=tmp_path, env=no_inventory_env(tmp_path))
    assert table.returncode == 0 and "nvidia-smi: not present on the host" in table.stdout


def test_a_missing_inventory_says_where_it_looked_and_how_to_give_one(tmp_path: Path) -> None:
    done = invoke("facts", "--host", "ws-5090", cwd=tmp_path, env=no_inventory_env(tmp_path))
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert lines[:4] == [
        "error: inventory: none found. Looked, in this order:",
        "  1. $PROVISION_INVENTORY: not set",
        ("  2. the lab's inventory, while the lab is up (in the checkout that brought it up, or with "
         f"$PROVISION_LAB=1): {tmp_path}/no-lab/inventory.yaml: absent"),
        f"  3. ./inventory/ in the current directory: {tmp_path}/inventory: absent"]
    assert "--inventory FILE, or $PROVISION_INVENTORY=FILE, or put it in ./inventory/" in done.stderr
    assert "`invoke init --host local` writes a starter one" in done.stderr
    env = {**no_inventory_env(tmp_path), "PROVISION_INVENTORY": str(tmp_path / "gone.yaml")}
    named = invoke("plan", "--host", "local", cwd=tmp_path, env=env)  # a named inventory must exist
    assert named.returncode == 2 and f"1. $PROVISION_INVENTORY: {tmp_path}/gone.yaml: absent" in named.stderr


def test_init_for_this_machine_writes_an_inventory_the_tasks_then_use(tmp_path: Path) -> None:
    env = no_inventory_env(tmp_path)
    done = invoke("init", "--host", "local", "--json", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["written"] and answer["hosts"]["local"]["profile"] == "cpu"  # no GPU here
    assert answer["hosts"]["local"]["found"].startswith(f"{platform.machine()}, kernel {platform.release()}")
    written = tmp_path / "inventory" / "hosts.yaml"
    assert inventory.load(written).hosts["local"].connection == "local"
    # ./inventory/ is the default: the next task finds it with no flag.
    shown = invoke("inventory", cwd=tmp_path, env=env)
    assert shown.returncode == 0 and "inventory: inventory" in shown.stdout and "local" in shown.stdout


def test_two_hosts_of_one_name_are_bad_usage_before_any_probe(tmp_path: Path) -> None:
    done = invoke("init", "--host", "a=192.0.2.1", "--host", "a=192.0.2.2", "--output", str(tmp_path / "h.yaml"),
                  cwd=tmp_path)
    assert done.returncode == 2 and "named twice: a" in done.stderr
    assert not (tmp_path / "h.yaml").exists()


def test_init_json_reports_no_login_or_port_for_this_machine() -> None:
    found = recorded("rtx5090x2-tr7960x")
    local = starter.starter(starter.parse_target("local"), found, PROFILES).as_json()
    assert local["connection"] == "local"
    assert not {"user", "port", "address"} & set(local)
    remote = starter.starter(starter.parse_target("ops@192.0.2.10:2222"), found, PROFILES).as_json()
    assert {key: remote[key] for key in ("connection", "address", "user", "port")} == {
        "connection": "ssh", "address": "192.0.2.10", "user": "ops", "port": 2222}
