"""The roll lock, with the real host programs run by this machine's python3 (host/roll.py holds it,
host/apply.py meets it): a deploy holds it from its drain to the replica's return, another run's
apply waits for it or is refused naming the holder, the holding run's own apply goes through, and
the hold ends with the connection that started it."""
from __future__ import annotations

import hashlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any

from provision import programs


def hold(tmp_path: Path, run: str, wait: float = 0) -> subprocess.Popen[str]:
    state = tmp_path / "state.json"
    spec = {"roll_lock": str(tmp_path / "roll.lock"), "lock": str(tmp_path / "host.lock"), "wait": wait,
            "run": run, "holder": f"run {run}: deploy from controller-a (pid 1)", "state_files": [str(state), str(tmp_path / "none")],
            "max_s": 60}
    process = subprocess.Popen(["python3", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdin is not None
    process.stdin.write(programs.ship(("roll",), "hold_main", spec))
    process.stdin.close()
    return process


def first_event(process: subprocess.Popen[str]) -> dict[str, Any]:
    assert process.stdout is not None
    line = process.stdout.readline()
    return dict(json.loads(line))


def apply(tmp_path: Path, run: str, wait: float = 0) -> dict[str, Any]:
    spec = {"action": "apply", "lock": str(tmp_path / "host.lock"), "roll_lock": str(tmp_path / "roll.lock"),
            "run": run, "wait": wait, "generations": None, "changes": [], "secrets": {}}
    done = subprocess.run(["python3", "-"], input=programs.ship(("generations", "apply"), "main", spec),
                          capture_output=True, text=True, timeout=60, check=False)
    return dict(json.loads(done.stdout))


def test_a_held_roll_refuses_another_runs_apply_naming_the_holder_and_lets_its_own_through(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text('{"current": 3}')
    keeper = hold(tmp_path, "aaaa")
    try:
        held = first_event(keeper)
        assert held["event"] == "held"
        # The generation records as read under the lock: what the controller compares with its facts.
        assert held["states"] == {str(tmp_path / "state.json"): hashlib.sha256(b'{"current": 3}').hexdigest(),
                                  str(tmp_path / "none"): None}
        refused = apply(tmp_path, "bbbb")
        assert refused["ok"] is False and refused["failed"]["kind"] == "lock", refused
        assert "a deploy is rolling this host (run aaaa: deploy from controller-a (pid 1), pid " in refused["failed"]["error"]
        assert "nothing done" in refused["failed"]["error"]
        own = apply(tmp_path, "aaaa")
        assert own["ok"] is True and own["failed"] is None, own
        # The same run asks again (a tune's next trial, another service of the host): held already.
        again = hold(tmp_path, "aaaa")
        assert first_event(again)["event"] == "held"
        assert again.wait(timeout=30) == 0
        assert again.stdout is not None
        again.stdout.close()
        second = hold(tmp_path, "cccc")
        answer = first_event(second)
        second.wait(timeout=30)
        assert second.stdout is not None
        second.stdout.close()
        assert answer["event"] == "result" and answer["held"] is False
        assert "holds " + str(tmp_path / "roll.lock") + " (run aaaa: deploy from controller-a" in answer["error"]
    finally:
        keeper.kill()
        keeper.wait()
        assert keeper.stdout is not None
        keeper.stdout.close()


def test_an_apply_with_wait_goes_through_once_the_roll_ends_and_the_hold_ends_with_its_connection(tmp_path: Path) -> None:
    keeper = hold(tmp_path, "aaaa")
    assert first_event(keeper)["event"] == "held"
    started = time.monotonic()
    refused = apply(tmp_path, "bbbb")
    assert refused["ok"] is False and "a deploy is rolling this host" in refused["failed"]["error"], refused
    # The controller's connection ends: the reading end of the hold's output closes. Its next newline
    # fails, and it ends: the roll lock is free for the apply that waits for it.
    assert keeper.stdout is not None
    keeper.stdout.close()
    done = apply(tmp_path, "bbbb", wait=20)
    assert done["ok"] is True, done
    assert time.monotonic() - started < 10
    assert keeper.wait(timeout=10) is not None
