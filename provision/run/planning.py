"""Planning: what each host that passed the gate needs, rendered and diffed (its venv resolved, a
source built once per architecture, its model compared with the hub's answer). Each HostPlan carries
the host's Context, inventory entry and declared settings: what runs after the plan reads those."""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provision import (
    build,
    checks,
    context,
    engines,
    facts,
    hints,
    inventory,
    ops,
    plan,
    remote,
    render,
    secrets,
    server,
    serverfiles,
    services,
    venv,
    weights,
)
from provision.context import Context
from provision.errors import ProvisionError, RenderError, about
from provision.run.gating import gate
from provision.run.options import Options, progress_line


@dataclass
class HostPlan:
    """One host's plan, and what the stages after the gate know of the host: its Context (the gate's
    settings, cluster and facts), its inventory entry and its declared settings. What runs after the
    plan reads these; it never resolves the host again."""

    changes: list[plan.Change]
    pushes: list[tuple[venv.Wheelhouse, list[venv.Wheel]]] = field(default_factory=list)
    cluster_address: str | None = None  # where the host's cluster peers reach it (weights copies)
    group: str = ""  # the cluster (or the host alone): one fetch from the hub per group
    scope: ops.Scope = field(default_factory=ops.Scope)  # what the host's generations cover
    # A deploy's generation left pending by a run that stopped before its readiness verdict.
    unfinished: dict[str, Any] | None = None
    transfer: str = "relay"  # how the cluster passes weights and wheels around (the `transfer` setting)
    arch: str = ""  # hosts of one cluster and architecture pass wheels to each other
    held_wheels: dict[str, str] = field(default_factory=dict)  # {name: sha256} in the host's wheelhouse
    # Where the host's server answers, recorded with its generation: None where the run renders none of
    # the server's files (weights or venv only), whose generation keeps where the current one answers.
    serve: dict[str, str] | None = None
    overrides: tuple[str, ...] = ()  # the run's --set keys that differ from the inventory: drift, in status
    # The model revision (weights.change_data) the host holds verified and needs no fetch of: its
    # cluster peers that must fetch it take it from this host before the hub.
    holds: Mapping[str, Any] | None = None
    # Why the host's weights are not the tool's to fetch, and what is there: "not fetched: ...".
    weights_note: str | None = None
    context: Context | None = None  # what the gate saw and judged (host_plan sets it)
    target: inventory.Host | None = None  # the inventory's host: where to connect
    declared: inventory.Settings | None = None  # the inventory's settings, without the run's --set
    # The source build the venv needed: where its wheel came from and the seconds it took (deploy's
    # steps show it: llama.cpp's CUDA build was 432 of an H200 host's 442 s to ready).
    build: tuple[str, float] | None = None

    @property
    def ctx(self) -> Context:
        if self.context is None:
            raise ValueError("a plan built without its host's context")
        return self.context

    @property
    def settings(self) -> inventory.Settings:
        """The host's settings as the gate resolved them (--set and --profile applied)."""
        return self.ctx.settings

    @property
    def host(self) -> inventory.Host:
        if self.target is None:
            raise ValueError("a plan built without its inventory host")
        return self.target

    @property
    def declared_settings(self) -> inventory.Settings:
        if self.declared is None:
            raise ValueError("a plan built without its host's declared settings")
        return self.declared

    @property
    def push_bytes(self) -> int:
        return sum(w.size for _, wheels in self.pushes for w in wheels)

    @property
    def push_count(self) -> int:
        return sum(len(wheels) for _, wheels in self.pushes)

    def of_kind(self, *kinds: str, target: str | None = None) -> list[plan.Change]:
        return [c for c in self.changes if c.kind in kinds and (target is None or c.target == target)]


@dataclass
class Planned:
    """What crosses from planning to carrying out: each host's plan (its context with it), the gate's
    findings and errors, the run's secrets, and the contexts of every host the gate saw (a cluster's
    head among them where it is not a target)."""

    order: list[str]
    plans: dict[str, HostPlan]
    findings: dict[str, list[checks.Finding]]
    errors: dict[str, BaseException]
    held: secrets.Secrets
    contexts: dict[str, context.Context] = field(default_factory=dict)


