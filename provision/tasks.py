"""The Invoke tasks: parse arguments, call the library, print the report. Nothing more.

Exit codes: 0 done; 1 something on a host (or the lab) failed; 2 bad usage or bad inventory.
"""
from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

from invoke import Collection, Context, task
from rich.console import Console, RenderableType
from rich.progress import (BarColumn, DownloadColumn, Progress, ProgressColumn, Task, TextColumn,
                           TimeRemainingColumn, TransferSpeedColumn)
from invoke.exceptions import Exit

from provision import (build, checks, config, context, cuda, facts, inventory, lab, ops, plan, remote, render, report, secrets,
                       venv, weights)
from provision.errors import InventoryError, LabError, ProvisionError, about
from provision.fanout import HostResults, for_each_host
from provision.profiles import load_profiles

F = TypeVar("F", bound=Callable[..., Any])

COMMON_HELP = {
    "inventory": "inventory file or directory (default: the lab's while it is up, else ./inventory)",
    "host": "a host name from the inventory, or 'local' for this machine (repeatable)",
    "cluster": "a cluster name from the inventory",
    "all": "every host of the inventory",
    "json": "print JSON for scripts instead of tables",
    "accept-new-host-keys": "trust and record the key of a host seen for the first time "
                            "(a changed key is always refused)",
    "profile": "hardware profile to assume (overrides the inventory's; useful with --host local)",
    "set": "override a service setting, KEY=VALUE (repeatable; highest precedence)",
    "verbose": "log every remote command (secrets masked) to stderr",
}


def _help(*names: str, **extra: str) -> dict[str, str]:
    return {**{name: COMMON_HELP[name] for name in names}, **extra}


def guarded(function: F) -> F:
    """Map the error tree to exit codes and one clear line on stderr, never a traceback."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except InventoryError as exc:
            raise Exit(f"error: {exc}", code=2) from None
        except LabError as exc:
            raise Exit(f"lab: {exc}", code=1) from None

    return wrapper  # type: ignore[return-value]


def _setup_logging(verbose: bool) -> None:
    logger = logging.getLogger("provision")
    logger.setLevel(logging.DEBUG)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(logging.DEBUG if verbose else logging.WARNING)
    handlers: list[logging.Handler] = [console]
    path = config.log_file()
    if path:
        handlers.append(logging.FileHandler(path))
    for handler in handlers:
        handler.addFilter(remote.MaskingFilter())
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)


def _load(path: str | None) -> inventory.Inventory:
    return inventory.load(Path(path) if path else config.default_inventory())


def _profile(name: str | None) -> Any:
    if name is None:
        return None
    profiles = load_profiles()
    if name not in profiles:
        raise InventoryError(f"unknown profile '{name}' (known: {', '.join(sorted(profiles))})",
                             file="command line", key="--profile")
    return profiles[name]


def _gather(inv: inventory.Inventory, targets: list[inventory.Host], overrides: dict[str, Any],
            assumed: Any, accept_new_host_keys: bool, pool: remote.Pool | None = None) -> HostResults[facts.HostFacts]:
    """Every target's facts in parallel, one round trip each; a failing host never stops the others.
    With a pool, the connections stay open for what the run does next."""

    def gather(target: inventory.Host) -> facts.HostFacts:
        settings = inv.settings(target.name, overrides, profile=assumed)
        paths = [settings.venv_dir, settings.model_dir, settings.hf_home]
        inspect: dict[str, list[str]] = plan.inspect_spec(
            [render.CONFIG_DIR, render.STATE_DIR, *paths[1:], *venv.inspect_paths(settings),
             f"{weights.HUB_VENV}/{venv.VENV_MANIFEST}"], settings.service_user)
        inspect["weights"] = [weights.root_of(settings)] if weights.managed(settings) else []
        runner = pool.connect(target) if pool else remote.connect(target, inv.ssh,
                                                                  accept_new_host_keys=accept_new_host_keys)
        try:
            return facts.gather(runner, paths=paths, inspect=inspect,
                                facts=(*facts.FACTS, facts.venv_fact(settings.venv_dir)))
        finally:
            if pool is None:
                runner.close()

    return for_each_host(targets, lambda target: target.name, gather)


@task(auto_shortflags=False, name="facts", help=_help("inventory", "host", "cluster", "all", "json",
                                                      "accept-new-host-keys", "profile", "verbose", "set"),
      iterable=["host", "set_"])
@guarded
def facts_(c: Context, host: list[str] | None = None, cluster: str | None = None, all_: bool = False,
           inventory_: str | None = None, json_: bool = False, accept_new_host_keys: bool = False,
           profile: str | None = None, set_: list[str] | None = None, verbose: bool = False) -> None:
    """Gather each host's facts in one round trip: kernel, CPU topology, memory, driver, GPUs, units."""
    _setup_logging(verbose)
    inv = _load(inventory_)
    overrides = inventory.parse_overrides(set_ or [])
    targets = inv.select(hosts=host or [], cluster=cluster, everything=all_)
    results = _gather(inv, targets, overrides, _profile(profile), accept_new_host_keys)
    if json_:
        print(report.dump_json(report.facts_json(results)))
    else:
        report.print_facts(results, report.console())
    if not results.ok:
        raise Exit(code=1)


