"""An image's /etc/nccl.conf on a lab host: the probe reads it over SSH, the gate names what it sets
beside the rendered environment, the plan shows it, and the printed fix clears the warning."""
from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from provision import inventory, lab
from tests.lab.conftest import on_host, run_invoke

pytestmark = pytest.mark.lab

IMAGE_CONF = "# set by the image\nNCCL_IB_USE_INLINE=1\n"


@pytest.fixture
def image_conf(the_lab: lab.Lab, lab_inventory: inventory.Inventory) -> Iterator[str]:
    """spark-a with an image's /etc/nccl.conf, removed afterwards (the lab host had none)."""
    assert on_host(lab_inventory, "spark-a", ["ls", "/etc"]).split().count("nccl.conf") == 0
    on_host(lab_inventory, "spark-a", ["tee", "/etc/nccl.conf"], stdin=IMAGE_CONF)
    try:
        yield "spark-a"
    finally:
        on_host(lab_inventory, "spark-a", ["rm", "-f", "/etc/nccl.conf"])


def nccl_conf(report: dict, host: str) -> dict:
    return next(f for f in report["hosts"][host]["findings"] if f["id"] == "config.nccl_conf")


def test_an_image_nccl_conf_is_named_shown_in_the_plan_and_cleared_by_the_printed_fix(image_conf: str) -> None:
    done = run_invoke("check", "--cluster", "lab-spark", "--json")
    report = json.loads(done.stdout)
    found = nccl_conf(report, image_conf)
    assert (found["status"], found["severity"]) == ("fail", "warning"), found
    assert found["evidence"]["applied"] == {"NCCL_IB_USE_INLINE": "1 (from /etc/nccl.conf; rendered: unset)"}
    assert nccl_conf(report, "spark-b")["status"] == "skip"  # the other node has no file
    planned = run_invoke("plan", "--cluster", "lab-spark")
    assert "/etc/nccl.conf: NCCL_IB_USE_INLINE=1" in planned.stdout, planned.stdout + planned.stderr
    assert "nccl.conf: an nccl.conf sets what the service's environment does not" in planned.stdout
    fix = found["fix"].split("e.g. to keep the file's: ", 1)[1]
    assert fix == "--set environment='{NCCL_IB_USE_INLINE: \"1\"}'"
    fixed = run_invoke("check", "--cluster", "lab-spark", "--json", "--set",
                       'environment={NCCL_IB_USE_INLINE: "1"}')
    assert nccl_conf(json.loads(fixed.stdout), image_conf)["status"] == "pass", fixed.stdout + fixed.stderr
