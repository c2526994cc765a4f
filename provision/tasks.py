"""The Invoke tasks of the host pipeline: parse the flags, call provision.run, print through
provision.report. Nothing more (deploy, status, bench and logs: cluster_tasks; verify.nccl: verify_tasks).

Exit codes: 0 done; 1 something on a host (or the lab) failed; 2 bad usage or bad inventory.
"""
from __future__ import annotations

import sys

from invoke.collection import Collection
from invoke.context import Context
from invoke.exceptions import Exit

from provision.taskargs import (
    HOST_TASK_FLAGS,
    TARGETS,
    HostFlags,
    exit_unless,
    guarded,
    help_for,
    host_task,
    select,
    task,
)


@host_task("facts", *TARGETS)
def facts_(c: Context, flags: HostFlags) -> None:
    """Gather each host's facts in one round trip.

    Kernel, CPU topology, memory, driver, GPUs and units, each read by a parser of its own."""
    from provision import report, run
    chosen = flags.select()
    results = run.gather(chosen.inventory, chosen.targets, flags.options(chosen))
    if flags.json:
        print(report.dump_json(report.facts_json(results)))
    else:
        report.print_facts(results, report.console(), verbose=flags.verbose)
    exit_unless(results.ok)


@host_task("check", *HOST_TASK_FLAGS,
           help={"force": "override a blocker by its check id (repeatable); it stays in the report"})
def check(c: Context, flags: HostFlags) -> None:
    """Run the preflight gate on each host; exit 1 if one blocks.

    Every rule on every host, with its evidence and the fix."""
    from provision import checks, report, run
    chosen = flags.select()
    gated = run.gate(chosen.inventory, chosen.targets, flags.options(chosen))
    if flags.json:
        print(report.dump_json(report.check_json(gated.order, gated.findings, gated.errors)))
    else:
        report.print_check(gated.order, gated.findings, gated.errors, report.console())
    exit_unless(not gated.errors and not any(checks.verdict(found) == "blocked" for found in gated.findings.values()))


@host_task("plan", *HOST_TASK_FLAGS)
def plan_(c: Context, flags: HostFlags) -> None:
    """Show what provision would change, with a diff per file.

    Changes nothing on the hosts."""
    from provision import report, run
    chosen = flags.select()
    planned = run.plans(chosen.inventory, chosen.targets, flags.options(chosen))
    if flags.json:
        print(report.dump_json(report.plans_json(planned.order, planned.plans, planned.findings, planned.errors)))
    else:
        report.print_plans(planned, show_diff=True)
    exit_unless(not planned.errors and len(planned.plans) == len(planned.order))


@host_task("provision", *HOST_TASK_FLAGS, "wait",
           help={"wait": "seconds to wait for another run's lock on a host (default: fail at once)"})
def provision_(c: Context, flags: HostFlags) -> None:
    """Put the rendered units and environment on each host.

    facts -> gate -> plan -> apply: each host's units and environment brought to the rendered state."""
    from provision import report, run
    chosen = flags.select()
    result = run.provision(chosen.inventory, chosen.targets, flags.options(chosen, may_build=True),
                           show=report.plans_shower(flags.json))
    report.print_applied(result, flags.json)
    exit_unless(result.ok)


@host_task("weights", *HOST_TASK_FLAGS, "wait",
           help={"verify": "hash every file of the model again, not only those whose size or time changed",
                 "wait": "seconds to wait for another run's lock"})
def weights_(c: Context, flags: HostFlags, verify: bool = False) -> None:
    """Fetch and verify each host's model weights only.

    A cluster fetches from the hub once."""
    from provision import report, run
    chosen = flags.select()
    result = run.provision(chosen.inventory, chosen.targets, flags.options(chosen, only="weights", verify=verify),
                           show=report.plans_shower(flags.json, "weights"))
    report.print_applied(result, flags.json)
    exit_unless(result.ok)