def run_gate(inv: inventory.Inventory, targets: list[inventory.Host], overrides: dict[str, Any],
             assumed: Any, accept_new_host_keys: bool, force: list[str]
             ) -> tuple[dict[str, list[checks.Finding]], dict[str, BaseException]]:
    findings, errors, _ = gate_with_contexts(inv, targets, overrides, assumed, accept_new_host_keys, force)
    return findings, errors


def gate_with_contexts(inv: inventory.Inventory, targets: list[inventory.Host], overrides: dict[str, Any],
                       assumed: Any, accept_new_host_keys: bool, force: list[str], pool: remote.Pool | None = None
                       ) -> tuple[dict[str, list[checks.Finding]], dict[str, BaseException],
                                  dict[str, context.Context]]:
    """Facts of the targets and of their clusters' other nodes, then every rule on each target."""
    unknown = sorted(set(force) - set(checks.RULE_IDS))
    if unknown:
        raise InventoryError(f"--force names unknown checks: {', '.join(unknown)} "
                             f"(known: {', '.join(checks.RULE_IDS)})", file="command line", key="--force")
    wanted = {target.name for target in targets}
    everyone = list(targets)
    for target in targets:
        cluster = inv.cluster_of(target.name)
        everyone.extend(inv.host(name) for name in (cluster.hosts if cluster else ())
                        if name not in {h.name for h in everyone})
    gathered = _gather(inv, everyone, overrides, assumed, accept_new_host_keys, pool)
    held = secrets.load(inv.secrets)
    if held.describe():
        _progress_line(f"secrets: {held.describe()}")
    contexts = _with_snapshots(context.contexts(inv, gathered.values, overrides, profile=assumed), held, wanted)
    contexts = {name: dataclasses.replace(ctx, api_key_set=bool(held.vllm_api_key)) for name, ctx in contexts.items()}
    errors = {name: error for name, error in gathered.errors.items() if name in wanted}
    contexts = _with_planned_wheels(contexts, wanted, errors)
    findings = {name: checks.evaluate(contexts[name], force) for name in wanted
                if name in contexts and name not in errors}
    return findings, errors, contexts


def _service_wheelhouse(ctx: context.Context) -> venv.Wheelhouse | None:
    """The wheels the service venv is made of, resolved on the controller (once; cached after)."""
    settings = ctx.settings
    requirements, local = venv.requirements_of(settings), list(settings.venv_wheels)
    if settings.venv_source or not (requirements or local):
        return None  # a source build's wheel is known only once built; nothing to install otherwise
    return venv.resolve(requirements, local, ctx.facts.arch or "", ctx.facts.python or "",
                        progress=_progress_line, indexes=venv.indexes_of(settings),
                        torch_variant=venv.torch_variant_of(ctx.profile, settings))


def _with_planned_wheels(contexts: dict[str, context.Context], wanted: set[str],
                         errors: dict[str, BaseException]) -> dict[str, context.Context]:
    """Each host whose venv would be (re)installed learns which torch its wheels bring: the driver
    must run that CUDA, not the one of the venv they replace. A resolve that fails is the host's error."""
    result = dict(contexts)
    for name in sorted(wanted & set(contexts)):
        ctx = contexts[name]
        try:
            house = _service_wheelhouse(ctx)
        except ProvisionError as exc:
            errors[name] = ProvisionError(about(name, str(exc)))
            continue
        if house is None:
            continue
        key = venv.venv_change_data(ctx.settings, ctx.profile.venv_remove, house)["key"]
        if key != venv.installed_key(ctx.facts, ctx.settings.venv_dir):
            result[name] = dataclasses.replace(ctx, planned_wheels=cuda.cuda_of_wheels(w.name for w in house.wheels))
    return result


def _with_snapshots(contexts: dict[str, context.Context], held: secrets.Secrets,
                    wanted: set[str]) -> dict[str, context.Context]:
    """Ask the hub once per (model, revision, files, endpoint) for the commit and the files' sizes and
    hashes; each host's context learns what it must still fetch (its manifest, read by the probe)."""
    asked: dict[tuple[Any, ...], weights.Snapshot | str] = {}
    quantization: dict[tuple[Any, ...], str | None] = {}
    result = dict(contexts)
    for name, ctx in contexts.items():
        if name not in wanted or not weights.managed(ctx.settings):
            continue
        s = ctx.settings
        key = (s.model, s.model_revision, tuple(s.model_files), s.hf_endpoint)
        if key not in asked:
            try:
                asked[key] = weights.resolve(s.model, s.model_revision, s.model_files,
                                             s.hf_endpoint, held.hf_token)
            except weights.WeightsError as exc:
                asked[key] = str(exc)
        answer = asked[key]
        if isinstance(answer, str):
            result[name] = dataclasses.replace(ctx, snapshot_error=answer)
            continue
        if key not in quantization:  # for the known issues; unknown (None) when config.json is unreadable
            try:
                quantization[key] = weights.model_quantization(answer.repo, answer.commit, s.hf_endpoint,
                                                               held.hf_token)
            except weights.WeightsError as exc:
                logging.getLogger("provision.weights").info("quantization unknown: %s", exc)
                quantization[key] = None
        _, to_fetch = weights.compare(answer, weights.host_weights(ctx.facts, weights.root_of(s)))
        result[name] = dataclasses.replace(ctx, snapshot=answer, weights_bytes=answer.total_bytes,
                                           weights_to_fetch=to_fetch, quantization=quantization[key])
    return result


