"""deploy's roll: apply batch after batch, each gated on readiness; promote or reject each host's
generation; multi-node clusters roll as one (every node's units; over Ray, Ray must see every node before
vLLM starts on the head; in vLLM's own launch the nodes start, and restart after a rollback, together).

deploy = the run's facts, gate and plan (provision.run); then, for all hosts at once, what restarts
nothing (wheels, the fetch helper, the weights); then the rest host by host (or `batch` at a time):
apply, wait for /health and a real one-token completion. A host that does not become ready gets its
generation rejected and its last good one back, and the roll stops: the hosts after it are left as
they were.

rollback = the same roll backwards: host after host, each restored generation gated on readiness at
the endpoint recorded with it (`restored_endpoint`) before the next host is touched.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from provision import (
    engines,
    hints,
    inventory,
    ops,
    parsers,
    plan,
    remote,
    router,
    run,
    secrets,
    server,
    venv,
    weights,
)
from provision.context import Context
from provision.endpoints import EndpointPlan, server_name
from provision.engines.vllm import RAY_PORT
from provision.errors import NotReady, ProvisionError, RollStopped, UnreachableHost, error_text
from provision.fanout import HostResults, for_each_host
from provision.run import Bar, Connect, HostPlan, Options, Planned, remaining, secret_environment
from provision.runner import Runner


@dataclass
class Outcome:
    host: str
    state: str = "unchanged"  # unchanged | ready | rolled back | failed | not rolled
    ready_s: float | None = None
    detail: str = ""
    steps: dict[str, float] = field(default_factory=dict)
    changes_unknown: bool = False  # the connection was lost while the host applied: it may have, or not


def batches(order: list[str], clusters: Mapping[str, inventory.Cluster | None], size: int) -> list[list[str]]:
    """Single hosts `size` at a time; a multi-node cluster is one batch of its own (head last).
    `clusters`: each host's cluster (None for a host alone)."""
    batches: list[list[str]] = []
    loose: list[str] = []
    seen: set[str] = set()
    for name in order:
        cluster = clusters.get(name)
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


def ray_nodes(runner: Runner, venv_dir: str, head_address: str, expected: int, timeout: float) -> int:
    """Live nodes of the Ray cluster as `ray status` on the head reports them, waiting up to
    `timeout` for all of them to join."""
    deadline = time.monotonic() + timeout
    while True:
        done = runner.run([f"{venv_dir.rstrip('/')}/bin/ray", "status", f"--address={head_address}:{RAY_PORT}"],
                          timeout=60)
        nodes = parsers.parse_ray_status(done.stdout) if done.ok else 0
        if nodes >= expected or time.monotonic() > deadline:
            return nodes
        time.sleep(3)


@dataclass(frozen=True)
class Roll:
    """What deploy's roll works from: the plans (each host's context with it), the run's secrets, and
    how it rolls. Everything it knows of a host is what the gate and the plan left here."""

    planned: Planned
    outcomes: dict[str, Outcome]
    batch: int = 1
    timeout: float = 600
    wait: float = 0
    by: str = "deploy"
    pool: remote.Pool | None = None  # the run's connections: a replica's router host need not be a target

    @property
    def plans(self) -> dict[str, HostPlan]:
        return self.planned.plans

    @property
    def held(self) -> secrets.Secrets:
        return self.planned.held

    def router_of(self, name: str) -> tuple[EndpointPlan, Runner] | None:
        """The endpoint `name`'s server is behind and a connection to its router host, where there is one."""
        behind = self.plans[name].ctx.behind
        if behind is None or behind.router is None or self.pool is None:
            return None
        return behind, self.pool.connect(behind.router)

    def settings_of(self, name: str, fallback: str) -> inventory.Settings:
        """The gate's settings of `name` (a cluster's head need not be a target: the gate saw it as a
        peer), else of `fallback`, a host of the same cluster in the roll."""
        return self.context_of(name, fallback).settings

    def context_of(self, name: str, fallback: str) -> Context:
        return self.planned.contexts.get(name) or self.plans[fallback].ctx


