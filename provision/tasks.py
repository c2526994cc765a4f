"""The Invoke tasks: parse arguments, call the library, print the report. Nothing more.

Exit codes: 0 done; 1 something on a host (or the lab) failed; 2 bad usage or bad inventory.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
import logging
import sys
from pathlib import Path
from typing import Any, Callable, TypeVar

from invoke import Collection, Context, task
from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                           TransferSpeedColumn)
from invoke.exceptions import Exit

from provision import checks, config, facts, inventory, lab, ops, plan, remote, render, report, venv
from provision.errors import InventoryError, LabError, ProvisionError
from provision.fanout import HostResults, for_each_host
from provision.profiles import load_profiles

F = TypeVar("F", bound=Callable[..., Any])

COMMON_HELP = {
    "inventory": "inventory file or directory (default: the lab's while it is up, else ./inventory)",
    "host": "a host name from the inventory, or 'local' for this machine (repeatable)",
    "cluster": "a cluster name from the inventory",
    "all": "every host of the inventory",
    "json": "print JSON for scripts instead of tables",
    "accept-new-host-keys": "trust and record the key of a host seen for the first time "
                            "(a changed key is always refused)",
    "profile": "hardware profile to assume (overrides the inventory's; useful with --host local)",
    "set": "override a service setting, KEY=VALUE (repeatable; highest precedence)",
    "verbose": "log every remote command (secrets masked) to stderr",
}


def _help(*names: str, **extra: str) -> dict[str, str]:
    return {**{name: COMMON_HELP[name] for name in names}, **extra}


def guarded(function: F) -> F:
    """Map the error tree to exit codes and one clear line on stderr, never a traceback."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except InventoryError as exc:
            raise Exit(f"error: {exc}", code=2) from None
        except LabError as exc:
            raise Exit(f"lab: {exc}", code=1) from None

    return wrapper  # type: ignore[return-value]


def _setup_logging(verbose: bool) -> None:
    logger = logging.getLogger("provision")
    logger.setLevel(logging.DEBUG)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(logging.DEBUG if verbose else logging.WARNING)
    handlers: list[logging.Handler] = [console]
    path = config.log_file()
    if path:
        handlers.append(logging.FileHandler(path))
    for handler in handlers:
        handler.addFilter(remote.MaskingFilter())
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)


def _load(path: str | None) -> inventory.Inventory:
    return inventory.load(Path(path) if path else config.default_inventory())


def _profile(name: str | None) -> Any:
    if name is None:
        return None
    profiles = load_profiles()
    if name not in profiles:
        raise InventoryError(f"unknown profile '{name}' (known: {', '.join(sorted(profiles))})",
                             file="command line", key="--profile")
    return profiles[name]


def _gather(inv: inventory.Inventory, targets: list[inventory.Host], overrides: dict[str, Any],
            assumed: Any, accept_new_host_keys: bool) -> HostResults[facts.HostFacts]:
    """Every target's facts in parallel, one round trip each; a failing host never stops the others."""

    def gather(target: inventory.Host) -> facts.HostFacts:
        settings = inv.settings(target.name, overrides, profile=assumed)
        paths = [settings["venv_dir"], settings["model_dir"], settings["hf_home"]]
        inspect = plan.inspect_spec([render.CONFIG_DIR, render.STATE_DIR, *paths[1:],
                                     *venv.inspect_paths(settings)], settings["service_user"])
        runner = remote.connect(target, inv.ssh, accept_new_host_keys=accept_new_host_keys)
        try:
            return facts.gather(runner, paths=paths, inspect=inspect,
                                facts=(*facts.FACTS, facts.venv_fact(settings["venv_dir"])))
        finally:
            runner.close()

    return for_each_host(targets, lambda target: target.name, gather)


@task(auto_shortflags=False, name="facts", help=_help("inventory", "host", "cluster", "all", "json",
                                                      "accept-new-host-keys", "profile", "verbose", "set"),
      iterable=["host", "set_"])