@task(auto_shortflags=False, name="check",
      help=_help("inventory", "host", "cluster", "all", "json", "accept-new-host-keys", "profile", "set",
                 "verbose", force="override a blocker by its check id (repeatable); it stays in the report"),
      iterable=["host", "set_", "force"])
@guarded
def check(c: Context, host: list[str] | None = None, cluster: str | None = None, all_: bool = False,
          inventory_: str | None = None, json_: bool = False, accept_new_host_keys: bool = False,
          profile: str | None = None, set_: list[str] | None = None, force: list[str] | None = None,
          verbose: bool = False) -> None:
    """The preflight gate: every rule on every host, with evidence and the fix; exit 1 if one blocks."""
    _setup_logging(verbose)
    inv = _load(inventory_)
    overrides = inventory.parse_overrides(set_ or [])
    targets = inv.select(hosts=host or [], cluster=cluster, everything=all_)
    findings, errors = run_gate(inv, targets, overrides, _profile(profile), accept_new_host_keys,
                                force or [])
    order = [target.name for target in targets]
    if json_:
        print(report.dump_json(report.check_json(order, findings, errors)))
    else:
        report.print_check(order, findings, errors, report.console())
    if errors or any(checks.verdict(found) == "blocked" for found in findings.values()):
        raise Exit(code=1)


@dataclass
class HostPlan:
    changes: list[plan.Change]
    pushes: list[tuple[venv.Wheelhouse, list[venv.Wheel]]] = field(default_factory=list)
    cluster_address: str | None = None  # where the host's cluster peers reach it (weights copies)
    group: str = ""  # the cluster (or the host alone): one fetch from the hub per group
    scope: ops.Scope = field(default_factory=ops.Scope)  # what the host's generations cover
    # A deploy's generation left pending by a run that stopped before its readiness verdict.
    unfinished: dict[str, Any] | None = None

    @property
    def push_bytes(self) -> int:
        return sum(w.size for _, wheels in self.pushes for w in wheels)

    @property
    def push_count(self) -> int:
        return sum(len(wheels) for _, wheels in self.pushes)

    def of_kind(self, *kinds: str, target: str | None = None) -> list[plan.Change]:
        return [c for c in self.changes if c.kind in kinds and (target is None or c.target == target)]


def _progress_line(line: str) -> None:
    print(line, file=sys.stderr)


Builder = Callable[[context.Context, build.Recipe], "Path | None"]


