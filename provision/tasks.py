"""The Invoke tasks of the host pipeline: parse the flags, call provision.run, print through
provision.report. Nothing more (deploy, status, bench and logs: cluster_tasks; verify.nccl: verify_tasks).

Exit codes: 0 done; 1 something on a host (or the lab) failed; 2 bad usage or bad inventory.
"""
from __future__ import annotations

import sys

from invoke.collection import Collection
from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import task

from provision.taskargs import (
    HOST_TASK_HELP,
    exit_unless,
    guarded,
    help_for,
    options,
    select,
    setup_logging,
)

TARGETS = ("inventory", "host", "cluster", "all", "json", "accept-new-host-keys", "profile", "set", "verbose")


@task(auto_shortflags=False, name="facts", help=help_for(*TARGETS), iterable=["host", "set_"])
@guarded
def facts_(c: Context, host: list[str] | None = None, cluster: str | None = None, all_: bool = False,
           inventory_: str | None = None, json_: bool = False, accept_new_host_keys: bool = False,
           profile: str | None = None, set_: list[str] | None = None, verbose: bool = False) -> None:
    """Gather each host's facts in one round trip: kernel, CPU topology, memory, driver, GPUs, units."""
    from provision import report, run
    setup_logging(verbose)
    chosen = select(inventory_, host, cluster, all_, set_)
    results = run.gather(chosen.inventory, chosen.targets,
                         options(chosen, profile=profile, accept_new_host_keys=accept_new_host_keys))
    if json_:
        print(report.dump_json(report.facts_json(results)))
    else:
        report.print_facts(results, report.console(), verbose=verbose)
    exit_unless(results.ok)


@task(auto_shortflags=False, name="check",
      help=help_for(*TARGETS, force="override a blocker by its check id (repeatable); it stays in the report"),
      iterable=["host", "set_", "force"])
@guarded
def check(c: Context, host: list[str] | None = None, cluster: str | None = None, all_: bool = False,
          inventory_: str | None = None, json_: bool = False, accept_new_host_keys: bool = False,
          profile: str | None = None, set_: list[str] | None = None, force: list[str] | None = None,
          verbose: bool = False) -> None:
    """The preflight gate: every rule on every host, with evidence and the fix; exit 1 if one blocks."""
    from provision import checks, report, run
    setup_logging(verbose)
    chosen = select(inventory_, host, cluster, all_, set_)
    gated = run.gate(chosen.inventory, chosen.targets,
                     options(chosen, profile=profile, accept_new_host_keys=accept_new_host_keys, force=force))
    if json_:
        print(report.dump_json(report.check_json(gated.order, gated.findings, gated.errors)))
    else:
        report.print_check(gated.order, gated.findings, gated.errors, report.console())
    exit_unless(not gated.errors and not any(checks.verdict(found) == "blocked" for found in gated.findings.values()))


@task(auto_shortflags=False, name="plan", help=HOST_TASK_HELP, iterable=["host", "set_", "force"])
@guarded
def plan_(c: Context, host: list[str] | None = None, cluster: str | None = None, all_: bool = False,
          inventory_: str | None = None, json_: bool = False, accept_new_host_keys: bool = False,
          profile: str | None = None, set_: list[str] | None = None, force: list[str] | None = None,
          verbose: bool = False) -> None:
    """Show what provision would change on each host, with a diff per file; changes nothing."""
    from provision import report, run
    setup_logging(verbose)
    chosen = select(inventory_, host, cluster, all_, set_)
    planned = run.plans(chosen.inventory, chosen.targets,
                        options(chosen, profile=profile, accept_new_host_keys=accept_new_host_keys, force=force))
    if json_:
        print(report.dump_json(report.plans_json(planned.order, planned.plans, planned.findings, planned.errors)))
    else:
        report.print_plans(planned, show_diff=True)
    exit_unless(not planned.errors and len(planned.plans) == len(planned.order))


@task(auto_shortflags=False, name="provision",
      help={**HOST_TASK_HELP, "wait": "seconds to wait for another run's lock on a host (default: fail at once)"},
      iterable=["host", "set_", "force"])
@guarded
def provision_(c: Context, host: list[str] | None = None, cluster: str | None = None, all_: bool = False,
               inventory_: str | None = None, json_: bool = False, accept_new_host_keys: bool = False,
               profile: str | None = None, set_: list[str] | None = None, force: list[str] | None = None,
               wait: float = 0, verbose: bool = False) -> None:
    """facts -> gate -> plan -> apply: bring each host's units and environment to the rendered state."""
    from provision import report, run
    setup_logging(verbose)
    chosen = select(inventory_, host, cluster, all_, set_)
    flags = options(chosen, profile=profile, accept_new_host_keys=accept_new_host_keys, force=force, wait=wait,
                    json_=json_, may_build=True)
    result = run.provision(chosen.inventory, chosen.targets, flags, show=report.plans_shower(json_))
    report.print_applied(result, json_)
    exit_unless(result.ok)


@task(auto_shortflags=False, name="weights",
      help={**HOST_TASK_HELP, "verify": "hash every file of the model again, not only those whose size or "
                                         "time changed", "wait": "seconds to wait for another run's lock"},
      iterable=["host", "set_", "force"])
@guarded
def weights_(c: Context, host: list[str] | None = None, cluster: str | None = None, all_: bool = False,
             inventory_: str | None = None, json_: bool = False, accept_new_host_keys: bool = False,
             profile: str | None = None, set_: list[str] | None = None, force: list[str] | None = None,
             verify: bool = False, wait: float = 0, verbose: bool = False) -> None:
    """Fetch and verify each host's model weights only (a cluster fetches from the hub once)."""
    from provision import report, run
    setup_logging(verbose)
    chosen = select(inventory_, host, cluster, all_, set_)
    flags = options(chosen, profile=profile, accept_new_host_keys=accept_new_host_keys, force=force, wait=wait,
                    json_=json_, only="weights", verify=verify)
    result = run.provision(chosen.inventory, chosen.targets, flags, show=report.plans_shower(json_, "weights"))
    report.print_applied(result, json_)
    exit_unless(result.ok)


