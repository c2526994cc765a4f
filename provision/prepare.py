"""Preparation: make the gate's fixable findings pass, then prove it by checking again.

inventory -> facts -> gate -> preparation plan -> apply -> reboot (only when asked) -> facts -> gate.

What may change is data (prepare.yaml): per profile and OS, by the gate rule a change fixes, the packages
(names with {branch}: the driver branch the CUDA build needs), modprobe files and commands, and whether the
change waits for a reboot. The host's survey (host/prepare.py: the package lists refreshed, installed and
candidate versions, held packages) pins each package to the version the plan shows before anything
changes. A rule with no entry (BIOS settings, PCIe link width, a missing GPU, DGX OS's kernel) stays a
finding with its manual fix. Hosts go one at a time (or `batch` at a time), so the rest of a cluster keeps
serving; a host that fails or does not come back from its reboot stops the roll.
"""
from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from provision import checks, datafiles, programs, remote, run
from provision import cuda as cuda_builds
from provision.checks import Finding
from provision.context import Context
from provision.errors import CommandFailed, ProvisionError, UnreachableHost
from provision.fanout import for_each_host
from provision.inventory import Host, Inventory
from provision.runner import Runner
from provision.taskargs import PrepareFlags

LOCK = "/run/lock/provision.lock"
BOOT_ID = "/proc/sys/kernel/random/boot_id"


@dataclass(frozen=True)
class Fix:
    """What prepare.yaml says fixes one rule on one profile and OS."""

    rule: str
    packages: tuple[str, ...] = ()
    files: Mapping[str, str] = field(default_factory=dict)
    commands: tuple[tuple[str, ...], ...] = ()
    reboot: bool = False
    source: str = ""


@cache
def data() -> dict[str, Any]:
    text = resources.files("provision").joinpath("prepare.yaml").read_text(encoding="utf-8")
    loaded: dict[str, Any] = datafiles.load(text)
    return loaded


def os_key(ctx: Context) -> str | None:
    release = ctx.facts.os
    return f"{release.id}-{release.version_id}" if release and release.id and release.version_id else None


def driver_branch(ctx: Context) -> str | None:
    """The driver branch to install: the loaded one where it is new enough for the profile and the CUDA
    the server will run (a proprietary 570 becomes the open 570), else the branch of the minimum."""
    expectation = ctx.profile.driver
    if expectation is None:
        return None
    needed = expectation.minimum
    cuda, _ = checks.cuda_to_run(ctx)
    for_cuda = cuda_builds.minimum_driver(cuda) if cuda else None
    if for_cuda:
        needed = max(needed, for_cuda, key=checks.version_tuple)
    loaded = ctx.facts.driver
    if loaded and checks.version_tuple(loaded.version) >= checks.version_tuple(needed):
        return loaded.version.split(".")[0]
    return needed.split(".")[0]


def fixes_for(ctx: Context, findings: Sequence[Finding]) -> tuple[list[Fix], list[Finding]]:
    """The fixes for this host's failing rules, and the failing findings nothing here can fix."""
    entries = (data()["fixes"].get(ctx.profile.name) or {}).get(os_key(ctx) or "") or {}
    sources = data()["sources"]
    cuda, _ = checks.cuda_to_run(ctx)
    values = {"branch": driver_branch(ctx) or "", "cuda": (cuda or "").replace(".", "-")}
    fixes, unfixable = [], []
    for finding in findings:
        if finding.status != "fail":
            continue
        entry = entries.get(finding.id)
        if entry is None:
            unfixable.append(finding)
            continue
        fixes.append(Fix(rule=finding.id,
                         packages=tuple(name.format(**values) for name in entry.get("packages", [])),
                         files=dict(entry.get("files") or {}),
                         commands=tuple(tuple(argv) for argv in entry.get("commands") or []),
                         reboot=bool(entry.get("reboot")), source=sources.get(entry.get("source"), "")))
    return fixes, unfixable


@dataclass(frozen=True)
class PackageChange:
    name: str
    installed: str | None
    candidate: str
    rules: tuple[str, ...]

    def describe(self) -> str:
        now = f"{self.installed} -> " if self.installed else "new, "
        return f"{self.name} {now}{self.candidate} (for {', '.join(self.rules)})"