@guarded
def facts_(c: Context, host: list[str] | None = None, cluster: str | None = None, all_: bool = False,
           inventory_: str | None = None, json_: bool = False, accept_new_host_keys: bool = False,
           profile: str | None = None, set_: list[str] | None = None, verbose: bool = False) -> None:
    """Gather each host's facts in one round trip: kernel, CPU topology, memory, driver, GPUs, units."""
    _setup_logging(verbose)
    inv = _load(inventory_)
    overrides = inventory.parse_overrides(set_ or [])
    targets = inv.select(hosts=host or [], cluster=cluster, everything=all_)
    results = _gather(inv, targets, overrides, _profile(profile), accept_new_host_keys)
    if json_:
        print(report.dump_json(report.facts_json(results)))
    else:
        report.print_facts(results, report.console())
    if not results.ok:
        raise Exit(code=1)


def run_gate(inv: inventory.Inventory, targets: list[inventory.Host], overrides: dict[str, Any],
             assumed: Any, accept_new_host_keys: bool, force: list[str]
             ) -> tuple[dict[str, list[checks.Finding]], dict[str, BaseException]]:
    findings, errors, _ = gate_with_contexts(inv, targets, overrides, assumed, accept_new_host_keys, force)
    return findings, errors


def gate_with_contexts(inv: inventory.Inventory, targets: list[inventory.Host], overrides: dict[str, Any],
                       assumed: Any, accept_new_host_keys: bool, force: list[str]
                       ) -> tuple[dict[str, list[checks.Finding]], dict[str, BaseException],
                                  dict[str, checks.Context]]:
    """Facts of the targets and of their clusters' other nodes, then every rule on each target."""
    unknown = sorted(set(force) - set(checks.RULE_IDS))
    if unknown:
        raise InventoryError(f"--force names unknown checks: {', '.join(unknown)} "
                             f"(known: {', '.join(checks.RULE_IDS)})", file="command line", key="--force")
    wanted = {target.name for target in targets}
    everyone = list(targets)
    for target in targets:
        cluster = inv.cluster_of(target.name)
        everyone.extend(inv.host(name) for name in (cluster.hosts if cluster else ())
                        if name not in {h.name for h in everyone})
    gathered = _gather(inv, everyone, overrides, assumed, accept_new_host_keys)
    contexts = checks.contexts(inv, gathered.values, overrides, profile=assumed)
    findings = {name: checks.evaluate(contexts[name], force) for name in wanted if name in contexts}
    errors = {name: error for name, error in gathered.errors.items() if name in wanted}
    return findings, errors, contexts


@task(auto_shortflags=False, name="check",
      help=_help("inventory", "host", "cluster", "all", "json", "accept-new-host-keys", "profile", "set",
                 "verbose", force="override a blocker by its check id (repeatable); it stays in the report"),
      iterable=["host", "set_", "force"])
@guarded
def check(c: Context, host: list[str] | None = None, cluster: str | None = None, all_: bool = False,
          inventory_: str | None = None, json_: bool = False, accept_new_host_keys: bool = False,
          profile: str | None = None, set_: list[str] | None = None, force: list[str] | None = None,
          verbose: bool = False) -> None:
    """The preflight gate: every rule on every host, with evidence and the fix; exit 1 if one blocks."""
    _setup_logging(verbose)
    inv = _load(inventory_)
    overrides = inventory.parse_overrides(set_ or [])
    targets = inv.select(hosts=host or [], cluster=cluster, everything=all_)
    findings, errors = run_gate(inv, targets, overrides, _profile(profile), accept_new_host_keys,
                                force or [])
    order = [target.name for target in targets]
    if json_:
        print(report.dump_json(report.check_json(order, findings, errors)))
    else:
        report.print_check(order, findings, errors, report.console())
    if errors or any(checks.verdict(found) == "blocked" for found in findings.values()):
        raise Exit(code=1)