def rolling(roll: Roll) -> Callable[..., Any]:
    """The last step of carry_out for deploy: apply batch after batch, each gated on readiness."""

    def final(names: list[str], connect: Connect, bar: Bar) -> tuple[dict[str, int], dict[str, BaseException]]:
        done: dict[str, int] = {}
        errors: dict[str, BaseException] = {}
        for group in batches(names, {name: roll.plans[name].ctx.cluster for name in names}, roll.batch):
            if errors:
                for name in group:
                    roll.outcomes[name].state = "not rolled"
                    roll.outcomes[name].detail = "the roll stopped before this host"
                continue
            failed = roll_one(group, roll, connect, bar, done)
            errors.update(failed)
        return done, errors

    return final


def roll_one(group: list[str], roll: Roll, connect: Connect, bar: Bar, done: dict[str, int]) -> dict[str, BaseException]:
    """Apply a batch (each host's changes become a pending generation), wait for readiness, then promote
    every generation the batch made, or reject them all: each host gets back its last good one."""
    plans, held, outcomes, timeout, wait = roll.plans, roll.held, roll.outcomes, roll.timeout, roll.wait
    cluster = plans[group[0]].ctx.cluster
    multi = bool(cluster and cluster.multi_node)
    head_engine = engines.engine_of(roll.settings_of(cluster.head, group[0])) if cluster else None
    # A Ray cluster's server starts only once Ray sees every node; an MPI or vLLM's own launch reaches them itself.
    ray = multi and cluster is not None and head_engine is not None and head_engine.launch(
        roll.context_of(cluster.head, group[0])) == "ray"
    whole = _whole_units(group, roll)  # vLLM's own launch: the nodes restart together
    held_back: dict[str, list[plan.Change]] = {}
    made: dict[str, int] = {}

    def apply(name: str) -> int:
        changes = remaining(plans[name])
        if ray and cluster and head_engine and name == cluster.head:  # vLLM starts only once Ray sees every node
            held_back[name] = [c for c in changes if c.target == plans[name].ctx.naming.unit(head_engine.server_unit)
                               and c.kind in ("start", "restart")]
            changes = [c for c in changes if c not in held_back[name]]
        started = time.monotonic()
        count = 0
        if changes:
            record = dataclasses.replace(run.generation_of(plans[name], held, roll.by), verify=True,
                                         deadline=timeout + (150 if multi else 30))
            try:
                outcome = ops.apply(connect(name), changes, wait, record)
            except UnreachableHost:  # the host may have applied all of it: only its next run can tell
                outcomes[name].changes_unknown = True
                raise
            count = len(outcome.done)
            if outcome.generation is not None:
                made[name] = outcome.generation
        outcomes[name].steps["apply"] = round(time.monotonic() - started, 2)
        return count

    drained = _drain(group, roll, bar)
    applied = for_each_host([name for name in group if name not in drained.errors], lambda name: name, apply)
    done.update(applied.values)
    errors: dict[str, BaseException] = {**drained.errors, **applied.errors}
    if not errors and ray and cluster:
        head = cluster.head
        ray_timeout = min(timeout, 120.0)  # nodes join within seconds; a missing one will not
        address = plans[head].cluster_address or plans[head].host.address
        nodes = ray_nodes(connect(head), plans[head].settings.venv_dir, address, len(cluster.hosts), ray_timeout)
        if nodes < len(cluster.hosts):
            errors[head] = RollStopped(
                f"{head}: Ray sees {nodes} of {len(cluster.hosts)} nodes; vLLM not started (check the "
                f"workers: `{hints.command('status')}`, "
                f"`{hints.command('logs --host NODE --unit vllm-ray-worker')}`)")
        elif held_back.get(head):  # part of the head's generation: promote records the units as they run
            done[head] = done.get(head, 0) + len(ops.apply(connect(head), held_back[head], wait=wait).done)
    servers = [name for name in group if not (multi and cluster and name != cluster.head)]
    for name in servers if not errors else []:
        update = bar(f"{name}: waiting for /health and a completion")
        started = time.monotonic()
        try:
            outcomes[name].ready_s = server.wait_ready(
                connect(name), plans[name].settings, held.api_key, timeout,
                _elapsed_on(update, timeout), plans[name].ctx.naming)
            outcomes[name].state = "ready"
        except ProvisionError as exc:
            errors[name] = exc
        outcomes[name].steps["ready"] = round(time.monotonic() - started, 2)
    for name, number in sorted(made.items()) if not errors else []:
        try:  # "ready" must be about what this run applied: refused if another run changed the host since
            steps = outcomes[name].steps
            restart = (round(steps.get("apply", 0.0) + steps["ready"], 1)
                       if outcomes[name].ready_s is not None and "ready" in steps else None)
            ops.promote(connect(name), number, plans[name].scope, wait=wait, restart_s=restart)
        except ProvisionError as exc:
            errors[name] = exc
            outcomes[name].state = "failed"
    if errors:
        cause = "; ".join(error_text(error) for error in errors.values())
        for name in group:
            if name in made:
                roll_back(name, made[name], roll, connect, errors, cause,
                          ready=None if whole else _ready_again(connect, name, held, timeout,
                                                                plans[name].declared_settings))
        if whole and made:
            _restart_together(whole, roll, connect, cluster.head if cluster else group[-1])
    _restore([name for name, done in drained.values.items() if done], roll, errors, bar)
    return errors


