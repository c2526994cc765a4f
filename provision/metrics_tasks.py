"""`invoke metrics`: what Prometheus scrapes of the inventory (provision/metrics.py), and with --apply the
Prometheus host's files written and read (provision/prometheus.py). Parse the flags, call the library,
print.

Exit codes as everywhere: 0 done; 1 the Prometheus host failed or could not be reached; 2 bad usage or an
inventory without `prometheus:` (nothing contacted).
"""
from __future__ import annotations

import time

from invoke.context import Context

from provision.taskargs import HostFlags, exit_unless, host_task


@host_task("metrics", "inventory", "json", "accept-new-host-keys", "set", "verbose",
           help={"apply": "write the targets (and, where the tool runs Prometheus, its configuration) on the "
                          "inventory's Prometheus host, have Prometheus read them and show how each target "
                          "answers it; without it nothing is contacted"})
def metrics_(c: Context, flags: HostFlags, apply: bool = False) -> None:
    """Show what Prometheus scrapes, or put it there with --apply.

    From the inventory's `prometheus:`: each target, where Prometheus reaches it and with which labels
    (host, cluster, service, engine, model, endpoint), the ones it cannot reach and why, and the scrape
    configuration. With --apply, the plan for the Prometheus host first, then the change."""
    from provision import prometheus, report
    from provision.run.options import progress_line
    chosen = flags.select(targets=False)
    inv = chosen.inventory
    if not apply:
        scrape, _ = prometheus.scrape_of(inv)
        report.print_metrics(scrape, None, flags.json)
        return
    prometheus.declared(inv)  # an inventory without `prometheus:` stops here, before any host is asked
    progress_line(f"asking {len(inv.hosts)} host(s) which exporters they run")
    found, unknown = prometheus.hosts_facts(inv, flags.accept_new_host_keys)
    scrape, key = prometheus.scrape_of(inv, prometheus.exporters(found))
    done = prometheus.apply(inv, scrape, key, accept_new_host_keys=flags.accept_new_host_keys, progress=progress_line)
    done.unknown = unknown
    done.textfiles = prometheus.write_textfiles(inv, found, flags.accept_new_host_keys, time.time())
    report.print_metrics(scrape, done, flags.json)
    exit_unless(done is None or done.error is None)