@dataclass
class HostPlan:
    changes: list[plan.Change]
    wheelhouse: venv.Wheelhouse | None = None
    to_push: list[venv.Wheel] = field(default_factory=list)


def _plans(inv: inventory.Inventory, targets: list[inventory.Host], overrides: dict[str, Any],
           assumed: Any, accept_new_host_keys: bool, force: list[str]
           ) -> tuple[dict[str, HostPlan], dict[str, list[checks.Finding]], dict[str, BaseException]]:
    """facts -> gate -> plan for every target; a blocked or failing host gets no plan."""
    findings, errors, contexts = gate_with_contexts(inv, targets, overrides, assumed, accept_new_host_keys,
                                                    force)
    plans: dict[str, HostPlan] = {}
    for name, found in findings.items():
        if checks.verdict(found) == "blocked":
            continue
        ctx = contexts[name]
        try:
            desired = render.desired_state(ctx, checks.resolutions(found))
            wheelhouse, venv_data = None, None
            if venv.requirements_of(ctx.settings) or ctx.settings["venv_wheels"]:
                wheelhouse = venv.resolve(venv.requirements_of(ctx.settings), ctx.settings["venv_wheels"],
                                          ctx.facts.arch or "", ctx.facts.python or "",
                                          progress=lambda line: print(line, file=sys.stderr))
                venv_data = venv.venv_change_data(ctx.settings, ctx.profile.venv_remove, wheelhouse)
        except (render.RenderError, ProvisionError, ValueError) as exc:
            errors[name] = exc if isinstance(exc, ProvisionError) else ProvisionError(f"{name}: {exc}")
            continue
        changes = plan.build(desired, ctx.facts, venv_data)
        push = venv.missing_wheels(wheelhouse, ctx.facts) if wheelhouse and any(
            c.kind == "venv" for c in changes) else []
        plans[name] = HostPlan(changes, wheelhouse, push)
    return plans, findings, errors


def _report_plans(order: list[str], plans: dict[str, HostPlan],
                  findings: dict[str, list[checks.Finding]], errors: dict[str, BaseException],
                  show_diff: bool) -> None:
    out = report.console()
    for name in order:
        if name in errors:
            out.print(f"[bold]{name}[/bold]: [red]{report.error_text(errors[name])}[/red]")
        elif name not in plans:
            blockers = [f for f in findings[name] if f.blocks]
            out.print(f"[bold]{name}[/bold]: [red]blocked by the gate, nothing changed[/red]")
            for finding in blockers:
                out.print(f"  {finding.id}: {finding.message} -> fix: {finding.fix}")
        else:
            out.print(f"[bold]{name}[/bold]: {plan.summary(plans[name].changes)}")
            if plans[name].to_push:
                size = sum(w.size for w in plans[name].to_push) / 2**20
                out.print(f"  push {len(plans[name].to_push)} wheel(s), {size:.0f} MiB")
            for change in plans[name].changes:
                out.print(f"  {change.describe()}")
                if show_diff and change.diff:
                    out.file.flush()
                    sys.stdout.write(change.diff)  # verbatim: a diff must not be re-wrapped


def _plans_json(order: list[str], plans: dict[str, HostPlan],
                findings: dict[str, list[checks.Finding]], errors: dict[str, BaseException],
                applied: dict[str, Any] | None = None) -> dict[str, Any]:
    hosts: dict[str, Any] = {}
    for name in order:
        body: dict[str, Any] = {"verdict": checks.verdict(findings[name]) if name in findings else None}
        if name in plans:
            body["changes"] = [{"kind": c.kind, "target": c.target, "reason": c.reason}
                               for c in plans[name].changes]
            body["push_bytes"] = sum(w.size for w in plans[name].to_push)
        if applied is not None and name in applied:
            body["applied"] = applied[name]
        if name in errors:
            body["error"] = report.error_text(errors[name])
        hosts[name] = body
    return {"hosts": hosts}