def _whole_units(group: list[str], roll: Roll) -> dict[str, str]:
    """{node: its unit of the server} where the batch's nodes are one server that restarts only whole."""
    found = {}
    for name in group:
        ctx = roll.plans[name].ctx
        unit = engines.engine_of(ctx.settings).pair_unit(ctx)
        if unit is not None:
            found[name] = ctx.naming.unit(unit)
    return found


def _restart_together(units: Mapping[str, str], roll: Roll, connect: Connect, head: str) -> None:
    """After a rollback of some of a server's nodes: every node's unit restarted (the rolled back and the
    untouched alike: none can rejoin the others alone), then the head waited for; said on the head."""
    restarted = for_each_host(sorted(units), lambda name: name, lambda name: ops.apply(
        connect(name), [plan.Change("restart", units[name], "the nodes restart together after a rollback")],
        wait=roll.wait))
    outcome = roll.outcomes[head]
    if restarted.errors:
        outcome.detail += "; restarting the nodes together failed: " + "; ".join(
            error_text(error) for error in restarted.errors.values())
        return
    try:
        seconds = server.wait_ready(connect(head), roll.plans[head].declared_settings, roll.held.api_key,
                                    roll.timeout, naming=roll.plans[head].ctx.naming)
        outcome.detail += f"; the nodes restarted together: the previous version is ready again ({seconds:.0f}s)"
    except ProvisionError as exc:
        outcome.detail += f"; the nodes restarted together, and the restored version does not answer: {error_text(exc)}"


def _restarts_server(hostplan: HostPlan) -> bool:
    """Whether the plan restarts or stops the server clients are sent to (a first start drains nothing)."""
    unit = hostplan.ctx.naming.unit(engines.engine_of(hostplan.settings).server_unit)
    return any(change.kind in ("restart", "stop") and change.target == unit for change in remaining(hostplan))


