"""Turn results into text for people (rich tables) or JSON for scripts. No logic beyond formatting."""
from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from provision import catalog, hints, parsers
from provision.affinity import compress
from provision.checks import Finding, resolutions, verdict
from provision.errors import RecipeError, error_text
from provision.facts import HostFacts, ProbeAccount
from provision.fanout import HostResults
from provision.inventory import Inventory
from provision.parsers import Gpu
from provision.plan import summary

# What only some tasks print (status, verify.nccl, prepare, tune) is imported where it is printed,
# so a no-op provision or a facts run does not pay for loading it.
if TYPE_CHECKING:
    from provision import stall, status
    from provision.nccl import NcclRun
    from provision.prepare import HostReport, Prepared
    from provision.recipes import Recipe
    from provision.recipes.applying import Application
    from provision.recipes.registry import Contents, Listed, Updated
    from provision.recipes.sparkarena import Imported
    from provision.rolling import Deployed
    from provision.run import Applied, Gated, HostPlan, Planned
    from provision.venv import WheelsSent
    from provision.weights import FetchResult


# Piped output (CI logs, `| less`, a file) has no right edge: a table is as wide as its widest cells,
# where rich's 80-column default (or any fixed width) would wrap or cut them. Tables are not expanded,
# so this is a bound no table meets, not a width any line is padded to.
PIPED_WIDTH = 100_000


def console() -> Console:
    """Every table and line for people goes through one of these: at a terminal, its width; piped,
    PIPED_WIDTH."""
    return Console(highlight=False, markup=False, soft_wrap=False,
                   width=None if sys.stdout.isatty() else PIPED_WIDTH)


def styled(markup: str) -> Text:
    """A line or cell in the report's own styles ([bold], [red], ...). The console reads markup nowhere
    else (console()), and every value a styled text interpolates goes through plain(): what a host, an
    error or a hint says prints as it is, brackets included (pip_extra_index_urls: [URL], [a, b])."""
    return Text.from_markup(markup)


def plain(value: object) -> str:
    """A value inside styled(), its brackets escaped (never read as styles)."""
    return escape(str(value))


def dump_json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=False)


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
    recorded = sorted({gpu.recorded for gpu in facts.gpus if gpu.recorded})
    when = f"; readings recorded {', '.join(recorded)}, not measured now" if recorded else ""
    return ", ".join(f"{count}x {label}" for label, count in names.items()) + _gpu_nodes(facts.gpus) + when


def _gpu_nodes(gpus: Sequence[Gpu]) -> str:
    """'; NUMA node: GPU 0-3 on 0, GPU 4-7 on 1', and where the kernel and the driver disagree, both."""
    def where(gpu: Gpu) -> str:
        if gpu.numa_node is not None and gpu.topo_numa_node not in (None, gpu.numa_node):
            return f"{gpu.numa_node} (topo -m: {gpu.topo_numa_node})"
        return "?" if gpu.node is None else str(gpu.node)

    groups: dict[str, list[int]] = {}
    for gpu in gpus:
        groups.setdefault(where(gpu), []).append(gpu.index)
    if set(groups) == {"?"}:
        return "; NUMA node not reported"
    return "; NUMA node: " + ", ".join(f"GPU {compress(tuple(indices))} on {node}" for node, indices in groups.items())


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
    engines = [f"{entry.title} {release}" for entry in catalog.ENGINES.values()
               if (release := venv.engine_release(entry))]
    if not (engines or venv.torch):
        return f"Python {venv.python}, no engine or torch"
    torch = f"torch {venv.torch}" + (f" (CUDA {venv.cuda})" if venv.cuda else " (CPU)") if venv.torch else "no torch"
    parts = [*(engines or ["no engine"]), torch]
    if venv.nccl:
        parts.append(f"NCCL {venv.nccl}")
    return ", ".join(parts) + f"; Python {venv.python}"


def _exposure(facts: HostFacts) -> str:
    """The installed units' systemd exposure; on a host with none of them yet, that (systemd-analyze
    exits 1 naming each unit it cannot find: what an unprovisioned host answers, not an error)."""
    scored = ", ".join(f"{name} {score.exposure} {score.level}" for name, score in (facts.unit_security or {}).items())
    if scored:
        return scored
    if facts.unit_security is not None and facts.units is not None \
            and not any(state.load_state != "not-found" for state in facts.units.values()):
        return "no unit installed yet"
    return facts.notes.get("unit_security", "no unit installed yet")


def _unknown(facts: HostFacts, fact: str) -> str:
    """A fact the host could not answer: said so, with why, never shown as an empty answer."""
    return f"unknown ({facts.notes.get(fact, 'no answer')})"


def _gpu_modules(facts: HostFacts) -> str:
    """The loaded kernel modules the gate judges (NVIDIA's, nouveau), or why the list is unknown: the
    row driver.nouveau's "could not be checked" points at."""
    if facts.modules is None:
        return f"unknown ({facts.notes.get('modules') or facts.notes.get('lsmod') or 'no answer'})"
    nvidia = sorted(name for name in facts.modules if name.startswith("nvidia"))
    nouveau = "nouveau loaded" if "nouveau" in facts.modules else "nouveau not loaded"
    return f"{', '.join(nvidia) or 'no NVIDIA module'}; {nouveau}"


def facts_rows(facts: HostFacts) -> list[tuple[str, str]]:
    driver = (f"{facts.driver.version} ({facts.driver.flavour} kernel module)" if facts.driver
              else facts.notes.get("nvidia_driver", "-"))
    rdma = ((_unknown(facts, "rdma") if "rdma" in facts.notes else "-") if facts.rdma is None else
            ", ".join(f"{link.device}->{link.netdev} ({'up' if link.up else 'down'})" for link in facts.rdma)
            or "none")
    units = _unknown(facts, "units") if facts.units is None else ", ".join(
        f"{name}: {state.active_state}" for name, state in facts.units.items()
        if state.load_state != "not-found") or "not installed"
    interfaces = _unknown(facts, "interfaces") if facts.interfaces is None else ", ".join(
        f"{i.name} {' '.join(i.addresses)}".strip() for i in facts.interfaces if i.name != "lo") or "-"
    return [
        ("kernel", f"{facts.kernel or '-'} ({facts.arch or '-'})"),
        ("os", facts.os.pretty_name or facts.os.id if facts.os else "-"),
        ("cpu", _cpu(facts)),
        ("memory", f"{_gib(facts.memory.total)} total, {_gib(facts.memory.available)} available"
         if facts.memory else "-"),
        ("driver", driver),
        ("modules", _gpu_modules(facts)),
        ("gpus", _gpus(facts)),
        ("python3", facts.python or "-"),
        ("venv", _venv(facts)),
        ("init", f"{facts.init or '-'}" + ("" if facts.systemd_is_pid1 else " (not systemd)")),
        ("units", units),
        ("exposure", _exposure(facts)),
        ("rdma", rdma),
        ("interfaces", interfaces),
    ] + [(f"disk {disk.path}", f"{_gib(disk.free_bytes)} free on {disk.checked}") for disk in facts.disks]


def print_facts(results: HostResults[HostFacts], out: Console, verbose: bool = False) -> None:
    for name in results.order:
        table = Table(title=name, show_header=False, title_justify="left", expand=False)
        table.add_column("fact", style="bold")
        table.add_column("value", overflow="fold")
        if name in results.errors:
            table.add_row("error", styled(f"[red]{plain(error_text(results.errors[name]))}[/red]"))
        else:
            for key, value in facts_rows(results.values[name]):
                table.add_row(key, value)
        out.print(table)
        if verbose and name in results.values:
            out.print(probe_table(name, results.values[name].probe))


def probe_table(host: str, account: ProbeAccount) -> Table:
    """--verbose: what the probe did on the host for each fact, slowest first, and what it kept."""
    took = "-" if account.seconds is None else f"{account.seconds:.2f} s"
    table = Table(title=f"{host}: the probe ({took} on the host)", title_justify="left")
    for column in ("fact", "how", "from", "seconds"):
        table.add_column(column, justify="right" if column == "seconds" else "left")
    for step in sorted(account.steps, key=lambda step: -step.seconds):
        table.add_row(step.fact, step.how, step.source, f"{step.seconds:.3f}")
    cached = [step.fact for step in account.steps if step.how == "cached"]
    kept = (f"cache {account.cache_file}: " + ("could not be written: " + account.cache_error
                                                if account.cache_error else
                                                "written" if account.cache_written else "unchanged")
            + (f"; answered from it: {', '.join(cached)}" if cached else ""))
    table.caption, table.caption_justify = kept, "left"
    return table


