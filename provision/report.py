"""Turn results into text for people (rich tables) or JSON for scripts. No logic beyond formatting."""
from __future__ import annotations

import json
import sys
from typing import Any, Iterable, Mapping

from rich.console import Console
from rich.table import Table

from provision.checks import Finding, resolutions, verdict
from provision.errors import ProvisionError
from provision.facts import HostFacts
from provision.fanout import HostResults
from provision.inventory import Inventory


def console() -> Console:
    # Piped output (CI logs, `| less`) gets a wide table instead of rich's 80-column default.
    return Console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 160)


def dump_json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=False)


def error_text(error: BaseException) -> str:
    if isinstance(error, ProvisionError):
        return str(error)
    return f"internal error ({type(error).__name__}): {error}"  # a defect of the tool: say so


def error_for(host: str, error: BaseException) -> str:
    """One host's error for a line that names the host itself (most errors name it already)."""
    return error_text(error).removeprefix(f"{host}: ")


def host_error(host: str, error: BaseException) -> str:
    """One host's error for a line of its own, the host named once."""
    return f"{host}: {error_for(host, error)}"


def facts_json(results: HostResults[HostFacts]) -> dict[str, Any]:
    return {
        "hosts": {name: results.values[name].as_json() for name in results.order if name in results.values},
        "errors": {name: error_text(results.errors[name]) for name in results.order
                   if name in results.errors},
    }


def _gib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**30:.1f} GiB"


def _gpus(facts: HostFacts) -> str:
    if facts.gpus is None:
        return f"unknown ({facts.notes.get('gpus', 'unreadable')})"
    if not facts.gpus:
        return facts.notes.get("gpus", "none")
    names: dict[str, int] = {}
    for gpu in facts.gpus:
        memory = f"{gpu.memory_total_mib} MiB" if gpu.memory_total_mib is not None else "memory N/A"
        label = f"{gpu.name} (sm {gpu.compute_cap or '?'}, {memory})"
        names[label] = names.get(label, 0) + 1
    return ", ".join(f"{count}x {label}" for label, count in names.items())


def _cpu(facts: HostFacts) -> str:
    if facts.cpu is None:
        return facts.notes.get("lscpu", "-")
    cpu = facts.cpu
    models = " + ".join(cpu.model_names) or "?"
    detail = f"{len(cpu.cpus)} CPUs" if cpu.cpus else "per-CPU table unavailable"
    if cpu.cpus:
        detail += f", {cpu.threads_per_core} thread(s)/core, {len(cpu.l3_domains)} L3 domain(s)"
    return f"{models}; {detail}"


def _venv(facts: HostFacts) -> str:
    venv = facts.venv
    if venv is None:
        return facts.notes.get("venv", "none")
    if not (venv.vllm or venv.torch):
        return f"Python {venv.python}, no vLLM or torch"
    torch = f"torch {venv.torch}" + (f" (CUDA {venv.cuda})" if venv.cuda else " (CPU)") if venv.torch else "no torch"
    parts = [f"vLLM {venv.vllm}" if venv.vllm else "no vLLM", torch]
    if venv.nccl:
        parts.append(f"NCCL {venv.nccl}")
    return ", ".join(parts) + f"; Python {venv.python}"


def facts_rows(facts: HostFacts) -> list[tuple[str, str]]:
    driver = (f"{facts.driver.version} ({facts.driver.flavour} kernel module)" if facts.driver
              else facts.notes.get("nvidia_driver", "-"))
    rdma = ("-" if facts.rdma is None else
            ", ".join(f"{link.device}->{link.netdev} ({'up' if link.up else 'down'})" for link in facts.rdma)
            or "none")
    units = ", ".join(f"{name}: {state.active_state}" for name, state in facts.units.items()
                      if state.load_state != "not-found") or "not installed"
    return [
        ("kernel", f"{facts.kernel or '-'} ({facts.arch or '-'})"),
        ("os", facts.os.pretty_name or facts.os.id if facts.os else "-"),
        ("cpu", _cpu(facts)),
        ("memory", f"{_gib(facts.memory.total)} total, {_gib(facts.memory.available)} available"
         if facts.memory else "-"),
        ("driver", driver),
        ("gpus", _gpus(facts)),
        ("python3", facts.python or "-"),
        ("venv", _venv(facts)),
        ("init", f"{facts.init or '-'}" + ("" if facts.systemd_is_pid1 else " (not systemd)")),
        ("units", units),
        ("exposure", ", ".join(f"{name} {score.exposure} {score.level}"
                               for name, score in (facts.unit_security or {}).items())
         or facts.notes.get("unit_security", "no unit installed")),
        ("rdma", rdma),
        ("interfaces", ", ".join(f"{i.name} {' '.join(i.addresses)}".strip()
                                 for i in facts.interfaces if i.name != "lo") or "-"),
    ] + [(f"disk {disk.path}", f"{_gib(disk.free_bytes)} free on {disk.checked}") for disk in facts.disks]