@task(auto_shortflags=False, name="venv", help={**HOST_TASK_HELP, "wait": "seconds to wait for another run's lock"},
      iterable=["host", "set_", "force"])
@guarded
def venv_(c: Context, host: list[str] | None = None, cluster: str | None = None, all_: bool = False,
          inventory_: str | None = None, json_: bool = False, accept_new_host_keys: bool = False,
          profile: str | None = None, set_: list[str] | None = None, force: list[str] | None = None,
          wait: float = 0, verbose: bool = False) -> None:
    """Build (a source: once per architecture), push and install each host's venv only."""
    from provision import report, run
    setup_logging(verbose)
    chosen = select(inventory_, host, cluster, all_, set_)
    flags = options(chosen, profile=profile, accept_new_host_keys=accept_new_host_keys, force=force, wait=wait,
                    json_=json_, only="venv", may_build=True)
    result = run.provision(chosen.inventory, chosen.targets, flags, show=report.plans_shower(json_, "venv"))
    report.print_applied(result, json_)
    exit_unless(result.ok)


@task(auto_shortflags=False, name="rollback",
      help=help_for("inventory", "host", "cluster", "all", "json", "accept-new-host-keys", "set",
                    wait="seconds to wait for another run's lock on a host",
                    list="show each host's generations (when, by what, what changed, passed or not) and change "
                         "nothing",
                    to="the generation to restore (default: the latest that ran before the current one and "
                       "was not rejected or abandoned)",
                    timeout="seconds each host's restored server has to answer /health and a completion "
                            "(default 600)"),
      iterable=["host", "set_"])
@guarded
def rollback_(c: Context, host: list[str] | None = None, cluster: str | None = None, all_: bool = False,
              inventory_: str | None = None, json_: bool = False, accept_new_host_keys: bool = False,
              set_: list[str] | None = None, wait: float = 0, list_: bool = False, to: int = 0,
              timeout: float = 600) -> None:
    """Restore a whole earlier generation (files, units, venv, model revision) on each host, one host
    after the other, each once its restored server answers; or list them."""
    from provision import report, rolling
    chosen = select(inventory_, host, cluster, all_, set_)
    results = rolling.rollback(chosen.inventory, chosen.targets,
                               options(chosen, accept_new_host_keys=accept_new_host_keys, wait=wait),
                               to=to or None, listing=list_, timeout=timeout)
    report.print_rollback(results, list_, json_)
    exit_unless(results.ok)


@task(auto_shortflags=False, name="inventory", help=help_for("inventory", "json", "set"), iterable=["set_"])
@guarded
def show_inventory(c: Context, inventory_: str | None = None, json_: bool = False,
                   set_: list[str] | None = None) -> None:
    """Validate the inventory and show hosts, clusters and each host's resolved settings."""
    from provision import report
    chosen = select(inventory_, set_=set_, targets=False)
    if json_:
        print(report.dump_json(report.inventory_json(chosen.inventory, chosen.overrides)))
    else:
        report.print_inventory(chosen.inventory, report.console())


@task(auto_shortflags=False, name="up", help={"hosts": "comma-separated lab host names (default: all of them)"})
@guarded
def lab_up(c: Context, hosts: str | None = None) -> None:
    """Boot the lab: real hosts (systemd-nspawn, sshd) replaying recorded GPU machines."""
    from provision import lab, report
    names = [name.strip() for name in hosts.split(",") if name.strip()] if hosts else None
    the_lab = lab.Lab()
    the_lab.up(names, progress=lambda line: print(line, file=sys.stderr))
    report.print_rows(the_lab.status(), f"lab hosts (inventory: {the_lab.inventory})", report.console())


@task(auto_shortflags=False, name="status", help=help_for("json"))
@guarded
def lab_status(c: Context, json_: bool = False) -> None:
    """Show the lab's hosts: address, profile, recording replayed, process and sshd state."""
    from provision import lab, report
    rows = lab.Lab().status()
    if json_:
        print(report.dump_json(rows))
    else:
        report.print_rows(rows, "lab hosts", report.console())
    if any(row["sshd"] != "answers" for row in rows):
        raise Exit(code=1)


@task(auto_shortflags=False, name="down",
      help={"keep-cache": "keep the cached base root filesystem for a faster next lab.up"})
@guarded
def lab_down(c: Context, keep_cache: bool = False) -> None:
    """Stop the lab and remove everything it made (processes, namespaces, links, files)."""
    from provision import lab
    removed = lab.Lab().down(keep_cache=keep_cache)
    print(f"lab down: stopped {', '.join(removed) or 'no hosts'}")
    for line in lab.left_in_place():
        print(line)


@task(auto_shortflags=False, name="shape",
      help={"host-rate": "each lab host's link, both ways, in tc's units (400mbit = 50 MB/s); leave out to lift",
            "hub-rate": "this machine's side of the lab bridge: the hub's and the controller's uplink"})
@guarded
def lab_shape(c: Context, host_rate: str | None = None, hub_rate: str | None = None) -> None:
    """Limit the lab's links like real networks (tc token buckets); with no rate, lift the limits."""
    from provision import lab
    changed = lab.Lab().shape(host_rate, hub_rate)
    print(f"lab links: hosts {host_rate or 'unlimited'}, hub and controller {hub_rate or 'unlimited'} "
          f"({len(changed)} links)")


lab_tasks = Collection("lab", lab_up, lab_status, lab_down, lab_shape)