@dataclass(frozen=True)
class Preparation:
    """One host's preparation plan: what changes, what a reboot will finish, what stays a finding."""

    host: str
    packages: tuple[PackageChange, ...] = ()
    files: Mapping[str, str] = field(default_factory=dict)
    commands: tuple[tuple[str, ...], ...] = ()
    reboot_after: tuple[str, ...] = ()  # rules whose fix takes effect at the next boot
    reboot_pending: tuple[str, ...] = ()  # what already waits for a reboot (/run/reboot-required)
    unfixable: tuple[Finding, ...] = ()
    problems: tuple[str, ...] = ()  # what stops the plan: no candidate, a held package, apt refused
    sources: Mapping[str, str] = field(default_factory=dict)  # rule -> where its fix comes from
    rule_files: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # rule -> files written for it

    @property
    def changes(self) -> bool:
        return bool(self.packages or self.files or self.commands)

    @property
    def needs_reboot(self) -> bool:
        return bool(self.reboot_after or self.reboot_pending)

    def by_rule(self) -> dict[str, str]:
        """{rule: what this plan does for it}: its packages and files, and whether a reboot finishes it."""
        done: dict[str, list[str]] = {}
        for change in self.packages:
            for rule in change.rules:
                done.setdefault(rule, []).append(change.name)
        for rule, paths in self.rule_files.items():
            done.setdefault(rule, []).extend(paths)
        later = set(self.reboot_after)
        return {rule: ", ".join(names) + (" (at the next boot)" if rule in later else "")
                for rule, names in done.items()} | {rule: "at the next boot" for rule in later if rule not in done}

    def steps(self) -> list[str]:
        lines = [f"install {change.describe()}" for change in self.packages]
        lines += [f"write {path}" for path in sorted(self.files)]
        lines += [f"run {' '.join(argv)}" for argv in self.commands]
        if self.needs_reboot:
            why = ", ".join(self.reboot_after or self.reboot_pending)
            lines.append(f"reboot (for {why})")
        return lines

    def as_json(self) -> dict[str, Any]:
        return {"packages": [dataclasses.asdict(change) for change in self.packages], "files": sorted(self.files),
                "commands": [list(argv) for argv in self.commands], "reboot_after": list(self.reboot_after),
                "reboot_pending": list(self.reboot_pending), "problems": list(self.problems),
                "unfixable": [{"id": f.id, "message": f.message, "fix": f.fix} for f in self.unfixable],
                "sources": dict(self.sources), "steps": self.steps()}


def plan(host: str, fixes: Sequence[Fix], unfixable: Sequence[Finding], survey: Mapping[str, Any]) -> Preparation:
    """Pure: the fixes against what the host has (its survey) -> the preparation plan."""
    packages, problems = _package_changes(fixes, survey)
    present = survey.get("files") or {}
    files = {path: content for fix in fixes for path, content in fix.files.items() if present.get(path) != content}
    writes = {fix.rule: tuple(path for path in fix.files if path in files) for fix in fixes}
    rule_files = {rule: paths for rule, paths in writes.items() if paths}
    commands = tuple(argv for fix in fixes if rule_files.get(fix.rule) for argv in fix.commands)
    touched = {rule for change in packages for rule in change.rules} | set(rule_files)
    # What already waits for a boot: the packages /run/reboot-required.pkgs names, or the file alone.
    pending = tuple(survey.get("reboot_packages") or ()) or (
        ("an earlier change",) if survey.get("reboot_required") else ())
    waiting = tuple(dict.fromkeys(fix.rule for fix in fixes if fix.reboot and (fix.rule in touched or pending)))
    return Preparation(host=host, packages=tuple(packages), files=files, commands=commands, reboot_after=waiting,
                       reboot_pending=pending, unfixable=tuple(unfixable), problems=tuple(problems),
                       sources={fix.rule: fix.source for fix in fixes}, rule_files=rule_files)


def _package_changes(fixes: Sequence[Fix], survey: Mapping[str, Any]) -> tuple[list[PackageChange], list[str]]:
    """Each package the fixes name, pinned to its candidate unless installed at it already; and what stops
    the plan: apt-get update refused, a package no source has, a held package."""
    installed, candidates = survey.get("installed") or {}, survey.get("candidates") or {}
    held = set(survey.get("held") or ())
    rules_of: dict[str, list[str]] = {}
    for fix in fixes:
        for name in fix.packages:
            rules_of.setdefault(name, []).append(fix.rule)
    problems = []
    update = survey.get("update")
    if update and not update.get("ok"):
        problems.append(f"apt-get update failed: {update.get('said')}")
    packages = []
    for name, rules in rules_of.items():
        candidate = candidates.get(name)
        if candidate is None:
            problems.append(f"{name}: no package source of this host has it (for {', '.join(rules)}); add the "
                            "repository it comes from to the host, or set apt_proxy")
        elif name in held:
            problems.append(f"{name} is held (apt-mark hold): prepare leaves it as it is; "
                            f"`apt-mark unhold {name}` to let it change")
        elif installed.get(name) != candidate:
            packages.append(PackageChange(name, installed.get(name), candidate, tuple(rules)))
    return packages, problems