def _drain(group: list[str], roll: Roll, bar: Bar) -> HostResults[bool]:
    """Each server of the batch that is behind an endpoint and is about to restart is taken out of its
    router first: no new requests, and those in flight finish (up to the endpoint's drain_timeout).
    True for each server drained; False for one whose router does not run yet (nothing reaches it
    through the router); a router that fails is the host's error."""
    routed = {name: found for name in group if (found := roll.router_of(name)) and _restarts_server(roll.plans[name])}

    def one(name: str) -> bool:
        endpoint, runner = routed[name]
        update = bar(f"{name}: draining from endpoint {endpoint.name}")
        started = time.monotonic()
        left = router.drain(runner, endpoint, _cluster_of(roll.plans[name]), lambda event: update(
            int(event.get("waited_s") or 0), int(endpoint.drain_timeout)))
        if left is None:
            return False
        roll.outcomes[name].steps["drain"] = round(time.monotonic() - started, 2)
        if left:
            roll.outcomes[name].detail = (f"{left} request(s) still running after the drain timeout "
                                          f"({endpoint.drain_timeout:.0f} s) were cut by the restart")
        return True

    return for_each_host(list(routed), lambda name: name, one)


def _restore(drained: list[str], roll: Roll, errors: dict[str, BaseException], bar: Bar) -> None:
    """Put each drained server back in its router: after its change, or after the generation it was
    rolled back to. The router sends to it only once its health check passes, so one that does not
    serve takes no requests, and joins again by itself when it does."""
    for name in drained:
        found = roll.router_of(name)
        assert found is not None  # it was drained through it
        endpoint, runner = found
        bar(f"{name}: back into endpoint {endpoint.name}")
        started = time.monotonic()
        should_serve = name not in errors or roll.outcomes[name].state == "rolled back"
        try:
            router.restore(runner, endpoint, _cluster_of(roll.plans[name]), timeout=60.0 if should_serve else 5.0)
        except ProvisionError as exc:
            if name in errors:
                roll.outcomes[name].detail += f"; endpoint {endpoint.name} sends it nothing until it serves"
            else:
                errors[name] = exc
        roll.outcomes[name].steps["restore"] = round(time.monotonic() - started, 2)


def _cluster_of(hostplan: HostPlan) -> str:
    """The router's name for this host's server: its cluster's name, or a service's HOST:SERVICE."""
    cluster = hostplan.ctx.cluster
    return cluster.name if cluster else server_name(hostplan.ctx.host)


def _elapsed_on(update: Callable[[int, int], None], timeout: float) -> Callable[[dict[str, Any]], None]:
    """A readiness wait's progress events (seconds elapsed) on its bar, out of the timeout."""
    return lambda event: update(int(event.get("elapsed", 0)), int(timeout))


def roll_back(name: str, generation: int, roll: Roll, connect: Connect, errors: dict[str, BaseException],
              cause: str, ready: Callable[[ops.Outcome], float | None] | None = None) -> None:
    """Reject what this deploy applied on the host; it gets back its newest good generation whole (files,
    venv, model, each unit enabled and running exactly as it was). `ready` waits until the restored
    server answers again (None where the restored generation runs no server)."""
    outcome = roll.outcomes[name]
    own = error_text(errors[name]).removeprefix(name + ": ") if name in errors else cause
    try:
        back = ops.reject(connect(name), generation, roll.plans[name].scope, own, wait=roll.wait,
                          secrets=secret_environment(roll.held))
        if back.to is None:  # another run's generation is current: that is what the host holds now
            outcome.detail = f"{own}; generation {generation} rejected, the host keeps what the other run applied"
            outcome.state = "superseded"
        else:
            what = ", ".join(back.restored) or "nothing differed"
            outcome.detail = f"{own}; rolled back to generation {back.to} ({what})"
            outcome.state = "rolled back"
            if ready is not None:
                try:  # the rollback itself is done; whether what it restored serves is worth saying
                    if ready(back) is not None:
                        outcome.detail += ": the previous version is ready again"
                except ProvisionError as exc:
                    outcome.detail += f"; the restored version does not answer either: {error_text(exc)}"
    except ProvisionError as exc:
        outcome.state = "failed"
        outcome.detail = f"{own}; the rollback failed too: {error_text(exc)}"
    errors[name] = RollStopped(f"{name}: {outcome.detail}; the roll stopped here")