Builder = Callable[[context.Context, build.Recipe], "Path | None"]


def source_wheel(ctx: context.Context, builder: Builder | None
                 ) -> tuple[Path | None, plan.Change | None, tuple[str, float] | None]:
    """The wheel of the host's `venv_source`: from the build cache, or built now by `builder` (timed), or
    a pending "build" change when there is no builder (plan). Also where it came from and its seconds."""
    settings = ctx.settings
    engine_env = build.with_cmake_args(engines.engine_of(settings).build_env(ctx, build.jobs_of(ctx.facts)),
                                       settings.build_cmake_args)
    recipe = build.recipe(str(settings.venv_source), ctx.profile, ctx.facts, engine_env,
                          venv.indexes_of(settings).args())
    built = build.cached_wheel(recipe)
    if built is not None:
        return built, None, ("the build cache", 0.0)
    if builder is not None:
        begun = time.monotonic()
        made = builder(ctx, recipe)
        return made, None, (f"built on {ctx.host}", round(time.monotonic() - begun, 1))
    return None, plan.Change("build", str(recipe.source), (
        f"no wheel built yet for {recipe.arch}/Python {recipe.python}: provision builds it on one "
        f"host of that architecture ({', '.join(f'{k}={v}' for k, v in sorted(recipe.env.items()))})")), None


def host_plan(ctx: context.Context, found: list[checks.Finding], only: str | None,
               verify: bool = False, builder: Builder | None = None, api_key: str | None = None,
               held: secrets.Secrets | None = None) -> HostPlan:
    """One host's plan: rendered files and units (unless `only` names "weights" or "venv"), the venv
    (with a source built once per architecture by `builder`), the model."""
    settings, host_facts = ctx.settings, ctx.facts
    arch, python = host_facts.wheel_arch or "", host_facts.python or ""
    pushes: list[tuple[venv.Wheelhouse, list[venv.Wheel]]] = []
    wheelhouse, venv_data = None, None
    local_wheels = list(settings.venv_wheels)
    pending_build: plan.Change | None = None
    build_step: tuple[str, float] | None = None
    if only != "weights" and settings.venv_source:
        built, pending_build, build_step = source_wheel(ctx, builder)
        if built is not None:
            local_wheels.append(str(built))
    requirements = engines.engine_of(ctx.settings).service_requirements(ctx)
    if only != "weights" and pending_build is None and (requirements or local_wheels):
        wheelhouse = venv.resolve_service(ctx, requirements, local_wheels, progress_line)
        venv_data = venv.venv_change_data(settings, ctx.profile.venv_remove, wheelhouse,
                                          verify=engines.engine_of(settings).verify_modules(
                                              venv.requirements_of(settings), local_wheels),
                                          requirements=requirements,
                                          site_files=engines.engine_of(settings).venv_site_files(ctx),
                                          base=ctx.facts.venv_base if settings.venv_base else None)
        venv_data["requirements"] = venv_data["requirements"][:len(requirements)] + [
            f"{venv.REMOTE_WHEELHOUSE}/{Path(w).name}" for w in local_wheels]
    fetch, hub_data, hub_house, holds = None, None, None, None
    if ctx.snapshot is not None and only != "venv":
        root = weights.root_of(settings)
        reason, to_fetch = weights.compare(ctx.snapshot, weights.host_weights(host_facts, root))
        amount = f"{to_fetch / 2**20:.1f} MiB to fetch"
        if verify and not reason:
            reason = "hash every file again (--verify)"
            # What fails its hash is fetched again: known only once hashed, at most the whole revision.
            amount = (f"up to {ctx.snapshot.total_bytes / 2**20:.1f} MiB to fetch: the files that "
                      "fail their hash")
        if reason:
            fetch = {"reason": f"{ctx.snapshot.repo}@{ctx.snapshot.commit[:12]}: {reason} ({amount})",
                     "data": weights.change_data(settings, ctx.snapshot)}
            hub_house = venv.resolve([weights.hub_requirement()], [], arch, python, progress=progress_line,
                                     indexes=venv.indexes_of(settings))
            hub_data = venv.helper_venv_data(weights.HUB_VENV, [weights.hub_requirement()], hub_house)
        else:
            holds = weights.change_data(settings, ctx.snapshot)
    if only:
        desired = render.DesiredState(files=(), directories=(), units=(), absent_units=(),
                                      user=settings.service_user, home=render.STATE_DIR)
        changes = [c for c in plan.build(desired, host_facts, venv_data, fetch, hub_data) if c.kind != "user"]
    else:
        desired = render.desired_state(ctx, checks.resolutions(found), api_key,
                                       {"mpi_ssh_key": held.mpi_ssh_key} if held else None)
        changes = plan.build(desired, host_facts, venv_data, fetch, hub_data)
    if pending_build is not None:
        changes.insert(0, pending_build)
    for house, directory in ((wheelhouse, settings.venv_dir.rstrip("/")), (hub_house, weights.HUB_VENV)):
        if house and any(c.kind == "venv" and c.target == directory for c in changes):
            pushes.append((house, venv.missing_wheels(house, host_facts)))
    link = ctx.link
    scope = scope_of(settings, ctx.naming, venv=bool(venv.requirements_of(settings) or local_wheels))
    return HostPlan(changes, pushes, link.address if link else None,
                    ctx.cluster.name if ctx.cluster else ctx.host, scope,
                    unfinished_generation(host_facts, state_file=ctx.naming.state_file),
                    transfer=settings.transfer, arch=arch, held_wheels=venv.remote_wheels(host_facts),
                    serve=server.endpoint(settings, ctx.naming) if settings.model and not only else None,
                    holds=holds,
                    weights_note=weights.not_fetched(settings, weights.placed_model(
                        host_facts, render.model_path(settings))), context=ctx, build=build_step)


