"""`invoke verify.*`: checks that measure a provisioned (or about to be) host instead of reading it.

    invoke verify.nccl --host NAME… | --cluster NAME [--json] [--min-bytes 1M] [--max-bytes 1G] ...

Exit codes as everywhere: 0 every test ran and every all-reduce was correct; 1 a host could not be
reached, a rank failed or a result was wrong; 2 bad usage or bad inventory (nothing contacted).
"""
from __future__ import annotations

from invoke.collection import Collection
from invoke.context import Context
from invoke.exceptions import Exit

# Made first, filled at the end: provision.tasks adds this same object to its namespace, so either
# module may be imported first (tasks.py imports this one from its last line).
verify = Collection("verify")

from provision import config
from provision.errors import InventoryError
from provision.taskargs import HostFlags, NcclFlags, host_task


@host_task("nccl", "inventory", "host", "cluster", "json", "accept-new-host-keys", "profile", "set", "verbose",
           asked=NcclFlags,
           help={"host": "a host name (repeatable): all-reduce across that host's GPUs; 'local' for this machine",
                 "cluster": "a cluster: across every GPU of every node (multi-node: over the cluster network)",
                 "min-bytes": "smallest message (default 1M; K, M, G are binary units)",
                 "max-bytes": "largest message (default 1G); sizes double from the smallest",
                 "iters": "timed all-reduces per size (default 20)",
                 "warmup": "untimed all-reduces per size first (default 5)",
                 "gpus": "GPUs per host to use (default: all that nvidia-smi lists)",
                 "port": f"rendezvous port on the head (default {config.NCCL_PORT})",
                 "timeout": "seconds the whole test may take on a host (default 600)",
                 "log-dir": "keep each node's answer, NCCL's INFO log of every rank included, as "
                            "DIR/TEST-HOST.json"})
def nccl_(c: Context, flags: HostFlags, asked: NcclFlags) -> None:
    """Measure all-reduce bus bandwidth across GPUs with NCCL.

    In the service's rendered environment.

    Like nccl-tests' all_reduce_perf: algbw and busbw per message size, each result checked, and the
    transport NCCL chose (P2P over NVLink or PCIe, SHM, NET/Socket, NET/IB) read from its own log.
    """
    from provision import nccl, report
    cluster = flags.one_cluster("verify.nccl")
    if bool(flags.host) == bool(cluster):
        raise InventoryError("name hosts (--host) or one cluster (--cluster), not both or neither",
                             file="command line")
    try:
        sizes = nccl.sizes_between(nccl.parse_size(asked.min_bytes), nccl.parse_size(asked.max_bytes))
    except ValueError as exc:
        raise InventoryError(str(exc), file="command line", key="--min-bytes/--max-bytes") from exc
    if asked.iters < 1 or asked.warmup < 0 or asked.gpus < 0 or asked.timeout <= 0 or not 0 < asked.port < 65536:
        raise InventoryError("--iters must be >= 1, --warmup and --gpus >= 0, --timeout > 0 and "
                             "--port a TCP port", file="command line")
    chosen = flags.select()
    order, runs, failures = nccl.verify(chosen.inventory, chosen.targets, flags.options(chosen), cluster,
                                        list(sizes), asked)
    if flags.json:
        print(report.dump_json(report.runs_json(order, runs, failures)))
    else:
        report.print_runs(order, runs, failures)
    if failures or any(run_.wrong for run_ in runs.values()):
        raise Exit(code=1)


verify.add_task(nccl_)