def restored_endpoint(back: ops.Outcome, declared: inventory.Settings) -> dict[str, Any] | None:
    """Where the restored generation's server answers: as recorded with that generation (its own port,
    address, model and unit, never the overrides of the run that restores it); for one recorded before
    generations kept that, where the inventory declares (`declared`). None when it runs no server."""
    where = dict(back.serve or server.endpoint(declared))
    return where if where["unit"] in back.running else None


def _ready_again(connect: Connect, name: str, held: secrets.Secrets, timeout: float,
                 declared: inventory.Settings) -> Callable[[ops.Outcome], float | None]:
    """The readiness wait of a host that was rolled back (NotReady when the restored version fails too),
    at the restored generation's own endpoint; None when it runs no server."""
    def ready(back: ops.Outcome) -> float | None:
        where = restored_endpoint(back, declared)
        return None if where is None else server.wait_ready_at(connect(name), where, held.api_key, timeout)

    return ready


def _gate_unchanged(roll: Roll, pool: remote.Pool, errors: dict[str, BaseException]) -> None:
    """A server this deploy did not touch still has to answer: the declared state is a served model,
    not only files (right after a provision the server may still be loading). Nothing to roll back."""
    plans, outcomes = roll.plans, roll.outcomes
    for name in roll.planned.order:
        if name not in plans or name in errors or outcomes[name].state != "unchanged" or not plans[name].ctx.is_head:
            continue
        settings = plans[name].settings
        if not settings.model:
            continue
        started = time.monotonic()
        runner = pool.connect(plans[name].host)
        unfinished = plans[name].unfinished
        try:
            outcomes[name].ready_s = server.wait_ready(runner, settings, roll.held.api_key, roll.timeout,
                                                       naming=plans[name].ctx.naming)
            outcomes[name].state, outcomes[name].detail = "ready", "unchanged; answers /health and a completion"
            if unfinished:  # an earlier deploy stopped before its verdict: this run gives it
                ops.promote(runner, unfinished["id"], plans[name].scope)
                outcomes[name].detail = (f"generation {unfinished['id']} ({unfinished.get('changes', 0)} change(s), "
                                         f"left unfinished by a deploy of {unfinished['created']}) answers: "
                                         "promoted to last-known-good")
        except ProvisionError as exc:
            errors[name] = exc
            outcomes[name].detail = error_text(exc)
            if unfinished:
                roll_back(name, unfinished["id"], dataclasses.replace(roll, wait=0),
                          lambda host: pool.connect(plans[host].host), errors, outcomes[name].detail)
        outcomes[name].steps["ready"] = round(time.monotonic() - started, 2)


@dataclass
class Deployed:
    """What deploy did: each host's outcome (state, detail, seconds per step), plans, applied, fetched, errors."""

    order: list[str]
    plans: dict[str, HostPlan]
    outcomes: dict[str, Outcome]
    applied: dict[str, int]
    fetched: dict[str, weights.FetchResult]
    errors: dict[str, BaseException]
    seconds: float
    held: secrets.Secrets
    wheels: venv.WheelsSent = field(default_factory=venv.WheelsSent)

    @property
    def ok(self) -> bool:
        return not self.errors and len(self.plans) == len(self.order)


def deploy(inv: inventory.Inventory, targets: list[inventory.Host], options: Options, *, batch: int = 1,
           timeout: float = 600, show: Callable[[Planned], None] = lambda planned: None,
           by: str = "deploy") -> Deployed:
    """provision's facts, gate and plan (`show`n before anything changes); then what restarts nothing on
    every host at once; then the roll, batch by batch, each gated on readiness; then the readiness of
    servers this deploy did not change."""
    started = time.monotonic()
    outcomes: dict[str, Outcome] = {}
    with remote.Pool(inv.ssh, accept_new_host_keys=options.accept_new_host_keys) as pool:
        planned = run.plans(inv, targets, options, pool)
        show(planned)
        return roll_out(planned, options, pool, Roll(planned, outcomes, batch, timeout, options.wait, by, pool), started)