def _host_plan(ctx: context.Context, found: list[checks.Finding], only: str | None,
               verify: bool = False, builder: Builder | None = None, api_key: str | None = None) -> HostPlan:
    """One host's plan: rendered files and units (unless `only` names "weights" or "venv"), the venv
    (with a source built once per architecture by `builder`), the model."""
    settings, host_facts = ctx.settings, ctx.facts
    arch, python = host_facts.arch or "", host_facts.python or ""
    pushes: list[tuple[venv.Wheelhouse, list[venv.Wheel]]] = []
    wheelhouse, venv_data = None, None
    local_wheels = list(settings.venv_wheels)
    pending_build: plan.Change | None = None
    if only != "weights" and settings.venv_source:
        recipe = build.recipe(settings.venv_source, ctx.profile, host_facts)
        built = build.cached_wheel(recipe) or (builder(ctx, recipe) if builder else None)
        if built is None:
            pending_build = plan.Change("build", str(recipe.source), (
                f"no wheel built yet for {recipe.arch}/Python {recipe.python}: provision builds it on one "
                f"host of that architecture ({', '.join(f'{k}={v}' for k, v in sorted(recipe.env.items()))})"))
        else:
            local_wheels.append(str(built))
    if only != "weights" and pending_build is None and (venv.requirements_of(settings) or local_wheels):
        wheelhouse = venv.resolve(venv.requirements_of(settings), local_wheels, arch, python,
                                  progress=_progress_line, indexes=venv.indexes_of(settings),
                                  torch_variant=venv.torch_variant_of(ctx.profile, settings))
        venv_data = venv.venv_change_data(settings, ctx.profile.venv_remove, wheelhouse)
        venv_data["requirements"] = venv_data["requirements"][:len(venv.requirements_of(settings))] + [
            f"{venv.REMOTE_WHEELHOUSE}/{Path(w).name}" for w in local_wheels]
    fetch, hub_data, hub_house = None, None, None
    if ctx.snapshot is not None and only != "venv":
        root = weights.root_of(settings)
        reason, to_fetch = weights.compare(ctx.snapshot, weights.host_weights(host_facts, root))
        if verify and not reason:
            reason = "hash every file again (--verify)"
        if reason:
            fetch = {"reason": f"{ctx.snapshot.repo}@{ctx.snapshot.commit[:12]}: {reason} "
                               f"({to_fetch / 2**20:.1f} MiB to fetch)",
                     "data": weights.change_data(settings, ctx.snapshot)}
            hub_house = venv.resolve([weights.hub_requirement()], [], arch, python, progress=_progress_line,
                                     indexes=venv.indexes_of(settings))
            hub_data = venv.helper_venv_data(weights.HUB_VENV, [weights.hub_requirement()], hub_house)
    if only:
        desired = render.DesiredState(files=(), directories=(), units=(), absent_units=(),
                                      user=settings.service_user, home=render.STATE_DIR)
        changes = [c for c in plan.build(desired, host_facts, venv_data, fetch, hub_data) if c.kind != "user"]
    else:
        desired = render.desired_state(ctx, checks.resolutions(found), api_key)
        changes = plan.build(desired, host_facts, venv_data, fetch, hub_data)
    if pending_build is not None:
        changes.insert(0, pending_build)
    for house, directory in ((wheelhouse, settings.venv_dir.rstrip("/")), (hub_house, weights.HUB_VENV)):
        if house and any(c.kind == "venv" and c.target == directory for c in changes):
            pushes.append((house, venv.missing_wheels(house, host_facts)))
    link = render.node_link(ctx) if ctx.cluster and ctx.cluster.multi_node else None
    scope = ops.Scope(venv=settings.venv_dir.rstrip("/") if venv.requirements_of(settings) or local_wheels
                      else None, model_root=weights.root_of(settings) if weights.managed(settings) else None)
    return HostPlan(changes, pushes, link.address if link else None,
                    ctx.cluster.name if ctx.cluster else ctx.host, scope, unfinished_generation(host_facts))


def unfinished_generation(host_facts: facts.HostFacts, now: float | None = None) -> dict[str, Any] | None:
    """The host's current generation when a deploy left it pending and its readiness deadline passed
    (the deploy stopped: killed, or its connection lost): the next deploy finishes it."""
    state = host_facts.files.get(plan.GENERATIONS_STATE, {})
    try:
        recorded = json.loads(str(state.get("content") or "{}"))
        current = next(g for g in recorded.get("generations", []) if g["id"] == recorded.get("current"))
    except (json.JSONDecodeError, StopIteration, AttributeError, KeyError, TypeError):
        return None
    deadline = current.get("deadline") or 0
    if current.get("state") == "pending" and deadline < (now if now is not None else time.time()):
        return {"id": current["id"], "created": current.get("created"), "by": current.get("by")}
    return None


def secret_environment(held: secrets.Secrets) -> dict[str, str | None]:
    """The secrets under the names rendered files hold them (generations keep placeholders instead)."""
    return {"VLLM_API_KEY": held.vllm_api_key, "HF_TOKEN": held.hf_token}


ONLY_RULES = {"weights": ("model.hub", "disk.space"), "venv": ("disk.space", "host.python", "driver.version")}


def _builder(inv: inventory.Inventory, accept_new_host_keys: bool) -> Builder:
    """Builds a source on the host being planned (the first of its architecture to need it)."""

    def run_build(ctx: context.Context, recipe: build.Recipe) -> Path:
        target = inv.host(ctx.host)
        runner = remote.connect(target, inv.ssh, accept_new_host_keys=accept_new_host_keys)
        try:
            house = venv.resolve(list(recipe.requires), [], recipe.arch, recipe.python, progress=_progress_line,
                                 indexes=venv.indexes_of(ctx.settings))
            missing = venv.missing_wheels(house, ctx.facts)
            venv.push(runner, house, missing)
            _progress_line(f"{ctx.host}: building {recipe.source} for {recipe.arch}/Python {recipe.python} "
                           f"({', '.join(f'{k}={v}' for k, v in sorted(recipe.env.items()))}) ...")
            return build.build(runner, recipe, on_line=lambda line: logging.getLogger("provision.build").debug(
                "%s: %s", ctx.host, line))
        finally:
            runner.close()

    return run_build