HOST_TASK_HELP = _help("inventory", "host", "cluster", "all", "json", "accept-new-host-keys", "profile",
                       "set", "verbose", force="override a blocker by its check id (repeatable)")


@task(auto_shortflags=False, name="plan", help=HOST_TASK_HELP, iterable=["host", "set_", "force"])
@guarded
def plan_(c: Context, host: list[str] | None = None, cluster: str | None = None, all_: bool = False,
          inventory_: str | None = None, json_: bool = False, accept_new_host_keys: bool = False,
          profile: str | None = None, set_: list[str] | None = None, force: list[str] | None = None,
          verbose: bool = False) -> None:
    """Show what provision would change on each host, with a diff per file; changes nothing."""
    _setup_logging(verbose)
    inv = _load(inventory_)
    overrides = inventory.parse_overrides(set_ or [])
    targets = inv.select(hosts=host or [], cluster=cluster, everything=all_)
    plans, findings, errors = _plans(inv, targets, overrides, _profile(profile), accept_new_host_keys,
                                     force or [])
    order = [target.name for target in targets]
    if json_:
        print(report.dump_json(_plans_json(order, plans, findings, errors)))
    else:
        _report_plans(order, plans, findings, errors, show_diff=True)
    if errors or len(plans) < len(order):
        raise Exit(code=1)


@task(auto_shortflags=False, name="provision",
      help={**HOST_TASK_HELP, "wait": "seconds to wait for another run's lock on a host (default: fail at once)"},
      iterable=["host", "set_", "force"])
@guarded
def provision_(c: Context, host: list[str] | None = None, cluster: str | None = None, all_: bool = False,
               inventory_: str | None = None, json_: bool = False, accept_new_host_keys: bool = False,
               profile: str | None = None, set_: list[str] | None = None, force: list[str] | None = None,
               wait: float = 0, verbose: bool = False) -> None:
    """facts -> gate -> plan -> apply: bring each host's units and environment to the rendered state."""
    _setup_logging(verbose)
    inv = _load(inventory_)
    overrides = inventory.parse_overrides(set_ or [])
    targets = inv.select(hosts=host or [], cluster=cluster, everything=all_)
    plans, findings, errors = _plans(inv, targets, overrides, _profile(profile), accept_new_host_keys,
                                     force or [])
    order = [target.name for target in targets]
    if not json_:
        _report_plans(order, plans, findings, errors, show_diff=False)
    to_apply = [inv.host(name) for name in order if name in plans and plans[name].changes]
    progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                        TimeRemainingColumn(), console=Console(stderr=True), disable=json_)

    def carry_out(target: inventory.Host) -> int:
        host_plan = plans[target.name]
        runner = remote.connect(target, inv.ssh, accept_new_host_keys=accept_new_host_keys)
        try:
            if host_plan.to_push and host_plan.wheelhouse:
                total = sum(w.size for w in host_plan.to_push)
                bar = progress.add_task(f"{target.name}: push wheels", total=total)
                venv.push(runner, host_plan.wheelhouse, host_plan.to_push,
                          lambda sent: progress.update(bar, completed=sent))
            step = progress.add_task(f"{target.name}: apply {len(host_plan.changes)} change(s)", total=None)
            done = len(ops.apply(runner, host_plan.changes, wait=wait).done)
            progress.update(step, total=1, completed=1)
            return done
        finally:
            runner.close()

    with progress:
        results = for_each_host(to_apply, lambda target: target.name, carry_out)
    errors.update(results.errors)
    applied = {name: count for name, count in results.values.items()}
    if json_:
        print(report.dump_json(_plans_json(order, plans, findings, errors, applied)))
    else:
        for name in order:
            if name in applied:
                print(f"{name}: applied {applied[name]} change(s)")
            elif name in results.errors:
                print(f"{name}: {report.error_text(results.errors[name])}", file=sys.stderr)
    if errors or len(plans) < len(order):
        raise Exit(code=1)


