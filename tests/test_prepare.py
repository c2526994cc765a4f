"""The preparation planner (provision/prepare.py) on recorded machines' facts and the gate's findings, and the
host side's readers on real apt output."""
from __future__ import annotations

import dataclasses
from typing import Any

from rich.console import Console

from provision import checks, context, prepare
from provision.host import prepare as on_host
from provision.parsers import NvidiaDriver
from tests.test_checks import PROFILES, recorded, settings

HWE = "linux-generic-hwe-24.04"


def ctx_of(machine: str, profile: str, change: Any = None, **values: Any) -> context.Context:
    facts = recorded(machine)
    if change:
        facts = change(facts)
    return context.Context(host="h", profile=PROFILES[profile], settings=settings(profile, **values), facts=facts)


def survey(**found: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"installed": {}, "candidates": {HWE: "6.14.0-29.29~24.04.1",
                                                            "nvidia-driver-570-open": "570.172.08-0ubuntu0.24.04.1",
                                                            "nvidia-driver-580-open": "580.65.06-0ubuntu0.24.04.1"},
                            "held": [], "files": {}, "reboot_required": False, "reboot_packages": []}
    return {**base, **found}


def planned(ctx: context.Context, **found: Any) -> prepare.Preparation:
    fixes, unfixable = prepare.fixes_for(ctx, checks.evaluate(ctx))
    return prepare.plan(ctx.host, fixes, unfixable, survey(**found))


def test_the_broken_workstation_gets_the_hwe_kernel_and_the_open_driver_of_its_branch() -> None:
    ctx = ctx_of("rtx5090x1-kernel68-proprietary", "rtx5090")  # 6.8 kernel, proprietary 570.133.07
    fixes, unfixable = prepare.fixes_for(ctx, checks.evaluate(ctx))
    assert {fix.rule: fix.packages for fix in fixes} == {
        "kernel.version": (HWE,), "driver.flavour": ("nvidia-driver-570-open",),
        "config.dmabuf": ("nvidia-driver-570-open",)}
    assert [f.id for f in unfixable] == ["config.model"]  # no model named: no preparation fixes that
    prepared = prepare.plan("h", fixes, unfixable, survey())
    assert [(c.name, c.installed, c.candidate) for c in prepared.packages] == [
        (HWE, None, "6.14.0-29.29~24.04.1"), ("nvidia-driver-570-open", None, "570.172.08-0ubuntu0.24.04.1")]
    assert prepared.packages[1].rules == ("driver.flavour", "config.dmabuf")
    assert set(prepared.reboot_after) == {"kernel.version", "driver.flavour", "config.dmabuf"}
    assert prepared.steps()[-1].startswith("reboot (for kernel.version")
    assert "6.14" in prepared.sources["kernel.version"]


def test_a_cuda_13_build_needs_the_580_branch() -> None:
    ctx = ctx_of("rtx5090x1-kernel68-proprietary", "rtx5090", cuda_version="13.0")
    fixes, _ = prepare.fixes_for(ctx, checks.evaluate(ctx))
    assert {name for fix in fixes for name in fix.packages} == {HWE, "nvidia-driver-580-open"}
    assert "driver.version" in {fix.rule for fix in fixes}  # 570 cannot run CUDA 13.0


def test_installed_and_waiting_for_a_reboot_plans_only_the_reboot() -> None:
    ctx = ctx_of("rtx5090x1-kernel68-proprietary", "rtx5090")
    prepared = planned(ctx, installed={HWE: "6.14.0-29.29~24.04.1",
                                       "nvidia-driver-570-open": "570.172.08-0ubuntu0.24.04.1"},
                       reboot_required=True, reboot_packages=[HWE, "nvidia-driver-570-open"])
    assert not prepared.changes and prepared.needs_reboot
    assert prepared.reboot_pending == (HWE, "nvidia-driver-570-open")


def test_a_held_package_or_one_no_source_has_stops_the_plan_with_the_reason() -> None:
    ctx = ctx_of("rtx5090x1-kernel68-proprietary", "rtx5090")
    held = planned(ctx, held=[HWE])
    assert [c.name for c in held.packages] == ["nvidia-driver-570-open"]
    assert any("linux-generic-hwe-24.04 is held (apt-mark hold)" in p for p in held.problems)
    missing = planned(ctx, candidates={HWE: "6.14.0-29.29~24.04.1"})
    assert any(p.startswith("nvidia-driver-570-open: no package source") for p in missing.problems)