def _plans(inv: inventory.Inventory, targets: list[inventory.Host], overrides: dict[str, Any],
           assumed: Any, accept_new_host_keys: bool, force: list[str], only: str | None = None,
           verify: bool = False, may_build: bool = False, pool: remote.Pool | None = None
           ) -> tuple[dict[str, HostPlan], dict[str, list[checks.Finding]], dict[str, BaseException]]:
    """facts -> gate -> plan for every target; a blocked or failing host gets no plan."""
    findings, errors, contexts = gate_with_contexts(inv, targets, overrides, assumed, accept_new_host_keys,
                                                    force, pool)
    if only:  # only what a fetch or a venv needs
        keep = ONLY_RULES[only]
        findings = {name: [f for f in found if f.id in keep] for name, found in findings.items()}
    builder = _builder(inv, accept_new_host_keys) if may_build else None
    api_key = secrets.load(inv.secrets).vllm_api_key
    plans: dict[str, HostPlan] = {}
    # One host after the other: the first host of an architecture builds a source, the rest reuse it.
    for name, found in findings.items():
        if checks.verdict(found) == "blocked":
            continue
        try:
            host_plan = _host_plan(contexts[name], found, only, verify, builder, api_key)
        except (render.RenderError, ProvisionError, ValueError) as exc:
            errors[name] = exc if isinstance(exc, ProvisionError) else ProvisionError(about(name, str(exc)))
            continue
        plans[name] = host_plan
    return plans, findings, errors


def _report_plans(order: list[str], plans: dict[str, HostPlan],
                  findings: dict[str, list[checks.Finding]], errors: dict[str, BaseException],
                  show_diff: bool, only: str | None = None) -> None:
    out = report.console()
    for name in order:
        if name in errors:
            out.print(f"[bold]{name}[/bold]: [red]{report.error_for(name, errors[name])}[/red]")
        elif name not in plans:
            blockers = [f for f in findings[name] if f.blocks]
            out.print(f"[bold]{name}[/bold]: [red]blocked by the gate, nothing changed[/red]")
            for finding in blockers:
                out.print(f"  {finding.id}: {finding.message} -> fix: {finding.fix}")
        else:
            out.print(f"[bold]{name}[/bold]: {plan.summary(plans[name].changes, only)}")
            unfinished = plans[name].unfinished
            if unfinished:
                out.print(f"  [yellow]generation {unfinished['id']} was left pending by a deploy that stopped "
                          f"(started {unfinished['created']}): `invoke deploy` gives its verdict, "
                          f"`invoke rollback` goes back[/yellow]")
            if plans[name].push_count:
                out.print(f"  push {plans[name].push_count} wheel(s), {plans[name].push_bytes / 2**20:.0f} MiB")
            for change in plans[name].changes:
                out.print(f"  {change.describe()}")
                if show_diff and change.diff:
                    out.file.flush()
                    sys.stdout.write(change.diff)  # verbatim: a diff must not be re-wrapped


def _plans_json(order: list[str], plans: dict[str, HostPlan],
                findings: dict[str, list[checks.Finding]], errors: dict[str, BaseException],
                applied: dict[str, Any] | None = None) -> dict[str, Any]:
    hosts: dict[str, Any] = {}
    for name in order:
        body: dict[str, Any] = {"verdict": checks.verdict(findings[name]) if name in findings else None}
        if body["verdict"] == "blocked":
            body["blockers"] = [{"id": f.id, "message": f.message, "fix": f.fix, "evidence": f.evidence}
                                for f in findings[name] if f.blocks]
        if name in plans:
            body["changes"] = [{"kind": c.kind, "target": c.target, "reason": c.reason}
                               for c in plans[name].changes]
            body["push_bytes"] = plans[name].push_bytes
            body["unfinished_generation"] = plans[name].unfinished
            fetch = plans[name].of_kind("weights")
            if fetch:
                body["weights"] = {"repo": fetch[0].data["repo"], "commit": fetch[0].data["commit"],
                                   "bytes": sum(f["size"] for f in fetch[0].data["files"])}
        if applied is not None and name in applied:
            body["applied"] = applied[name]
        if name in errors:
            body["error"] = report.error_text(errors[name])
        hosts[name] = body
    return {"hosts": hosts}


HOST_TASK_HELP = _help("inventory", "host", "cluster", "all", "json", "accept-new-host-keys", "profile",
                       "set", "verbose", force="override a blocker by its check id (repeatable)")


@task(auto_shortflags=False, name="plan", help=HOST_TASK_HELP, iterable=["host", "set_", "force"])
@guarded
def plan_(c: Context, host: list[str] | None = None, cluster: str | None = None, all_: bool = False,
          inventory_: str | None = None, json_: bool = False, accept_new_host_keys: bool = False,
          profile: str | None = None, set_: list[str] | None = None, force: list[str] | None = None,
          verbose: bool = False) -> None:
    """Show what provision would change on each host, with a diff per file; changes nothing."""
    _setup_logging(verbose)
    inv = _load(inventory_)
    overrides = inventory.parse_overrides(set_ or [])
    targets = inv.select(hosts=host or [], cluster=cluster, everything=all_)
    plans, findings, errors = _plans(inv, targets, overrides, _profile(profile), accept_new_host_keys,
                                     force or [])
    order = [target.name for target in targets]
    if json_:
        print(report.dump_json(_plans_json(order, plans, findings, errors)))
    else:
        _report_plans(order, plans, findings, errors, show_diff=True)
    if errors or len(plans) < len(order):
        raise Exit(code=1)