def unfinished_generation(host_facts: facts.HostFacts, now: float | None = None,
                          state_file: str = plan.GENERATIONS_STATE) -> dict[str, Any] | None:
    """The server's current generation when a deploy left it pending and its readiness deadline passed
    (the deploy stopped: killed, or its connection lost): the next deploy finishes it. A deploy that
    holds the host's roll lock judges it past every deadline (`now` infinite): no other deploy is
    waiting for its verdict then."""
    state = host_facts.files.get(state_file, {})
    try:
        recorded = json.loads(str(state.get("content") or "{}"))
        current = next(g for g in recorded.get("generations", []) if g["id"] == recorded.get("current"))
    except (json.JSONDecodeError, StopIteration, AttributeError, KeyError, TypeError):
        return None
    deadline = current.get("deadline") or 0
    if current.get("state") == "pending" and deadline < (now if now is not None else time.time()):
        return {"id": current["id"], "created": current.get("created"), "by": current.get("by"),
                "changes": len(current.get("changes") or [])}
    return None


ONLY_RULES = {"weights": ("model.hub", "disk.space"), "venv": ("disk.space", "host.python", "driver.version")}


def builder(inv: inventory.Inventory, accept_new_host_keys: bool) -> Builder:
    """Builds a source on the host being planned (the first of its architecture to need it)."""

    def run_build(ctx: context.Context, recipe: build.Recipe) -> Path:
        target = inv.host(ctx.host)
        runner = remote.connect(target, inv.ssh, accept_new_host_keys=accept_new_host_keys)
        try:
            house = venv.resolve(list(recipe.requires), [], recipe.arch, recipe.python, progress=progress_line,
                                 indexes=venv.indexes_of(ctx.settings))
            venv.push(runner, house.files(venv.missing_wheels(house, ctx.facts)))
            progress_line(f"{ctx.host}: building {recipe.source} for {recipe.arch}/Python {recipe.python} "
                           f"({', '.join(f'{k}={v}' for k, v in sorted(recipe.env.items()))}) ...")
            shown = [-100]

            def on_line(line: str) -> None:
                logging.getLogger("provision.build").debug("%s: %s", ctx.host, line)
                percent = build.build_percent(line, shown[0])
                if percent is not None:
                    shown[0] = percent
                    progress_line(f"{ctx.host}: building {ctx.settings.venv_source}: {percent} % ({line.strip()[7:90]})")

            return build.build(runner, recipe, on_line=on_line, progress=progress_line)
        finally:
            runner.close()

    return run_build


