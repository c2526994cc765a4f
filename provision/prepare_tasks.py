"""`invoke prepare`: fix what the gate finds (driver, kernel, toolkit), reboot when asked, check again.
Parse the flags, call provision.prepare, print through provision.report."""
from __future__ import annotations

from invoke.context import Context

from provision.taskargs import (
    HOST_TASK_FLAGS,
    HostFlags,
    PrepareFlags,
    exit_unless,
    host_task,
)


@host_task("prepare", *HOST_TASK_FLAGS, asked=PrepareFlags,
           help={"reboot": "reboot a host whose changes need it, and wait for it (never without this flag)",
                 "dry-run": "show each host's preparation plan (packages and versions, files, reboot); change "
                            "nothing",
                 "batch": "hosts prepared (and rebooted) at a time (default 1: the rest keep serving)",
                 "timeout": "seconds a rebooting host has to come back (default 600)",
                 "lock-wait": "seconds apt waits for another package manager's lock (default 120)"})
def prepare(c: Context, flags: HostFlags, asked: PrepareFlags) -> None:
    """Fix what the gate finds, reboot if asked, check again.

    The open driver, the HWE kernel, the toolkit. The packages and versions, files and reboot are shown before anything changes (--dry-run: only
    shown); a prepared host plans nothing."""
    from provision import prepare as preparation
    from provision import report, run
    chosen = flags.select()
    result = preparation.prepare(chosen.inventory, chosen.targets, flags.options(chosen), asked,
                                 progress=run.progress_line)
    if flags.json:
        print(report.dump_json(report.prepared_json(result)))
    else:
        report.print_prepared(result, report.console())
    exit_unless(result.ok)