@task(auto_shortflags=False, name="provision",
      help={**HOST_TASK_HELP, "wait": "seconds to wait for another run's lock on a host (default: fail at once)"},
      iterable=["host", "set_", "force"])
@guarded
def provision_(c: Context, host: list[str] | None = None, cluster: str | None = None, all_: bool = False,
               inventory_: str | None = None, json_: bool = False, accept_new_host_keys: bool = False,
               profile: str | None = None, set_: list[str] | None = None, force: list[str] | None = None,
               wait: float = 0, verbose: bool = False) -> None:
    """facts -> gate -> plan -> apply: bring each host's units and environment to the rendered state."""
    _setup_logging(verbose)
    _plan_and_carry_out(inventory_, host, cluster, all_, set_, profile, force, accept_new_host_keys, wait, json_)


def _plan_and_carry_out(inventory_: str | None, host: list[str] | None, cluster: str | None, all_: bool,
                        set_: list[str] | None, profile: str | None, force: list[str] | None,
                        accept_new_host_keys: bool, wait: float, json_: bool, only: str | None = None,
                        verify: bool = False) -> None:
    """What provision, venv and weights share: plan every target, show it, carry it out, report."""
    inv = _load(inventory_)
    overrides = inventory.parse_overrides(set_ or [])
    targets = inv.select(hosts=host or [], cluster=cluster, everything=all_)
    with remote.Pool(inv.ssh, accept_new_host_keys=accept_new_host_keys) as pool:
        plans, findings, errors = _plans(inv, targets, overrides, _profile(profile), accept_new_host_keys,
                                         force or [], only=only, verify=verify, may_build=only != "weights",
                                         pool=pool)
        order = [target.name for target in targets]
        if not json_:
            _report_plans(order, plans, findings, errors, show_diff=False, only=only)
        applied, failed, fetched = carry_out(inv, plans, order, accept_new_host_keys, wait,
                                             secrets.load(inv.secrets), quiet=json_, verify_all=verify, pool=pool)
    errors.update(failed)
    _report_applied(order, plans, findings, errors, applied, fetched, json_)
    if errors or len(plans) < len(order):
        raise Exit(code=1)


class _BytesOnly(ProgressColumn):
    """A byte column shown only on tasks that move bytes."""

    def __init__(self, column: ProgressColumn) -> None:
        super().__init__()
        self.column = column

    def render(self, task: Task) -> RenderableType:
        return self.column.render(task) if task.fields.get("moves_bytes", True) else ""


Connect = Callable[[str], remote.Runner]
Bar = Callable[[str], Callable[[int, int], None]]
# The last step: apply the rest of the plans on the given hosts; returns (changes done, errors).
Final = Callable[[list[str], Connect, Bar], tuple[dict[str, int], dict[str, BaseException]]]


def carry_out(inv: inventory.Inventory, plans: dict[str, HostPlan], order: list[str],
              accept_new_host_keys: bool, wait: float, held: secrets.Secrets, quiet: bool,
              verify_all: bool = False, final: Final | None = None,
              timings: dict[str, dict[str, float]] | None = None, pool: remote.Pool | None = None) -> tuple[
                  dict[str, int], dict[str, BaseException], dict[str, weights.FetchResult]]:
    """Apply the plans in three steps, all hosts at once in each: wheels pushed and the fetch helper
    built; the weights fetched (the hub once per cluster, then host to host); the rest applied (by
    `final` where given: deploy rolls it host by host). A host that fails leaves the later steps;
    the others go on. `timings` collects each host's seconds per step. Connections come from `pool`
    (the ones the facts came over) where given."""
    progress = Progress(TextColumn("{task.description}"), BarColumn(), _BytesOnly(DownloadColumn()),
                        _BytesOnly(TransferSpeedColumn()),
                        TimeRemainingColumn(), console=Console(stderr=True), disable=quiet)
    own = pool is None
    connections = pool or remote.Pool(inv.ssh, accept_new_host_keys=accept_new_host_keys)
    lock = threading.Lock()
    clock = timings if timings is not None else {}

    def connect(name: str) -> remote.Runner:
        return connections.connect(inv.host(name))

    def bar(description: str) -> Callable[[int, int], None]:
        # Steps that move bytes say "MB"; others (apply, waits for health) just show the bar.
        moves_bytes = description.endswith(("wheel(s)", "from the hub")) or ": from " in description
        task_id = progress.add_task(description, total=None, moves_bytes=moves_bytes)
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
        host_plan, runner = plans[name], connect(name)
        for house, wheels in host_plan.pushes:
            if wheels:
                total = sum(w.size for w in wheels)
                update = bar(f"{name}: push {len(wheels)} wheel(s)")
                venv.push(runner, house, wheels, lambda sent: update(sent, total))
        helper = host_plan.of_kind("venv", target=weights.HUB_VENV)
        return len(ops.apply(runner, helper, wait=wait).done) if helper else 0

    def parallel_final(names: list[str], connect: Connect, bar: Bar) -> tuple[dict[str, int], dict[str, BaseException]]:
        def finish(name: str) -> int:
            rest = remaining(plans[name])
            fetched_model = [c.describe() for c in plans[name].of_kind("weights")]
            if not rest:
                if fetched_model:  # a new model revision alone is a generation too: rollback brings the old one
                    ops.apply(connect(name), [], wait=wait, scope=plans[name].scope, by="weights",
                              secrets=secret_environment(held), model_changed=True, record=fetched_model)
                return 0
            update = bar(f"{name}: apply {len(rest)} change(s)")
            outcome = ops.apply(connect(name), rest, wait=wait, scope=plans[name].scope, by="provision",
                                secrets=secret_environment(held), model_changed=bool(plans[name].of_kind("weights")))
            update(1, 1)
            return len(outcome.done)

        last = for_each_host(names, lambda name: name, timed("apply", finish))
        return dict(last.values), dict(last.errors)

    fetched: dict[str, weights.FetchResult] = {}
    try:
        with progress:
            first = for_each_host(active, lambda name: name, timed("prepare", prepare))
            errors.update(first.errors)
            done.update(first.values)
            jobs = [weights.Job(name, plans[name].group, plans[name].of_kind("weights")[0].data,
                                plans[name].cluster_address)
                    for name in active if name not in errors and plans[name].of_kind("weights")]
            started = time.monotonic()
            fetched, fetch_errors = weights.fetch_all(jobs, connect, held.hf_token, verify_all, wait, bar)
            for job in jobs:
                clock.setdefault(job.host, {})["weights"] = round(time.monotonic() - started, 2)
            errors.update(fetch_errors)
            for name in fetched:
                done[name] = done.get(name, 0) + 1
            counts, final_errors = (final or parallel_final)([n for n in active if n not in errors], connect, bar)
            errors.update(final_errors)
            for name, count in counts.items():
                done[name] = done.get(name, 0) + count
    finally:
        if own:
            connections.close()
    return done, errors, fetched


