"""`init`: write a starter inventory for this machine or for SSH hosts (provision.starter)."""
from __future__ import annotations

from pathlib import Path

from invoke.context import Context

from provision import hints
from provision.taskargs import exit_unless, guarded, help_for, setup_logging, task


@task(auto_shortflags=False, name="init",
      help=help_for("json", "accept-new-host-keys", "verbose",
                    host="'local' for this machine (no SSH), or [NAME=][USER@]ADDRESS[:PORT] (repeatable)",
                    output="the file to write (default ./inventory/hosts.yaml); an existing file is never "
                           "overwritten",
                    **{"key-file": "private key for the SSH hosts (default: the SSH agent and ~/.ssh/id_*)",
                       "known-hosts": "known_hosts file to check their keys against (default ~/.ssh/known_hosts)"}),
      iterable=["host"])
@guarded
def init(c: Context, host: list[str] | None = None, output: str = "inventory/hosts.yaml", json_: bool = False,
         accept_new_host_keys: bool = False, key_file: str | None = None, known_hosts: str | None = None,
         verbose: bool = False) -> None:
    """Probe the hosts and write a starter inventory.

    Each host's profile from its GPUs, tensor parallel = its GPU count, a model that fits; every line
    commented. Exit 2 if the file exists."""
    from provision import report, starter
    from provision.errors import InventoryError

    setup_logging(verbose)
    if not host:
        raise InventoryError("name a host: --host local, or --host [USER@]ADDRESS", file="command line")
    targets = [starter.parse_target(text) for text in host]
    ssh = starter.SshChoice(known_hosts=str(Path(known_hosts).expanduser().resolve()) if known_hosts else None,
                            key_file=str(Path(key_file).expanduser().resolve()) if key_file else None)
    done = starter.initialize(targets, Path(output), ssh, accept_new_host_keys=accept_new_host_keys,
                              command=hints.command("init"))
    if json_:
        print(report.dump_json(report.init_json(done)))
    else:
        report.print_init(done, report.console())
    exit_unless(done.ok)