def _cluster_name(inventory: Inventory, host: str) -> str | None:
    cluster = inventory.cluster_of(host)
    return cluster.name if cluster else None


def inventory_json(inventory: Inventory, overrides: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "sources": list(inventory.sources),
        "hosts": {
            name: {
                "address": host.address, "port": host.port, "user": host.user,
                "profile": host.profile.name, "connection": host.connection,
                "cluster": _cluster_name(inventory, name),
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
    for name in unserved(inventory):
        out.print(f"{name}: no model to serve (the gate refuses it): add `vars: {{model: ORG/NAME}}` under it in "
                  f"{inventory.host(name).source}, or in its cluster's vars", markup=False, soft_wrap=True)


def unserved(inventory: Inventory) -> list[str]:
    """The hosts that would serve, yet name no model: not one that only runs an endpoint's router,
    nor one whose services (each a target of its own, with its own model) serve for it."""
    return [name for name, host in inventory.hosts.items()
            if not host.services and not inventory.endpoints_on(name) and not inventory.settings(name).model]


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
    """The stable shape of `invoke check --json` (docs/check.md shows it)."""
    hosts = {name: {"verdict": verdict(findings[name]),
                    "findings": [finding_json(f) for f in findings[name]],
                    "resolutions": {"extra_args": resolutions(findings[name])}}
             for name in order if name in findings}
    return {
        "hosts": hosts,
        "errors": {name: error_text(errors[name]) for name in order if name in errors},
        "blocked": [name for name, body in hosts.items() if body["verdict"] == "blocked"],
    }


_STATUS_STYLE = {"pass": Text("pass", style="green"), "fail": Text("FAIL", style="red"),
                 "forced": Text("forced", style="yellow"), "skip": Text("skip", style="dim")}


def print_check(order: Iterable[str], findings: Mapping[str, list[Finding]],
                errors: Mapping[str, BaseException], out: Console) -> None:
    for name in order:
        if name in errors:
            out.print(styled(f"[bold]{plain(name)}[/bold]: [red]{plain(error_for(name, errors[name]))}[/red]"))
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
    """A host's generations, oldest first: the one it runs now, the one `invoke rollback` restores, the
    others `--to` may restore, the ones never restored; a tune trial's named as a trial."""
    if not listing.get("generations"):
        out.print(Text(f"{host}: no generations yet: each deploy or provision that changes the host "
                       "records one, for rollback to restore"))
        return
    table = Table(title=f"{host}: generations", title_justify="left")
    for column in ("#", "state", "created", "by", "changes", "rollback"):
        table.add_column(column)
    for row in listing.get("generations", []):
        changes = "; ".join(row.get("changes") or []) or (row.get("note") or "-")
        table.add_row(styled(f"[bold]{plain(row['id'])} (current)[/bold]") if row.get("current") else str(row["id"]),
                      row["state"], row.get("created") or "-", row.get("by") or "-", changes, _rollback_role(row))
    out.print(table)


def _rollback_role(row: Mapping[str, Any]) -> str | Text:
    """What `rollback` does with one generation of the listing, in words."""
    trial = " (a tune trial's settings)" if row.get("trial") else ""
    if row.get("current"):
        return styled("[bold]runs now[/bold]" + plain(trial))
    if row.get("default"):
        return f"default target (no --to){trial}"
    if row["state"] in ("rejected", "abandoned", "pending"):
        return f"never ({row['state']})"
    return f"with --to {row['id']}{trial}"


# ---------------------------------------------------------------------------------------------
# plans and what was applied


def print_plans(planned: Planned, show_diff: bool, only: str | None = None) -> None:
    """Each host's plan (or why it has none), before anything changes; diffs verbatim with show_diff."""
    order, plans, findings, errors = planned.order, planned.plans, planned.findings, planned.errors
    out = console()
    for name in order:
        if name in errors:
            out.print(styled(f"[bold]{plain(name)}[/bold]: [red]{plain(error_for(name, errors[name]))}[/red]"))
        elif name not in plans:
            blockers = [f for f in findings[name] if f.blocks]
            out.print(styled(f"[bold]{plain(name)}[/bold]: [red]blocked by the gate, nothing changed[/red]"))
            for finding in blockers:
                out.print(f"  {finding.id}: {finding.message} -> fix: {finding.fix}")
        else:
            said = summary(plans[name].changes, only)
            if only == "weights" and not plans[name].changes and plans[name].weights_note:
                said = str(plans[name].weights_note)  # nothing was verified: say what is there instead
            out.print(styled(f"[bold]{plain(name)}[/bold]: {plain(said)}"))
            memory = memory_estimate(findings.get(name, []))
            if memory is not None:
                style = "yellow" if memory.status == "fail" else "dim"
                out.print(styled(f"  [{style}]memory: {plain(memory.message)}[/{style}]"))
            conf = nccl_conf_finding(findings.get(name, []))
            if conf is not None:  # what the host's nccl.conf adds to the rendered environment
                style = "yellow" if conf.status == "fail" else "dim"
                for path, values in conf.evidence.get("files", {}).items():
                    shown = ", ".join(f"{key}={value}" for key, value in values.items()) or "no variables"
                    out.print(styled(f"  [{style}]{plain(path)}: {plain(shown)}[/{style}]"))
                out.print(styled(f"  [{style}]nccl.conf: {plain(conf.message)}[/{style}]"))
                if conf.status == "fail" and conf.fix:
                    out.print(styled(f"  [{style}]  fix: {plain(conf.fix)}[/{style}]"))
            unfinished = plans[name].unfinished
            if unfinished:
                out.print(styled(f"  [yellow]generation {plain(unfinished['id'])} was left pending by a deploy that "
                                 f"stopped (started {plain(unfinished['created'])}): `{plain(hints.command('deploy'))}` "
                                 f"gives its verdict, `{plain(hints.command('rollback'))}` goes back[/yellow]"))
            if plans[name].push_count:
                out.print(f"  push {plans[name].push_count} wheel(s), {plans[name].push_bytes / 2**20:.0f} MiB")
            for change in plans[name].changes:
                out.print(f"  {change.describe()}")
                if show_diff and change.diff:
                    out.file.flush()
                    sys.stdout.write(change.diff)  # verbatim: a diff must not be re-wrapped


def memory_estimate(findings: Iterable[Finding]) -> Finding | None:
    """The memory.fits finding where it judged this host (weights, KV cache, context that fits)."""
    return next((f for f in findings if f.id == "memory.fits" and f.status != "skip"), None)


def nccl_conf_finding(findings: Iterable[Finding]) -> Finding | None:
    """The config.nccl_conf finding where the host has an nccl.conf (its files and what they set)."""
    return next((f for f in findings if f.id == "config.nccl_conf" and f.status != "skip"), None)


def plans_json(order: list[str], plans: Mapping[str, HostPlan],
               findings: Mapping[str, list[Finding]], errors: Mapping[str, BaseException],
                applied: dict[str, Any] | None = None) -> dict[str, Any]:
    hosts: dict[str, Any] = {}
    for name in order:
        body: dict[str, Any] = {"verdict": verdict(findings[name]) if name in findings else None}
        if body["verdict"] == "blocked":
            body["blockers"] = [{"id": f.id, "message": f.message, "fix": f.fix, "evidence": f.evidence}
                                for f in findings[name] if f.blocks]
        memory = memory_estimate(findings.get(name, []))
        if memory is not None:
            body["memory"] = finding_json(memory)
        conf = nccl_conf_finding(findings.get(name, []))
        if conf is not None:
            body["nccl_conf"] = finding_json(conf)
        if name in plans:
            body["changes"] = [{"kind": c.kind, "target": c.target, "reason": c.reason}
                               for c in plans[name].changes]
            body["push_bytes"] = plans[name].push_bytes
            body["unfinished_generation"] = plans[name].unfinished
            if plans[name].weights_note:
                body["weights_note"] = plans[name].weights_note
            fetch = plans[name].of_kind("weights")
            if fetch:
                body["weights"] = {"repo": fetch[0].data["repo"], "commit": fetch[0].data["commit"],
                                   "bytes": sum(f["size"] for f in fetch[0].data["files"])}
        if applied is not None and name in applied:
            body["applied"] = applied[name]
        if name in errors:
            body["error"] = error_text(errors[name])
        hosts[name] = body
    return {"hosts": hosts}





def print_applied(result: Applied, json_: bool) -> None:
    """What provision (venv, weights) did on each host; JSON with --json."""
    order, plans, findings, errors = result.order, result.plans, result.findings, result.errors
    applied, fetched = result.applied, result.fetched
    from_hub = bytes_from_hub(fetched)
    if json_:
        document = plans_json(order, plans, findings, errors, applied)
        for name, got in fetched.items():
            document["hosts"][name]["fetched"] = {"bytes": got.fetched, "from": got.source,
                                                  "by_source": got.detail.get("from", {}),
                                                  "rerouted": got.detail.get("rerouted", []),
                                                  "linked": got.detail.get("linked", 0),
                                                  "quarantined": got.detail.get("quarantined", []),
                                                  "served_replaced": got.detail.get("served_replaced", [])}
        document.update(transfer_json(result.fetched, result.wheels))
        print(dump_json(document))
        return
    for name in order:
        if name in errors and name in plans:
            print(host_error(name, errors[name]), file=sys.stderr)
        elif name in applied:
            line = f"{name}: applied {applied[name]} change(s)"
            if name in fetched:
                got = fetched[name]
                line += f"; weights: {got.fetched / 2**20:.1f} MiB from {got.source}"
                if got.detail.get("quarantined"):
                    line += (f", {len(got.detail['quarantined'])} bad file(s) set aside and fetched again: "
                             + ", ".join(str(path) for path in got.detail["quarantined"]))
                if got.detail.get("served_replaced"):
                    line += ("; replaced in the revision the server serves: "
                             + ", ".join(str(path) for path in got.detail["served_replaced"])
                             + " (a running server read the earlier copy at its start and keeps it until it restarts)")
                for step in got.detail.get("rerouted", []):
                    line += f"; left {step['source']} for {step['next']} ({step['why']})"
            print(line)
    if fetched:
        print(f"bytes fetched from the hub: {from_hub} ({from_hub / 2**20:.1f} MiB)")
    pushed = sum(result.wheels.pushed.values())
    if pushed:
        print(f"wheel bytes sent by this machine: {pushed} ({pushed / 2**20:.1f} MiB)")


def bytes_from_hub(fetched: Mapping[str, FetchResult]) -> int:
    """What the hosts took from the hub: a relay's host falls back to it only when its relays fail."""
    return sum(int(got.detail.get("from", {}).get("hub", 0)) for got in fetched.values())


def transfer_json(fetched: Mapping[str, FetchResult], wheels: WheelsSent) -> dict[str, Any]:
    """Bytes by origin for a run: the hub's (weights), this machine's (wheels), and what the hosts passed
    on to each other."""
    return {"bytes_from_hub": bytes_from_hub(fetched),
            "bytes_from_controller": sum(wheels.pushed.values()),
            "wheels": {"pushed": wheels.pushed, "relayed": wheels.relayed}}


def print_rollback(results: HostResults[Any], listing: bool, json_: bool) -> None:
    """What rollback restored on each host (or each host's generations, with --list)."""
    if json_:
        body = {name: ({"error": error_text(results.errors[name])} if name in results.errors
                       else results.values[name] if listing
                       else {"to": results.values[name].to, "restored": list(results.values[name].restored),
                             "ready_s": results.values[name].ready_s, "seconds": results.values[name].seconds})
                for name in results.order}
        print(dump_json({"hosts": body}))
        return
    for name in results.order:
        if name in results.errors:
            print(host_error(name, results.errors[name]), file=sys.stderr)
        elif listing:
            print_generations(name, results.values[name], console())
        else:
            outcome = results.values[name]
            serving = ("; it runs no server" if outcome.ready_s is None
                       else f"; it answers /health and a completion ({outcome.ready_s:.0f}s)")
            print(f"{name}: generation {outcome.to} restored: {', '.join(outcome.restored) or 'it was in place'}"
                  f"{serving}")


# ---------------------------------------------------------------------------------------------
# deploy and status


def _build_from(hostplan: Any) -> str | None:
    """Where a host's source-built wheel came from this run: built on it, or the build cache."""
    built = hostplan.build if hostplan is not None else None
    return built[0] if built else None


def print_deployed(result: Deployed, json_: bool) -> None:
    """deploy's summary: each host's state, changes, seconds per step and what happened."""
    rows = deployed_rows(result)
    if json_:
        print(dump_json({"hosts": rows, "seconds": round(result.seconds, 2), "ok": not result.errors,
                         **transfer_json(result.fetched, result.wheels)}))
        return
    console().print(deployed_table(rows, result.seconds))


def deployed_rows(result: Deployed) -> list[dict[str, Any]]:
    """One row per host of deploy's summary, as --json prints it."""
    plans, fetched, errors = result.plans, result.fetched, result.errors
    rows: list[dict[str, Any]] = []
    for name in result.order:
        outcome = result.outcomes[name]
        changes = plans[name].changes if name in plans else []
        # None: the connection was lost while the host applied them; its next run tells (generations).
        applied = None if outcome.changes_unknown else result.applied.get(name, 0)
        rows.append({"host": name, "state": outcome.state, "changes": applied,
                     "planned": [c.describe() for c in changes], "steps_s": outcome.steps,
                     "ready_s": outcome.ready_s, "weights_from": fetched[name].source if name in fetched else None,
                     "build_from": _build_from(plans.get(name)),
                     "detail": outcome.detail or (error_text(errors[name]) if name in errors else "")})
    return rows


def deployed_table(rows: Sequence[Mapping[str, Any]], seconds: float) -> Table:
    """deploy's summary for people. The detail (why a host failed or was rolled back) wraps inside its
    cell, a long path split where it must be: rich's default cuts a word wider than its column with an
    ellipsis ("removed /etc/systemd/sys…"), so wherever the console's width is fixed (a terminal's, or
    one given for a log) the end of the reason was lost."""
    table = Table(title=f"deploy: {len(rows)} host(s) in {seconds:.1f}s")
    for column in ("host", "state", "changes", "steps (s)"):
        table.add_column(column)
    table.add_column("detail", overflow="fold")
    for row in rows:
        steps = ", ".join(f"{step} {value:g}" + (f" ({row['build_from']})" if step == "build" and row["build_from"]
                                                 else "") for step, value in row["steps_s"].items())
        style = {"ready": "green", "unchanged": "", "rolled back": "yellow"}.get(row["state"], "red")
        table.add_row(row["host"], styled(f"[{style}]{plain(row['state'])}[/{style}]") if style else row["state"],
                      "?" if row["changes"] is None else str(row["changes"]), steps, row["detail"])
    return table


def _fmt(value: Any, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}{unit}"
    return f"{value}{unit}"


def status_problems(found: dict[str, status.HostStatus]) -> list[str]:
    """What is wrong with each host that is not healthy, whole, one line each (under the table)."""
    lines = []
    for name, item in found.items():
        if item.idle is not None:
            lines.append(f"{name}: idle: {item.idle}")
        elif not item.healthy and item.problem:
            lines.append(f"{name}: {item.problem.removeprefix(f'{name}: ')}")
        # A host can serve and still run what the inventory does not declare: said even when healthy.
        lines.extend(f"{name}: drift: {line}" for line in item.drift)
    return lines


STATUS_COLUMNS = ("host", "unit", "restarts", "health", "model @ revision",
                  "GPUs (mem used/total GiB, °C, util, W)", "run/wait", "failed", "tok/s", "KV %",
                  "KV tokens (est.)", "prefix hit %")
# What a person must read of each host; the rest is status --wide's (and --json's) where the whole
# table does not fit the terminal.
STATUS_NARROW = ("host", "unit", "health", "model @ revision", "GPUs (mem used/total GiB, °C, util, W)", "tok/s")


def status_table(found: dict[str, status.HostStatus], title: str, columns: Sequence[str] = STATUS_COLUMNS) -> Table:
    """The hosts, one row each, in `columns` (of STATUS_COLUMNS). No cell is ever cut: a long one wraps
    at its spaces, and a word wider than its column folds onto the next line; the host's name keeps its
    whole width."""
    from provision import status

    table = Table(title=title)
    for column in columns:
        if column == "host":
            table.add_column(column, no_wrap=True, min_width=max(map(len, found), default=4))
        else:
            table.add_column(column, overflow="fold")
    for name, item in found.items():
        if not item.reachable:  # the whole reason goes below the table, not into a narrow last column
            cells: dict[str, Any] = {column: "-" for column in STATUS_COLUMNS}
            cells.update({"host": styled(f"[red]{plain(name)}[/red]"), "unit": styled("[red]unreachable[/red]"),
                          "health": status.short_reason(item.problem or "")})
            table.add_row(*(cells[column] for column in columns))
            continue
        gpus = "; ".join(
            f"{g['name'].replace('NVIDIA ', '')} {_fmt((g['memory_used_mib'] or 0) / 1024)}/"
            f"{_fmt((g['memory_total_mib'] or 0) / 1024)} {_fmt(g['temperature_c'])}° {_fmt(g['utilization_pct'])}%"
            + (f" {g['power_w']:.0f} W" if g.get("power_w") is not None else "")
            + (f" (recorded {g['recorded']})" if g.get("recorded") else "")
            for g in item.gpus) or "-"
        fig = item.figures
        unit = (f"{str(item.unit.get('name', '?')).removesuffix('.service')}: {item.unit.get('active', '?')}"
                + (f" since {item.unit['since']}" if item.unit.get("since") else "")
                + (" (crashed, restarting)" if item.unit.get("crashed") else ""))
        if item.unit.get("installed") is False or item.idle is not None:
            unit = "idle" if item.idle is not None else "not installed"
        colour = ("dim" if item.idle is not None else "red" if not item.healthy
                  else "yellow" if item.drift else "green")
        model = f"{item.model or '-'} @ {item.revision[:12] if item.revision else '-'}"
        row: tuple[str | Text, ...] = (
            styled(f"[{colour}]{plain(name)}[/{colour}]"), unit, _fmt(item.unit.get("restarts")),
            item.health or item.role,
            model if item.role == "server" or item.unit.get("installed") is False
            else f"({item.unit.get('note') or 'Ray worker'})", gpus,
            f"{_fmt(fig.running, digits=0)}/{_fmt(fig.waiting, digits=0)}" if fig else "-",
            _fmt(fig.failed_requests, digits=0) if fig else "-",  # since the server started
            styled(plain(_fmt(fig.generation_tokens_per_s) if fig else "-") + _progress(item.progress)),
            _fmt(fig.kv_cache_usage_pct) if fig else "-", _kv_tokens(item),
            _fmt(fig.prefix_cache_hit_pct) if fig else "-")
        table.add_row(*(cell for column, cell in zip(STATUS_COLUMNS, row, strict=True) if column in columns))
    return table


def _progress(found: stall.Progress | None) -> str:
    """The stuck rule's word beside tokens/s: nothing while it generates or has nothing to do, nor where
    the rule cannot judge the engine (llama.cpp: every such host would carry it; --json says why). Markup,
    for styled()."""
    if found is None or found.state in ("generating", "no requests", "not judged"):
        return ""
    if found.state == "stuck":
        return f" [red]stuck {found.seconds:.0f}s[/red]"
    return f" [yellow]still {found.seconds:.0f}s[/yellow]"  # stalled: still, for less than the window


def _tokens(count: int | None) -> str:
    if count is None:
        return "-"
    return f"{count / 1e6:.2f}M" if count >= 1e6 else f"{count / 1e3:.1f}k" if count >= 1e4 else str(count)


def _kv_tokens(item: status.HostStatus) -> str:
    """The server's KV cache size in tokens, the gate's estimate in brackets."""
    reported = item.figures.kv_capacity_tokens if item.figures else None
    if reported is None and item.kv_estimate_tokens is None:
        return "-"
    return f"{_tokens(reported)} ({_tokens(item.kv_estimate_tokens)})"


def print_bench(host: str, result: Any, concurrency: int, json_: bool) -> None:
    """bench's figures: tokens/s, time to first token, latency and the server's own counters."""
    if json_:
        print(dump_json({"host": host, **result.__dict__}))
        return
    # At most as many at once as there are requests: 1 request is concurrency 1, whatever was asked.
    table = Table(title=f"bench {host}: {result.succeeded}/{result.requests} requests, "
                        f"concurrency {min(concurrency, result.requests)}")
    for column in ("tokens/s", "output tokens", "seconds", "TTFT mean", "TTFT p50", "TTFT p90",
                   "latency p50", "server tokens", "prefix hit %"):
        table.add_column(column)
    table.add_row(_fmt(result.tokens_per_s, digits=2), str(result.output_tokens), _fmt(result.seconds, digits=2),
                  _fmt(result.ttft_mean_s, "s", 3), _fmt(result.ttft_p50_s, "s", 3), _fmt(result.ttft_p90_s, "s", 3),
                  _fmt(result.latency_p50_s, "s", 3), _fmt(result.server_generation_tokens, digits=0),
                  _fmt(result.server_prefix_cache_hit_pct))
    console().print(table)
    for error in result.errors:
        print(f"  error: {error}", file=sys.stderr)


def print_bench_profile(document: Mapping[str, Any], kept: str, json_: bool) -> None:
    """bench --profile: per run its sizes, llama-benchy's tokens/s and time to first token; the cut; the file."""
    from provision.benchrun import rows_of, unmeasured_decode

    rows = rows_of(document)
    note = unmeasured_decode(rows)
    if json_:
        print(dump_json({**document, "file": kept, "summary": rows, "notes": [note] if note else []}))
        return
    out = console()
    profile, tool = document["profile"], document["tool"]
    table = Table(title=f"bench {document['measured']}: profile {profile['name']} with {tool['name']} {tool['version']}",
                  title_justify="left")
    for column in ("run", "pp", "tg", "prefill tok/s", "decode tok/s", "TTFT ms", "s", "exit"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["label"], str(row["pp"]), str(row["tg"]), _fmt(row["pp_tokens_per_s"], digits=1),
                      _fmt(row["tg_tokens_per_s"], digits=1), _fmt(row["ttft_ms"], digits=1),
                      _fmt(row["seconds"], digits=0), str(row["exit"]))
    out.print(table)
    if note:
        out.print(Text(note))
    out.print(Text(f"profile {profile['name']}: {profile['description']}"))
    if document.get("cut"):
        out.print(Text(f"profile {document['cut']}"))
    for key, value in profile.get("changed_by_command_line", {}).items():
        out.print(Text(f"profile arg {key} = {json.dumps(value)} (--arg, not the published profile's)"))
    for item in document["runs"]:
        if item.get("output_tail"):
            out.print(Text(f"{item['label']}: llama-benchy exit {item['exit']}: {' | '.join(item['output_tail'])}"))
    out.print(Text(f"kept in {kept}"))


def status_document(found: Mapping[str, Any], routed: Sequence[Any] = ()) -> dict[str, Any]:
    from provision import status
    return {"hosts": {name: status.as_json(item) for name, item in found.items()},
            "endpoints": {item.name: status.endpoint_json(item) for item in routed},
            # "healthy": every host that should serve does (status's exit 0); "idle": who serves nothing by design.
            "healthy": status.serving_as_declared(found),
            "idle": [name for name, item in found.items() if item.idle is not None],
            "drift": any(item.drift for item in found.values())}


def endpoints_table(routed: Sequence[Any]) -> Table:
    """status: each endpoint's replicas as its router sees them."""
    table = Table(title="endpoints", title_justify="left")
    for column in ("endpoint", "router", "replica", "model", "state", "in flight", "failed (since router start)"):
        table.add_column(column)
    for item in routed:
        if item.error:
            table.add_row(item.name, item.url, "", "", f"router: {item.error}", "", "")
            continue
        for index, replica in enumerate(item.replicas):
            table.add_row(item.name if index == 0 else "", item.url if index == 0 else "",
                          f"{replica['cluster']} ({replica['host']} {replica['address']})", replica["model"],
                          replica["state"], str(replica["in_flight"]), replica_failures(replica.get("failures") or {}))
    return table


def replica_failures(counted: Mapping[str, int]) -> str:
    """A replica's failure counters from its router, in words: "none", or "3 HTTP 5xx, 1 cut"; retries
    (a client never saw them fail) after a semicolon."""
    words = {"http_5xx": "HTTP 5xx", "response_errors": "cut or unreadable", "connection_errors": "refused",
             "server_aborts": "aborted by the server"}
    failed = [f"{counted[key]} {word}" for key, word in words.items() if counted.get(key)]
    retried = counted.get("retried", 0) + counted.get("redispatched", 0)
    return (", ".join(failed) or "none") + (f"; {retried} retried elsewhere" if retried else "")


def status_view(found: Mapping[str, Any], seconds: float, routed: Sequence[Any] = (), width: int = PIPED_WIDTH,
                wide: bool = False) -> Group:
    """The table and, under it, what is wrong with each host, whole; then the endpoints' replicas. All of
    the table's columns where they fit `width` (or `wide`); else STATUS_NARROW's, and a line that says
    which columns `status --wide` adds."""
    drifted = sum(bool(item.drift) for item in found.values())
    idle = sum(item.idle is not None for item in found.values())
    title = (f"status: {sum(item.healthy for item in found.values())}/{len(found) - idle} healthy"
             f"{f', {idle} idle' if idle else ''}"
             f"{f', {drifted} drifted from the inventory' if drifted else ''} ({seconds:.1f}s)")
    lines = [Text(line) for line in status_problems(dict(found))]
    table = status_table(dict(found), title)
    if not wide and Console(width=PIPED_WIDTH).measure(table).maximum > width:
        table = status_table(dict(found), title, STATUS_NARROW)
        left = [column.split(" (")[0] for column in STATUS_COLUMNS if column not in STATUS_NARROW]
        lines.append(Text(f"`{hints.command('status --wide')}` adds {', '.join(left)} (or --json)"))
    return Group(table, *lines, *([endpoints_table(routed)] if routed else []))


def print_status(found: Mapping[str, Any], seconds: float, json_: bool, routed: Sequence[Any] = (),
                 wide: bool = False) -> None:
    """status: one table for the whole cluster (what is wrong, whole, under it), or JSON."""
    if json_:
        print(dump_json(status_document(found, routed)))
        return
    out = console()
    out.print(status_view(found, seconds, routed, out.width, wide))


class StatusScreen:
    """status --watch: on a terminal the table is redrawn in place (rich's Live); piped, each refresh's
    table follows the last; with --json each refresh is one JSON document on one line (JSON Lines), so
    a script reads the refreshes as they come."""

    def __init__(self, json_: bool, wide: bool = False) -> None:
        self.json = json_
        self.wide = wide
        self.console = console()
        self.live: Live | None = None
        if not json_ and self.console.is_terminal:
            self.live = Live(console=self.console, auto_refresh=False, transient=False)

    def start(self) -> None:
        if self.live is not None:
            self.live.start()

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()

    def show(self, found: Mapping[str, Any], seconds: float) -> None:
        if self.json:
            print(json.dumps(status_document(found)), flush=True)
        elif self.live is not None:
            self.live.update(status_view(found, seconds, width=self.console.width, wide=self.wide), refresh=True)
        else:
            self.console.print(status_view(found, seconds, width=self.console.width, wide=self.wide))


def print_answer(answer: Any, prompt: str, json_: bool) -> None:
    """ask: the completion after its prompt, and what it took."""
    if json_:
        print(dump_json({"prompt": prompt, **answer.__dict__}))
        return
    console().print(f"{prompt}{answer.text}", highlight=False, markup=False, soft_wrap=True)
    tokens = "?" if answer.completion_tokens is None else str(answer.completion_tokens)
    print(f"({answer.host}, {answer.model or '?'}: {tokens} tokens in {answer.seconds:.2f}s, "
          f"finish {answer.finish_reason or '?'})", file=sys.stderr)


def print_how_to_query(lines: Iterable[str]) -> None:
    for line in lines:
        console().print(line, highlight=False, markup=False, soft_wrap=True)


# ---------------------------------------------------------------------------------------------
# verify.nccl


def runs_json(order: list[str], runs: dict[str, NcclRun],
              failures: dict[str, BaseException]) -> dict[str, Any]:
    """{"runs": {NAME: NcclRun.as_json()}, "errors": {NAME: "..."}}, NAME a host or the cluster."""
    return {"runs": {name: runs[name].as_json() for name in order if name in runs},
            "errors": {name: error_text(failures[name]) for name in order if name in failures}}


def print_runs(order: list[str], runs: dict[str, NcclRun], failures: dict[str, BaseException]) -> None:
    """A table per test in nccl-tests' columns, after the facts needed to read it."""
    from rich.table import Table

    from provision.nccl import describe_transport, human_size

    out = console()
    for name in order:
        if name in failures:
            text = error_text(failures[name])
            text = text if text.startswith(f"{name}: ") else f"{name}: {text}"
            out.print(styled(f"[red]{plain(text)}[/red]"))
            continue
        result = runs[name]
        devices = ", ".join(f"{count}x {device}" for device, count in _count(result.devices).items())
        out.print(styled(f"[bold]{plain(name)}[/bold]: " + plain(
            f"all-reduce (sum, float) across {result.world_size} GPUs on {len(result.hosts)} node(s) ({devices}); "
            f"torch {result.torch}, NCCL {result.nccl}")))
        out.print(f"  transport: {describe_transport(result.log)}")
        if result.log.nvls_channels is not None:
            out.print(f"  NVLS (NVLink SHARP) channels: {result.log.nvls_channels}")
        if len(result.hosts) > 1 and result.log.network:
            out.print(f"  network between nodes: {result.log.network}")
        for warning in result.log.warnings:
            out.print(styled(f"  [yellow]warning: {plain(warning)}[/yellow]"))
        for host_name, python in result.pythons.items():
            out.print(f"  python on {host_name}: {python}")
        for host_name, env in result.environment.items():
            out.print(f"  environment on {host_name}: "
                      + " ".join(f"{key}={value}" for key, value in env.items()))
        for host_name, reads in result.reads.items():
            if reads:
                out.print(f"  NCCL on {host_name}: " + ", ".join(f"{read.name} {read.verdict}" for read in reads))
        for finding in result.findings:
            out.print(styled(f"  [yellow]finding: {plain(finding)}[/yellow]"))
        table = Table(title_justify="left")
        for column in ("size", "count", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong"):
            table.add_column(column, justify="right")
        for row in result.rows:
            table.add_row(human_size(row.bytes), str(row.count), f"{row.time_us:.1f}",
                          f"{row.algbw_gbs:.2f}", f"{row.busbw_gbs:.2f}",
                          str(row.wrong) if not row.wrong else styled(f"[red]{plain(row.wrong)}[/red]"))
        out.print(table)
        out.print(styled(plain(f"  peak busbw {result.peak_busbw_gbs:.2f} GB/s; busbw = algbw x 2(n-1)/n, n = "
                               f"{result.world_size}") + ("" if not result.wrong else
                                                          f"; [red]{plain(result.wrong)} wrong element(s)[/red]")))
        if result.late:
            sizes = ", ".join(human_size(row.bytes) for row in result.late)
            out.print(styled(f"  [yellow]at {plain(sizes)} the GPU ran ahead of the host queueing the batch: those "
                             "times include the host's pace (try fewer --iters)[/yellow]"))
    sys.stdout.flush()


def _count(items: tuple[str, ...]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return counts


def plans_shower(json_: bool, only: str | None = None) -> Callable[[Planned], None]:
    """What a run shows once it has planned and before it changes anything: the plans (not with --json)."""
    if json_:
        return lambda planned: None
    return lambda planned: print_plans(planned, show_diff=False, only=only)


# ---------------------------------------------------------------------------------------------
# prepare


def prepared_json(result: Prepared) -> dict[str, Any]:
    return {"hosts": {name: result.reports[name].as_json() for name in result.order if name in result.reports},
            "errors": {name: error_text(error) for name, error in result.errors.items()},
            "stopped": result.stopped, "dry_run": result.dry_run, "ok": result.ok}


def preparation_line(item: HostReport, dry_run: bool) -> str:
    """What prepare did on a host, in the host's own account of its steps: a run stopped at the lock
    (or at a failing step) did not do what it planned, and a reboot is said only once it happened."""
    steps = item.prepared.steps() if item.prepared else []
    if not steps:
        return "nothing to change"
    if dry_run:
        return "would: " + "; ".join(steps)
    applied = item.applied
    if applied is None and item.rebooted_s is None:
        return "has: " + "; ".join(steps)  # nothing to apply: what already waits for a reboot
    did = [*(applied.get("done") or [] if applied else []), *(["rebooted"] if item.rebooted_s is not None else [])]
    parts = [f"did: {'; '.join(did)}"] if did else []
    if applied is not None and not applied.get("ok"):
        parts.append(("did not finish: " if did else "did not: ") + "; ".join(steps))
    return "; ".join(parts) or "did nothing: every step was in place"


def print_prepared(result: Prepared, out: Console) -> None:
    """Each host: its preparation plan (or what was done), then the gate before and after, side by side."""
    for name in result.order:
        if name in result.errors:
            out.print(styled(f"[bold]{plain(name)}[/bold]: [red]{plain(error_for(name, result.errors[name]))}[/red]"))
            continue
        item = result.reports.get(name)
        if item is None:
            out.print(styled(f"[bold]{plain(name)}[/bold]: [yellow]not prepared: the roll stopped before its turn[/yellow]"))
            continue
        prepared = item.prepared
        out.print(styled(f"[bold]{plain(name)}[/bold]: {plain(preparation_line(item, result.dry_run))}"))
        for problem in prepared.problems if prepared else ():
            out.print(styled(f"  [red]{plain(problem)}[/red]"))
        if item.applied and item.applied.get("skipped"):
            out.print(f"  skipped: {'; '.join(item.applied['skipped'])}")
        if item.error:
            out.print(styled(f"  [red]{plain(item.error)}[/red]"))
        if item.rebooted_s is not None:
            out.print(f"  rebooted and back in {item.rebooted_s:.0f}s")
        elif item.waiting_for_reboot and not result.dry_run:
            out.print(styled(f"  [yellow]reboot pending: {plain(', '.join(item.waiting_for_reboot))} take effect at "
                             f"the next boot (`{plain(hints.command('prepare --reboot'))}`, or reboot the host "
                             "yourself)[/yellow]"))
        table = Table(title_justify="left")
        for column in ("check", "before", "after", "prepare", "fix"):
            table.add_column(column, overflow="fold")
        after = {f.id: f for f in item.after or []}
        by_rule = prepared.by_rule() if prepared else {}
        for finding in item.before:
            if finding.status == "skip" or (finding.status == "pass" and after.get(finding.id, finding).status == "pass"):
                continue
            now = after.get(finding.id)
            fix = "" if now is not None and now.status == "pass" else (finding.fix or "")
            table.add_row(finding.id, _STATUS_STYLE[finding.status],
                          _STATUS_STYLE[now.status] if now is not None else "-",
                          by_rule.get(finding.id, "manual fix" if finding.status == "fail" else ""), fix)
        if table.row_count:
            out.print(table)
    if result.stopped:
        out.print(styled(f"[red]the roll stopped: {plain(result.stopped)}[/red]"))


def tuned_json(results: Sequence[Any], errors: Mapping[str, BaseException]) -> dict[str, Any]:
    """tune --json: per unit its trials (settings, figures, verdict, spread), the winner with its margin
    over the runner-up and the noise, the workload measured (fitted to the served context), the budget,
    the file, the plot."""
    units = {}
    for result in results:
        slo = result.slo
        units[result.unit.name] = {
            "hosts": list(result.unit.hosts), "workload": parsers.json_ready(result.workload),
            "workload_asked": parsers.json_ready(result.asked), "fit": result.fit,
            "slo": parsers.json_ready(slo), "interrupted": result.interrupted, "final": result.final, "ok": result.ok,
            "budget_s": result.budget_s, "seconds": result.seconds, "stopped": result.stopped,
            "winner": dict(result.winner.settings) if result.winner else None,
            "tokens_per_s": result.winner.score(slo) if result.winner else None,
            "decision": result.decision.as_json(slo) if result.decision else None,
            "tuned_file": next(iter(result.tuned_files), None), "tuned_files": result.tuned_files, "recipe_file": result.recipe_file, "diff": result.diff,
            "plot": result.plot,
            "trials": [{**parsers.json_ready(trial), "verdict": trial.verdict(slo), "score": trial.score(slo),
                        "spread": trial.spread(slo)} for trial in result.trials]}
    return {"units": units, "errors": {name: error_text(error) for name, error in errors.items()}}


def print_tuned(results: Sequence[Any], errors: Mapping[str, BaseException], out: Console) -> None:
    """tune: a table of trials per unit (settings, tokens/s, TTFT p50/p95, ITL p95, verdict), then what was kept."""
    from provision.tune_rules import margin_words
    for result in results:
        slo = result.slo
        table = Table(title=f"tune {result.unit.name}: {len(result.trials)} trial(s), workload "
                            f"{result.workload.name}" + (f" ({result.interrupted})" if result.interrupted else ""))
        for column in ("#", "settings", "tokens/s", "at c=", "TTFT p50", "TTFT p95", "ITL p95", "s", "verdict"):
            table.add_column(column)
        for number, trial in enumerate(result.trials, 1):
            best = trial.best(slo) or (max(trial.levels, key=lambda lv: lv.tokens_per_s) if trial.levels else None)
            chosen = result.winner is not None and trial.key == result.winner.key
            mark = "[green]*[/green]" if chosen else ""  # markup, for styled()
            verdict = trial.verdict(slo) + (" (kept from an earlier run)" if trial.resumed else "")
            table.add_row(styled(f"{number}{mark}"), _describe_settings(trial.settings),
                          _fmt(best.tokens_per_s) if best else "-", str(best.concurrency) if best else "-",
                          _fmt(best.ttft_p50_s, "s", 3) if best else "-", _fmt(best.ttft_p95_s, "s", 3) if best else "-",
                          _fmt(best.itl_p95_s, "s", 4) if best else "-", _fmt(trial.seconds, digits=0),
                          verdict[:160])
        out.print(table)
        if result.fit:
            out.print(f"workload: {result.fit}")
        if result.stopped:
            out.print(styled(f"[yellow]budget ({(result.budget_s or 0) / 60:g} min, {result.seconds:.0f} s used): "
                             f"{plain(result.stopped)}[/yellow]"))
        if result.decision is not None:
            out.print(f"decision: {result.decision.note}")
            if result.winner is not None:
                out.print(f"margin: {margin_words(result.decision, slo)}")
        if result.tuned_files:
            out.print(f"kept in {', '.join(result.tuned_files)}" + ("" if result.diff else " (unchanged)"))
        if result.recipe_file:
            out.print(f"the winner as a recipe: {result.recipe_file} (`recipe.show`, `recipe.apply`, `recipe.export` "
                      "take its path)")
        elif not result.winner:
            out.print("no trial passed: nothing kept")
        if result.plot:
            out.print(f"plot: {result.plot}")
        out.print(f"{result.unit.name} {result.final}")
    for name, error in errors.items():
        out.print(styled(f"[red]{plain(name)}: {plain(error_text(error).removeprefix(name + ': '))}[/red]"))


def _describe_settings(settings: Mapping[str, Any]) -> str:
    return ", ".join(f"{name}={value}" for name, value in settings.items()) or "(as it was)"


def init_json(done: Any) -> dict[str, Any]:
    """`init --json`: done is a starter.Initialized."""
    return {"output": done.output, "written": done.text is not None, "why_not": done.why_not,
            "hosts": {name: done.starters[name].as_json() for name in done.order if name in done.starters},
            "errors": {name: error_text(done.errors[name]) for name in done.order if name in done.errors}}


def print_init(done: Any, out: Console) -> None:
    for name in done.order:
        if name in done.errors:
            out.print(styled(f"{plain(name)}: [red]{plain(error_text(done.errors[name]))}[/red]"))
            continue
        item = done.starters[name]
        out.print(f"{name}: found {item.facts_summary}")
        out.print(f"  profile: {item.choice.reason}")
        if item.suggestion is not None:
            chosen = (f"{item.suggestion.model}, max_model_len {item.suggestion.max_model_len}: "
                      if item.suggestion.model else "")
            out.print(f"  model: {chosen}{item.suggestion.reason}")
    if done.text is None:
        out.print(styled(f"[red]{plain(done.why_not)}[/red]"))
    else:
        out.print(f"wrote {done.output}; next: `{hints.command(f'inventory --inventory {done.output}')}`")


def _figure_text(recipe: Recipe) -> str:
    from provision.recipes import NOT_MEASURED

    return "; ".join(f"{figure.metric} {figure.value:g} {figure.unit} ({figure.kind})"
                     for figure in recipe.figures) or NOT_MEASURED


def recipe_json(recipe: Recipe) -> dict[str, Any]:
    from provision.recipes import to_mapping

    return {**to_mapping(recipe), "inventory_vars": _jsonable(recipe.inventory_vars())}


def _jsonable(values: Mapping[str, Any]) -> dict[str, Any]:
    return {key: list(value) if isinstance(value, tuple) else value for key, value in values.items()}


def fit_json(gated: Gated) -> dict[str, Any]:
    """A recipe judged on one host: the gate's verdict (or the host's error) and its memory finding."""
    host = gated.order[0]
    if host in gated.errors:
        return {"host": host, "verdict": None, "error": error_text(gated.errors[host]), "memory": None}
    findings = gated.findings[host]
    memory = next((finding for finding in findings if finding.id == "memory.fits"), None)
    return {"host": host, "verdict": verdict(findings), "error": None,
            "blockers": [finding.id for finding in findings if finding.blocks],
            "memory": finding_json(memory) if memory is not None else None}


def _fit_text(gated: Gated) -> str:
    fit = fit_json(gated)
    if fit["error"]:
        return f"error: {fit['error']}"
    memory = fit["memory"]
    blockers = [name for name in fit["blockers"] if name != "memory.fits"]
    return "; ".join([fit["verdict"], *([f"memory: {memory['message']}"] if memory else []),
                      *([f"blocked by {', '.join(blockers)}"] if blockers else [])])


def print_recipes(recipes: Sequence[Recipe], out: Console, host: str | None = None,
                  fitted: Mapping[str, Gated] | None = None, origins: Mapping[str, str] | None = None) -> None:
    """One row a recipe; `origins`: where each comes from (shipped, or a registry at its commit)."""
    if not recipes:
        out.print("recipes: none for this profile")
        return
    table = Table(title="recipes", title_justify="left")
    columns = ("name", *(["from"] if origins else []), "profile", "gpus", "nodes", "model", "engine", "figures",
               *([f"on {host}"] if fitted is not None else []))
    for column in columns:
        table.add_column(column, overflow="fold")
    rows = [(recipe.name, *([origins.get(recipe.name, "")] if origins else []), recipe.hardware.profile,
             str(recipe.hardware.gpus), str(recipe.hardware.nodes), recipe.model,
             f"{recipe.engine} {recipe.engine_version or '(version not given)'}", _figure_text(recipe),
             *([_fit_text(fitted[recipe.name])] if fitted is not None else [])) for recipe in recipes]
    for row in rows:
        table.add_row(*row)
    if Console(width=PIPED_WIDTH).measure(table).maximum <= out.width:
        out.print(table)
    else:  # narrower than the table: one recipe a block, its name (what recipe.show takes) whole on its line
        out.print(Text("recipes", style="italic"))
        for name, *values in rows:
            out.print(Text(name, style="bold"))
            out.print(Text("; ".join(f"{column} {value}" for column, value in zip(columns[1:], values, strict=True)),
                           overflow="fold"))
    if fitted is not None:
        out.print(Text(f"on {host}: the gate with each recipe's settings; the venv's wheels are not resolved for a "
                       f"list (`{hints.command(f'recipe.show NAME --host {host}')}` resolves them)"))


def registry_recipe_json(item: Listed) -> dict[str, Any]:
    """Where a registry's recipe was read: the registry, its URL, the commit and the file."""
    return {"registry": item.registry.name, "url": item.registry.url, "commit": item.registry.commit,
            "path": item.path}


def registry_json(contents: Contents) -> dict[str, Any]:
    """One registry: where it is, the commit its recipes were read at, and what its files became."""
    registry = contents.registry
    return {"name": registry.name, "url": registry.url, "commit": registry.commit, "updated": registry.updated,
            "recipes": [item.recipe.name for item in contents.recipes],
            "refused": [{"path": path, "why": why} for path, why in contents.refused],
            "not_recipes": [{"path": path, "why": why} for path, why in contents.not_recipes]}


def print_registries(everything: Sequence[Contents], out: Console) -> None:
    if not everything:
        out.print(Text(f"registries: none added (`{hints.command('registry.add URL')}`)"))
        return
    table = Table(title="recipe registries", title_justify="left")
    for column in ("name", "url", "commit", "updated", "recipes", "refused", "not recipes"):
        table.add_column(column, overflow="fold")
    for contents in everything:
        registry = contents.registry
        table.add_row(registry.name, registry.url, registry.commit[:12], registry.updated,
                      str(len(contents.recipes)), str(len(contents.refused)), str(len(contents.not_recipes)))
    out.print(table)
    for contents in everything:
        for path, why in contents.refused:
            out.print(Text(f"{contents.registry.name}: {path} refused: {why}"))


def print_hidden_experimental(hidden: int, task: str, out: Console) -> None:
    """Below a recipe list: how many of the registries' experimental recipes it leaves out, and the
    command line (`task`, the list's own options and --all) that lists them."""
    out.print(Text(f"{hidden} experimental recipe(s) of the registries not listed "
                   f"(`{hints.command(task)}` lists them)"))


def print_registry_counts(contents: Contents, out: Console) -> None:
    """Below a recipe list: what of a registry's files is not in it."""
    if contents.refused:
        out.print(Text(f"registry {contents.registry.name} at {contents.registry.commit[:12]}: "
                       f"{len(contents.refused)} recipe file(s) refused, not listed "
                       f"(`{hints.command('registry.list')}` says why)"))


def update_json(result: Updated | RecipeError) -> dict[str, Any]:
    if isinstance(result, RecipeError):
        return {"error": result.message}
    return {"name": result.registry.name, "url": result.registry.url, "before": result.before,
            "commit": result.registry.commit, "unchanged": result.unchanged,
            "changed": [{"status": status, "path": path} for status, path in result.changed]}


def print_updates(results: Sequence[Updated | RecipeError], out: Console) -> None:
    for result in results:
        if isinstance(result, RecipeError):
            out.print(styled(f"[red]error:[/red] {plain(result.message)}"))
            continue
        registry = result.registry
        if result.unchanged:
            out.print(Text(f"{registry.name}: unchanged at {registry.commit[:12]}"))
            continue
        out.print(Text(f"{registry.name}: {result.before[:12]} -> {registry.commit[:12]}, "
                       f"{len(result.changed)} recipe file(s) changed"))
        for status, path in result.changed:
            out.print(Text(f"  {status} {path}"))


def print_recipe(recipe: Recipe, out: Console, host: str | None = None, gated: Gated | None = None) -> None:
    """One recipe: what it is, the settings as an inventory's vars, the hardware, every figure and where
    it comes from."""
    hardware = recipe.hardware
    memory = f"{hardware.gpu_memory_gib:g} GiB a GPU" if hardware.gpu_memory_gib else "GPU memory: none given (unified, or no GPU)"
    out.print(Text(f"recipe {recipe.name}: {recipe.description}"))
    out.print(Text(f"  model {recipe.model} at {recipe.revision}; engine {recipe.engine} "
                   f"{recipe.engine_version or '(version not given)'}"))
    out.print(Text(f"  hardware: profile {hardware.profile}, {hardware.gpus} GPU(s) a node, {hardware.nodes} "
                   f"node(s), {memory}"))
    out.print(Text(f"  source: {recipe.source}"))
    out.print(Text("  settings (an inventory's vars):"))
    for key, value in recipe.inventory_vars().items():
        out.print(Text(f"    {key}: {json.dumps(list(value) if isinstance(value, tuple) else value)}"))
    if not recipe.figures:
        out.print(Text("  figures: not measured here"))
    for figure in recipe.figures:
        origin = (f"measured: {figure.how}; benchmark {figure.benchmark}, {figure.date}, {figure.tool}"
                  if figure.kind == "measured" else f"cited: {figure.where}")
        out.print(Text(f"  figure {figure.metric}: {figure.value:g} {figure.unit} ({origin})"))
    for note in recipe.notes:
        out.print(Text(f"  note: {note}"))
    if gated is not None:
        out.print(Text(f"  on {host}: {_fit_text(gated)}"))


def application_json(application: Application, gated: Gated, passed: bool, written: bool) -> dict[str, Any]:
    """The stable shape of `recipe.apply --json`: the file, whether it was written, the gate's answer
    (check's shape), and per host each changed setting and each the recipe sets that a higher layer keeps."""
    return {"recipe": application.recipe.name, "cluster": application.cluster, "file": str(application.path),
            "written": written, "unchanged": application.unchanged, "gate_passed": passed,
            "diff": application.diff, "notes": list(application.notes), "dropped": list(application.dropped),
            "changes": {host: [{"key": change.key, "before": _plain_deep(change.before),
                                "after": _plain_deep(change.after), "from": change.origin} for change in changes]
                        for host, changes in application.changes.items()},
            "kept": {host: [{"key": kept.key, "recipe": _plain_deep(kept.recipe_value), "value": _plain_deep(kept.value),
                             "from": kept.origin} for kept in items] for host, items in application.kept.items()},
            "gate": check_json(gated.order, gated.findings, gated.errors)}


def print_application(application: Application, gated: Gated, passed: bool, dry_run: bool,
                      inventory_option: str, out: Console) -> None:
    """What applying the recipe changes on each host, what a higher layer keeps, the gate's verdict on
    the cluster's hosts, and what became of the file."""
    out.print(Text(f"recipe {application.recipe.name} on cluster {application.cluster}"))
    for host, changes in application.changes.items():
        table = Table(title=f"{host}: settings that change", title_justify="left")
        for column in ("setting", "now", "applied", "from"):
            table.add_column(column, overflow="fold")
        for change in changes:
            table.add_row(change.key, json.dumps(_plain_deep(change.before)), json.dumps(_plain_deep(change.after)),
                          change.origin)
        out.print(table if changes else Text(f"{host}: no setting changes"))
        for kept in application.kept.get(host, ()):
            out.print(Text(f"  kept: {kept.key} stays {json.dumps(_plain_deep(kept.value))} ({kept.origin}; the "
                           f"recipe's {json.dumps(_plain_deep(kept.recipe_value))})"))
    for note in application.notes:
        out.print(Text(f"note: {note}"))
    for what in application.dropped:
        out.print(Text(f"not carried: {what}"))
    print_check(gated.order, gated.findings, gated.errors, out)
    path = application.path
    if not passed:
        out.print(Text(f"not written: the gate refused a host of {application.cluster} (above); {path} is as it was"))
    elif application.unchanged:
        out.print(Text(f"{path}: unchanged (the recipe is applied already)"))
    else:
        out.print(Text(application.diff.rstrip("\n")))
        deploy = f"deploy --cluster {application.cluster}{' ' + inventory_option if inventory_option else ''}"
        out.print(Text(f"{'would write' if dry_run else 'wrote'} {path}; next: `{hints.command(deploy)}`"))


def imported_json(imported: Imported) -> dict[str, Any]:
    return {"source": imported.source, "refused": imported.refused or None,
            "placeholders": dict(imported.placeholders), "unknown_placeholders": list(imported.unknown),
            "not_carried": [{"what": what, "why": why} for what, why in imported.not_carried],
            "command": list(imported.command),
            "recipe": recipe_json(imported.recipe) if imported.recipe is not None else None}


def print_imported(imported: Imported, out: Console) -> None:
    """What a registry file became: its command as expanded, the settings, and what was not carried."""
    out.print(Text(f"{imported.source}:"))
    if imported.command:
        out.print(Text(f"  command, expanded: {' '.join(imported.command)}"))
    for name in imported.unknown:
        out.print(Text(f"  placeholder {{{name}}}: defined nowhere in the recipe"))
    for what, why in imported.not_carried:
        out.print(Text(f"  not carried: {what}: {why}"))
    if imported.recipe is not None:
        out.print(Text("  settings (an inventory's vars):"))
        for key, value in imported.recipe.inventory_vars().items():
            out.print(Text(f"    {key}: {json.dumps(list(value) if isinstance(value, tuple) else value)}"))
        for note in imported.recipe.notes[1:]:  # the first lists what was not carried, shown above
            out.print(Text(f"  note: {note}"))
    else:
        out.print(Text(f"  not imported: {imported.refused}"))


def print_imports(results: Sequence[Imported], skipped: Sequence[str], out: Console) -> None:
    """A registry checkout's recipes, one row each."""
    table = Table(title="Spark Arena recipes", title_justify="left")
    for column in ("file", "imported", "not carried"):
        table.add_column(column)
    for imported in results:
        state = "yes" if imported.recipe is not None else f"no: {imported.refused}"
        table.add_row(imported.source, state, str(len(imported.not_carried)))
    out.print(table)
    for line in skipped:
        out.print(Text(f"not read: {line}"))


def print_metrics(scrape: Any, done: Any, json_: bool) -> None:
    """`metrics`: the targets (provision/metrics.py Scrape), and what --apply did (prometheus.Applied, or
    None)."""
    from provision import prometheus

    if json_:
        document = prometheus.targets_json(scrape)
        if done is not None:
            document["applied"] = prometheus.applied_json(done)
        print(dump_json(document))
        return
    out = console()
    where = scrape.prometheus
    title = (f"Prometheus on {where.host} ({where.bind_host}:{where.port}, {where.retention}, every "
             f"{where.scrape_interval})" if where.manage else
             f"a site's Prometheus on {where.host}: targets in {where.targets_dir}")
    table = Table(title=title, title_justify="left")
    for column in ("job", "target", "scraped at", "labels", "key"):
        table.add_column(column)
    for target in scrape.targets:
        labels = ", ".join(f"{k}={v}" for k, v in target.labels.items() if k != "host")
        table.add_row(target.job, target.host, "-" if target.unreachable else f"{target.address}{target.path}",
                      labels, "yes" if target.keyed else "")
    out.print(table)
    for target in scrape.unreachable:
        out.print(f"not reachable: {target.host} ({target.job}): {target.unreachable}", markup=False, soft_wrap=True)
    for line in scrape.not_scraped:
        out.print(f"not scraped: {line}", markup=False, soft_wrap=True)
    if done is None:
        if not where.manage:
            out.print(f"A site's own Prometheus reads the targets from {where.targets_dir} with the scrape configs "
                      f"`{hints.command('metrics --json')}` lists (scrape_configs).", markup=False, soft_wrap=True)
        out.print(f"`{hints.command('metrics --apply')}` asks the hosts which exporters they run, and writes the "
                  f"targets on {where.host}.", markup=False, soft_wrap=True)
        return
    for line in done.unknown:
        out.print(f"exporters not known: {line}", markup=False, soft_wrap=True)
    for host, why in done.textfiles.items():
        out.print(f"{host}: node-exporter's textfile " + (f"not written: {why}" if why else "written"),
                  markup=False, soft_wrap=True)
    for line in done.planned:
        out.print(line, markup=False, soft_wrap=True)
    if done.error:
        print(f"{done.host}: {done.error}", file=sys.stderr)
        return
    out.print(f"{done.host}: " + (f"{len(done.written)} file(s) written, Prometheus {done.action or 'unchanged'}"
                                  if done.written or done.action else "no changes"), markup=False)
    if done.health:
        health = Table(title=f"{done.host}: Prometheus's view of its targets", title_justify="left")
        for column in ("job", "instance", "host", "health", "last error"):
            health.add_column(column)
        for item in done.health:
            health.add_row(item["job"], item["instance"], item["host"], item["health"], item["error"] or "")
        out.print(health)