def test_a_prepared_host_plans_nothing() -> None:
    ctx = ctx_of("rtx5090x2-tr7960x", "rtx5090")  # 6.14 kernel, open 580 driver: every rule passes
    prepared = planned(ctx)
    assert not prepared.changes and not prepared.needs_reboot and prepared.steps() == []


def test_nouveau_is_blacklisted_once_and_the_initramfs_rebuilt() -> None:
    ctx = ctx_of("rtx5090x2-tr7960x", "rtx5090",
                 change=lambda f: dataclasses.replace(f, modules=f.modules | {"nouveau"}))
    prepared = planned(ctx)
    path = "/etc/modprobe.d/provision-blacklist-nouveau.conf"
    assert prepared.files == {path: "blacklist nouveau\noptions nouveau modeset=0\n"}
    assert prepared.commands == (("update-initramfs", "-u"),) and "driver.nouveau" in prepared.reboot_after
    again = planned(ctx, files={path: "blacklist nouveau\noptions nouveau modeset=0\n"})
    assert not again.files and not again.commands  # written already: nothing to do


def test_dgx_os_kernel_is_never_replaced() -> None:
    ctx = ctx_of("dgx-spark-gb10", "dgx-spark", change=lambda f: dataclasses.replace(f, kernel="6.8.0-1010-nvidia"))
    fixes, unfixable = prepare.fixes_for(ctx, checks.evaluate(ctx))
    assert [f.id for f in unfixable] == ["kernel.version", "config.model"] and fixes == []


def test_hopper_gets_the_server_driver_branch_for_its_cuda_and_nothing_blackwell() -> None:
    old = NvidiaDriver(version="550.163.01", flavour="open", arch="x86_64")
    ctx = ctx_of("h200x2-driver580", "hopper", change=lambda f: dataclasses.replace(f, driver=old),
                 cuda_version="12.8")
    fixes, _ = prepare.fixes_for(ctx, checks.evaluate(ctx))
    assert {name for fix in fixes for name in fix.packages} == {"nvidia-driver-570-server-open"}


def test_an_os_without_data_leaves_every_finding_to_the_admin() -> None:
    def debian(facts: Any) -> Any:
        return dataclasses.replace(facts, os=dataclasses.replace(facts.os, id="debian", version_id="12"))

    ctx = ctx_of("rtx5090x1-kernel68-proprietary", "rtx5090", change=debian)
    fixes, unfixable = prepare.fixes_for(ctx, checks.evaluate(ctx))
    assert fixes == [] and {f.id for f in unfixable} >= {"kernel.version", "driver.flavour"}


# Recorded on a Debian 12 machine: `apt-cache policy bash nvidia-driver-570-open` (the second is unknown
# there: apt prints nothing for it).
POLICY = """bash:
  Installed: 5.2.15-2+b8
  Candidate: 5.2.15-2+b13
  Version table:
     5.2.15-2+b13 500
        500 http://deb.debian.org/debian bookworm/main amd64 Packages
 *** 5.2.15-2+b8 100
        100 /var/lib/dpkg/status
"""


def test_candidate_versions_from_apt_cache_policy() -> None:
    assert on_host.parse_policy(POLICY, ["bash", "nvidia-driver-570-open"]) == {
        "bash": "5.2.15-2+b13", "nvidia-driver-570-open": None}
    assert on_host.parse_policy("foo:\n  Installed: (none)\n  Candidate: (none)\n", ["foo"]) == {"foo": None}


def test_a_prepare_stopped_at_the_lock_says_it_did_none_of_its_steps() -> None:
    from provision import report
    prepared = prepare.Preparation(host="h200", packages=(prepare.PackageChange("nvidia-driver-570", "550", "570",
                                                                               ("driver.version",)),),
                                   reboot_after=("driver.version",))
    stopped = prepare.HostReport("h200", [], prepared, applied={
        "ok": False, "done": [], "skipped": [], "undone": [],
        "failed": "another provision holds /run/lock/provision.lock (pid 42 since 10:00)"})
    out = Console(record=True, width=300)
    report.print_prepared(prepare.Prepared(["h200"], {"h200": stopped}, {}, "h200: apply failed"), out)
    line = out.export_text().splitlines()[0]
    assert "did:" not in line, line
    assert line.startswith("h200: did not: install nvidia-driver-570"), line
    installed = dataclasses.replace(stopped, applied={"ok": True, "done": ["installed nvidia-driver-570 570"]})
    assert report.preparation_line(installed, dry_run=False) == "did: installed nvidia-driver-570 570"  # no reboot
    rebooted = dataclasses.replace(installed, rebooted_s=40.0)
    assert report.preparation_line(rebooted, dry_run=False) == "did: installed nvidia-driver-570 570; rebooted"
