"""The everyday tasks: deploy (rolling, health-gated), status, bench and logs.

deploy = provision's facts, gate and plan; then, for all hosts at once, what restarts nothing (wheels,
the fetch helper, the weights); then the rest host by host (or `--batch N` at a time): apply, wait
for /health and a real one-token completion. A host that does not become ready is rolled back to what
it ran before (the files this deploy wrote, the venv, the model revision), and the roll stops: the
hosts after it are left as they were. Multi-node clusters roll as one: every node's units, then Ray
must see every node before vLLM starts on the head.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from invoke import Context, task
from invoke.exceptions import Exit
from rich.table import Table

from provision import inventory, ops, plan, remote, report, secrets, server, status, weights
from provision.render import RAY_PORT
from provision.errors import ProvisionError
from provision.fanout import for_each_host
from provision.tasks import (secret_environment, HOST_TASK_HELP, Bar, Connect, HostPlan, _help, _load, _plans, _profile,
                             _report_plans, _setup_logging, carry_out, guarded, remaining)

class RollStopped(ProvisionError):
    """A host was not ready after its change: rolled back, and the roll went no further."""


@dataclass
class Outcome:
    host: str
    state: str = "unchanged"  # unchanged | ready | rolled back | failed | not rolled
    ready_s: float | None = None
    detail: str = ""
    steps: dict[str, float] = field(default_factory=dict)


def _batches(order: list[str], inv: inventory.Inventory, size: int) -> list[list[str]]:
    """Single hosts `size` at a time; a multi-node cluster is one batch of its own (head last)."""
    batches: list[list[str]] = []
    loose: list[str] = []
    seen: set[str] = set()
    for name in order:
        cluster = inv.cluster_of(name)
        if cluster and cluster.multi_node:
            if cluster.name not in seen:
                seen.add(cluster.name)
                members = [h for h in cluster.hosts if h in order]
                batches.append(sorted(members, key=lambda h: h == cluster.head))
            continue
        loose.append(name)
    for index in range(0, len(loose), max(1, size)):
        batches.append(loose[index:index + max(1, size)])
    return batches


def _ray_nodes(runner: remote.Runner, venv_dir: str, head_address: str, expected: int, timeout: float) -> int:
    """Live nodes of the Ray cluster as `ray status` on the head reports them, waiting up to
    `timeout` for all of them to join."""
    deadline = time.monotonic() + timeout
    while True:
        done = runner.run([f"{venv_dir.rstrip('/')}/bin/ray", "status", f"--address={head_address}:{RAY_PORT}"],
                          timeout=60)
        nodes = status.parse_ray_status(done.stdout) if done.ok else 0
        if nodes >= expected or time.monotonic() > deadline:
            return nodes
        time.sleep(3)


def rolling(inv: inventory.Inventory, plans: dict[str, HostPlan], overrides: dict[str, Any], held: secrets.Secrets,
            batch: int, timeout: float, wait: float, outcomes: dict[str, Outcome]) -> Callable[..., Any]:
    """The last step of carry_out for deploy: apply batch after batch, each gated on readiness."""

    def final(names: list[str], connect: Connect, bar: Bar) -> tuple[dict[str, int], dict[str, BaseException]]:
        done: dict[str, int] = {}
        errors: dict[str, BaseException] = {}
        for group in _batches(names, inv, batch):
            if errors:
                for name in group:
                    outcomes[name].state = "not rolled"
                    outcomes[name].detail = "the roll stopped before this host"
                continue
            failed = _roll_one(group, inv, plans, overrides, held, timeout, wait, connect, bar, done, outcomes)
            errors.update(failed)
        return done, errors

    return final


def _roll_one(group: list[str], inv: inventory.Inventory, plans: dict[str, HostPlan], overrides: dict[str, Any],
              held: secrets.Secrets, timeout: float, wait: float, connect: Connect, bar: Bar,
              done: dict[str, int], outcomes: dict[str, Outcome]) -> dict[str, BaseException]:
    """Apply a batch (each host's changes become a pending generation), wait for readiness, then promote
    every generation the batch made, or reject them all: each host gets back its last good one."""
    cluster = inv.cluster_of(group[0])
    multi = bool(cluster and cluster.multi_node)
    held_back: dict[str, list[plan.Change]] = {}
    made: dict[str, int] = {}

    def apply(name: str) -> int:
        changes = remaining(plans[name])
        if multi and cluster and name == cluster.head:  # vLLM starts only once Ray sees every node
            held_back[name] = [c for c in changes if c.target == "vllm.service" and c.kind in ("start", "restart")]
            changes = [c for c in changes if c not in held_back[name]]
        started = time.monotonic()
        count = 0
        if changes:
            outcome = ops.apply(connect(name), changes, wait=wait, scope=plans[name].scope, by="deploy", verify=True,
                                deadline=timeout + (150 if multi else 30), secrets=secret_environment(held),
                                model_changed=bool(plans[name].of_kind("weights")))
            count = len(outcome.done)
            if outcome.generation is not None:
                made[name] = outcome.generation
        outcomes[name].steps["apply"] = round(time.monotonic() - started, 2)
        return count

    applied = for_each_host(group, lambda name: name, apply)
    done.update(applied.values)
    errors: dict[str, BaseException] = dict(applied.errors)
    if not errors and multi and cluster:
        head = cluster.head
        settings = inv.settings(head, overrides)
        ray_timeout = min(timeout, 120.0)  # nodes join within seconds; a missing one will not
        address = plans[head].cluster_address or inv.host(head).address
        nodes = _ray_nodes(connect(head), settings.venv_dir, address, len(cluster.hosts), ray_timeout)
        if nodes < len(cluster.hosts):
            errors[head] = RollStopped(
                f"{head}: Ray sees {nodes} of {len(cluster.hosts)} nodes; vLLM not started (check the "
                "workers: `invoke status`, `invoke logs --host NODE --unit vllm-ray-worker`)")
        elif held_back.get(head):  # part of the head's generation: promote records the units as they run
            done[head] = done.get(head, 0) + len(ops.apply(connect(head), held_back[head], wait=wait).done)
    servers = [name for name in group if not (multi and cluster and name != cluster.head)]
    for name in servers if not errors else []:
        settings = inv.settings(name, overrides)
        update = bar(f"{name}: waiting for /health and a completion")
        started = time.monotonic()
        try:
            outcomes[name].ready_s = server.wait_ready(
                connect(name), settings, held.vllm_api_key, timeout,
                lambda event: update(int(event.get("elapsed", 0)), int(timeout)))
            outcomes[name].state = "ready"
        except ProvisionError as exc:
            errors[name] = exc
        outcomes[name].steps["ready"] = round(time.monotonic() - started, 2)
    for name, number in sorted(made.items()) if not errors else []:
        try:  # "ready" must be about what this run applied: refused if another run changed the host since
            ops.promote(connect(name), number, plans[name].scope, wait=wait)
        except ProvisionError as exc:
            errors[name] = exc
            outcomes[name].state = "failed"
    if errors:
        cause = "; ".join(report.error_text(error) for error in errors.values())
        for name in group:
            if name in made:
                _roll_back(name, made[name], plans, held, wait, connect, errors, outcomes, cause)
    return errors


def _roll_back(name: str, generation: int, plans: dict[str, HostPlan], held: secrets.Secrets, wait: float,
               connect: Connect, errors: dict[str, BaseException], outcomes: dict[str, Outcome], cause: str) -> None:
    """Reject what this deploy applied on the host; it gets back its newest good generation whole (files,
    venv, model, each unit enabled and running exactly as it was)."""
    outcome = outcomes[name]
    own = report.error_text(errors[name]).removeprefix(name + ": ") if name in errors else cause
    try:
        back = ops.reject(connect(name), generation, plans[name].scope, own, wait=wait,
                          secrets=secret_environment(held))
        if back.to is None:  # another run's generation is current: that is what the host holds now
            outcome.detail = f"{own}; generation {generation} rejected, the host keeps what the other run applied"
            outcome.state = "superseded"
        else:
            what = ", ".join(back.restored) or "nothing differed"
            outcome.detail = f"{own}; rolled back to generation {back.to} ({what})"
            outcome.state = "rolled back"
    except ProvisionError as exc:
        outcome.state = "failed"
        outcome.detail = f"{own}; the rollback failed too: {report.error_text(exc)}"
    errors[name] = RollStopped(f"{name}: {outcome.detail}; the roll stopped here")


@task(auto_shortflags=False, name="deploy",
      help={**HOST_TASK_HELP, "batch": "hosts restarted at a time (default 1; a multi-node cluster is one step)",
            "timeout": "seconds a host may take to answer /health and a completion (default 600)",
            "wait": "seconds to wait for another run's lock on a host"},
      iterable=["host", "set_", "force"])
@guarded
def deploy(c: Context, host: list[str] | None = None, cluster: str | None = None, all_: bool = False,
           inventory_: str | None = None, json_: bool = False, accept_new_host_keys: bool = False,
           profile: str | None = None, set_: list[str] | None = None, force: list[str] | None = None,
           batch: int = 1, timeout: float = 600, wait: float = 0, verbose: bool = False) -> None:
    """Bring hosts to the inventory's state without taking them all down: rolling, gated on readiness."""
    _setup_logging(verbose)
    inv = _load(inventory_)
    overrides = inventory.parse_overrides(set_ or [])
    targets = inv.select(hosts=host or [], cluster=cluster, everything=all_ or not (host or cluster))
    held = secrets.load(inv.secrets)
    started = time.monotonic()
    outcomes: dict[str, Outcome] = {}
    timings: dict[str, dict[str, float]] = {}
    with remote.Pool(inv.ssh, accept_new_host_keys=accept_new_host_keys) as pool:
        plans, findings, errors = _plans(inv, targets, overrides, _profile(profile), accept_new_host_keys,
                                         force or [], may_build=True, pool=pool)
        order = [target.name for target in targets]
        if not json_:
            _report_plans(order, plans, findings, errors, show_diff=False)
        outcomes.update({name: Outcome(name) for name in order})
        applied, failed, fetched = carry_out(inv, plans, order, accept_new_host_keys, wait, held, quiet=json_,
                                             final=rolling(inv, plans, overrides, held, batch, timeout, wait,
                                                           outcomes),
                                             timings=timings, pool=pool)
        errors.update(failed)
        _gate_unchanged(inv, order, plans, overrides, held, timeout, pool, outcomes, errors)
    for name, outcome in outcomes.items():
        outcome.steps = {**timings.get(name, {}), **outcome.steps}
        if name in errors and outcome.state in ("unchanged", "ready"):
            outcome.state, outcome.detail = "failed", report.error_text(errors[name])
        elif name not in plans and name not in errors:
            outcome.state, outcome.detail = "blocked", "blocked by the gate, nothing changed"
    _summary(order, plans, outcomes, applied, fetched, errors, time.monotonic() - started, json_)
    if not json_:
        scope = f"--cluster {cluster}" if cluster else " ".join(f"--host {name}" for name in order)
        for name in order:
            if outcomes[name].state == "ready":
                for line in server.how_to_query(name, inv.host(name).address, inv.settings(name, overrides),
                                                bool(held.vllm_api_key), scope):
                    report.console().print(line, highlight=False, markup=False, soft_wrap=True)
    if errors or len(plans) < len(order):
        raise Exit(code=1)


def _gate_unchanged(inv: inventory.Inventory, order: list[str], plans: dict[str, HostPlan],
                    overrides: dict[str, Any], held: secrets.Secrets, timeout: float, pool: remote.Pool,
                    outcomes: dict[str, Outcome], errors: dict[str, BaseException]) -> None:
    """A server this deploy did not touch still has to answer: the declared state is a served model,
    not only files (right after a provision the server may still be loading). Nothing to roll back."""
    for name in order:
        if name not in plans or name in errors or outcomes[name].state != "unchanged" or _role(inv, name) != "server":
            continue
        settings = inv.settings(name, overrides)
        if not settings.model:
            continue
        started = time.monotonic()
        runner = pool.connect(inv.host(name))
        unfinished = plans[name].unfinished
        try:
            outcomes[name].ready_s = server.wait_ready(runner, settings, held.vllm_api_key, timeout)
            outcomes[name].state, outcomes[name].detail = "ready", "unchanged; answers /health and a completion"
            if unfinished:  # an earlier deploy stopped before its verdict: this run gives it
                ops.promote(runner, unfinished["id"], plans[name].scope)
                outcomes[name].detail = (f"generation {unfinished['id']}, left unfinished by a deploy of "
                                         f"{unfinished['created']}, answers: promoted to last-known-good")
        except ProvisionError as exc:
            errors[name] = exc
            outcomes[name].detail = report.error_text(exc)
            if unfinished:
                _roll_back(name, unfinished["id"], plans, held, 0, lambda host: pool.connect(inv.host(host)),
                           errors, outcomes, outcomes[name].detail)
        outcomes[name].steps["ready"] = round(time.monotonic() - started, 2)


def _summary(order: list[str], plans: dict[str, HostPlan], outcomes: dict[str, Outcome], applied: dict[str, int],
             fetched: dict[str, weights.FetchResult], errors: dict[str, BaseException], seconds: float,
             json_: bool) -> None:
    rows = []
    for name in order:
        outcome = outcomes[name]
        changes = plans[name].changes if name in plans else []
        rows.append({"host": name, "state": outcome.state, "changes": applied.get(name, 0),
                     "planned": [c.describe() for c in changes], "steps_s": outcome.steps,
                     "ready_s": outcome.ready_s, "weights_from": fetched[name].source if name in fetched else None,
                     "detail": outcome.detail or (report.error_text(errors[name]) if name in errors else "")})
    if json_:
        print(report.dump_json({"hosts": rows, "seconds": round(seconds, 2), "ok": not errors}))
        return
    table = Table(title=f"deploy: {len(order)} host(s) in {seconds:.1f}s")
    for column in ("host", "state", "changes", "steps (s)", "detail"):
        table.add_column(column)
    for row in rows:
        steps = ", ".join(f"{step} {value:g}" for step, value in row["steps_s"].items())
        style = {"ready": "green", "unchanged": "", "rolled back": "yellow"}.get(row["state"], "red")
        table.add_row(row["host"], f"[{style}]{row['state']}[/{style}]" if style else row["state"],
                      str(row["changes"]), steps, row["detail"])
    report.console().print(table)


# ---------------------------------------------------------------------------------------------
# status


def _role(inv: inventory.Inventory, name: str) -> str:
    cluster = inv.cluster_of(name)
    return "worker" if cluster and cluster.multi_node and name != cluster.head else "server"


def gather_status(inv: inventory.Inventory, targets: list[inventory.Host], overrides: dict[str, Any],
                  held: secrets.Secrets, window: float, timeout: float) -> dict[str, status.HostStatus]:
    def one(name: str) -> status.HostStatus:
        target = inv.host(name)
        ssh = inventory.SshSettings(**{**inv.ssh.__dict__, "connect_timeout": min(inv.ssh.connect_timeout, timeout)})
        runner = remote.connect(target, ssh)
        try:
            return status.gather_one(runner, name, _role(inv, name), inv.settings(name, overrides),
                                     held.vllm_api_key, window, timeout)
        finally:
            runner.close()

    return status.with_deadline([t.name for t in targets], one, timeout + window + 2,
                                lambda name, why: status.unreachable(name, _role(inv, name), why))


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
        if item.healthy or not item.problem:
            continue
        text = item.problem.removeprefix(f"{name}: ")
        lines.append(f"{name}: {text}")
    return lines


def status_table(found: dict[str, status.HostStatus], title: str) -> Table:
    table = Table(title=title)
    for column in ("host", "unit", "restarts", "health", "model @ revision", "GPUs (mem used/total GiB, °C, util)",
                   "run/wait", "tok/s", "KV %", "prefix hit %"):
        table.add_column(column)
    for name, item in found.items():
        if not item.reachable:  # the whole reason goes below the table, not into a narrow last column
            table.add_row(f"[red]{name}[/red]", "[red]unreachable[/red]", "-",
                          status.short_reason(item.problem or ""), "-", "-", "-", "-", "-", "-")
            continue
        gpus = "; ".join(
            f"{g['name'].replace('NVIDIA ', '')} {_fmt((g['memory_used_mib'] or 0) / 1024)}/"
            f"{_fmt((g['memory_total_mib'] or 0) / 1024)} {_fmt(g['temperature_c'])}° {_fmt(g['utilization_pct'])}%"
            for g in item.gpus) or "-"
        fig = item.figures
        unit = item.unit.get("active", "?") + (f" since {item.unit['since']}" if item.unit.get("since") else "")
        if item.unit.get("installed") is False:
            unit = "not installed"
        colour = "green" if item.healthy else "red"
        model = f"{item.model or '-'} @ {item.revision[:12] if item.revision else '-'}"
        table.add_row(f"[{colour}]{name}[/{colour}]", unit, _fmt(item.unit.get("restarts")),
                      item.health or item.role,
                      model if item.role == "server" or item.unit.get("installed") is False else "(Ray worker)", gpus,
                      f"{_fmt(fig.running, digits=0)}/{_fmt(fig.waiting, digits=0)}" if fig else "-",
                      _fmt(fig.generation_tokens_per_s) if fig else "-",
                      _fmt(fig.kv_cache_usage_pct) if fig else "-", _fmt(fig.prefix_cache_hit_pct) if fig else "-")
    return table


@task(auto_shortflags=False, name="status",
      help={**_help("inventory", "host", "cluster", "all", "json", "set"),
            "watch": "refresh every N seconds until interrupted (0: once)",
            "timeout": "seconds each host may take (default 5); later ones are marked unreachable",
            "window": "seconds between the two /metrics samples that give tokens/s (default 1)"},
      iterable=["host", "set_"])
@guarded
def status_(c: Context, host: list[str] | None = None, cluster: str | None = None, all_: bool = False,
            inventory_: str | None = None, json_: bool = False, set_: list[str] | None = None, watch: float = 0,
            timeout: float = 5, window: float = 1.0) -> None:
    """Every host at a glance: unit, restarts, health, model, GPUs, requests, tokens/s, KV and prefix cache."""
    inv = _load(inventory_)
    overrides = inventory.parse_overrides(set_ or [])
    targets = inv.select(hosts=host or [], cluster=cluster, everything=all_ or not (host or cluster))
    held = secrets.load(inv.secrets)
    while True:
        started = time.monotonic()
        found = gather_status(inv, targets, overrides, held, window, timeout)
        title = f"status: {sum(s.healthy for s in found.values())}/{len(found)} healthy ({time.monotonic() - started:.1f}s)"
        if json_:
            print(report.dump_json({"hosts": {name: status.as_json(item) for name, item in found.items()},
                                    "healthy": all(s.healthy for s in found.values())}))
        else:
            report.console().print(status_table(found, title))
            for line in status_problems(found):
                report.console().print(line, highlight=False, markup=False)
        if not watch:
            break
        time.sleep(max(0.0, watch - (time.monotonic() - started)))
    if not all(s.healthy for s in found.values()):
        raise Exit(code=1)


# ---------------------------------------------------------------------------------------------
# bench and logs


@task(auto_shortflags=False, name="bench",
      help={**_help("inventory", "host", "json", "set"), "prompt": "the prompt (a number is appended per request)",
            "count": "requests (default 16)", "concurrency": "requests at once (default 4)",
            "max-tokens": "tokens per completion (default 32)"},
      iterable=["set_"])
@guarded
def bench(c: Context, host: str | None = None, inventory_: str | None = None, json_: bool = False,
          set_: list[str] | None = None, prompt: str = "Tell me about GPUs", count: int = 16, concurrency: int = 4,
          max_tokens: int = 32) -> None:
    """Real completions against a host's server: tokens/s, time to first token, the server's own figures."""
    if not host:
        raise Exit("error: bench needs --host NAME", code=2)
    if count < 1 or concurrency < 1 or max_tokens < 1:
        raise Exit("error: --count, --concurrency and --max-tokens must be at least 1", code=2)
    inv = _load(inventory_)
    overrides = inventory.parse_overrides(set_ or [])
    target = inv.host(host)
    held = secrets.load(inv.secrets)
    settings = inv.settings(host, overrides)
    runner = remote.connect(target, inv.ssh)
    try:
        result = server.bench(runner, settings, held.vllm_api_key, prompt, count, concurrency, max_tokens,
                              lambda event: print(f"  {event.get('done')}/{event.get('total')} requests",
                                                  file=sys.stderr) if not json_ else None)
    except ProvisionError as exc:
        raise Exit(report.host_error(host, exc), code=1) from None
    finally:
        runner.close()
    if json_:
        print(report.dump_json({"host": host, **result.__dict__}))
    else:
        table = Table(title=f"bench {host}: {result.succeeded}/{result.requests} requests, concurrency {concurrency}")
        for column in ("tokens/s", "output tokens", "seconds", "TTFT mean", "TTFT p50", "TTFT p90",
                       "latency p50", "server tokens", "prefix hit %"):
            table.add_column(column)
        table.add_row(_fmt(result.tokens_per_s, digits=2), str(result.output_tokens), _fmt(result.seconds, digits=2),
                      _fmt(result.ttft_mean_s, "s", 3), _fmt(result.ttft_p50_s, "s", 3), _fmt(result.ttft_p90_s, "s", 3),
                      _fmt(result.latency_p50_s, "s", 3), _fmt(result.server_generation_tokens, digits=0),
                      _fmt(result.server_prefix_cache_hit_pct))
        report.console().print(table)
        for error in result.errors:
            print(f"  error: {error}", file=sys.stderr)
    if result.succeeded < result.requests:
        raise Exit(code=1)


@task(auto_shortflags=False, name="logs",
      help={**_help("inventory", "host"), "follow": "keep printing new lines until interrupted",
            "lines": "lines of the journal to show (default 100)",
            "unit": "vllm (default), vllm-ray-head or vllm-ray-worker"})
@guarded
def logs(c: Context, host: str | None = None, inventory_: str | None = None, follow: bool = False,
         lines: int = 100, unit: str = "vllm") -> None:
    """A unit's journal on a host (secrets masked)."""
    if not host:
        raise Exit("error: logs needs --host NAME", code=2)
    if unit not in ("vllm", "vllm-ray-head", "vllm-ray-worker"):
        raise Exit(f"error: --unit must be vllm, vllm-ray-head or vllm-ray-worker, not {unit!r}", code=2)
    inv = _load(inventory_)
    secrets.load(inv.secrets)  # registered for masking
    runner = remote.connect(inv.host(host), inv.ssh)
    argv = ["journalctl", "-u", f"{unit}.service", "--no-pager", "-n", str(lines), *(["-f"] if follow else [])]
    try:
        done = runner.run(argv, timeout=None if not follow else 7 * 24 * 3600,
                          on_line=(lambda line: print(remote.mask(line), flush=True)) if follow else None)
    except ProvisionError as exc:
        raise Exit(report.host_error(host, exc), code=1) from None
    finally:
        runner.close()
    if not follow:
        sys.stdout.write(remote.mask(done.stdout))
    if not done.ok:
        print(f"{host}: journalctl exited {done.exited}: {remote.mask(done.stderr).strip()}", file=sys.stderr)
        raise Exit(code=1)