def roll_out(planned: Planned, options: Options, pool: remote.Pool, roll: Roll, started: float) -> Deployed:
    """deploy after its gate and plan: from here on, what a host is comes from its plan alone (the
    inventory is not asked again)."""
    refused = hold_rolls(planned, pool, options.wait, roll.by)
    if refused:  # not rolled: nothing drained or changed there
        planned = dataclasses.replace(planned, errors={**planned.errors, **refused}, plans={
            name: hostplan for name, hostplan in planned.plans.items() if name not in refused})
        roll = dataclasses.replace(roll, planned=planned)
    plans, errors, order, held, outcomes = planned.plans, dict(planned.errors), planned.order, planned.held, roll.outcomes
    timings: dict[str, dict[str, float]] = {}
    outcomes.update({name: Outcome(name) for name in order})
    applied, failed, fetched, wheels_sent = run.carry_out(planned, options, pool, final=rolling(roll), timings=timings)
    errors.update(failed)
    _gate_unchanged(roll, pool, errors)
    for name, outcome in outcomes.items():
        built = plans[name].build if name in plans else None
        outcome.steps = {**({"build": built[1]} if built else {}), **timings.get(name, {}), **outcome.steps}
        if name in errors and outcome.state in ("unchanged", "ready"):
            outcome.state, outcome.detail = "failed", error_text(errors[name])
        elif name not in plans and name not in errors:
            outcome.state, outcome.detail = "blocked", "blocked by the gate, nothing changed"
    return Deployed(order, plans, outcomes, applied, fetched, errors, time.monotonic() - started, held,
                    wheels_sent)


def hold_rolls(planned: Planned, pool: remote.Pool, wait: float, by: str) -> dict[str, BaseException]:
    """Each planned host's roll lock (ops.hold_roll), taken before anything of this deploy reaches it
    (wheels, weights, a drain) and kept to the end of the run: a second deploy of the same replica
    waits for it (`--wait`) or is refused, having drained nothing. Under it, the host's generation
    records must be what this run's facts read: one that another run changed since (applied, promoted,
    rolled back) is refused too, since its plan was made of what was there before. The refusals, by
    plan name (a host's services share its lock)."""
    names_of: dict[str, list[str]] = {}
    for name, hostplan in planned.plans.items():
        names_of.setdefault(hostplan.host.name, []).append(name)

    def one(host: str) -> None:
        names = names_of[host]
        read = {planned.plans[name].ctx.naming.state_file: planned.plans[name].ctx.facts.files.get(
            planned.plans[name].ctx.naming.state_file, {}).get("sha256") for name in names}
        now = ops.hold_roll(pool.connect(planned.plans[names[0]].host), sorted(read), wait, by)
        changed = [path for path, digest in read.items() if now.get(path) != digest]
        if changed:
            raise ProvisionError(f"{host}: another run changed its generations ({', '.join(sorted(changed))}) since "
                                 f"this run read the host: nothing drained or changed; run again to plan what "
                                 f"is there now (`{hints.command('generations --host ' + host)}` shows it)")
        for name in names:  # held: a pending generation's run has stopped, whatever its deadline says
            hostplan = planned.plans[name]
            hostplan.unfinished = run.unfinished_generation(hostplan.ctx.facts, now=float("inf"),
                                                            state_file=hostplan.ctx.naming.state_file)

    held = for_each_host(list(names_of), lambda host: host, one)
    return {name: error for host, error in held.errors.items() for name in names_of[host]}


@dataclass(frozen=True)
class RolledBack:
    """What rollback did on one host: the generation restored, what it restored, and the seconds until
    the restored server answered /health and a completion (None where it runs no server)."""

    to: int | None
    restored: tuple[str, ...]
    ready_s: float | None = None
    seconds: float = 0.0


