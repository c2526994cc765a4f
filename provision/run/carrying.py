"""Carrying out the plans: wheels pushed and the fetch helper built, the weights fetched (the hub
once per cluster, then host to host), the rest applied (or handed to deploy's roll), each host on its
own; with progress bars on stderr. provision() is plan then carry out, for provision, venv and weights."""
from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, RenderableType
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TransferSpeedColumn,
)
from rich.text import Text

from provision import (
    checks,
    inventory,
    ops,
    plan,
    remote,
    secrets,
    venv,
    weights,
)
from provision.fanout import for_each_host
from provision.run.options import Options
from provision.run.planning import HostPlan, Planned, plans
from provision.runner import Runner


@dataclass
class Applied:
    """What provision (venv, weights) did: the plans, what each host applied, fetched, or failed at."""

    order: list[str]
    plans: dict[str, HostPlan]
    findings: dict[str, list[checks.Finding]]
    errors: dict[str, BaseException]
    applied: dict[str, int]
    fetched: dict[str, weights.FetchResult]
    wheels: venv.WheelsSent = field(default_factory=venv.WheelsSent)

    @property
    def ok(self) -> bool:
        return not self.errors and len(self.plans) == len(self.order)


def provision(inv: inventory.Inventory, targets: list[inventory.Host], options: Options,
              show: Callable[[Planned], None] = lambda planned: None) -> Applied:
    """What provision, venv and weights share: plan every target, `show` the plans, carry them out."""
    with remote.Pool(inv.ssh, accept_new_host_keys=options.accept_new_host_keys) as pool:
        planned = plans(inv, targets, options, pool)
        show(planned)
        applied, failed, fetched, wheels_sent = carry_out(planned, options, pool)
    return Applied(planned.order, planned.plans, planned.findings, {**planned.errors, **failed}, applied, fetched,
                   wheels_sent)


def secret_environment(held: secrets.Secrets) -> dict[str, str | None]:
    """The secrets under the names rendered files hold them (generations keep placeholders instead)."""
    return {"VLLM_API_KEY": held.api_key, "HF_TOKEN": held.hf_token, "MPI_SSH_KEY": held.mpi_ssh_key}


class _BytesOnly(ProgressColumn):
    """A byte column shown only on tasks that move bytes."""

    def __init__(self, column: ProgressColumn) -> None:
        super().__init__()
        self.column = column

    def render(self, task: Task) -> RenderableType:
        return self.column.render(task) if task.fields.get("moves_bytes", True) else ""


def time_left(seconds: float | None) -> str:
    """A bar's clock, labelled: 192 -> '3m12s left' (what remains, not what has passed)."""
    if seconds is None:
        return ""
    whole = max(0, math.ceil(seconds))
    hours, minutes, rest = whole // 3600, whole % 3600 // 60, whole % 60
    if hours:
        return f"{hours}h{minutes:02d}m left"
    return f"{minutes}m{rest:02d}s left" if minutes else f"{rest}s left"


class _TimeLeft(ProgressColumn):
    """The time left: of the timeout on a wait (its bar counts seconds), else rich's estimate."""

    def render(self, task: Task) -> RenderableType:
        if task.fields.get("counts_seconds") and task.total is not None:
            return Text(time_left(task.total - task.completed))
        return Text(time_left(task.time_remaining))


Connect = Callable[[str], Runner]


Bar = Callable[[str], Callable[[int, int], None]]


# The last step: apply the rest of the plans on the given hosts; returns (changes done, errors).
Final = Callable[[list[str], Connect, Bar], tuple[dict[str, int], dict[str, BaseException]]]