def remaining(host_plan: HostPlan) -> list[plan.Change]:
    """What the last step applies: everything but the fetch and its helper venv (done before)."""
    return [c for c in host_plan.changes if c.kind not in ("weights", "build") and c.target != weights.HUB_VENV]


def _named(name: str, error: BaseException) -> str:
    return report.host_error(name, error)


def _report_applied(order: list[str], plans: dict[str, HostPlan], findings: dict[str, list[checks.Finding]],
                    errors: dict[str, BaseException], applied: dict[str, int],
                    fetched: dict[str, weights.FetchResult], json_: bool) -> None:
    from_hub = sum(result.fetched for result in fetched.values() if result.source == "hub")
    if json_:
        document = _plans_json(order, plans, findings, errors, applied)
        for name, result in fetched.items():
            document["hosts"][name]["fetched"] = {"bytes": result.fetched, "from": result.source,
                                                  "linked": result.detail.get("linked", 0),
                                                  "quarantined": result.detail.get("quarantined", [])}
        document["bytes_from_hub"] = from_hub
        print(report.dump_json(document))
        return
    for name in order:
        if name in errors and name in plans:
            print(_named(name, errors[name]), file=sys.stderr)
        elif name in applied:
            line = f"{name}: applied {applied[name]} change(s)"
            if name in fetched:
                result = fetched[name]
                line += f"; weights: {result.fetched / 2**20:.1f} MiB from {result.source}"
                if result.detail.get("quarantined"):
                    line += f", {len(result.detail['quarantined'])} bad file(s) set aside and fetched again"
            print(line)
    if fetched:
        print(f"bytes fetched from the hub: {from_hub} ({from_hub / 2**20:.1f} MiB)")


@task(auto_shortflags=False, name="weights",
      help={**HOST_TASK_HELP, "verify": "hash every file of the model again, not only those whose size or "
                                         "time changed", "wait": "seconds to wait for another run's lock"},
      iterable=["host", "set_", "force"])
@guarded
def weights_(c: Context, host: list[str] | None = None, cluster: str | None = None, all_: bool = False,
             inventory_: str | None = None, json_: bool = False, accept_new_host_keys: bool = False,
             profile: str | None = None, set_: list[str] | None = None, force: list[str] | None = None,
             verify: bool = False, wait: float = 0, verbose: bool = False) -> None:
    """Fetch and verify each host's model weights only (a cluster fetches from the hub once)."""
    _setup_logging(verbose)
    _plan_and_carry_out(inventory_, host, cluster, all_, set_, profile, force, accept_new_host_keys, wait, json_,
                        only="weights", verify=verify)


@task(auto_shortflags=False, name="venv", help={**HOST_TASK_HELP, "wait": "seconds to wait for another run's lock"},
      iterable=["host", "set_", "force"])
