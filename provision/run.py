"""The run itself, in one place: gather -> gate -> plan -> carry out, for every task that changes or
inspects hosts (check, plan, provision, venv, weights; deploy adds its roll in provision.rolling).

    gather(inventory, targets, options)   facts of every target, one round trip each, in parallel
    gate(...)     -> Gated                 the contexts (facts, settings, hub answers) and every rule's finding
    plans(...)    -> Planned               what each host needs, rendered and diffed; blocked hosts get none
    carry_out(...)                         wheels pushed, weights fetched (the hub once per cluster), the rest
                                           applied (or handed to deploy's roll), each host on its own
    provision(...) -> Applied              plans then carry_out, for provision, venv and weights

What a run was asked to do travels as one frozen Options; the task modules only parse arguments into it
and print what comes back (provision.report).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
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
    build,
    checks,
    context,
    cuda,
    engines,
    facts,
    inventory,
    known_issues,
    ops,
    plan,
    remote,
    render,
    secrets,
    server,
    venv,
    weights,
)
from provision.errors import InventoryError, ProvisionError, RenderError, WeightsError, about
from provision.fanout import HostResults, for_each_host
from provision.profiles import Profile
from provision.runner import Runner


@dataclass(frozen=True)
class Options:
    """What one run was asked to do, from the command line (every field has the tasks' default)."""

    overrides: Mapping[str, Any] = field(default_factory=dict)  # --set KEY=VALUE, highest precedence
    profile: Profile | None = None  # --profile: assumed instead of the inventory's
    accept_new_host_keys: bool = False
    force: tuple[str, ...] = ()  # --force ID: blockers overridden, kept in the report
    wait: float = 0  # seconds to wait for another run's lock on a host
    quiet: bool = False  # --json: no progress bars
    only: str | None = None  # "weights" or "venv": that part of the plan alone
    verify: bool = False  # hash every weights file again
    may_build: bool = False  # build a venv source on a host while planning (provision, venv, deploy)


@dataclass(frozen=True)
class Gated:
    order: list[str]  # the targets, in the order asked
    findings: dict[str, list[checks.Finding]]
    errors: dict[str, BaseException]
    contexts: dict[str, context.Context]
    held: secrets.Secrets  # read once per run: the gate, the plan and carry_out share them


def gather(inv: inventory.Inventory, targets: list[inventory.Host], options: Options,
           pool: remote.Pool | None = None) -> HostResults[facts.HostFacts]:
    """Every target's facts in parallel, one round trip each; a failing host never stops the others.
    With a pool, the connections stay open for what the run does next."""

    def one(target: inventory.Host) -> facts.HostFacts:
        settings = inv.settings(target.name, options.overrides, profile=options.profile)
        paths = [settings.venv_dir, settings.model_dir, settings.hf_home]
        inspect: dict[str, list[str]] = plan.inspect_spec(
            [render.CONFIG_DIR, render.STATE_DIR, *paths[1:], *venv.inspect_paths(settings),
             f"{weights.HUB_VENV}/{facts.VENV_MANIFEST}"], settings.service_user)
        inspect["weights"] = [weights.root_of(settings)] if weights.managed(settings) else []
        # Weights placed by hand: their config.json and sizes, for the memory fit (one small read).
        inspect["models"] = [render.model_path(settings)] if settings.model and not weights.managed(settings) else []
        runner = pool.connect(target) if pool else remote.connect(
            target, inv.ssh, accept_new_host_keys=options.accept_new_host_keys)
        try:
            return facts.gather(runner, paths=paths, inspect=inspect,
                                facts=(*facts.FACTS, facts.venv_fact(settings.venv_dir)))
        finally:
            if pool is None:
                runner.close()

    return for_each_host(targets, lambda target: target.name, one)


def gate(inv: inventory.Inventory, targets: list[inventory.Host], options: Options,
         pool: remote.Pool | None = None) -> Gated:
    """Facts of the targets and of their clusters' other nodes, then every rule on each target."""
    unknown = sorted(set(options.force) - set(checks.RULE_IDS))
    if unknown:
        raise InventoryError(f"--force names unknown checks: {', '.join(unknown)} "
                             f"(known: {', '.join(checks.RULE_IDS)})", file="command line", key="--force")
    wanted = {target.name for target in targets}
    everyone = list(targets)
    for target in targets:
        cluster = inv.cluster_of(target.name)
        everyone.extend(inv.host(name) for name in (cluster.hosts if cluster else ())
                        if name not in {h.name for h in everyone})
    held = secrets.load(inv.secrets)
    early = _ask_hub_early(inv, sorted(wanted), options.overrides, held)  # while the facts are gathered
    gathered = gather(inv, everyone, options, pool)
    if held.describe():
        progress_line(f"secrets: {held.describe()}")
    contexts = _with_snapshots(context.contexts(inv, gathered.values, options.overrides, profile=options.profile),
                               held, wanted, early)
    contexts = _with_placed_weights(contexts, held, wanted)
    contexts = {name: dataclasses.replace(ctx, api_key_set=bool(held.vllm_api_key), mpi_key_set=bool(held.mpi_ssh_key))
                for name, ctx in contexts.items()}
    errors = {name: error for name, error in gathered.errors.items() if name in wanted}
    contexts = _with_planned_wheels(contexts, wanted, errors)
    contexts = _with_reachability(inv, contexts, wanted, errors, options, pool)
    findings = {name: checks.evaluate(contexts[name], options.force) for name in wanted
                if name in contexts and name not in errors}
    return Gated([target.name for target in targets], findings, errors, contexts, held)


def _service_wheelhouse(ctx: context.Context) -> venv.Wheelhouse | None:
    """The wheels the service venv is made of, resolved on the controller (once; cached after)."""
    settings = ctx.settings
    requirements, local = venv.service_requirements(ctx), list(settings.venv_wheels)
    if settings.venv_source or not (requirements or local):
        return None  # a source build's wheel is known only once built; nothing to install otherwise
    return venv.resolve(requirements, local, ctx.facts.wheel_arch or "", ctx.facts.python or "",
                        progress=progress_line, indexes=venv.indexes_of(settings),
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
        ctx = result[name] = dataclasses.replace(ctx, resolved_wheels=tuple(w.name for w in house.wheels))
        key = venv.venv_change_data(ctx.settings, ctx.profile.venv_remove, house)["key"]
        if key != venv.installed_key(ctx.facts, ctx.settings.venv_dir):
            result[name] = dataclasses.replace(ctx, planned_wheels=cuda.cuda_of_wheels(w.name for w in house.wheels))
    return result


def _with_reachability(inv: inventory.Inventory, contexts: dict[str, context.Context], wanted: set[str],
                       errors: dict[str, BaseException], options: Options,
                       pool: remote.Pool | None) -> dict[str, context.Context]:
    """The endpoints a known issue needs tried from a host (its other matchers all hold: vLLM 0.26+
    without flashinfer-cubin planned), tried in one small probe per such host; no other host pays."""
    asks = {name: endpoints for name in sorted(wanted & set(contexts)) if name not in errors
            and (endpoints := sorted({endpoint for issue in known_issues.load()
                                      for endpoint in known_issues.endpoints_to_try(
                                          issue, known_issues.evidence_of(contexts[name]))}))}
    if not asks:
        return contexts

    def one(target: inventory.Host) -> dict[str, str | None]:
        runner = pool.connect(target) if pool else remote.connect(
            target, inv.ssh, accept_new_host_keys=options.accept_new_host_keys)
        try:
            return facts.reach(runner, asks[target.name])
        finally:
            if pool is None:
                runner.close()

    tried = for_each_host([inv.host(name) for name in asks], lambda target: target.name, one)
    result = dict(contexts)
    for name, answer in tried.values.items():
        ctx = contexts[name]
        result[name] = dataclasses.replace(ctx, facts=dataclasses.replace(
            ctx.facts, reachable={**ctx.facts.reachable, **answer}))
    for name, error in tried.errors.items():
        errors[name] = error
    return result


def _quantization(model_config: dict[str, Any] | None) -> str | None:
    if model_config is None:
        return None
    try:
        return weights.quantization_of(model_config)
    except WeightsError as exc:
        logging.getLogger("provision.weights").info("quantization unknown: %s", exc)
        return None


HubKey = tuple[str, str, tuple[str, ...], str]  # (model, revision, file patterns, endpoint)
HubAnswer = tuple["weights.Snapshot | str", "dict[str, Any] | None"]  # (snapshot or why not, config.json)


def _hub_key(settings: inventory.Settings) -> HubKey:
    return str(settings.model), settings.model_revision, tuple(settings.model_files), settings.hf_endpoint


def _ask_hub(key: HubKey, held: secrets.Secrets) -> HubAnswer:
    """The revision's commit and files, and the model's config.json (None when unreadable), asked with
    the run's hf_token; a refusal names where that token came from."""
    model, revision, files, endpoint = key
    try:
        snapshot = weights.resolve(model, revision, files, endpoint, held.hf_token, held.sources.get("hf_token"))
    except WeightsError as exc:
        return str(exc), None
    weights.keep_snapshot(snapshot, files, endpoint)
    try:  # known issues and the KV cache estimate
        return snapshot, weights.model_config(snapshot.repo, snapshot.commit, endpoint, held.hf_token)
    except WeightsError as exc:
        logging.getLogger("provision.weights").info("config.json unknown: %s", exc)
        return snapshot, None


def _kept(key: HubKey, token: str | None) -> HubAnswer | None:
    """A pinned commit's files and config.json as the hub gave them before: a plan of hosts that have
    them asks the hub nothing (and loads no hub client). None when the hub must be asked."""
    model, revision, files, endpoint = key
    snapshot = weights.kept_snapshot(model, revision, files, endpoint)
    if snapshot is None:
        return None
    try:
        return snapshot, weights.model_config(model, snapshot.commit, endpoint, token)
    except WeightsError:
        return None


@dataclass(frozen=True)
class HubAnswers:
    """What a plan knows of its models before the facts are in: pinned commits' answers kept from an
    earlier plan, and the hub's answers being asked meanwhile."""

    kept: Mapping[HubKey, HubAnswer] = field(default_factory=dict)
    asking: Mapping[HubKey, Future[HubAnswer]] = field(default_factory=dict)


def _ask_hub_early(inv: inventory.Inventory, names: Sequence[str], overrides: Mapping[str, Any],
                   held: secrets.Secrets) -> HubAnswers:
    """The targets' models: each pinned commit answered from what was kept, the others asked of the
    hub in threads of their own, so the hub and the hosts answer at the same time."""
    kept: dict[HubKey, HubAnswer] = {}
    keys = set()
    for name in names:
        settings = inv.settings(name, overrides)
        if not weights.managed(settings):
            continue
        key = _hub_key(settings)
        if key not in kept and key not in keys:
            answer = _kept(key, held.hf_token)
            if answer is None:
                keys.add(key)
            else:
                kept[key] = answer
    if not keys:
        return HubAnswers(kept)
    asking = ThreadPoolExecutor(max_workers=min(8, len(keys)), thread_name_prefix="hub")
    futures = {key: asking.submit(_ask_hub, key, held) for key in keys}
    asking.shutdown(wait=False)
    return HubAnswers(kept, futures)


def _with_snapshots(contexts: dict[str, context.Context], held: secrets.Secrets, wanted: set[str],
                    early: HubAnswers) -> dict[str, context.Context]:
    """Ask the hub once per (model, revision, files, endpoint) for the commit and the files' sizes and
    hashes (the answers asked early where the key is the same); each host's context learns what it
    must still fetch (its manifest, read by the probe). A pinned commit's kept answer stands while
    its hosts have it; once one must fetch, the hub is asked, so the gate's model.hub says what the
    hub says now (a repository gone, a token refused)."""
    asked: dict[HubKey, HubAnswer] = {}
    live: set[HubKey] = set()  # answers the hub gave in this run (not kept from an earlier one)
    result = dict(contexts)
    for name, ctx in contexts.items():
        s = ctx.settings
        if name not in wanted or not weights.managed(s) or not s.model:
            continue
        key = _hub_key(s)
        if key not in asked:
            kept = early.kept.get(key) or (None if key in early.asking else _kept(key, held.hf_token))
            if kept is not None:
                asked[key] = kept
            else:
                asked[key] = early.asking[key].result() if key in early.asking else _ask_hub(key, held)
                live.add(key)
        answer, model_config = asked[key]
        if isinstance(answer, str):
            result[name] = dataclasses.replace(ctx, snapshot_error=answer)
            continue
        reason, to_fetch = weights.compare(answer, weights.host_weights(ctx.facts, weights.root_of(s)))
        if reason and key not in live:  # a host must fetch: the gate asks the hub itself
            live.add(key)
            asked[key] = _ask_hub(key, held)
            answer, model_config = asked[key]
            if isinstance(answer, str):
                result[name] = dataclasses.replace(ctx, snapshot_error=answer)
                continue
            reason, to_fetch = weights.compare(answer, weights.host_weights(ctx.facts, weights.root_of(s)))
        result[name] = dataclasses.replace(ctx, snapshot=answer, weights_bytes=answer.weight_bytes,
                                           weights_to_fetch=to_fetch, model_config=model_config,
                                           quantization=_quantization(model_config))
    return result


def _with_placed_weights(contexts: dict[str, context.Context], held: secrets.Secrets,
                         wanted: set[str]) -> dict[str, context.Context]:
    """Hosts whose weights the tool does not fetch learn the model's config.json and weight bytes for
    the memory fit: from the model directory on the host (read by the probe), else, for a hub
    repository id, from the hub (once per model, revision, files and endpoint); where neither has
    them, why (the gate says it instead of nothing). The hub's refusal blocks nothing here: the
    weights are the host's own."""
    asked: dict[HubKey, HubAnswer] = {}
    result = dict(contexts)
    for name, ctx in contexts.items():
        s = ctx.settings
        if name not in wanted or not s.model or weights.managed(s):
            continue
        directory = render.model_path(s)
        placed = weights.placed_model(ctx.facts, directory)
        if placed is not None and placed.config is not None:
            result[name] = dataclasses.replace(
                ctx, model_config=placed.config, quantization=_quantization(dict(placed.config)),
                weights_bytes=placed.weight_bytes, model_config_from=f"{directory}/config.json on the host",
                weights_from=f"file sizes in {directory} on the host" if placed.weight_bytes else None)
            continue
        on_host = placed.config_error if placed is not None else f"{directory} was not inspected"
        if str(s.model).startswith("/"):
            result[name] = dataclasses.replace(ctx, model_config_note=(
                f"{on_host}, and the model is a path, not a hub repository id"))
            continue
        key = _hub_key(s)
        if key not in asked:
            asked[key] = _kept(key, held.hf_token) or _ask_hub(key, held)
        answer, model_config = asked[key]
        if isinstance(answer, str):
            result[name] = dataclasses.replace(ctx, model_config_note=f"{on_host}; the hub: {answer}")
        elif model_config is None:
            result[name] = dataclasses.replace(
                ctx, weights_bytes=answer.weight_bytes, weights_from=f"hub file sizes of {answer.repo}",
                model_config_note=f"{on_host}; the hub gave no readable config.json of {answer.repo}")
        else:
            result[name] = dataclasses.replace(
                ctx, model_config=model_config, quantization=_quantization(model_config),
                weights_bytes=answer.weight_bytes, weights_from=f"hub file sizes of {answer.repo}",
                model_config_from=f"the hub ({answer.repo}@{answer.commit[:12]}; {on_host})")
    return result


@dataclass
class HostPlan:
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
    serve: dict[str, str] | None = None  # where the host's server answers: recorded with its generation
    overrides: tuple[str, ...] = ()  # the run's --set keys that differ from the inventory: drift, in status
    # The model revision (weights.change_data) the host holds verified and needs no fetch of: its
    # cluster peers that must fetch it take it from this host before the hub.
    holds: Mapping[str, Any] | None = None
    # Why the host's weights are not the tool's to fetch, and what is there: "not fetched: ...".
    weights_note: str | None = None

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
    order: list[str]
    plans: dict[str, HostPlan]
    findings: dict[str, list[checks.Finding]]
    errors: dict[str, BaseException]
    held: secrets.Secrets


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
        applied, failed, fetched, wheels_sent = carry_out(inv, planned.plans, planned.order, options,
                                                          planned.held, pool=pool)
    return Applied(planned.order, planned.plans, planned.findings, {**planned.errors, **failed}, applied, fetched,
                   wheels_sent)


def progress_line(line: str) -> None:
    """A step's progress on stderr (stdout is the report's, JSON included)."""
    print(line, file=sys.stderr)


Builder = Callable[[context.Context, build.Recipe], "Path | None"]


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
    if only != "weights" and settings.venv_source:
        engine_env = engines.engine_of(settings).build_env(ctx, build.jobs_of(host_facts))
        recipe = build.recipe(settings.venv_source, ctx.profile, host_facts, engine_env,
                              venv.indexes_of(settings).args())
        built = build.cached_wheel(recipe) or (builder(ctx, recipe) if builder else None)
        if built is None:
            pending_build = plan.Change("build", str(recipe.source), (
                f"no wheel built yet for {recipe.arch}/Python {recipe.python}: provision builds it on one "
                f"host of that architecture ({', '.join(f'{k}={v}' for k, v in sorted(recipe.env.items()))})"))
        else:
            local_wheels.append(str(built))
    requirements = venv.service_requirements(ctx)
    if only != "weights" and pending_build is None and (requirements or local_wheels):
        wheelhouse = venv.resolve(requirements, local_wheels, arch, python,
                                  progress=progress_line, indexes=venv.indexes_of(settings),
                                  torch_variant=venv.torch_variant_of(ctx.profile, settings))
        venv_data = venv.venv_change_data(settings, ctx.profile.venv_remove, wheelhouse,
                                          verify=engines.engine_of(settings).verify_modules(
                                              venv.requirements_of(settings), local_wheels),
                                          requirements=requirements)
        venv_data["requirements"] = venv_data["requirements"][:len(requirements)] + [
            f"{venv.REMOTE_WHEELHOUSE}/{Path(w).name}" for w in local_wheels]
    fetch, hub_data, hub_house, holds = None, None, None, None
    if ctx.snapshot is not None and only != "venv":
        root = weights.root_of(settings)
        reason, to_fetch = weights.compare(ctx.snapshot, weights.host_weights(host_facts, root))
        if verify and not reason:
            reason = "hash every file again (--verify)"
        if reason:
            fetch = {"reason": f"{ctx.snapshot.repo}@{ctx.snapshot.commit[:12]}: {reason} "
                               f"({to_fetch / 2**20:.1f} MiB to fetch)",
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
    scope = ops.Scope(venv=settings.venv_dir.rstrip("/") if venv.requirements_of(settings) or local_wheels
                      else None, model_root=weights.root_of(settings) if weights.managed(settings) else None)
    return HostPlan(changes, pushes, link.address if link else None,
                    ctx.cluster.name if ctx.cluster else ctx.host, scope, unfinished_generation(host_facts),
                    transfer=settings.transfer, arch=arch, held_wheels=venv.remote_wheels(host_facts),
                    serve=server.endpoint(settings) if settings.model else None, holds=holds,
                    weights_note=weights.not_fetched(settings, weights.placed_model(
                        host_facts, render.model_path(settings))))


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
    return {"VLLM_API_KEY": held.vllm_api_key, "HF_TOKEN": held.hf_token, "MPI_SSH_KEY": held.mpi_ssh_key}


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
            return build.build(runner, recipe, on_line=lambda line: logging.getLogger("provision.build").debug(
                "%s: %s", ctx.host, line))
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
    api_key = gated.held.vllm_api_key
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
        planned.overrides = departing(inv, name, options)
        result[name] = planned
    return Planned(gated.order, result, findings, errors, gated.held)


def departing(inv: inventory.Inventory, name: str, options: Options) -> tuple[str, ...]:
    """The run's --set keys whose value on the host differs from what the inventory declares (a --set
    that repeats the inventory is no drift)."""
    if not options.overrides:
        return ()
    asked, declared = inv.settings(name, options.overrides), inv.settings(name, {})
    return tuple(sorted(key for key in options.overrides
                        if getattr(asked, key, None) != getattr(declared, key, None)))


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


def carry_out(inv: inventory.Inventory, plans: dict[str, HostPlan], order: list[str], options: Options,
              held: secrets.Secrets, final: Final | None = None,
              timings: dict[str, dict[str, float]] | None = None, pool: remote.Pool | None = None) -> tuple[
                  dict[str, int], dict[str, BaseException], dict[str, weights.FetchResult], venv.WheelsSent]:
    """Apply the plans in three steps, all hosts at once in each: wheels pushed and the fetch helper
    built; the weights fetched (the hub once per cluster, then host to host); the rest applied (by
    `final` where given: deploy rolls it host by host). A host that fails leaves the later steps;
    the others go on. `timings` collects each host's seconds per step. Connections come from `pool`
    (the ones the facts came over) where given."""
    progress = Progress(TextColumn("{task.description}"), BarColumn(), _BytesOnly(DownloadColumn()),
                        _BytesOnly(TransferSpeedColumn()),
                        _TimeLeft(), console=Console(stderr=True), disable=options.quiet)
    own = pool is None
    connections = pool or remote.Pool(inv.ssh, accept_new_host_keys=options.accept_new_host_keys)
    wait = options.wait
    lock = threading.Lock()
    clock = timings if timings is not None else {}

    def connect(name: str) -> Runner:
        return connections.connect(inv.host(name))

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
                    ops.apply(connect(name), [], wait=wait, scope=plans[name].scope, by="weights",
                              secrets=secret_environment(held), model_changed=True, record=fetched_model,
                              serve=plans[name].serve, overrides=plans[name].overrides)
                return 0
            update = bar(f"{name}: apply {len(rest)} change(s)")
            outcome = ops.apply(connect(name), rest, wait=wait, scope=plans[name].scope, by="provision",
                                secrets=secret_environment(held), model_changed=bool(plans[name].of_kind("weights")),
                                serve=plans[name].serve, overrides=plans[name].overrides)
            update(1, 1)
            return len(outcome.done)

        last = for_each_host(names, lambda name: name, timed("apply", finish))
        return dict(last.values), dict(last.errors)

    fetched: dict[str, weights.FetchResult] = {}
    wheels_sent = venv.WheelsSent()
    try:
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
    finally:
        if own:
            connections.close()
    return done, errors, fetched, wheels_sent


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


def scope_of(settings: inventory.Settings) -> ops.Scope:
    """What a host's generations cover: its venv and the model root it serves from."""
    return ops.Scope(venv=settings.venv_dir.rstrip("/"),
                     model_root=weights.root_of(settings) if weights.managed(settings) else None)
