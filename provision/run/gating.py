"""The gate: every target's facts (and its cluster peers'), each host's settings resolved once,
the hub's answers, the wheels a planned venv brings, the endpoints a known issue needs tried; then
every rule on each target. What it learned travels on as each host's Context (Gated.contexts)."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from provision import (
    checks,
    context,
    cuda,
    endpoints,
    engines,
    facts,
    inventory,
    issue_evidence,
    known_issues,
    plan,
    remote,
    render,
    secrets,
    serverfiles,
    services,
    venv,
    weights,
)
from provision.errors import InventoryError, ProvisionError, about
from provision.fanout import HostResults, for_each_host
from provision.run.hub import ask_early, with_placed_weights, with_snapshots
from provision.run.options import Options, progress_line


@dataclass(frozen=True)
class Gated:
    order: list[str]  # the targets, in the order asked
    findings: dict[str, list[checks.Finding]]
    errors: dict[str, BaseException]
    contexts: dict[str, context.Context]  # every host with facts, the targets' cluster peers included
    held: secrets.Secrets  # read once per run: the gate, the plan and carry_out share them
    hosts: dict[str, inventory.Host] = field(default_factory=dict)  # the targets and their peers


def resolve(inv: inventory.Inventory, names: Sequence[str], options: Options) -> dict[str, inventory.Settings]:
    """Each host's settings, resolved once for the run (--set and --profile applied): what the gate
    judges, and what the plan and the roll read after it (on each host's Context)."""
    return {name: inv.settings(name, options.overrides, profile=options.profile) for name in names}


@dataclass(frozen=True)
class ProbeAsk:
    """What one probe asks of a host: the paths whose free space the gate reads, the managed state the
    plan reads (files, users, directories, units), and whose venv's versions."""

    paths: tuple[str, ...]
    inspect: Mapping[str, tuple[str, ...]]
    units: tuple[str, ...]
    venv_dir: str
    venv_base: str | None = None  # the base environment the venv reuses (venv_base), read with it

    def joined(self, other: ProbeAsk) -> ProbeAsk:
        """Both asks in one probe: each list's entries once, in the order first asked."""
        keys = list(dict.fromkeys([*self.inspect, *other.inspect]))
        return ProbeAsk(_once(self.paths, other.paths),
                        {key: _once(self.inspect.get(key, ()), other.inspect.get(key, ())) for key in keys},
                        _once(self.units, other.units), self.venv_dir, self.venv_base or other.venv_base)


def _once(first: Sequence[str], second: Sequence[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys([*first, *second]))


def probe_ask(inv: inventory.Inventory, target: str, settings: inventory.Settings) -> ProbeAsk:
    """What the gate and the plan read of `target`'s host for its server."""
    paths = [settings.venv_dir, settings.model_dir, settings.hf_home]
    naming = inv.naming(target)
    inspect = plan.inspect_spec(
        [render.CONFIG_DIR, render.STATE_DIR, *paths[1:], *venv.inspect_paths(settings),
         f"{weights.HUB_VENV}/{facts.VENV_MANIFEST}"], settings.service_user, naming)
    # The files server_files gives and their folders (compared as every managed file); the server's
    # folder listed, so a file no longer given is removed.
    given = serverfiles.host_paths(settings.server_files, naming.service)
    inspect["files"] = sorted({*inspect["files"], *given.values(),
                               *(render.server_file_dirs(naming) if given else ())})
    inspect["dirs"] = [*inspect["dirs"], serverfiles.host_dir(naming.service)]
    inspect["weights"] = [weights.root_of(settings)] if weights.managed(settings) else []
    # Weights placed by hand: their config.json and sizes, for the memory fit (one small read).
    inspect["models"] = [render.model_path(settings)] if settings.model and not weights.managed(settings) else []
    return ProbeAsk(tuple(paths), {key: tuple(values) for key, values in inspect.items()},
                    tuple(render.units_of(naming)), settings.venv_dir, settings.venv_base)


def gather(inv: inventory.Inventory, targets: list[inventory.Host], options: Options,
           pool: remote.Pool | None = None,
           resolved: Mapping[str, inventory.Settings] | None = None) -> HostResults[facts.HostFacts]:
    """Every host's facts in parallel, one round trip each; a failing host never stops the others.
    The services of one host that share a venv share its probe, which asks what each of them asks
    (fanout runs a host's services in turn, so the first one's probe serves the next). With a pool,
    the connections stay open for what the run does next; with `resolved`, the targets' settings are
    the run's (else each is resolved here)."""

    def settings_of(target: inventory.Host) -> inventory.Settings:
        return resolved[target.name] if resolved is not None else \
            inv.settings(target.name, options.overrides, profile=options.profile)

    asks = {target.name: probe_ask(inv, target.name, settings_of(target)) for target in targets}

    def probe_of(name: str) -> tuple[str, str]:
        return services.split(name)[0], asks[name].venv_dir

    shared: dict[tuple[str, str], ProbeAsk] = {}
    for name, ask in asks.items():
        key = probe_of(name)
        shared[key] = shared[key].joined(ask) if key in shared else ask
    probed: dict[tuple[str, str], facts.HostFacts | ProvisionError] = {}

    def one(target: inventory.Host) -> facts.HostFacts:
        key = probe_of(target.name)
        if key not in probed:
            ask = shared[key]
            runner = pool.connect(target) if pool else remote.connect(
                target, inv.ssh, accept_new_host_keys=options.accept_new_host_keys)
            try:
                probed[key] = facts.gather(runner, paths=ask.paths, inspect=ask.inspect,
                                           facts=(*facts.with_units(facts.FACTS, ask.units),
                                                  facts.venv_fact(ask.venv_dir, engines.dists(), ask.venv_base),
                                                  *([facts.base_fact(ask.venv_base)] if ask.venv_base else [])))
            except ProvisionError as exc:
                probed[key] = exc
            finally:
                if pool is None:
                    runner.close()
        found = probed[key]
        if isinstance(found, ProvisionError):
            raise found
        return found if found.host == target.name else dataclasses.replace(found, host=target.name)

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
    resolved = resolve(inv, [target.name for target in everyone], options)
    # A router host renders its config from its replicas' settings, and the gate judges a service
    # beside its host's other services (ports, shared GPUs): theirs as the inventory has them where the
    # run does not change them (--set and --profile are the targets'). Resolved once, here.
    resolved.update({name: inv.settings(name) for name in [*endpoints.heads_behind(inv, list(wanted)),
                                                           *(s for target in wanted for s in inv.siblings(target))]
                     if name not in resolved})
    early = ask_early([resolved[name] for name in sorted(wanted)], held)  # while the facts are gathered
    gathered = gather(inv, everyone, options, pool, resolved)
    if held.describe():
        progress_line(f"secrets: {held.describe()}")
    contexts = with_snapshots(context.contexts(inv, gathered.values, options.overrides, profile=options.profile,
                                                settings=resolved), held, wanted, early)
    contexts = with_placed_weights(contexts, held, wanted)
    contexts = {name: dataclasses.replace(ctx, api_key_set=bool(held.api_key), mpi_key_set=bool(held.mpi_ssh_key))
                for name, ctx in contexts.items()}
    errors = {name: error for name, error in gathered.errors.items() if name in wanted}
    if options.resolve_wheels:
        contexts = _with_planned_wheels(contexts, wanted, errors)
    contexts = _with_reachability(inv, contexts, wanted, errors, options, pool)
    findings = {name: checks.evaluate(contexts[name], options.force) for name in wanted
                if name in contexts and name not in errors}
    return Gated([target.name for target in targets], findings, errors, contexts, held,
                 {target.name: target for target in everyone})


def _service_wheelhouse(ctx: context.Context) -> venv.Wheelhouse | None:
    """The wheels the service venv is made of, resolved on the controller (once; cached after)."""
    settings = ctx.settings
    requirements, local = engines.engine_of(ctx.settings).service_requirements(ctx), list(settings.venv_wheels)
    if settings.venv_source or not (requirements or local):
        return None  # a source build's wheel is known only once built; nothing to install otherwise
    if checks.install_gaps(ctx)[1]:
        return None  # pip would fail on a pin no index here carries: engine.installable says so, with the fix
    if checks.python_refusals(ctx):
        return None  # pip would fail on a release this Python cannot install: host.python says so, with the fix
    return venv.resolve_service(ctx, requirements, local, progress_line)


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
        key = venv.venv_change_data(ctx.settings, ctx.profile.venv_remove, house,
                                    site_files=engines.engine_of(ctx.settings).venv_site_files(ctx),
                                    base=ctx.facts.venv_base if ctx.settings.venv_base else None)["key"]
        if key != venv.installed_key(ctx.facts, ctx.settings.venv_dir):
            result[name] = dataclasses.replace(ctx, venv_rebuilt=True,
                                               planned_wheels=cuda.cuda_of_wheels(w.name for w in house.wheels))
    return result


def _with_reachability(inv: inventory.Inventory, contexts: dict[str, context.Context], wanted: set[str],
                       errors: dict[str, BaseException], options: Options,
                       pool: remote.Pool | None) -> dict[str, context.Context]:
    """The endpoints a known issue needs tried from a host (its other matchers all hold: vLLM 0.26+
    without flashinfer-cubin planned), tried in one small probe per such host; no other host pays."""
    asks = {name: endpoints for name in sorted(wanted & set(contexts)) if name not in errors
            and (endpoints := sorted({endpoint for issue in known_issues.load()
                                      for endpoint in known_issues.endpoints_to_try(
                                          issue, issue_evidence.evidence_of(contexts[name]))}))}
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
