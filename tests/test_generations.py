"""Generations, run for real: the host program (hostgenerations.py + hostapply.py, as ops sends it) on this
machine against files in a temporary directory, under a real lock. No systemd here, so the scope has no
units and the managed files are plain files: what is checked is which generation the files are, which
state each generation is in, and what a rollback may restore.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from provision import programs
from provision.host import generations as host_generations
from tests.conftest import FIXTURES

SECRET = "sk-generation-test-0123456789"


@pytest.fixture
def host(tmp_path: Path) -> dict[str, Any]:
    return {"root": str(tmp_path / "generations"), "files": [str(tmp_path / "etc" / "vllm.env"),
                                                             str(tmp_path / "etc" / "other.conf")],
            "units": [], "venv": None, "model_root": None, "lock": str(tmp_path / "lock"), "tmp": tmp_path}


def run(host: dict[str, Any], action: str, **spec: Any) -> dict[str, Any]:
    generations = {key: host[key] for key in ("root", "files", "units", "venv", "model_root")}
    body = {"action": action, "lock": host["lock"], "wait": 5, "generations": generations,
            "secrets": {"VLLM_API_KEY": SECRET}, "changes": [], **spec}
    program = programs.ship(("generations", "apply"), "main", body)  # exactly what ops sends a host
    done = subprocess.run([sys.executable, "-"], input=program, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def write(path: str, content: str) -> dict[str, Any]:
    return {"kind": "file", "target": path, "describe": f"file {path}",
            "data": {"content": content, "mode": 0o600, "owner": "root", "group": "root"}}


def deploy(host: dict[str, Any], content: str, **extra: Any) -> dict[str, Any]:
    return run(host, "apply", by="deploy", verify=True, deadline=extra.pop("deadline", 900),
               changes=[write(host["files"][0], content)], **extra)


def text(host: dict[str, Any]) -> str:
    return Path(host["files"][0]).read_text()


def test_good_rejected_good_lists_three_and_offers_only_the_good_ones(host: dict[str, Any]) -> None:
    first = deploy(host, "PORT=8000\n")
    assert first["ok"] and first["generation"] == 2  # 1 is what the host had before: found
    assert run(host, "promote", generation=2)["ok"]
    bad = deploy(host, "PORT=9999\n")
    assert bad["generation"] == 3 and text(host) == "PORT=9999\n"
    back = run(host, "reject", generation=3, why="not ready")
    assert back["ok"] and back["to"] == 2 and text(host) == "PORT=8000\n"  # copied back, not swapped
    good = deploy(host, "PORT=8001\n")
    assert run(host, "promote", generation=good["generation"])["ok"]
    listing = run(host, "list")["generations"]
    rows = {row["id"]: row for row in listing["generations"]}
    assert [(rows[n]["state"], rows[n]["target"]) for n in (2, 3, 4)] == [
        ("good", True), ("rejected", False), ("good", False)]  # the current one is no target: it runs
    assert rows[1]["state"] == "found" and rows[4]["current"]
    assert [n for n in rows if rows[n]["default"]] == [2] and listing["default"] == 2
    # The default rollback goes to the newest good one before the current, never to the rejected one.
    rolled = run(host, "rollback")
    assert rolled["to"] == 2 and text(host) == "PORT=8000\n"
    refused = run(host, "rollback", to=3)
    assert not refused["ok"] and "rejected: not a rollback target" in refused["failed"]["error"]
    assert text(host) == "PORT=8000\n"


def test_a_rejected_deploy_restores_every_managed_file_of_the_good_generation(host: dict[str, Any]) -> None:
    env, other = host["files"]
    run(host, "apply", by="deploy", verify=True, changes=[write(env, "A=1\n"), write(other, "x\n")])
    run(host, "promote", generation=2)
    # Three runs later the files would be a mix; a generation restores them as they ran together.
    bad = run(host, "apply", by="deploy", verify=True, changes=[write(env, "A=2\n"), write(other, "y\n")])
    run(host, "reject", generation=bad["generation"], why="crashed")
    assert (Path(env).read_text(), Path(other).read_text()) == ("A=1\n", "x\n")


def test_a_second_identical_run_after_waiting_for_the_lock_applies_nothing(host: dict[str, Any]) -> None:
    change = write(host["files"][0], "PORT=8000\n")
    first = run(host, "apply", changes=[change])
    again = run(host, "apply", changes=[change])  # planned before the first applied: already in place now
    assert first["done"] == [0] and again["done"] == [] and again["skipped"] == [0]
    assert again["generation"] is None
    states = run(host, "list")["generations"]["generations"]
    assert [g["state"] for g in states] == ["found", "applied"]  # the earlier version is still kept


def test_secrets_rest_as_placeholders_and_come_back_on_restore(host: dict[str, Any]) -> None:
    deploy(host, f"VLLM_API_KEY={SECRET}\n")
    run(host, "promote", generation=2)
    deploy(host, f"VLLM_API_KEY={SECRET}\nPORT=1\n")
    kept = [path for path in Path(host["root"]).rglob("*") if path.is_file()]
    assert kept and not any(SECRET.encode() in path.read_bytes() for path in kept)
    assert all(oct(path.stat().st_mode & 0o777) in ("0o600",) for path in kept if "files" in path.parts)
    run(host, "reject", generation=3, why="test")
    assert text(host) == f"VLLM_API_KEY={SECRET}\n"


def test_a_rollback_lacking_a_secret_says_which_and_changes_nothing(host: dict[str, Any]) -> None:
    env, other = host["files"]
    run(host, "apply", by="deploy", verify=True, changes=[write(env, f"VLLM_API_KEY={SECRET}\n"), write(other, "x\n")])
    run(host, "promote", generation=2)
    later = run(host, "apply", by="deploy", verify=True, changes=[write(env, "A=1\n"), write(other, "y\n")])
    run(host, "promote", generation=later["generation"])
    refused = run(host, "rollback", secrets={})  # other.conf sorts first: it would have been written
    assert not refused["ok"] and "needs the secret VLLM_API_KEY" in refused["failed"]["error"], refused
    assert (Path(env).read_text(), Path(other).read_text()) == ("A=1\n", "y\n")
    assert run(host, "rollback")["to"] == 2 and Path(other).read_text() == "x\n"  # with the secret it restores


def test_a_deploy_that_stopped_before_its_verdict_is_reported_and_then_abandoned(host: dict[str, Any]) -> None:
    deploy(host, "PORT=8000\n")
    run(host, "promote", generation=2)
    deploy(host, "PORT=7777\n", deadline=-1)  # its deadline passed: the deploy is gone
    later = deploy(host, "PORT=8002\n")
    assert later["unfinished"]["id"] == 3
    rows = {row["id"]: row for row in run(host, "list")["generations"]["generations"]}
    assert rows[3]["state"] == "abandoned" and not rows[3]["target"]
    run(host, "reject", generation=later["generation"], why="not ready")
    assert text(host) == "PORT=8000\n"  # the last good one, not the abandoned one


def test_promote_is_refused_when_another_run_changed_the_host_meanwhile(host: dict[str, Any]) -> None:
    mine = deploy(host, "PORT=8000\n")
    run(host, "apply", changes=[write(host["files"][0], "PORT=8123\n")])  # a provision during readiness
    refused = run(host, "promote", generation=mine["generation"])
    assert not refused["ok"] and "another run changed the host" in refused["failed"]["error"]


def test_the_lock_is_held_for_the_whole_run(host: dict[str, Any]) -> None:
    import fcntl

    os.makedirs(os.path.dirname(host["lock"]), exist_ok=True)
    fd = os.open(host["lock"], os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.pwrite(fd, b"pid 4242 since test", 0)
    try:
        started = time.monotonic()
        body = {"wait": 0}
        answer = run(host, "apply", changes=[write(host["files"][0], "X\n")], **body)
        assert not answer["ok"] and "pid 4242 since test" in answer["failed"]["error"]
        assert time.monotonic() - started < 30
    finally:
        os.close(fd)


def test_a_model_revision_alone_is_a_generation_and_rollback_brings_the_old_one(host: dict[str, Any]) -> None:
    model = host["tmp"] / "models" / "org" / "m"
    for revision in ("r1", "r2"):
        (model / "revisions" / revision).mkdir(parents=True)
    os.symlink("revisions/r1", model / "current")
    host["model_root"] = str(model)
    deploy(host, "PORT=8000\n")
    run(host, "promote", generation=2)
    # The weights step moved current to r2 (previous r1) before any file changed: recorded as such.
    os.symlink("revisions/r1", model / ".previous")
    os.rename(model / ".previous", model / "previous")
    os.remove(model / "current")
    os.symlink("revisions/r2", model / "current")
    fetched = run(host, "apply", model_changed=True, record=["weights org/m: revision r1 -> r2"])
    assert fetched["generation"] == 3
    rolled = run(host, "rollback")
    assert rolled["to"] == 2 and os.readlink(model / "current") == "revisions/r1"
    assert os.readlink(model / "previous") == "revisions/r2"
    assert f"{model} -> revisions/r1" in rolled["restored"]


def test_a_rollback_from_a_killed_runs_pending_generation_settles_it_as_abandoned(host: dict[str, Any]) -> None:
    deploy(host, "PORT=8000\n")
    run(host, "promote", generation=2)
    run(host, "apply", by="tune trial", verify=True, deadline=-1,  # a tune trial killed before its verdict
        changes=[write(host["files"][0], "PORT=7777\n")])
    back = run(host, "rollback")
    assert back["to"] == 2 and text(host) == "PORT=8000\n"
    rows = {row["id"]: row for row in run(host, "list")["generations"]["generations"]}
    assert rows[3]["state"] == "abandoned" and "before its readiness verdict" in rows[3]["note"], rows[3]
    assert rows[3]["by"] == "tune trial"  # `rollback --list` names it as a trial


def test_the_next_apply_settles_an_older_pending_generation_with_the_reason(host: dict[str, Any]) -> None:
    deploy(host, "PORT=8000\n")
    run(host, "promote", generation=2)
    deploy(host, "PORT=7777\n", deadline=-1)  # killed: pending, its deadline passed
    # The host was put back to generation 2 by some means that left 3 pending and not current (a
    # rollback by an earlier version of the tool did exactly this).
    state_path = Path(host["root"]) / "state.json"
    state = json.loads(state_path.read_text())
    state["current"] = 2
    state_path.write_text(json.dumps(state))
    answer = run(host, "apply", changes=[write(host["files"][1], "x=1\n")])
    assert answer["settled"] == [3]
    rows = {row["id"]: row for row in run(host, "list")["generations"]["generations"]}
    assert rows[3]["state"] == "abandoned" and "stopped before the readiness verdict" in rows[3]["note"]


def test_a_restored_generation_answers_with_the_endpoint_recorded_with_it(host: dict[str, Any]) -> None:
    own = {"base": "http://127.0.0.1:8000", "model": "tiny-llama", "unit": "vllm.service"}
    deploy(host, "PORT=8000\n", serve=own, overrides=[])
    run(host, "promote", generation=2)
    failed = deploy(host, "PORT=8123\n", serve={**own, "base": "http://127.0.0.1:8123"}, overrides=["port"])
    rows = {row["id"]: row for row in run(host, "list")["generations"]["generations"]}
    assert rows[3]["overrides"] == ["port"] and rows[2]["overrides"] == []
    back = run(host, "reject", generation=failed["generation"], why="port taken")
    assert back["to"] == 2 and back["serve"] == own  # judged at :8000, not at the failed run's :8123


def test_a_generation_that_fetched_weights_only_keeps_where_the_server_answers(host: dict[str, Any]) -> None:
    """`invoke weights` with another model changes the model store, not the unit: the generation it records
    must be judged by the model the unit serves, not by the one it fetched (a rollback to it once waited
    420 s for a model the restored server never had)."""
    own = {"base": "http://127.0.0.1:8000", "model": "tiny-llama", "unit": "vllm.service"}
    deploy(host, "PORT=8000\n", serve=own, overrides=[])
    run(host, "promote", generation=2)
    fetched = run(host, "apply", by="weights", record=["weights test/relay-llama"], serve=None)
    assert fetched["generation"] == 3
    other = {**own, "model": "test/relay-llama"}
    relay = deploy(host, "PORT=8000\nMODEL=relay\n", serve=other, overrides=["model"])
    run(host, "promote", generation=relay["generation"])
    back = run(host, "rollback")  # to the newest one that ran before: the fetch's
    assert back["to"] == 3 and back["serve"] == own


@pytest.mark.parametrize("unit, restored, restart", [
    ("vllm-ray-head.service", ["/etc/systemd/system/vllm.service"], False),  # the deploy changed vLLM's unit only
    ("vllm.service", ["/etc/systemd/system/vllm.service"], True),
    ("vllm-ray-head.service", ["/etc/vllm/vllm.env"], True),  # every unit reads the environment file
    ("vllm-ray-head.service", ["/opt/vllm/venv"], True),  # Ray runs from the venv too
    ("vllm-ray-head.service", ["/var/lib/vllm/models/org/m -> revisions/abc"], False),  # Ray reads no weights
    ("vllm.service", ["/var/lib/vllm/models/org/m -> revisions/abc"], True),
    ("vllm.service", ["removed /etc/systemd/system/vllm.service.d/override.conf"], True),
    ("vllm-ray-head.service", ["removed /etc/systemd/system/vllm.service.d/override.conf"], False),
], ids=["ray-head-kept-for-vllm-unit", "vllm-unit", "env-file", "venv", "ray-head-kept-for-model", "model",
        "own-drop-in", "other-units-drop-in"])
def test_a_restore_restarts_only_the_units_that_read_what_it_put_back(unit: str, restored: list[str],
                                                                       restart: bool) -> None:
    """A Ray head restarted for nothing loses its workers (they do not join the new head's session)."""
    from provision.host import generations

    assert generations.must_restart(unit, restored, ["/var/lib/vllm/models/org/m"]) is restart


def promoted(host: dict[str, Any], content: str) -> int:
    number: int = deploy(host, content)["generation"]
    assert run(host, "promote", generation=number)["ok"]
    return number


def test_a_rollback_after_rollback_to_goes_to_the_generation_that_ran_before_not_a_leftover(
        host: dict[str, Any]) -> None:
    """2 and 3 are good; --to 2; a deploy makes 4 from 2: its rollback is 2, not 3 (numbered between,
    it never ran before 4: another engine's, left by an earlier run)."""
    vllm = promoted(host, "ENGINE=vllm\n")
    leftover = promoted(host, "ENGINE=llama.cpp\n")
    assert run(host, "rollback", to=vllm)["to"] == vllm and text(host) == "ENGINE=vllm\n"
    later = promoted(host, "ENGINE=vllm\nMAX_MODEL_LEN=200\n")
    assert later > leftover
    listing = run(host, "list")["generations"]
    assert listing["default"] == vllm
    rolled = run(host, "rollback")
    assert rolled["to"] == vllm and rolled["left"] == later and text(host) == "ENGINE=vllm\n"


def test_a_rejected_deploy_after_rollback_to_gets_back_what_ran_before_it(host: dict[str, Any]) -> None:
    vllm = promoted(host, "ENGINE=vllm\n")
    promoted(host, "ENGINE=llama.cpp\n")
    run(host, "rollback", to=vllm)
    bad = deploy(host, "ENGINE=vllm\nPORT=8123\n")
    back = run(host, "reject", generation=bad["generation"], why="port taken")
    assert back["to"] == vllm and text(host) == "ENGINE=vllm\n"


def test_the_chain_skips_rejected_and_abandoned_generations_and_goes_on_before_them(
        host: dict[str, Any]) -> None:
    good = promoted(host, "A=1\n")
    killed = deploy(host, "A=2\n", deadline=-1)["generation"]  # pending, its run gone
    later = deploy(host, "A=3\n")["generation"]  # ran after the killed one, which it abandons
    assert load_summary(host, later)["previous"] == killed
    assert run(host, "promote", generation=later)["ok"]
    assert run(host, "rollback")["to"] == good and text(host) == "A=1\n"


def load_summary(host: dict[str, Any], number: int) -> dict[str, Any]:
    state = json.loads((Path(host["root"]) / "state.json").read_text())
    summary: dict[str, Any] = next(g for g in state["generations"] if g["id"] == number)
    return summary


def test_a_record_without_previous_falls_back_to_the_next_lower_number(host: dict[str, Any]) -> None:
    """Records older than the `previous` field say nothing of what ran before: the numbers are all."""
    first = promoted(host, "A=1\n")
    second = promoted(host, "A=2\n")
    run(host, "rollback", to=first)
    third = promoted(host, "A=3\n")
    state_path = Path(host["root"]) / "state.json"
    state = json.loads(state_path.read_text())
    for summary in state["generations"]:
        if summary["id"] == third:
            del summary["previous"]
    state_path.write_text(json.dumps(state))
    assert run(host, "rollback")["to"] == second


def test_a_link_to_a_pruned_generation_goes_on_below_it(host: dict[str, Any]) -> None:
    from provision.host import generations

    root = Path(host["root"])
    root.mkdir()
    rows = [{"id": 1, "state": "found", "previous": None}, {"id": 2, "state": "good", "previous": 1},
            {"id": 5, "state": "good", "previous": 2}, {"id": 7, "state": "good", "previous": 4},
            {"id": 9, "state": "good", "previous": 7}]
    (root / "state.json").write_text(json.dumps({"current": 9, "generations": rows}))
    assert generations.ran_before(str(root), 9) == [7, 2, 1]  # 4 is pruned; 5 (above 4) never ran before 7
    assert generations.rollback_target(str(root)) == 7
    assert generations.rollback_target(str(root), before=7) == 2
    assert generations.rollback_target(str(root), before=2) is None  # before 2: only what the host had


def test_forward_goes_back_to_the_generation_the_rollback_left_pending_again(host: dict[str, Any]) -> None:
    """A rollback whose restored generation does not serve: back to the one that was running, in the
    state it had (a deploy's generation without a verdict is pending again, not abandoned)."""
    good = promoted(host, "A=1\n")
    waiting = deploy(host, "A=2\n")["generation"]
    rolled = run(host, "rollback")
    assert rolled["to"] == good and rolled["left"] == waiting
    assert load_summary(host, waiting)["state"] == "abandoned"
    forward = run(host, "rollback", to=waiting, forward=True)
    assert forward["ok"] and forward["to"] == waiting and forward["left"] == good, forward
    assert text(host) == "A=2\n" and load_summary(host, waiting)["state"] == "pending"
    assert run(host, "list")["generations"]["current"] == waiting
    again = run(host, "rollback", to=waiting, forward=True)  # the record of what was left is spent
    assert not again["ok"] and "not the one the last rollback left" in again["failed"]["error"]


def test_forward_is_refused_once_another_run_changed_the_host(host: dict[str, Any]) -> None:
    first = promoted(host, "A=1\n")
    second = promoted(host, "A=2\n")
    run(host, "rollback", to=first)
    run(host, "apply", changes=[write(host["files"][1], "x=1\n")])  # a provision meanwhile
    refused = run(host, "rollback", to=second, forward=True)
    assert not refused["ok"] and "another run changed it since" in refused["failed"]["error"], refused
    assert text(host) == "A=1\n"


def test_a_rollback_after_tune_goes_to_what_ran_before_the_trials(host: dict[str, Any]) -> None:
    """tune leaves the host on its winning trial; a plain rollback then means the settings that ran
    before the tuning, not the trial tune tried last (which `--to` still restores by number)."""
    before = promoted(host, "A=1\n")
    first_trial = run(host, "apply", by="tune trial", verify=True, deadline=900,
                      changes=[write(host["files"][0], "A=1\nB=2\n")])["generation"]
    assert run(host, "promote", generation=first_trial)["ok"]
    winner = run(host, "apply", by="tune trial", verify=True, deadline=900,
                 changes=[write(host["files"][0], "A=1\nB=4\n")])["generation"]
    assert run(host, "promote", generation=winner)["ok"]
    listing = run(host, "list")["generations"]
    assert listing["default"] == before
    assert [row["trial"] for row in listing["generations"] if row["id"] in (first_trial, winner)] == [True, True]
    rolled = run(host, "rollback")
    assert rolled["to"] == before and text(host) == "A=1\n"
    assert run(host, "rollback", to=first_trial)["to"] == first_trial and text(host) == "A=1\nB=2\n"


def test_unit_states_read_one_systemctl_show_for_all_units() -> None:
    """Installed, enabled, active per unit from one `systemctl show` (recorded on a lab host), as
    `systemctl is-enabled` and `is-active` would answer them."""
    case = json.loads((FIXTURES / "systemd" / "debian12-systemd252-unit-states.json").read_text())
    assert host_generations.parse_unit_states(case["stdout"], case["units"]) == case["expected"]
    assert host_generations.parse_unit_states("", ["vllm.service"]) == {
        "vllm.service": {"installed": False, "enabled": False, "active": False}}


def test_a_promoted_generation_keeps_how_long_its_restart_took(host: dict[str, Any]) -> None:
    """Deploy's apply plus readiness, kept with the generation: tune's estimate of a restart on this
    hardware (the H200 host's deploys took 4-9 s while tune, knowing none, counted 120 s)."""
    deploy(host, "PORT=8000\n")
    assert run(host, "promote", generation=2, restart_s=9.1)["ok"]
    deploy(host, "PORT=8001\n")
    assert run(host, "promote", generation=3)["ok"]  # a caller that measured none (older tools)
    rows = {row["id"]: row for row in run(host, "list")["generations"]["generations"]}
    assert (rows[2]["restart_s"], rows[3].get("restart_s")) == (9.1, None)
    state = Path(host["root"], "state.json").read_text()
    assert [g.get("restart_s") for g in json.loads(state)["generations"] if g["id"] in (2, 3)] == [9.1, None]
