"""`invoke verify.*`: checks that measure a provisioned (or about to be) host instead of reading it.

    invoke verify.nccl --host NAME… | --cluster NAME [--json] [--min-bytes 1M] [--max-bytes 1G] ...

Exit codes as everywhere: 0 every test ran and every all-reduce was correct; 1 a host could not be
reached, a rank failed or a result was wrong; 2 bad usage or bad inventory (nothing contacted).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from invoke import Collection, Context, task
from invoke.exceptions import Exit

# Made first, filled at the end: provision.tasks adds this same object to its namespace, so either
# module may be imported first (tasks.py imports this one from its last line).
verify = Collection("verify")

from provision import inventory, nccl, remote, report  # noqa: E402
from provision.errors import InventoryError, ProvisionError  # noqa: E402
from provision.fanout import for_each_host  # noqa: E402
from provision.tasks import _help, _load, _profile, _setup_logging, gate_with_contexts, guarded  # noqa: E402

NCCL_HELP = _help(
    "inventory", "json", "accept-new-host-keys", "profile", "set", "verbose",
    host="a host name (repeatable): all-reduce across that host's GPUs; 'local' for this machine",
    cluster="a cluster: across every GPU of every node (multi-node: over the cluster network)",
    **{"min-bytes": "smallest message (default 1M; K, M, G are binary units)",
       "max-bytes": "largest message (default 1G); sizes double from the smallest",
       "iters": "timed all-reduces per size (default 20)",
       "warmup": "untimed all-reduces per size first (default 5)",
       "gpus": "GPUs per host to use (default: all that nvidia-smi lists)",
       "port": f"rendezvous port on the head (default {nccl.DEFAULT_PORT})",
       "timeout": "seconds the whole test may take on a host (default 600)",
       "log-dir": "keep each node's answer, NCCL's INFO log of every rank included, as "
                  "DIR/TEST-HOST.json"},
)


@task(auto_shortflags=False, name="nccl", help=NCCL_HELP, iterable=["host", "set_"])
@guarded
def nccl_(c: Context, host: list[str] | None = None, cluster: str | None = None,
          inventory_: str | None = None, json_: bool = False, accept_new_host_keys: bool = False,
          profile: str | None = None, set_: list[str] | None = None, min_bytes: str = "1M",
          max_bytes: str = "1G", iters: int = 20, warmup: int = 5, gpus: int = 0, port: int = nccl.DEFAULT_PORT,
          timeout: int = 600, log_dir: str | None = None, verbose: bool = False) -> None:
    """Measure all-reduce bus bandwidth across GPUs with NCCL, in the service's rendered environment.

    Like nccl-tests' all_reduce_perf: algbw and busbw per message size, each result checked, and the
    transport NCCL chose (P2P over NVLink or PCIe, SHM, NET/Socket, NET/IB) read from its own log.
    """
    _setup_logging(verbose)
    if bool(host) == bool(cluster):
        raise InventoryError("name hosts (--host) or one cluster (--cluster), not both or neither",
                             file="command line")
    try:
        sizes = nccl.sizes_between(nccl.parse_size(min_bytes), nccl.parse_size(max_bytes))
    except ValueError as exc:
        raise InventoryError(str(exc), file="command line", key="--min-bytes/--max-bytes") from None
    if iters < 1 or warmup < 0 or gpus < 0 or timeout <= 0 or not 0 < port < 65536:
        raise InventoryError("--iters must be >= 1, --warmup and --gpus >= 0, --timeout > 0 and "
                             "--port a TCP port", file="command line")
    inv = _load(inventory_)
    overrides = inventory.parse_overrides(set_ or [])
    targets = inv.select(hosts=host or [], cluster=cluster)
    _, errors, contexts = gate_with_contexts(inv, targets, overrides, _profile(profile),
                                             accept_new_host_keys, [])

    # One test per named host, or one for the cluster (across nodes when it has several).
    plans: dict[str, list[nccl.NodeLaunch]] = {}
    failures: dict[str, BaseException] = {}
    tests = [(cluster, list(inv.cluster(cluster).hosts))] if cluster else [(t.name, [t.name]) for t in targets]
    for name, members in tests:
        missing = [member for member in members if member not in contexts]
        if missing:
            failures[name] = errors.get(missing[0]) or ProvisionError(f"{missing[0]}: no facts")
            continue
        try:
            if len(members) == 1:
                plans[name] = nccl.plan_host(contexts[members[0]], gpus=gpus or None, port=port)
            else:
                head = inv.cluster(name).head
                plans[name] = nccl.plan_cluster([contexts[m] for m in members], head,
                                                gpus=gpus or None, port=port)
        except ProvisionError as exc:
            failures[name] = exc

    # Every node of every test at once: a multi-node group only forms when all its nodes run.
    launches = [(name, launch) for name, node_launches in plans.items() for launch in node_launches]

    def run(item: tuple[str, nccl.NodeLaunch]) -> nccl.NodeAnswer:
        _, launch = item
        runner = remote.connect(inv.host(launch.host), inv.ssh, accept_new_host_keys=accept_new_host_keys)
        try:
            return nccl.run_node(runner, launch, launch.spec(sizes, iters, warmup, timeout))
        finally:
            runner.close()

    answers = for_each_host(launches, lambda item: f"{item[0]}/{item[1].host}", run)
    if log_dir:
        folder = Path(log_dir)
        folder.mkdir(parents=True, exist_ok=True)
        for key, answer in answers.values.items():
            (folder / f"{key.replace('/', '-')}.json").write_text(answer.raw, encoding="utf-8")
    runs: dict[str, nccl.NcclRun] = {}
    for name, node_launches in plans.items():
        keys = [f"{name}/{launch.host}" for launch in node_launches]
        broken = [answers.errors[key] for key in keys if key in answers.errors]
        try:
            if broken:
                raise broken[0]
            runs[name] = nccl.summarize(name, node_launches, [answers.values[key] for key in keys])
        except ProvisionError as exc:
            failures[name] = exc
        except Exception as exc:  # noqa: BLE001 - reported per test (as an internal error), never lost
            failures[name] = exc
    order = [name for name, _ in tests]
    if json_:
        print(report.dump_json(runs_json(order, runs, failures)))
    else:
        print_runs(order, runs, failures)
    if failures or any(run_.wrong for run_ in runs.values()):
        raise Exit(code=1)


def runs_json(order: list[str], runs: dict[str, nccl.NcclRun],
              failures: dict[str, BaseException]) -> dict[str, Any]:
    """{"runs": {NAME: NcclRun.as_json()}, "errors": {NAME: "..."}}, NAME a host or the cluster."""
    return {"runs": {name: runs[name].as_json() for name in order if name in runs},
            "errors": {name: report.error_text(failures[name]) for name in order if name in failures}}


def print_runs(order: list[str], runs: dict[str, nccl.NcclRun], failures: dict[str, BaseException]) -> None:
    """A table per test in nccl-tests' columns, after the facts needed to read it."""
    from rich.table import Table

    out = report.console()
    for name in order:
        if name in failures:
            text = report.error_text(failures[name])
            text = text if text.startswith(f"{name}: ") else f"{name}: {text}"
            out.print(f"[red]{text}[/red]")
            continue
        result = runs[name]
        devices = ", ".join(f"{count}x {device}" for device, count in _count(result.devices).items())
        out.print(f"[bold]{name}[/bold]: all-reduce (sum, float) across {result.world_size} GPUs on "
                  f"{len(result.hosts)} node(s) ({devices}); torch {result.torch}, NCCL {result.nccl}")
        out.print(f"  transport: {nccl.describe_transport(result.log)}")
        if result.log.nvls_channels is not None:
            out.print(f"  NVLS (NVLink SHARP) channels: {result.log.nvls_channels}")
        if len(result.hosts) > 1 and result.log.network:
            out.print(f"  network between nodes: {result.log.network}")
        for warning in result.log.warnings:
            out.print(f"  [yellow]warning: {warning}[/yellow]")
        for host_name, python in result.pythons.items():
            out.print(f"  python on {host_name}: {python}")
        for host_name, env in result.environment.items():
            out.print(f"  environment on {host_name}: "
                      + " ".join(f"{key}={value}" for key, value in env.items()))
        table = Table(title_justify="left")
        for column in ("size", "count", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong"):
            table.add_column(column, justify="right")
        for row in result.rows:
            table.add_row(nccl.human_size(row.bytes), str(row.count), f"{row.time_us:.1f}",
                          f"{row.algbw_gbs:.2f}", f"{row.busbw_gbs:.2f}",
                          str(row.wrong) if not row.wrong else f"[red]{row.wrong}[/red]")
        out.print(table)
        out.print(f"  peak busbw {result.peak_busbw_gbs:.2f} GB/s; busbw = algbw x 2(n-1)/n, n = "
                  f"{result.world_size}" + ("" if not result.wrong else
                                             f"; [red]{result.wrong} wrong element(s)[/red]"))
        if result.late:
            sizes = ", ".join(nccl.human_size(row.bytes) for row in result.late)
            out.print(f"  [yellow]at {sizes} the GPU ran ahead of the host queueing the batch: those times "
                      "include the host's pace (try fewer --iters)[/yellow]")
    sys.stdout.flush()


def _count(items: tuple[str, ...]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return counts


verify.add_task(nccl_)
