"""A replay host's GPU readings come from a recording: facts and status say so (nvidia-smi's own
timestamp column, far older than the probe), as they would for any host answering old readings."""
from __future__ import annotations

import pytest

from tests.lab.conftest import invoke_json

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("the_lab")]


def test_a_replay_hosts_gpu_readings_are_shown_as_recorded_in_status_and_facts() -> None:
    code, found, text = invoke_json("status", "--host", "h200", timeout=120)
    assert code == 0, text
    gpus = found["hosts"]["h200"]["gpus"]
    assert len(gpus) == 2 and all(gpu["recorded"] == "2026-11-30 01:45" for gpu in gpus), gpus
    code, gathered, text = invoke_json("facts", "--host", "h200", timeout=120)
    assert code == 0, text
    (host,) = [value for value in gathered.get("hosts", gathered).values() if isinstance(value, dict)
               and "gpus" in value]
    assert [gpu["recorded"] for gpu in host["gpus"]] == ["2026-11-30 01:45"] * 2, host["gpus"]
    assert [gpu["read_at"] for gpu in host["gpus"]] == ["2026/11/30 01:45:22.000"] * 2