@guarded
def venv_(c: Context, host: list[str] | None = None, cluster: str | None = None, all_: bool = False,
          inventory_: str | None = None, json_: bool = False, accept_new_host_keys: bool = False,
          profile: str | None = None, set_: list[str] | None = None, force: list[str] | None = None,
          wait: float = 0, verbose: bool = False) -> None:
    """Build (a source: once per architecture), push and install each host's venv only."""
    _setup_logging(verbose)
    _plan_and_carry_out(inventory_, host, cluster, all_, set_, profile, force, accept_new_host_keys, wait, json_,
                        only="venv")


@task(auto_shortflags=False, name="rollback",
      help=_help("inventory", "host", "cluster", "all", "json", "accept-new-host-keys", "set",
                 wait="seconds to wait for another run's lock on a host",
                 list="show each host's generations (when, by what, what changed, passed or not) and change nothing",
                 to="the generation to restore (default: the newest before the current one that was not rejected)"),
      iterable=["host", "set_"])
@guarded
def rollback_(c: Context, host: list[str] | None = None, cluster: str | None = None, all_: bool = False,
              inventory_: str | None = None, json_: bool = False, accept_new_host_keys: bool = False,
              set_: list[str] | None = None, wait: float = 0, list_: bool = False, to: int = 0) -> None:
    """Restore a whole earlier generation (files, units, venv, model revision) on each host, or list them."""
    inv = _load(inventory_)
    overrides = inventory.parse_overrides(set_ or [])
    targets = inv.select(hosts=host or [], cluster=cluster, everything=all_)
    held = secrets.load(inv.secrets)

    def scope_of(name: str) -> ops.Scope:
        settings = inv.settings(name, overrides)
        return ops.Scope(venv=settings.venv_dir.rstrip("/"),
                         model_root=weights.root_of(settings) if weights.managed(settings) else None)

    def act(target: inventory.Host) -> ops.Outcome | Any:
        runner = remote.connect(target, inv.ssh, accept_new_host_keys=accept_new_host_keys)
        try:
            if list_:
                return ops.generations(runner, scope_of(target.name))
            return ops.rollback(runner, scope_of(target.name), to=to or None, wait=wait,
                                secrets=secret_environment(held))
        finally:
            runner.close()

    results = for_each_host(targets, lambda target: target.name, act)
    if json_:
        body = {name: ({"error": report.error_text(results.errors[name])} if name in results.errors
                       else results.values[name] if list_
                       else {"to": results.values[name].to, "restored": list(results.values[name].restored)})
                for name in results.order}
        print(report.dump_json({"hosts": body}))
    else:
        for name in results.order:
            if name in results.errors:
                print(report.host_error(name, results.errors[name]), file=sys.stderr)
            elif list_:
                report.print_generations(name, results.values[name], report.console())
            else:
                outcome = results.values[name]
                print(f"{name}: generation {outcome.to} restored: {', '.join(outcome.restored) or 'it was in place'}")
    if not results.ok:
        raise Exit(code=1)


@task(auto_shortflags=False, name="inventory", help=_help("inventory", "json", "set"), iterable=["set_"])
@guarded
def show_inventory(c: Context, inventory_: str | None = None, json_: bool = False,
                   set_: list[str] | None = None) -> None:
    """Validate the inventory and show hosts, clusters and each host's resolved settings."""
    inv = _load(inventory_)
    overrides = inventory.parse_overrides(set_ or [])
    if json_:
        print(report.dump_json(report.inventory_json(inv, overrides)))
    else:
        report.print_inventory(inv, report.console())


@task(auto_shortflags=False, name="up", help={"hosts": "comma-separated lab host names (default: all of them)"})
@guarded
def lab_up(c: Context, hosts: str | None = None) -> None:
    """Boot the lab: real hosts (systemd-nspawn, sshd) replaying recorded GPU machines."""
    names = [name.strip() for name in hosts.split(",") if name.strip()] if hosts else None
    the_lab = lab.Lab()
    the_lab.up(names, progress=lambda line: print(line, file=sys.stderr))
    report.print_rows(the_lab.status(), f"lab hosts (inventory: {the_lab.inventory})", report.console())


@task(auto_shortflags=False, name="status", help=_help("json"))
@guarded
def lab_status(c: Context, json_: bool = False) -> None:
    """Show the lab's hosts: address, profile, recording replayed, process and sshd state."""
    rows = lab.Lab().status()
    if json_:
        print(report.dump_json(rows))
    else:
        report.print_rows(rows, "lab hosts", report.console())
    if any(row["sshd"] != "answers" for row in rows):
        raise Exit(code=1)


@task(auto_shortflags=False, name="down", help={"keep-cache": "keep the cached base root filesystem for a faster next lab.up"})
@guarded
def lab_down(c: Context, keep_cache: bool = False) -> None:
    """Stop the lab and remove everything it made (processes, namespaces, links, files)."""
    removed = lab.Lab().down(keep_cache=keep_cache)
    print(f"lab down: stopped {', '.join(removed) or 'no hosts'}")
    for line in lab.left_in_place():
        print(line)


lab_tasks = Collection("lab", lab_up, lab_status, lab_down)
