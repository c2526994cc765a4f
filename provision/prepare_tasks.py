"""`invoke prepare`: fix what the gate finds (driver, kernel, toolkit), reboot when asked, check again.
Parse the flags, call provision.prepare, print through provision.report."""
from __future__ import annotations

from invoke.context import Context
from invoke.tasks import task

from provision.taskargs import HOST_TASK_HELP, exit_unless, guarded, options, select, setup_logging


@task(auto_shortflags=False, name="prepare",
      help={**HOST_TASK_HELP,
            "reboot": "reboot a host whose changes need it, and wait for it (never without this flag)",
            "dry-run": "show each host's preparation plan (packages and versions, files, reboot); change nothing",
            "batch": "hosts prepared (and rebooted) at a time (default 1: the rest keep serving)",
            "timeout": "seconds a rebooting host has to come back (default 600)",
            "lock-wait": "seconds apt waits for another package manager's lock (default 120)"},
      iterable=["host", "set_", "force"])
@guarded
def prepare(c: Context, host: list[str] | None = None, cluster: str | None = None, all_: bool = False,
            inventory_: str | None = None, json_: bool = False, accept_new_host_keys: bool = False,
            profile: str | None = None, set_: list[str] | None = None, force: list[str] | None = None,
            reboot: bool = False, dry_run: bool = False, batch: int = 1, timeout: float = 600,
            lock_wait: float = 120, verbose: bool = False) -> None:
    """Fix what the gate finds (open driver, HWE kernel, toolkit), reboot if asked, check again.

    The packages and versions, files and reboot are shown before anything changes (--dry-run: only
    shown); a prepared host plans nothing."""
    from provision import prepare as preparation
    from provision import report, run
    setup_logging(verbose)
    chosen = select(inventory_, host, cluster, all_, set_)
    flags = options(chosen, profile=profile, accept_new_host_keys=accept_new_host_keys, force=force, json_=json_)
    asked = preparation.Flags(reboot=reboot, dry_run=dry_run, batch=batch, timeout=timeout, lock_wait=lock_wait)
    result = preparation.prepare(chosen.inventory, chosen.targets, flags, asked,
                                 progress=run.progress_line)
    if json_:
        print(report.dump_json(report.prepared_json(result)))
    else:
        report.print_prepared(result, report.console())
    exit_unless(result.ok)