@host_task("venv", *HOST_TASK_FLAGS, "wait", help={"wait": "seconds to wait for another run's lock"})
def venv_(c: Context, flags: HostFlags) -> None:
    """Build, push and install each host's venv only.

    A source build is made once per architecture."""
    from provision import report, run
    chosen = flags.select()
    result = run.provision(chosen.inventory, chosen.targets, flags.options(chosen, only="venv", may_build=True),
                           show=report.plans_shower(flags.json, "venv"))
    report.print_applied(result, flags.json)
    exit_unless(result.ok)


@host_task("rollback", "inventory", "host", "cluster", "all", "json", "accept-new-host-keys", "set", "wait",
           help={"list": "show each host's generations (when, by what, what changed, passed or not) and change "
                         "nothing",
                 "to": "the generation to restore (default: the latest that ran before the current one and "
                       "was not rejected or abandoned)",
                 "timeout": "seconds each host's restored server has to answer /health and a completion "
                            "(default 600)"})
def rollback_(c: Context, flags: HostFlags, list_: bool = False, to: int = 0, timeout: float = 600) -> None:
    """Restore an earlier generation on each host, or list them.

    A whole generation (files, units, venv, model revision), one host after the other, each once its
    restored server answers."""
    _rollback(flags, listing=list_, to=to, timeout=timeout)


@host_task("generations", "inventory", "host", "cluster", "all", "json", "accept-new-host-keys", "set")
def generations_(c: Context, flags: HostFlags) -> None:
    """List each host's generations; change nothing.

    When each was made, by what, what changed and whether it passed: what `rollback --list` shows."""
    _rollback(flags, listing=True)


def _rollback(flags: HostFlags, *, listing: bool, to: int = 0, timeout: float = 600) -> None:
    """rollback, and generations (its --list)."""
    from provision import report, rolling
    chosen = flags.select()
    results = rolling.rollback(chosen.inventory, chosen.targets, flags.options(chosen), to=to or None,
                               listing=listing, timeout=timeout)
    report.print_rollback(results, listing, flags.json)
    exit_unless(results.ok)


@task(auto_shortflags=False, name="inventory", help=help_for("inventory", "json", "set"), iterable=["set_"])
@guarded
def show_inventory(c: Context, inventory_: str | None = None, json_: bool = False,
                   set_: list[str] | None = None) -> None:
    """Validate the inventory and show what it declares.

    Hosts, clusters and each host's resolved settings."""
    from provision import report
    chosen = select(inventory_, set_=set_, targets=False)
    if json_:
        print(report.dump_json(report.inventory_json(chosen.inventory, chosen.overrides)))
    else:
        report.print_inventory(chosen.inventory, report.console())


@task(auto_shortflags=False, name="up", help={"hosts": "comma-separated lab host names (default: all of them)"})
@guarded
def lab_up(c: Context, hosts: str | None = None) -> None:
    """Boot the lab: real hosts replaying recorded GPU machines.

    Each host is a systemd-nspawn container running sshd."""
    from provision import config, lab, report
    names = [name.strip() for name in hosts.split(",") if name.strip()] if hosts else None
    the_lab = lab.Lab()
    the_lab.up(names, progress=lambda line: print(line, file=sys.stderr))
    report.print_rows(the_lab.status(), f"lab hosts (inventory: {the_lab.inventory})", report.console())
    where = config.lab_owner()
    given = f"give --inventory {the_lab.inventory} or PROVISION_LAB=1"
    print(f"lab inventory: the default in {where}; elsewhere {given}" if where else
          f"lab inventory: {given} (brought up by an installed tool: no checkout defaults to it)")


@task(auto_shortflags=False, name="status", help=help_for("json"))
@guarded
def lab_status(c: Context, json_: bool = False) -> None:
    """Show the lab's hosts; exit 1 if one's sshd does not answer.

    Address, profile, recording replayed, process and sshd state."""
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
    """Stop the lab and remove everything it made.

    Processes, namespaces, links and files."""
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
    """Limit the lab's links like real networks, or lift limits.

    tc token buckets; with no rate, the limits are lifted."""
    from provision import lab
    changed = lab.Lab().shape(host_rate, hub_rate)
    print(f"lab links: hosts {host_rate or 'unlimited'}, hub and controller {hub_rate or 'unlimited'} "
          f"({len(changed)} links)")


lab_tasks = Collection("lab", lab_up, lab_status, lab_down, lab_shape)
