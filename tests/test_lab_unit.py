"""The lab's refusals and its recordings, without booting anything."""
from __future__ import annotations

import pytest

from provision import facts, lab
from provision.errors import LabError


def test_lab_refuses_without_root_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lab.os, "geteuid", lambda: 1000)
    with pytest.raises(LabError, match="needs root"):
        lab.preflight()


def test_lab_refuses_without_nspawn_and_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lab.os, "geteuid", lambda: 0)
    monkeypatch.setattr(lab.shutil, "which", lambda tool: None if tool in ("systemd-nspawn", "debootstrap") else "/usr/bin/" + tool)
    with pytest.raises(LabError) as caught:
        lab.preflight()
    assert "missing systemd-nspawn, debootstrap" in str(caught.value)
    assert "apt-get install -y systemd-container debootstrap" in str(caught.value)


@pytest.mark.parametrize("host", [h for h in lab.DEFAULT_HOSTS if h.machine], ids=lambda h: h.name)
def test_every_recording_answers_the_tools_current_commands(host: lab.LabHost) -> None:
    """A recording made with an older command would be replayed to nobody: catch the drift here."""
    recording = lab.load_machine(host.machine or "")
    assert recording["profile"] == host.profile
    by_fact = {entry["fact"]: entry for entry in recording["outputs"]}
    for fact in facts.FACTS:
        entry = by_fact.get(fact.name)
        if entry is None:
            continue
        assert entry.get("argv", entry.get("file")) == (list(fact.argv) if fact.argv else fact.file)
        assert entry.get("provenance"), f"{host.machine}/{fact.name} does not say where it comes from"
    for needed in ("uname", "gpus", "nvidia_driver", "lscpu", "lscpu_cpus"):
        assert needed in by_fact, f"{host.machine} lacks {needed}"