def plans(inv: inventory.Inventory, targets: list[inventory.Host], options: Options,
          pool: remote.Pool | None = None) -> Planned:
    """facts -> gate -> plan for every target; a blocked or failing host gets no plan."""
    gated = gate(inv, targets, options, pool)
    findings, errors, contexts = gated.findings, dict(gated.errors), gated.contexts
    only = options.only
    if only:  # only what a fetch or a venv needs
        keep = ONLY_RULES[only]
        findings = {name: [f for f in found if f.id in keep] for name, found in findings.items()}
    build_with = builder(inv, options.accept_new_host_keys) if options.may_build else None
    api_key = gated.held.api_key
    result: dict[str, HostPlan] = {}
    # One host after the other: the first host of an architecture builds a source, the rest reuse it.
    for name, found in findings.items():
        if checks.verdict(found) == "blocked":
            continue
        try:
            planned = host_plan(contexts[name], found, only, options.verify, build_with, api_key, gated.held)
        except (RenderError, ProvisionError, ValueError) as exc:
            errors[name] = exc if isinstance(exc, ProvisionError) else ProvisionError(about(name, str(exc)))
            continue
        planned.declared = inv.settings(name, {})
        planned.overrides = departing(contexts[name].settings, planned.declared, options.overrides)
        planned.target = gated.hosts[name]
        result[name] = planned
    restart_whole(result, errors)
    return Planned(gated.order, result, findings, errors, gated.held, contexts)


def restart_whole(result: dict[str, HostPlan], errors: dict[str, BaseException]) -> None:
    """A cluster whose nodes are one server that restarts only whole (the engine's pair_unit: vLLM's own
    multi-node launch): where one node's plan starts or restarts its unit, every other node's restarts it.
    Where a node that would have to is not in this run (not a target, or blocked by the gate), no node of
    the cluster is changed: restarting some of them would leave a server that cannot form."""
    clusters: dict[str, dict[str, str]] = {}
    members: dict[str, tuple[str, ...]] = {}
    for name, planned in result.items():
        ctx = planned.ctx
        unit = engines.engine_of(ctx.settings).pair_unit(ctx)
        if unit is not None and ctx.cluster is not None:
            clusters.setdefault(ctx.cluster.name, {})[name] = ctx.naming.unit(unit)
            members[ctx.cluster.name] = ctx.cluster.hosts
    for cluster, units in clusters.items():
        joined = plan.together({name: result[name].changes for name in units}, units)
        moving = [name for name in units if any(c.kind in ("start", "restart") and c.target == units[name]
                                                for c in joined[name])]
        left_out = [name for name in members[cluster] if name not in units]
        if moving and left_out:
            for name in units:
                errors[name] = ProvisionError(
                    f"{name}: the nodes of cluster {cluster} start together, and {', '.join(left_out)} is not in "
                    f"this run (not a target, or refused by the gate): nothing changed; run it for the whole "
                    f"cluster: `{hints.command(f'deploy --cluster {cluster}')}`")
                del result[name]
            continue
        for name, changes in joined.items():
            result[name].changes = changes


def departing(asked: inventory.Settings, declared: inventory.Settings, overrides: Mapping[str, Any]) -> tuple[str, ...]:
    """The run's --set keys (`overrides`) whose value on the host (`asked`: the run's settings) differs
    from what the inventory `declared` (a --set that repeats the inventory is no drift)."""
    if not overrides:
        return ()
    return tuple(sorted(key for key in overrides if getattr(asked, key, None) != getattr(declared, key, None)))


def scope_of(settings: inventory.Settings, naming: services.Naming = services.HOST, venv: bool = True) -> ops.Scope:
    """What a server's generations cover: its venv (where the tool installs one), the model root it
    serves from, and its own files and units, kept where its names say: the files server_files places
    too (a rollback to a generation whose plugin has since changed or gone puts it back)."""
    placed = tuple(sorted(serverfiles.host_paths(settings.server_files, naming.service).values()))
    return ops.Scope(venv=settings.venv_dir.rstrip("/") if venv else None,
                     model_root=weights.root_of(settings) if weights.managed(settings) else None,
                     root=naming.generations, files=(*render.managed_paths_of(naming), *placed),
                     units=render.units_of(naming))