def print_facts(results: HostResults[HostFacts], out: Console) -> None:
    for name in results.order:
        table = Table(title=name, show_header=False, title_justify="left", expand=False)
        table.add_column("fact", style="bold")
        table.add_column("value", overflow="fold")
        if name in results.errors:
            table.add_row("error", f"[red]{error_text(results.errors[name])}[/red]")
        else:
            for key, value in facts_rows(results.values[name]):
                table.add_row(key, value)
        out.print(table)


def inventory_json(inventory: Inventory, overrides: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "sources": list(inventory.sources),
        "hosts": {
            name: {
                "address": host.address, "port": host.port, "user": host.user,
                "profile": host.profile.name, "connection": host.connection,
                "cluster": (inventory.cluster_of(name).name if inventory.cluster_of(name) else None),
                "settings": _plain(inventory.settings(name, overrides).values),
                "origin": dict(inventory.settings(name, overrides).origin),
            }
            for name, host in inventory.hosts.items()
        },
        "groups": {name: list(group.hosts) for name, group in inventory.groups.items()},
        "clusters": {name: {"hosts": list(cluster.hosts), "head": cluster.head,
                            "multi_node": cluster.multi_node}
                     for name, cluster in inventory.clusters.items()},
    }


def _plain(values: Mapping[str, Any]) -> dict[str, Any]:
    return {key: list(value) if isinstance(value, tuple) else value for key, value in values.items()}


def print_inventory(inventory: Inventory, out: Console) -> None:
    table = Table(title=f"inventory: {', '.join(inventory.sources)}", title_justify="left")
    for column in ("host", "address", "profile", "cluster", "model", "tp"):
        table.add_column(column)
    for name, host in inventory.hosts.items():
        settings = inventory.settings(name)
        cluster = inventory.cluster_of(name)
        address = "local" if host.connection == "local" else f"{host.user}@{host.address}:{host.port}"
        table.add_row(name, address, host.profile.name, cluster.name if cluster else "-",
                      str(settings.model or "-"), str(settings.tensor_parallel_size))
    out.print(table)


def print_rows(rows: Iterable[Mapping[str, Any]], title: str, out: Console) -> None:
    rows = list(rows)
    table = Table(title=title, title_justify="left")
    if not rows:
        out.print(f"{title}: nothing")
        return
    for column in rows[0]:
        table.add_column(column)
    for row in rows:
        table.add_row(*(str(value) for value in row.values()))
    out.print(table)


def finding_json(finding: Finding) -> dict[str, Any]:
    return {"id": finding.id, "severity": finding.severity, "status": finding.status,
            "message": finding.message, "evidence": _plain_deep(finding.evidence), "fix": finding.fix}


def _plain_deep(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain_deep(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain_deep(v) for v in value]
    return value


def check_json(order: Iterable[str], findings: Mapping[str, list[Finding]],
               errors: Mapping[str, BaseException]) -> dict[str, Any]:
    """The stable shape of `invoke check --json` (README, "check --json")."""
    hosts = {name: {"verdict": verdict(findings[name]),
                    "findings": [finding_json(f) for f in findings[name]],
                    "resolutions": {"extra_args": resolutions(findings[name])}}
             for name in order if name in findings}
    return {
        "hosts": hosts,
        "errors": {name: error_text(errors[name]) for name in order if name in errors},
        "blocked": [name for name, body in hosts.items() if body["verdict"] == "blocked"],
    }


_STATUS_STYLE = {"pass": "[green]pass[/green]", "fail": "[red]FAIL[/red]", "forced": "[yellow]forced[/yellow]",
                 "skip": "[dim]skip[/dim]"}


def print_check(order: Iterable[str], findings: Mapping[str, list[Finding]],
                errors: Mapping[str, BaseException], out: Console) -> None:
    for name in order:
        if name in errors:
            out.print(f"[bold]{name}[/bold]: [red]{error_for(name, errors[name])}[/red]")
            continue
        table = Table(title=f"{name}: {verdict(findings[name])}", title_justify="left")
        for column in ("status", "check", "severity", "finding", "fix"):
            table.add_column(column, overflow="fold")
        shown = sorted((f for f in findings[name] if f.status != "skip"),
                       key=lambda f: (f.status == "pass", f.severity != "blocker"))
        for finding in shown:
            table.add_row(_STATUS_STYLE[finding.status], finding.id, finding.severity,
                          finding.message, finding.fix or "" if finding.status != "pass" else "")
        out.print(table)


def print_generations(host: str, listing: Mapping[str, Any], out: Console) -> None:
    """A host's generations, oldest first: which is current and which rollback may restore."""
    table = Table(title=f"{host}: generations", title_justify="left")
    for column in ("#", "state", "created", "by", "changes", "rollback target"):
        table.add_column(column)
    for row in listing.get("generations", []):
        number = f"{row['id']}{' (current)' if row.get('current') else ''}"
        changes = "; ".join(row.get("changes") or []) or (row.get("note") or "-")
        table.add_row(number, row["state"], row.get("created") or "-", row.get("by") or "-", changes,
                      "yes" if row.get("target") else "no")
    out.print(table)