# ---------------------------------------------------------------------------------------------
# on the hosts


def apt_options(ctx: Context) -> list[str]:
    """The site's apt proxy (apt_proxy) as apt options, never in a file the tool leaves behind."""
    proxy = ctx.settings.apt_proxy
    return ["-o", f"Acquire::http::Proxy={proxy}", "-o", f"Acquire::https::Proxy={proxy}"] if proxy else []


def survey(runner: Runner, ctx: Context, fixes: Sequence[Fix], flags: PrepareFlags) -> dict[str, Any]:
    spec = {"packages": sorted({name for fix in fixes for name in fix.packages}),
            "files": sorted({path for fix in fixes for path in fix.files}), "update": True,
            "apt_options": apt_options(ctx), "lock_wait": flags.lock_wait}
    done = runner.run(["python3", "-"], stdin=programs.ship(("prepare",), "survey", spec),
                      timeout=flags.lock_wait + 900)
    if not done.ok:
        raise CommandFailed(ctx.host, "prepare survey", done)
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def apply(runner: Runner, ctx: Context, prepared: Preparation, flags: PrepareFlags) -> dict[str, Any]:
    spec = {"install": {change.name: change.candidate for change in prepared.packages},
            "write": dict(prepared.files), "commands": [list(argv) for argv in prepared.commands],
            "apt_options": apt_options(ctx), "lock_wait": flags.lock_wait, "lock": LOCK, "wait": 0}
    done = runner.run(["python3", "-"], stdin=programs.ship(("prepare",), "apply", spec),
                      timeout=flags.lock_wait + 3600)
    if not done.stdout.strip():
        raise CommandFailed(ctx.host, "prepare apply", done)
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def boot_id(runner: Runner) -> str:
    done = runner.run(["cat", BOOT_ID], timeout=15)
    return done.stdout.strip() if done.ok else ""


def reboot_and_wait(connect: Callable[[], Runner], runner: Runner, before: str,
                    timeout: float, progress: Callable[[str], None]) -> float:
    """Ask systemd to reboot; the host is back when its boot id differs and sshd answers. Seconds taken."""
    started = time.monotonic()
    try:
        runner.run(["systemctl", "reboot"], timeout=30)
    except UnreachableHost:
        pass  # the connection going away is the reboot starting
    runner.close()
    deadline = started + timeout
    while time.monotonic() < deadline:
        time.sleep(2)
        fresh = connect()
        try:
            now = boot_id(fresh)
            if now and now != before:
                return time.monotonic() - started
        except ProvisionError:
            pass  # still down: sshd not answering yet
        finally:
            fresh.close()
        progress(f"waiting for it to come back ({time.monotonic() - started:.0f}s)")
    raise UnreachableHost(runner.host, f"did not come back from its reboot within {timeout:g}s "
                                       "(boot id unchanged or sshd silent)")


@dataclass
class HostReport:
    """One host's preparation: before and after, what was done, and what stopped it."""

    host: str
    before: list[Finding]
    prepared: Preparation | None = None
    applied: dict[str, Any] | None = None
    rebooted_s: float | None = None
    after: list[Finding] | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and (self.prepared is None or not self.prepared.problems)

    @property
    def waiting_for_reboot(self) -> tuple[str, ...]:
        """Rules whose fix is installed and takes effect at the next boot (no reboot was made)."""
        if self.prepared is None or self.rebooted_s is not None:
            return ()
        return self.prepared.reboot_after

    @property
    def remaining(self) -> list[Finding]:
        """Blockers still failing after preparing, other than those a reboot will settle."""
        found = self.after if self.after is not None else self.before
        return [f for f in found if f.blocks and f.id not in self.waiting_for_reboot]

    def as_json(self) -> dict[str, Any]:
        def statuses(findings: list[Finding] | None) -> dict[str, str]:
            return {f.id: f.status for f in findings or [] if f.status != "skip"}

        return {"host": self.host, "verdict_before": checks.verdict(self.before),
                "verdict_after": checks.verdict(self.after) if self.after is not None else None,
                "before": statuses(self.before), "after": statuses(self.after) if self.after is not None else None,
                "plan": self.prepared.as_json() if self.prepared else None, "applied": self.applied,
                "rebooted_s": None if self.rebooted_s is None else round(self.rebooted_s, 1),
                "waiting_for_reboot": list(self.waiting_for_reboot),
                "remaining": [{"id": f.id, "message": f.message, "fix": f.fix} for f in self.remaining],
                "error": self.error}