def rollback(inv: inventory.Inventory, targets: list[inventory.Host], options: Options, *, to: int | None = None,
             listing: bool = False, timeout: float = 600) -> HostResults[Any]:
    """Each target back to generation `to` (default: the latest good or applied one that ran before the
    current, by each generation's record of what ran before it), one host after the other (a multi-node
    cluster's head last), each gated on readiness as deploy is: the next host is touched only once the
    restored server answers /health and a real completion at its own recorded endpoint. A host whose
    restored generation does not serve goes back to the generation that was running and fails, and the
    hosts after it are left as they are. With listing, each host's generations (all at once: it changes
    nothing)."""
    held = secrets.load(inv.secrets)
    with remote.Pool(inv.ssh, accept_new_host_keys=options.accept_new_host_keys) as pool:
        if listing:
            return for_each_host(targets, lambda target: target.name, lambda target: ops.generations(
                pool.connect(target), run.scope_of(inv.settings(target.name, options.overrides), inv.naming(target.name))))
        values: dict[str, Any] = {}
        errors: dict[str, BaseException] = {}
        for group in batches([target.name for target in targets],
                             {target.name: inv.cluster_of(target.name) for target in targets}, 1):
            for name in group:
                if errors:
                    errors[name] = RollStopped(f"{name}: not rolled back: the rollback stopped at "
                                               f"{next(iter(errors))}")
                    continue
                one = for_each_host([inv.host(name)], lambda target: target.name, lambda target: _roll_back_host(
                    inv, pool.connect(target), options, held, to, timeout))
                values.update(one.values)
                errors.update(one.errors)
    return HostResults(tuple(target.name for target in targets), values, errors)


def _roll_back_host(inv: inventory.Inventory, runner: Runner, options: Options, held: secrets.Secrets,
                    to: int | None, timeout: float) -> RolledBack:
    """Restore the generation (its server restarted once, after its files, venv and model are in place),
    then wait until it serves. One that does not serve is left for the generation that was running
    before (restored whole, its units as they were, and waited for in turn): NotReady names both."""
    started = time.monotonic()
    declared = inv.settings(runner.host, options.overrides)
    scope = run.scope_of(declared, inv.naming(runner.host))
    back = ops.rollback(runner, scope, to=to, wait=options.wait, secrets=secret_environment(held))
    where = restored_endpoint(back, inv.settings(runner.host, {}))
    ready_s = None
    if where is not None:
        try:
            ready_s = server.wait_ready_at(runner, where, held.api_key, timeout)
        except ProvisionError as exc:
            said = (f"{runner.host}: generation {back.to} restored "
                    f"({', '.join(back.restored) or 'it was in place'}), but it does not serve: "
                    f"{error_text(exc).removeprefix(runner.host + ': ')}")
            raise NotReady(said + _back_to_running(inv, runner, scope, back, options, held, timeout)) from exc
    return RolledBack(back.to, back.restored, ready_s, round(time.monotonic() - started, 2))


def _back_to_running(inv: inventory.Inventory, runner: Runner, scope: ops.Scope, back: ops.Outcome,
                     options: Options, held: secrets.Secrets, timeout: float) -> str:
    """A rollback whose restored generation does not serve goes back to the generation that was running
    (`back.left`), and waits for it as for any restored one; what happened, as the rest of a sentence."""
    if back.left is None or back.left == back.to:
        return "; nothing else ran before it to go back to"
    try:
        again = ops.rollback(runner, scope, to=back.left, wait=options.wait, secrets=secret_environment(held),
                             forward=True)
        where = restored_endpoint(again, inv.settings(runner.host, {}))
        if where is None:
            return f"; back on generation {back.left}, the one that was running (it runs no server)"
        seconds = server.wait_ready_at(runner, where, held.api_key, timeout)
    except ProvisionError as exc:
        return (f"; going back to generation {back.left}, the one that was running, failed too: "
                f"{error_text(exc).removeprefix(runner.host + ': ')}")
    return (f"; back on generation {back.left}, the one that was running: it answers /health and a completion "
            f"again ({seconds:.0f}s)")