def carry_out(planned: Planned, options: Options, pool: remote.Pool, final: Final | None = None,
              timings: dict[str, dict[str, float]] | None = None) -> tuple[
                  dict[str, int], dict[str, BaseException], dict[str, weights.FetchResult], venv.WheelsSent]:
    """Apply the plans in three steps, all hosts at once in each: wheels pushed and the fetch helper
    built; the weights fetched (the hub once per cluster, then host to host); the rest applied (by
    `final` where given: deploy rolls it host by host). A host that fails leaves the later steps;
    the others go on. `timings` collects each host's seconds per step. Connections come from `pool`
    (the ones the facts came over), to the hosts the plans carry."""
    progress = Progress(TextColumn("{task.description}"), BarColumn(), _BytesOnly(DownloadColumn()),
                        _BytesOnly(TransferSpeedColumn()),
                        _TimeLeft(), console=Console(stderr=True), disable=options.quiet)
    plans, order, held = planned.plans, planned.order, planned.held
    wait = options.wait
    lock = threading.Lock()
    clock = timings if timings is not None else {}

    def connect(name: str) -> Runner:
        return pool.connect(plans[name].host)

    def bar(description: str) -> Callable[[int, int], None]:
        # Steps that move bytes say "MB"; others (apply, waits for health) just show the bar.
        moves_bytes = "wheel(s)" in description or ": from " in description or description.endswith("from the hub")
        task_id = progress.add_task(description, total=None, moves_bytes=moves_bytes,
                                    counts_seconds=": waiting for " in description)
        return lambda done, total: progress.update(task_id, completed=done, total=total)

    def timed(step: str, work: Callable[[str], int]) -> Callable[[str], int]:
        def run(name: str) -> int:
            started = time.monotonic()
            try:
                return work(name)
            finally:
                with lock:
                    clock.setdefault(name, {})[step] = round(time.monotonic() - started, 2)
        return run

    errors: dict[str, BaseException] = {}
    done: dict[str, int] = {}
    active = [name for name in order if name in plans and plans[name].changes]

    def prepare(name: str) -> int:
        helper = plans[name].of_kind("venv", target=weights.HUB_VENV)
        return len(ops.apply(connect(name), helper, wait=wait).done) if helper else 0

    def parallel_final(names: list[str], connect: Connect, bar: Bar) -> tuple[dict[str, int], dict[str, BaseException]]:
        def finish(name: str) -> int:
            rest = remaining(plans[name])
            fetched_model = [c.describe() for c in plans[name].of_kind("weights")]
            if not rest:
                if fetched_model:  # a new model revision alone is a generation too: rollback brings the old one
                    ops.apply(connect(name), [], wait, generation_of(plans[name], held, "weights", fetched_model))
                return 0
            update = bar(f"{name}: apply {len(rest)} change(s)")
            outcome = ops.apply(connect(name), rest, wait, generation_of(plans[name], held, "provision"))
            update(1, 1)
            return len(outcome.done)

        last = for_each_host(names, lambda name: name, timed("apply", finish))
        return dict(last.values), dict(last.errors)

    fetched: dict[str, weights.FetchResult] = {}
    wheels_sent = venv.WheelsSent()
    with progress:
        started = time.monotonic()
        wanting = wheel_jobs(plans, active)
        wheels_sent = venv.send_all(wanting, connect, bar)
        for wheel_job in wanting:
            clock.setdefault(wheel_job.host, {})["wheels"] = round(time.monotonic() - started, 2)
        errors.update(wheels_sent.errors)
        first = for_each_host([name for name in active if name not in errors], lambda name: name,
                              timed("prepare", prepare))
        errors.update(first.errors)
        done.update(first.values)
        jobs, holders = weight_jobs(plans, [name for name in active if name not in errors], order)
        started = time.monotonic()
        fetched, fetch_errors = weights.fetch_all(jobs, connect, held.hf_token, options.verify, wait, bar,
                                                  holders)
        for job in jobs:
            clock.setdefault(job.host, {})["weights"] = round(time.monotonic() - started, 2)
        errors.update(fetch_errors)
        for name in fetched:
            done[name] = done.get(name, 0) + 1
        counts, final_errors = (final or parallel_final)([n for n in active if n not in errors], connect, bar)
        errors.update(final_errors)
        for name, count in counts.items():
            done[name] = done.get(name, 0) + count
    return done, errors, fetched, wheels_sent


def generation_of(host_plan: HostPlan, held: secrets.Secrets, by: str, changed: Sequence[str] = ()) -> ops.Record:
    """What applying the host's plan records as a generation: its scope, endpoint and --set drift, and
    whether its model changed (a fetch before the apply)."""
    return ops.Record(scope=host_plan.scope, by=by, secrets=secret_environment(held),
                      model_changed=bool(host_plan.of_kind("weights")), changed=changed, serve=host_plan.serve,
                      overrides=host_plan.overrides)


def weight_jobs(plans: Mapping[str, HostPlan], names: Sequence[str],
                order: Sequence[str] = ()) -> tuple[list[weights.Job], list[weights.Job]]:
    """Pure: the fetches of `names` that need one, and every planned host holding its model revision
    verified (the fetches' first sources in its cluster: weights.holders_of picks them), in the run's
    host `order` (plans arrive in the order their facts did: the chain must not depend on that)."""
    def job(name: str, data: Mapping[str, Any]) -> weights.Job:
        return weights.Job(name, plans[name].group, data, plans[name].cluster_address, plans[name].transfer)

    jobs = [job(name, plans[name].of_kind("weights")[0].data) for name in names if plans[name].of_kind("weights")]
    ranked = [*[name for name in order if name in plans], *[name for name in plans if name not in order]]
    holders = [job(name, held) for name, held in ((n, plans[n].holds) for n in ranked) if held is not None]
    return jobs, holders


def wheel_jobs(plans: Mapping[str, HostPlan], names: Sequence[str]) -> list[venv.WheelJob]:
    """The hosts that lack wheels, each with its cluster and architecture (the hosts it relays to)."""
    jobs = []
    for name in names:
        host_plan = plans[name]
        missing = tuple(file for house, wheels in host_plan.pushes for file in house.files(wheels))
        if missing:
            jobs.append(venv.WheelJob(name, f"{host_plan.group} {host_plan.arch}", host_plan.cluster_address,
                                      host_plan.transfer, missing, host_plan.held_wheels))
    return jobs


def remaining(host_plan: HostPlan) -> list[plan.Change]:
    """What the last step applies: everything but the fetch and its helper venv (done before)."""
    return [c for c in host_plan.changes if c.kind not in ("weights", "build") and c.target != weights.HUB_VENV]