@dataclass(frozen=True)
class Prepared:
    order: list[str]
    reports: dict[str, HostReport]
    errors: dict[str, BaseException]
    stopped: str | None  # why the roll stopped before every host had its turn
    dry_run: bool = False

    @property
    def ok(self) -> bool:
        """Every host prepared with nothing left blocking but what a reboot settles (a dry run: every
        host planned)."""
        return not self.errors and self.stopped is None and all(
            report.ok and (self.dry_run or not report.remaining) for report in self.reports.values())


def prepare(inv: Inventory, targets: list[Host], options: run.Options, flags: PrepareFlags,
            progress: Callable[[str], None] = lambda line: None) -> Prepared:
    """The whole task: gate every target, then one host (or `batch`) at a time plan, apply, reboot when
    asked, and gate again. A host that fails or does not come back stops the roll."""
    gated = run.gate(inv, targets, options)
    reports: dict[str, HostReport] = {}
    errors: dict[str, BaseException] = dict(gated.errors)
    stopped = None
    ready = [target for target in targets if target.name in gated.findings]
    def one(target: Host) -> HostReport:
        report = HostReport(target.name, gated.findings[target.name])
        try:
            _prepare_one(inv, target, gated.contexts[target.name], options, flags, report, progress)
        except ProvisionError as exc:
            report.error = str(exc)
        return report

    size = max(1, flags.batch)
    for start in range(0, len(ready), size):
        done = for_each_host(ready[start:start + size], lambda target: target.name, one)
        reports.update(done.values)
        errors.update(done.errors)
        failed = [report for report in done.values.values() if not report.ok]
        if failed or done.errors:
            stopped = "; ".join([f"{r.host}: {r.error or '; '.join(r.prepared.problems if r.prepared else [])}"
                                 for r in failed] + [f"{name}: {error}" for name, error in done.errors.items()])
            break
    return Prepared([t.name for t in targets], reports, errors, stopped, flags.dry_run)


def _prepare_one(inv: Inventory, target: Host, ctx: Context, options: run.Options, flags: PrepareFlags,
                 report: HostReport, progress: Callable[[str], None]) -> None:
    fixes, unfixable = fixes_for(ctx, report.before)
    runner = remote.connect(target, inv.ssh, accept_new_host_keys=options.accept_new_host_keys)
    try:
        progress(f"{target.name}: surveying packages ({len(fixes)} fixable finding(s))")
        surveyed = survey(runner, ctx, fixes, flags)  # a reboot may be pending with nothing failing
        report.prepared = prepared = plan(target.name, fixes, unfixable, surveyed)
        if flags.dry_run or prepared.problems:
            return
        if prepared.changes:
            progress(f"{target.name}: " + "; ".join(prepared.steps()))
            report.applied = apply(runner, ctx, prepared, flags)
            if not report.applied.get("ok"):
                report.error = f"apply failed: {report.applied.get('failed')}" + (
                    f"; undone: {', '.join(report.applied['undone'])}" if report.applied.get("undone") else "")
                return
        wants_reboot = prepared.needs_reboot or bool(report.applied and report.applied.get("reboot_required"))
        if flags.reboot and wants_reboot:
            progress(f"{target.name}: rebooting")
            report.rebooted_s = reboot_and_wait(
                lambda: remote.connect(target, inv.ssh, accept_new_host_keys=options.accept_new_host_keys),
                runner, surveyed.get("boot_id") or boot_id(runner), flags.timeout,
                lambda line: progress(f"{target.name}: {line}"))
    finally:
        runner.close()
    if prepared.changes or report.rebooted_s is not None:
        progress(f"{target.name}: checking again")
        again = run.gate(inv, [target], options)
        if target.name in again.errors:
            raise ProvisionError(f"the check after preparing failed: {again.errors[target.name]}")
        report.after = again.findings[target.name]
    else:
        report.after = report.before