@task(auto_shortflags=False, name="rollback",
      help=_help("inventory", "host", "cluster", "all", "json", "accept-new-host-keys",
                 wait="seconds to wait for another run's lock on a host"),
      iterable=["host"])
@guarded
def rollback_(c: Context, host: list[str] | None = None, cluster: str | None = None, all_: bool = False,
              inventory_: str | None = None, json_: bool = False, accept_new_host_keys: bool = False,
              wait: float = 0) -> None:
    """Restore each host's last-known-good files, reload systemd and restart what runs."""
    inv = _load(inventory_)
    targets = inv.select(hosts=host or [], cluster=cluster, everything=all_)

    def restore(target: inventory.Host) -> list[str]:
        runner = remote.connect(target, inv.ssh, accept_new_host_keys=accept_new_host_keys)
        try:
            return list(ops.rollback(runner, wait=wait).restored)
        finally:
            runner.close()

    results = for_each_host(targets, lambda target: target.name, restore)
    if json_:
        print(report.dump_json({"hosts": {name: {"restored": results.values.get(name),
                                                 "error": report.error_text(results.errors[name])
                                                 if name in results.errors else None}
                                          for name in results.order}}))
    else:
        for name in results.order:
            if name in results.errors:
                print(f"{name}: {report.error_text(results.errors[name])}", file=sys.stderr)
            else:
                print(f"{name}: restored {', '.join(results.values[name]) or 'nothing (no earlier version kept)'}")
    if not results.ok:
        raise Exit(code=1)


@task(auto_shortflags=False, name="inventory", help=_help("inventory", "json", "set"), iterable=["set_"])
@guarded
def show_inventory(c: Context, inventory_: str | None = None, json_: bool = False,
                   set_: list[str] | None = None) -> None:
    """Validate the inventory and show hosts, clusters and each host's resolved settings."""
    inv = _load(inventory_)
    overrides = inventory.parse_overrides(set_ or [])
    if json_:
        print(report.dump_json(report.inventory_json(inv, overrides)))
    else:
        report.print_inventory(inv, report.console())


@task(auto_shortflags=False, name="up", help={"hosts": "comma-separated lab host names (default: all of them)"})
@guarded
def lab_up(c: Context, hosts: str | None = None) -> None:
    """Boot the lab: real hosts (systemd-nspawn, sshd) replaying recorded GPU machines."""
    names = [name.strip() for name in hosts.split(",") if name.strip()] if hosts else None
    the_lab = lab.Lab()
    the_lab.up(names, progress=lambda line: print(line, file=sys.stderr))
    report.print_rows(the_lab.status(), f"lab hosts (inventory: {the_lab.inventory})", report.console())


@task(auto_shortflags=False, name="status", help=_help("json"))
@guarded
def lab_status(c: Context, json_: bool = False) -> None:
    """Show the lab's hosts: address, profile, recording replayed, process and sshd state."""
    rows = lab.Lab().status()
    if json_:
        print(report.dump_json(rows))
    else:
        report.print_rows(rows, "lab hosts", report.console())
    if any(row["sshd"] != "answers" for row in rows):
        raise Exit(code=1)


@task(auto_shortflags=False, name="down", help={"keep-cache": "keep the cached base root filesystem for a faster next lab.up"})
@guarded
def lab_down(c: Context, keep_cache: bool = False) -> None:
    """Stop the lab and remove everything it made (processes, namespaces, links, files)."""
    removed = lab.Lab().down(keep_cache=keep_cache)
    print(f"lab down: stopped {', '.join(removed) or 'no hosts'}")


lab_tasks = Collection("lab", lab_up, lab_status, lab_down)
ns = Collection(facts_, check, plan_, provision_, rollback_, show_inventory, lab_tasks)
