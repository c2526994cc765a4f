"""`invoke tune`: the fastest serving settings a host sustains within a latency bound, found by trials on
the host itself and kept where the inventory reads them.

    load_space(path, profile, engine)          the settings and their candidate values (tune_spaces.yaml:
                                               a default space per engine, by profile), each flag one the
                                               engine's release has (engine_contracts.yaml), else refused
    load_workload(path) -> Workload            prompts, output length, concurrency levels, a fixed seed
    search(dimensions, current, measure, ...)  one dimension at a time, best value kept, a dimension left
                                               once a value fails or two in a row do not help
    tune(inv, unit, ...) -> Tuned              each trial deployed through the normal path (rendered unit,
                                               apply, restart, readiness with a real completion, rolled back
                                               when not ready) and benchmarked; the winner written to
                                               tuned/HOST.yaml (diff shown first) and deployed

A trial is scored by output tokens/s at the best concurrency level whose p95 time to first token and
p95 inter-token latency stay within the bound in every run of it. Trials are kept per hardware
fingerprint and workload in tuned/trials/: a second run resumes, and hosts of one kind share what was
measured. Before the first trial the workload is fitted to the context the server serves; the host as
it is is run twice (the spread of the two is the noise a winner must beat); a step starts only when the
budget has room for it and its way back (provision/tune_rules.py holds these rules).
"""
from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from provision import (
    __version__,
    catalog,
    contracts,
    datafiles,
    endpoints,
    engines,
    hints,
    inventory,
    recipes,
    remote,
    rolling,
    secrets,
    server,
    tune_rules,
)
from provision.errors import InventoryError, ProvisionError, TuneError
from provision.facts import HostFacts
from provision.run import Options, gate, progress_line
from provision.runner import Runner
from provision.tune_rules import (
    Costs,
    Decision,
    Level,
    Slo,
    Trial,
    Workload,
    decide,
    milliseconds,
)

SPACES = "tune_spaces.yaml"  # package data: the default space per engine and profile
DEFAULT_SPACE = "default"  # an engine's space for the profiles it names no space of its own for


@dataclass(frozen=True)
class Dimension:
    name: str
    values: tuple[Any, ...]
    flag: str | None = None  # a server flag (kept in server_flags) ...
    setting: str | None = None  # ... or an inventory setting
    needs: Mapping[str, str] = field(default_factory=dict)  # {"compute_capability": ">=8.9"}

    def overrides(self, value: Any) -> dict[str, Any]:
        return {"server_flags": {self.flag: value}} if self.flag else {str(self.setting): value}


# ---------------------------------------------------------------------------------------------
# Space and workload files


def _yaml(path: Path) -> Any:
    try:
        return datafiles.load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise TuneError(f"cannot read: {str(exc).splitlines()[0]}", file=str(path)) from exc


def dimensions_of(raw: Any, source: str) -> tuple[Dimension, ...]:
    """A list of {name, values, flag | setting, needs?} (the format of tune_spaces.yaml's entries)."""
    if not isinstance(raw, list) or not raw:
        raise TuneError("a space is a non-empty list of {name, values, flag or setting}", file=source)
    found = []
    for index, item in enumerate(raw):
        where = f"dimension {index + 1}"
        if not isinstance(item, dict) or not set(item) <= {"name", "values", "flag", "setting", "needs"}:
            raise TuneError(f"{where}: keys are name, values, flag or setting, needs", file=source)
        if not isinstance(item.get("name"), str) or not isinstance(item.get("values"), list) or not item["values"]:
            raise TuneError(f"{where}: needs a name and a non-empty list of values", file=source)
        if ("flag" in item) == ("setting" in item):
            raise TuneError(f"{item['name']}: give one of flag (--a-server-flag) or setting (an inventory setting)",
                            file=source)
        if "setting" in item and item["setting"] not in inventory.VAR_SPECS:
            raise TuneError(f"{item['name']}: {item['setting']!r} is not an inventory setting", file=source)
        if "flag" in item and not str(item["flag"]).startswith("-"):
            raise TuneError(f"{item['name']}: flag {item['flag']!r} is not a --flag", file=source)
        for value in item["values"]:  # each value must be one the inventory accepts there
            probe = {"server_flags": {item["flag"]: value}} if "flag" in item else {item["setting"]: value}
            try:
                inventory.validate_vars(probe, source=source, entity=f"tune {item['name']}")
            except InventoryError as exc:
                raise TuneError(f"{item['name']}: {exc}", file=source) from exc
        needs = item.get("needs") or {}
        if not isinstance(needs, dict) or not set(needs) <= {"compute_capability"}:
            raise TuneError(f"{item['name']}: needs takes compute_capability: '>=8.9'", file=source)
        found.append(Dimension(item["name"], tuple(item["values"]), item.get("flag"), item.get("setting"),
                               {str(k): str(v) for k, v in needs.items()}))
    return tuple(found)


def _default_spaces() -> dict[str, Any]:
    loaded: dict[str, Any] = datafiles.load((resources.files("provision") / SPACES).read_text(encoding="utf-8"))
    return loaded


def spaces_of(engine: str) -> tuple[str, ...]:
    """The profiles the engine has a default space for (`default`: every other profile)."""
    return tuple(_default_spaces().get(engine) or ())


def load_space(path: str | None, profile: str, engine: str = "vllm") -> tuple[Dimension, ...]:
    """The space a file gives, else the engine's default for the profile: the flags are the engine's
    own (llama-server's --parallel is not vLLM's --max-num-seqs), so a space is chosen by engine first."""
    if path:
        return dimensions_of(_yaml(Path(path)), path)
    by_profile = _default_spaces().get(engine) or {}
    chosen = profile if profile in by_profile else DEFAULT_SPACE
    if chosen not in by_profile:
        raise TuneError(f"no default space for {engine} on the {profile} profile: give one with --space FILE",
                        file=SPACES)
    return dimensions_of(by_profile[chosen], f"{SPACES} ({engine}, {chosen})")


def foreign_flags(dimensions: Sequence[Dimension], engine: str, release: str) -> list[str]:
    """Why each flag of the space is not one the engine's release has (engine_contracts.yaml): no row
    for it there, or a row whose versions leave the release out. Empty: every flag is the engine's."""
    table = contracts.load()
    title = engines.ENGINES[engine].title
    problems = []
    for dimension in dimensions:
        if dimension.flag is None:
            continue
        row = table.row(engine, "flag", dimension.flag)
        if row is None:
            problems.append(f"{dimension.name}: {dimension.flag} is not a known flag of {title} "
                            f"(no row in {contracts.DATA})")
        elif not row.holds(release):
            problems.append(f"{dimension.name}: {title} {release} has no {dimension.flag} "
                            f"(only {row.versions}: {row.source})")
    return problems


def space_of(inv: inventory.Inventory, unit: Unit, options: Options, space: str | None) -> tuple[Dimension, ...]:
    """The unit's space, checked against the engine its server's settings name, from the inventory
    alone: a space of another engine's flags is refused (exit 2) before any host is contacted."""
    settings = inv.settings(unit.server, dict(options.overrides))
    profile = (options.profile or inv.host(unit.server).profile).name
    dimensions = load_space(space, profile, settings.engine)
    check_space(dimensions, settings.engine, contracts.load().release(settings.engine, settings.engine_spec),
                space or SPACES)
    return dimensions


def check_space(dimensions: Sequence[Dimension], engine: str, release: str, source: str) -> None:
    """Refuse a space with a flag the engine's release lacks, before any trial: every trial of it would
    crash the server and be rolled back."""
    problems = foreign_flags(dimensions, engine, release)
    if problems:
        raise TuneError("; ".join(problems) + f" (the host serves {engines.ENGINES[engine].title} {release}: "
                        "give a space of its own flags with --space FILE)", file=source)


def load_workload(path: str | None) -> Workload:
    if not path:
        return Workload()
    raw = _yaml(Path(path))
    known = {f.name for f in dataclasses.fields(Workload)}
    if not isinstance(raw, dict) or not set(raw) <= known:
        raise TuneError(f"a workload is a mapping of {', '.join(sorted(known))}", file=path)
    values = dict(raw)
    try:
        if "concurrency" in values:
            values["concurrency"] = tuple(int(c) for c in values["concurrency"])
        if "prompt_words" in values:
            low, high = (int(w) for w in values["prompt_words"])
            values["prompt_words"] = (low, high)
        workload = Workload(**values)
        ok = (workload.requests >= 1 and workload.output_tokens >= 1 and workload.concurrency
              and all(c >= 1 for c in workload.concurrency) and 0 <= workload.prompt_words[0] <= workload.prompt_words[1])
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise TuneError("requests, output_tokens and each concurrency at least 1; prompt_words [MIN, MAX]",
                        file=path)
    return workload


# ---------------------------------------------------------------------------------------------
# The search (pure: `measure` does the work)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def unworkable(dimension: Dimension, value: Any, host_facts: HostFacts) -> str | None:
    """Why the host cannot run this value (its `needs`), or None. The first value of a dimension with
    needs is the one every host runs (auto, off)."""
    wanted = dimension.needs.get("compute_capability")
    if not wanted or value == dimension.values[0]:
        return None
    minimum = _version(wanted.lstrip(">="))
    found = sorted({gpu.compute_cap for gpu in host_facts.gpus or () if gpu.compute_cap})
    if not found:
        return f"{dimension.name}={value} needs a GPU of compute capability {wanted}; this host has none"
    if any(_version(cap) < minimum for cap in found):
        return f"{dimension.name}={value} needs compute capability {wanted}; the host's GPUs are {', '.join(found)}"
    return None


def current_values(dimensions: Sequence[Dimension], settings: inventory.Settings) -> dict[str, Any]:
    """What the host runs now for each dimension (None where it is the server's default)."""
    found: dict[str, Any] = {}
    for dimension in dimensions:
        if dimension.flag:
            found[dimension.name] = settings.server_flags.get(dimension.flag)
        else:
            found[dimension.name] = getattr(settings, str(dimension.setting))
    return found


def search(dimensions: Sequence[Dimension], current: Mapping[str, Any], measure: Callable[[dict[str, Any]], Trial],
           slo: Slo, skip: Callable[[Dimension, Any], str | None], room: Callable[[str, Trial | None], str | None],
           record: Callable[[Trial], None], repeat: Callable[[Trial], Trial]) -> list[Trial]:
    """The host as it is first, then each dimension in order: its values in order, the leader kept
    (tune_rules.leads: beaten only beyond the noise). A dimension is left once a value fails (the next
    would ask more of the host) or two in a row do not take the lead.

    A trial just measured is run again (`repeat`, the same server, as many requests more) when one run
    cannot decide: the first one within the bound (its two runs give the noise) and one above the leader
    by no more than the noise. `room(step, trial)` says why the budget has no room for a step ("trial",
    or "repeat" of `trial`), or None; the search ends at the first trial it has no room for."""
    trials: list[Trial] = []

    def settle(trial: Trial, leader: Trial | None) -> Trial:
        fresh = trial.outcome == "measured" and not trial.resumed and trial.score(slo) is not None
        noise = tune_rules.noise_of(trials, slo)
        unsure = noise is None or (leader is not None and tune_rules.within_noise(trial, leader, noise, slo))
        if fresh and unsure and room("repeat", trial) is None:
            return repeat(trial)
        return trial

    first = settle(measure({}), None)
    trials.append(first)
    record(first)
    leader: Trial | None = first
    best_settings: dict[str, Any] = {}
    for dimension in dimensions:
        misses = 0
        for value in dimension.values:
            if value == current.get(dimension.name):
                continue
            settings = {**best_settings, dimension.name: value}
            why = skip(dimension, value)
            if why:
                trial = Trial(key_of(settings), settings, "skipped", why)
            else:
                if room("trial", None) is not None:
                    return trials
                trial = settle(measure(settings), leader)
            trials.append(trial)
            record(trial)
            if trial.outcome == "skipped":
                continue
            if tune_rules.leads(trial, leader, tune_rules.noise_of(trials, slo), slo):
                leader, best_settings, misses = trial, settings, 0
                continue
            misses += 1
            if trial.outcome == "failed" or misses >= 2:
                break
    return trials


def key_of(settings: Mapping[str, Any]) -> str:
    return json.dumps(settings, sort_keys=True, default=str)


def winner(trials: Sequence[Trial], slo: Slo) -> Trial | None:
    """The trial kept (tune_rules.decide): a later one wins only by beating the leader beyond the noise
    (a difference within it keeps the earlier, nearer the host's own settings)."""
    return decide(trials, slo).winner


def overrides_of(dimensions: Sequence[Dimension], settings: Mapping[str, Any]) -> dict[str, Any]:
    """A trial's settings as inventory values: flags under server_flags, settings by name."""
    by_name = {d.name: d for d in dimensions}
    result: dict[str, Any] = {}
    for name, value in settings.items():
        for key, item in by_name[name].overrides(value).items():
            result[key] = {**result.get(key, {}), **item} if key == "server_flags" else item
    return result


# ---------------------------------------------------------------------------------------------
# Trials on a host


@dataclass(frozen=True)
class Unit:
    """What one tuning serves: the server that answers (its gate, facts and served context stand for
    the unit), and every host its deploy touches (a multi-node cluster's nodes). Through an endpoint:
    the replicas of one model behind it, each trial rolled over all of them (drained, as deploy does)
    and measured through the router; the winner is kept for each replica."""

    server: str
    hosts: tuple[str, ...]
    routed: endpoints.EndpointPlan | None = None  # the endpoint the load goes through, as planned
    model: str | None = None  # the model the endpoint routes to these replicas (a request's "model")
    replicas: tuple[str, ...] = ()

    @property
    def endpoint(self) -> str | None:
        return self.routed.name if self.routed else None

    @property
    def name(self) -> str:
        return f"endpoint {self.endpoint} ({self.model})" if self.endpoint else self.server

    @property
    def kept_for(self) -> tuple[str, ...]:
        """The servers whose tuned/ file the winner goes to."""
        return self.replicas or (self.server,)


def units_of(inv: inventory.Inventory, targets: Sequence[inventory.Host]) -> list[Unit]:
    units: list[Unit] = []
    for target in targets:
        cluster = inv.cluster_of(target.name)
        if cluster and cluster.multi_node:
            unit = Unit(cluster.head, tuple(cluster.hosts))
        else:
            unit = Unit(target.name, (target.name,))
        if unit not in units:
            units.append(unit)
    return units


def endpoint_unit(inv: inventory.Inventory, name: str, model: str | None,
                  overrides: Mapping[str, Any]) -> Unit:
    """The replicas of `model` (default: the endpoint's first) behind endpoint `name`: every host a roll
    over them touches. They must run one engine: a space is one engine's flags."""
    routed = endpoints.named(inv, name)
    backend = routed.backend_for(model)
    heads = tuple(replica.host for replica in backend.replicas)
    engines_run = {inv.settings(head, dict(overrides)).engine for head in heads}
    if len(engines_run) > 1:
        raise TuneError(f"the replicas of {backend.model} behind endpoint {name} run different engines "
                        f"({', '.join(sorted(engines_run))}): tune them one host at a time", file="command line")
    hosts: list[str] = []
    for head in heads:
        cluster = inv.cluster_of(head)
        hosts += [host for host in (cluster.hosts if cluster and cluster.multi_node else [head]) if host not in hosts]
    return Unit(heads[0], tuple(hosts), routed, backend.model, heads)


def fingerprint(profile: str, host_facts: HostFacts, settings: inventory.Settings,
                overrides: Mapping[str, Any] | None = None, replicas: int = 1) -> str:
    """Hosts with the same hardware and served model measure alike: their trials are shared (a run's
    --set is part of what was measured, and so is the number of replicas a load through an endpoint
    was spread over)."""
    gpus = sorted(f"{gpu.name}" for gpu in host_facts.gpus or ())
    cpu = host_facts.cpu
    what = {"profile": profile, "arch": host_facts.arch, "gpus": gpus, "overrides": dict(overrides or {}),
            "cpus": len(getattr(cpu, "cpus", ()) or ()) if cpu is not None else None, "memory": host_facts.memory.total // 2**30
            if host_facts.memory else None, "engine": settings.engine, "model": settings.model,
            "revision": settings.model_revision, "spec": settings.engine_spec, "max_model_len": settings.max_model_len}
    if replicas > 1:  # one server's fingerprint stays what it was: its kept trials are still found
        what["replicas"] = replicas
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def workload_key(workload: Workload) -> str:
    return hashlib.sha256(json.dumps(dataclasses.asdict(workload), sort_keys=True).encode()).hexdigest()[:12]


class TrialStore:
    """tuned/trials/FINGERPRINT-WORKLOAD.json: every trial measured for that hardware, model and workload."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.trials: dict[str, Trial] = {}
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            for raw in data.get("trials", []):
                levels = _levels(raw.pop("levels", []))
                repeats = tuple(_levels(run) for run in raw.pop("repeats", []))
                trial = Trial(**{**raw, "levels": levels, "repeats": repeats})
                self.trials[trial.key] = trial
        except FileNotFoundError:
            pass
        except (ValueError, TypeError, AttributeError) as exc:
            raise TuneError(f"cannot read the kept trials ({exc}): move the file away to start over",
                            file=str(path)) from exc

    def get(self, key: str) -> Trial | None:
        """A kept trial (resumed: it costs nothing now, and the host is not running it)."""
        found = self.trials.get(key)
        return dataclasses.replace(found, resumed=True) if found else None

    def keep(self, trial: Trial) -> None:
        if trial.outcome == "skipped" or trial.resumed:
            return
        self.trials[trial.key] = trial
        rows = [dataclasses.asdict(t) | {"resumed": False} for t in self.trials.values()]
        datafiles.write_whole(self.path, json.dumps({"trials": rows}, indent=1, default=str) + "\n")


def _levels(rows: Sequence[Mapping[str, Any]]) -> tuple[Level, ...]:
    return tuple(Level(**{**row, "errors": tuple(row.get("errors", ()))}) for row in rows)


@dataclass
class Tuned:
    """One unit's tuning: its trials, the winner, the file written (and its diff), the plot, the end state."""

    unit: Unit
    trials: list[Trial]
    slo: Slo
    workload: Workload
    dimensions: tuple[Dimension, ...]
    winner: Trial | None = None
    tuned_files: list[str] = field(default_factory=list)  # tuned/SERVER.yaml of each server kept for
    recipe_file: str | None = None  # the winner as a recipe, with its measurements (tuned/recipes/)
    diff: str = ""
    plot: str | None = None
    interrupted: str | None = None  # "interrupted" | "budget" when the search stopped early
    final: str = ""  # what the host runs now, in words
    ok: bool = True
    decision: Decision | None = None  # the winner, the runner-up, the margin and the spread
    asked: Workload | None = None  # the workload as given, where `workload` is it cut to the served context
    fit: str = ""  # the context fit, in words
    budget_s: float | None = None
    stopped: str = ""  # why the budget ended the search (and the --budget that would not have)
    seconds: float = 0.0  # the whole tuning, its way back included


Send = Callable[[server.Requests], server.BenchReport]


def sender(runner: Runner, unit: Unit, settings: inventory.Settings, api_key: str | None,
           plan: endpoints.EndpointPlan | None) -> Send:
    """How a trial's requests reach the unit: the server on its host, or the endpoint's router from the
    router's host (`plan`), named by the unit's model."""
    if plan is not None:
        return lambda load: server.bench_endpoint(runner, plan, str(unit.model), api_key, load, lambda event: None)
    return lambda load: server.bench(runner, settings, api_key, load, lambda event: None)


def measure_levels(send: Send, workload: Workload, progress: Callable[[str], None], warm: bool = True,
                   room_for: Callable[[float, int], bool] | None = None) -> tuple[Level, ...]:
    """The workload's levels in order (`send` runs one level's requests). With `room_for` (the first
    benchmark, before any was measured) a level starts only if room_for(its estimate in seconds, its
    concurrency): the first level is estimated from the warm-up (its requests one after the other at
    the warm-up's latency), each next by the slowest level so far (the same requests at more
    concurrency take no longer)."""
    prompts = workload.prompts()
    # A server just restarted answers its first requests slower (caches, allocator, compiled paths):
    # a few short ones first, not counted, so every trial is measured warm.
    warm_s: float | None = None
    if warm:
        found = send(server.Requests(min(4, workload.requests), 1, 4, prompts=prompts))
        if found.ttft_p50_s is not None:
            warm_s = found.ttft_p50_s + workload.output_tokens * (found.itl_p50_s or 0.0)
    levels = []
    slowest: float | None = None
    for concurrency in workload.concurrency:
        estimate = slowest if slowest is not None else (
            None if warm_s is None else -(-workload.requests // concurrency) * warm_s)
        if room_for is not None and estimate is not None and not room_for(estimate, concurrency):
            break
        progress(f"  bench: {workload.requests} requests, concurrency {concurrency}")
        begun = time.monotonic()
        found = send(server.Requests(workload.requests, concurrency, workload.output_tokens, prompts=prompts))
        slowest = max(slowest or 0.0, time.monotonic() - begun)
        levels.append(Level(concurrency, found.tokens_per_s, found.ttft_p50_s, found.ttft_p95_s, found.itl_p95_s,
                            found.succeeded, found.requests, found.errors))
    return tuple(levels)


@dataclass(frozen=True)
class Tuning:
    """What one tuning was asked: the space file (None: the engine's for the profile), the workload, the
    latency bounds, the budget in seconds (None: none), seconds each trial's server has to become ready,
    and whether to draw the trials."""

    space: str | None
    workload: Workload
    slo: Slo
    budget_s: float | None = None
    timeout: float = 600
    plot: bool = True


def tune(inv: inventory.Inventory, unit: Unit, options: Options, tuning: Tuning,
         progress: Callable[[str], None] = progress_line) -> Tuned:
    """Trials on one unit, the winner kept and deployed; the host runs the winner, or what it ran before."""
    space, workload, slo, budget_s = tuning.space, tuning.workload, tuning.slo, tuning.budget_s
    timeout, plot = tuning.timeout, tuning.plot
    started = time.monotonic()
    server_host = inv.host(unit.server)
    gated = gate(inv, [server_host], dataclasses.replace(options, quiet=True))
    if unit.server in gated.errors:
        raise gated.errors[unit.server]
    ctx = gated.contexts[unit.server]
    dimensions = load_space(space, ctx.profile.name, ctx.settings.engine)
    check_space(dimensions, ctx.settings.engine, contracts.load().release(ctx.settings.engine, ctx.settings.engine_spec),
                space or SPACES)
    base = dict(options.overrides)
    settings_now = inv.settings(unit.server, base)
    current = current_values(dimensions, settings_now)
    base_key = key_of({name: value for name, value in current.items() if value is not None})
    folder = Path(inv.tuned_dir or "tuned")
    held = secrets.load(inv.secrets)
    targets = [inv.host(name) for name in unit.hosts]
    result = Tuned(unit, [], slo, workload, dimensions, asked=workload, budget_s=budget_s)

    def deploy(overrides: Mapping[str, Any], by: str) -> tuple[rolling.Deployed, bool]:
        deployed = rolling.deploy(inv, targets, dataclasses.replace(options, overrides=dict(overrides), quiet=True),
                                  timeout=timeout, by=by)  # named so in `rollback --list`
        plans = [deployed.plans.get(name) for name in unit.kept_for]
        return deployed, any(plan is not None and plan.changes for plan in plans)

    # The workload fitted to the context the server serves, before any benchmark (and before the
    # kept trials are looked up: they are kept by the workload measured).
    early_restart: float | None = None
    answer = served_context_answer(inv, server_host, settings_now, held.api_key)
    if answer.get("models") is None:  # nothing answers: the host as it is first, then ask again
        progress(f"{unit.name}: {unit.server}'s server does not answer ({answer.get('models_error')}): "
                 "deploying it as it is")
        begun = time.monotonic()
        deployed, restarted = deploy(base, "tune trial")
        early_restart = round(time.monotonic() - begun, 1) if restarted else None
        answer = served_context_answer(inv, server_host, settings_now, held.api_key)
        if answer.get("models") is None:
            why = not_serving(deployed, unit)
            raise ProvisionError(f"{unit.server}: does not serve its own settings, nothing to tune from "
                                 f"({why[1] if why else answer.get('models_error')})")
    context = counted_context(inv, server_host, settings_now, held.api_key, answer)
    result.workload, result.fit = tune_rules.fit(workload, context)
    progress(f"{unit.name}: workload {result.fit}")

    def store_path(measured: Workload) -> Path:
        kind = fingerprint(ctx.profile.name, ctx.facts, settings_now, base, len(unit.kept_for))
        return folder / "trials" / f"{ctx.profile.name}-{kind}-{workload_key(measured)}.json"

    store = TrialStore(store_path(result.workload))

    def measure(trial_settings: dict[str, Any]) -> Trial:
        nonlocal store  # a first benchmark the budget cut to fewer levels is kept as that workload's
        # Kept and compared by what the host runs in the end (its current values under the trial's), so a
        # later run, whose current values a kept winner changed, finds the same trials again.
        absolute = {name: value for name, value in {**current, **trial_settings}.items() if value is not None}
        key = key_of(absolute)
        kept = store.get(key)
        if kept is not None:
            progress(f"{unit.name}: {describe(trial_settings)}: measured before ({kept.outcome})")
            return kept
        progress(f"{unit.name}: trial {describe(trial_settings)} ...")
        begun = time.monotonic()
        overrides = merge(base, overrides_of(dimensions, trial_settings))
        deployed, restarted = deploy(overrides, "tune trial")
        deploy_s = round(time.monotonic() - begun, 1)
        why = not_serving(deployed, unit)
        if why is not None:
            state, detail = why
            outcome_word = "skipped" if state == "blocked" else "failed"
            return Trial(key, absolute, outcome_word, _clip(f"{state}: {detail}"), seconds=deploy_s,
                         deploy_s=deploy_s, restarted=restarted)
        first = budget_s is not None and Costs.of([*store.trials.values(), *result.trials]).bench_s is None
        levels, failure, bench_s = bench_now(overrides, warm=True, back_s=deploy_s if first else None)
        if first and levels and len(levels) < len(result.workload.concurrency) and not failure:
            held_levels = tuple(level.concurrency for level in levels)
            progress(f"{unit.name}: the budget holds the levels at concurrency {list(held_levels)} only: "
                     "every trial measures those")
            result.workload = dataclasses.replace(result.workload, concurrency=held_levels)
            result.fit += f"; concurrency {list(held_levels)} only (the budget)"
            store = TrialStore(store_path(result.workload))
        elif first and not levels and not failure:
            failure = "the budget has no room for one level of the benchmark"
        return Trial(key, absolute, "failed" if failure else "measured", failure, levels,
                     round(deploy_s + bench_s, 1), deploy_s=deploy_s, restarted=restarted, bench_s=bench_s)

    def bench_now(overrides: Mapping[str, Any], warm: bool,
                  back_s: float | None = None) -> tuple[tuple[Level, ...], str, float]:
        begun = time.monotonic()
        runner = remote.connect(inv.host(unit.routed.host) if unit.routed else server_host, inv.ssh)

        def room_for(estimate: float, concurrency: int) -> bool:
            left = (budget_s or 0.0) - (time.monotonic() - started) - (back_s or 0.0)
            if estimate <= left:
                return True
            if not result.stopped:
                result.interrupted = "budget"
                result.stopped = (f"the benchmark's level at concurrency {concurrency} takes about {estimate:.0f} s; "
                                  f"{max(0.0, left):.0f} s of the budget are left (the way back kept): --budget "
                                  f"{tune_rules.minutes_for(time.monotonic() - started + (back_s or 0.0), estimate)} "
                                  "leaves room for it")
                progress(f"{unit.name}: the budget stops the benchmark: {result.stopped}")
            return False

        try:
            send = sender(runner, unit, inv.settings(unit.server, dict(overrides)), held.api_key, unit.routed)
            levels = measure_levels(send, result.workload, progress, warm=warm,
                                    room_for=room_for if back_s is not None else None)
        except ProvisionError as exc:
            levels, failure = (), str(exc)
        else:
            failure = ""
        finally:
            runner.close()
        return levels, failure, round(time.monotonic() - begun, 1)

    def repeat(trial: Trial) -> Trial:
        progress(f"{unit.name}: {describe(trial.settings)}: run again, {result.workload.requests} requests more "
                 f"({'the noise' if tune_rules.noise_of(result.trials, slo) is None else 'within the noise of the leader'})")
        levels, failure, bench_s = bench_now(merge(base, overrides_of(dimensions, trial.settings)), warm=False)
        if failure:
            progress(f"{unit.name}: the run again failed ({failure}): its first run stands alone")
            return dataclasses.replace(trial, bench_s=trial.bench_s + bench_s, seconds=trial.seconds + bench_s)
        return dataclasses.replace(trial, repeats=(*trial.repeats, levels), bench_s=round(trial.bench_s + bench_s, 1),
                                   seconds=round(trial.seconds + bench_s, 1))

    # A restart the host's deploys measured before this run (read once: the facts do not change here).
    recorded_restart = tune_rules.recorded_restart_s(ctx.facts.files.get(ctx.naming.state_file, {}).get("content"))

    def room(step: str, trial: Trial | None) -> str | None:
        if budget_s is None:
            return None
        costs = Costs.of([*store.trials.values(), *result.trials, *([trial] if trial else [])])
        known = early_restart if early_restart is not None else recorded_restart
        if costs.restart_s is None and known is not None:
            costs = dataclasses.replace(costs, restart_s=known)
        elapsed = time.monotonic() - started
        back_restarts = trial is not None and trial.key != base_key
        why = tune_rules.room(step, left_s=budget_s - elapsed, costs=costs, timeout=timeout,
                              back_restarts=back_restarts)
        if why is not None and not result.stopped:
            need, _ = tune_rules.step_cost(step, costs=costs, timeout=timeout, back_restarts=back_restarts)
            hint = (f": --budget {tune_rules.minutes_for(elapsed, need)} leaves room for it" if need is not None
                    else "")
            result.interrupted, result.stopped = "budget", f"{why}{hint}"
            progress(f"{unit.name}: the budget stops the search: {result.stopped}")
        return why

    def keep(trial: Trial) -> None:
        store.keep(trial)
        result.trials.append(trial)
        progress(f"{unit.name}: {describe(trial.settings)}: {trial.verdict(slo)}"
                 + (f" ({trial.score(slo):.1f} tokens/s)" if trial.score(slo) else ""))

    def skip(dimension: Dimension, value: Any) -> str | None:
        return unworkable(dimension, value, ctx.facts)

    try:
        search(dimensions, current, measure, slo, skip, room, keep, repeat)
    except KeyboardInterrupt:
        result.interrupted = "interrupted"
        progress(f"{unit.name}: interrupted: putting the best settings found so far in place ...")
    result.decision = decide(result.trials, slo)
    result.winner = result.decision.winner
    progress(f"{unit.name}: {result.decision.note}")
    nodes = len(unit.hosts) // len(unit.kept_for)  # one replica's
    on = measured_on(ctx.profile.name, ctx.facts, nodes, ctx.settings.engine)
    finished = finish(inv, unit, options, result, base, timeout, plot, progress, on)
    finished.seconds = round(time.monotonic() - started, 1)
    return finished


def not_serving(deployed: rolling.Deployed, unit: Unit) -> tuple[str, str] | None:
    """Why the unit does not serve after a deploy, as (state, detail) of the first of its servers that
    is not ready (named where there are several), or None when every one is."""
    for name in unit.kept_for:
        outcome = deployed.outcomes.get(name)
        if deployed.ok and outcome is not None and outcome.state in ("ready", "unchanged"):
            continue
        detail = (outcome.detail if outcome and outcome.detail else
                  "; ".join(str(e) for e in deployed.errors.values()) or "not deployed")
        return (outcome.state if outcome else "failed",
                f"{name}: {detail}" if len(unit.kept_for) > 1 else detail)
    return None


def served_context_answer(inv: inventory.Inventory, host: inventory.Host, settings: inventory.Settings,
                          api_key: str | None, words: Sequence[str] = tune_rules.PROBE_WORDS) -> dict[str, Any]:
    """host/serve.py's `context` answer for the server as it runs now (models None: it does not answer),
    its probes made of `words`."""
    runner = remote.connect(host, inv.ssh)
    try:
        return server.context(runner, settings, api_key, tune_rules.probe_texts(words))
    finally:
        runner.close()


def counted_context(inv: inventory.Inventory, host: inventory.Host, settings: inventory.Settings,
                    api_key: str | None, answer: Mapping[str, Any]) -> tune_rules.ServedContext:
    """The served context and the server's count of the probe words. A server whose context is shorter
    than the probes (llama-server refuses such a prompt; a tokenizer of many tokens a word makes them
    long) is asked again with half the words, down to a few."""
    words: Sequence[str] = tune_rules.PROBE_WORDS
    model = server.served_name(settings)
    context = tune_rules.served_context(answer, model, settings.max_model_len, words)
    while context.tokens_per_word is None and len(words) >= 2 * MIN_PROBE_WORDS:
        words = words[:len(words) // 2]
        context = tune_rules.served_context(served_context_answer(inv, host, settings, api_key, words), model,
                                            settings.max_model_len, words)
    return context


MIN_PROBE_WORDS = 4  # fewer words count the tokens a word takes too coarsely


def _clip(text: str, room: int = 900) -> str:
    """A long reason keeps its start (what broke) and its end (what the rollback did)."""
    return text if len(text) <= room else f"{text[:room - 300]} [...] {text[-280:]}"


def merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        merged[key] = {**merged.get(key, {}), **value} if key in inventory.MERGED else value
    return merged


def describe(settings: Mapping[str, Any]) -> str:
    return ", ".join(f"{name}={value}" for name, value in settings.items()) or "as it is"


def tuned_text(unit: Unit, vars_: Mapping[str, Any], trial: Trial, baseline: Trial | None, workload: Workload,
               slo: Slo, decision: Decision | None = None, server: str | None = None) -> str:
    """The tuned/ file of `server` (default: the unit's own): the vars, then how they were measured."""
    best = trial.best(slo)
    assert best is not None
    server = server or unit.server
    through = (f" Measured through endpoint {unit.endpoint}, over its {len(unit.kept_for)} replicas of "
               f"{unit.model}." if unit.endpoint else "")
    header = [
        f"# Kept by `{hints.command('tune')}` on {time.strftime('%Y-%m-%d %H:%M')} (provision {__version__}) for {server}.{through}",
        (f"# Workload {workload.name}: {workload.requests} requests, prompts of {workload.prompt_words[0]}-"
        f"{workload.prompt_words[1]} words after a shared {workload.shared_prefix_words}, {workload.output_tokens} "
        f"tokens out, concurrency {list(workload.concurrency)}, seed {workload.seed}."),
        (f"# Bound: TTFT p95 {'no bound' if slo.ttft_p95_ms is None else f'<= {slo.ttft_p95_ms:g} ms'}, "
         f"ITL p95 {'no bound' if slo.itl_p95_ms is None else f'<= {slo.itl_p95_ms:g} ms'}."),
        f"# Measured: {best.tokens_per_s:.1f} tokens/s at concurrency {best.concurrency}, TTFT p50 "
        f"{milliseconds(best.ttft_p50_s)}, p95 {milliseconds(best.ttft_p95_s)}, ITL p95 {milliseconds(best.itl_p95_s)}"
        + (f"; the host as it was: {baseline.score(slo):.1f} tokens/s." if baseline and baseline.score(slo) else "."),
        *([f"# Margin: {tune_rules.margin_words(decision, slo)}."] if decision is not None else []),
        f"# Delete this file to go back to the inventory's own settings (then `{hints.command('deploy')}`).",
    ]
    body = yaml.safe_dump({"host": server, "vars": dict(vars_)}, sort_keys=True, default_flow_style=False)
    return "\n".join(header) + "\n" + body


# What of a server's settings a recipe carries: how it serves, not where (its port, paths, user, indexes).
RECIPE_SETTINGS = ("served_model_name", "tensor_parallel_size", "pipeline_parallel_size", "max_model_len",
                   "concurrent_sequences", "gpu_memory_utilization", "enable_prefix_caching", "extra_args",
                   "environment", "server_flags", "engine_spec", "venv_source", "cpu_affinity", "cuda_version")
RECIPES = "recipes"  # under the tuned folder: the winners as recipes (`invoke recipe.show FILE`, apply, export)


@dataclass(frozen=True)
class MeasuredOn:
    """What the winner was measured on, from the server's facts: the hardware (recipes.Hardware's
    fields) and the engine's version the venv holds (None where its facts do not say)."""

    profile: str
    gpus: int
    gpu_memory_gib: float | None
    nodes: int
    engine_version: str | None = None

    @property
    def hardware(self) -> dict[str, Any]:
        return {"profile": self.profile, "gpus": self.gpus, "gpu_memory_gib": self.gpu_memory_gib, "nodes": self.nodes}


def measured_on(profile: str, host_facts: HostFacts, nodes: int, engine: str) -> MeasuredOn:
    """The profile, the GPUs a node and each one's memory (None: unified, unreadable, or none), the
    engine's version where the venv says it (vLLM's own key, another engine's package)."""
    gpus = host_facts.gpus or ()
    memory = gpus[0].memory_total_mib if gpus else None
    venv = host_facts.venv
    version = venv.engine_release(catalog.entry(engine)) if venv is not None else None
    return MeasuredOn(profile, len(gpus), round(memory / 1024, 1) if memory else None, nodes, version)


def tuned_recipe(unit: Unit, settings: inventory.Settings, on: MeasuredOn, trial: Trial, baseline: Trial | None,
                 workload: Workload, slo: Slo, decision: Decision | None,
                 day: str | None = None) -> recipes.Recipe:
    """The winner as a recipe: the settings the server runs with that the inventory, tune or --set chose
    (not the built-in or profile defaults, which every host of the profile has), the hardware, and its
    figures measured by this tuning (how, the workload, the date, this tool's version)."""
    best = trial.best(slo)
    assert best is not None, "a winner held the bound at some level"
    day = day or time.strftime("%Y-%m-%d")
    chosen = {key: getattr(settings, key) for key in RECIPE_SETTINGS
              if not settings.origin.get(key, "default").startswith(("default", "profile "))}
    chosen = {key: list(value) if isinstance(value, tuple) else value for key, value in chosen.items()}
    low, high = workload.prompt_words
    bound = (f"TTFT p95 {'no bound' if slo.ttft_p95_ms is None else f'<= {slo.ttft_p95_ms:g} ms'}, ITL p95 "
             f"{'no bound' if slo.itl_p95_ms is None else f'<= {slo.itl_p95_ms:g} ms'}")
    how = (f"{hints.command('tune')} on {unit.name}: {workload.requests} requests at concurrency {best.concurrency} "
           f"(of {list(workload.concurrency)}), prompts of {low}-{high} words after a shared "
           f"{workload.shared_prefix_words}, {workload.output_tokens} tokens out, seed {workload.seed}; {bound}")
    common = {"kind": "measured", "how": how, "benchmark": f"tune workload {workload.name}", "date": day,
              "tool": f"provision {__version__}"}
    figures = [{"metric": "throughput", "value": round(best.tokens_per_s, 1), "unit": "tok/s", **common}]
    figures += [{"metric": metric, "value": round(seconds * 1000, 1), "unit": "ms", **common}
                for metric, seconds in (("TTFT p50", best.ttft_p50_s), ("TTFT p95", best.ttft_p95_s),
                                        ("ITL p95", best.itl_p95_s)) if seconds is not None]
    notes = [f"tune's winner: {describe(trial.settings)}"]
    if baseline is not None and baseline is not trial and baseline.score(slo):
        notes.append(f"the host as it was: {baseline.score(slo):.1f} tok/s in the same run")
    if decision is not None:
        notes.append(f"margin: {tune_rules.margin_words(decision, slo)}")
    source = f"{hints.command('tune')} on {unit.name}, {day}"
    where = f"endpoint-{unit.endpoint}" if unit.endpoint else unit.server.replace("/", "-")
    return recipes.from_mapping({
        "name": f"tuned-{where}-{workload.name}",
        "description": f"{settings.model} as tune left it on {unit.name} ({on.profile})",
        "model": {"id": settings.model, "revision": settings.model_revision},
        "engine": {"name": settings.engine, "version": on.engine_version}, "settings": chosen,
        "hardware": on.hardware, "figures": figures, "source": source, "notes": notes}, source)


def keep_recipe(folder: Path, recipe: recipes.Recipe) -> Path:
    """tuned/recipes/NAME.yaml: the last tuning of that server and workload (a later one replaces it)."""
    path = folder / f"{recipe.name}.yaml"
    datafiles.write_whole(path, recipes.to_yaml(recipe))
    return path


def finish(inv: inventory.Inventory, unit: Unit, options: Options, result: Tuned, base: Mapping[str, Any],
           timeout: float, plot: bool, progress: Callable[[str], None], on: MeasuredOn) -> Tuned:
    """Keep the winner (diff first) and the recipe it makes, deploy what the host should run now, draw the plot."""
    folder = Path(inv.tuned_dir or "tuned")
    winning = result.winner
    if winning is not None:
        baseline = next((t for t in result.trials if not t.settings), None)
        for name in unit.kept_for:  # through an endpoint, each replica keeps the winner as its own
            path = folder / inventory.tuned_file_name(name)
            new_vars = merge(dict(inv.tuned.get(name, {})), overrides_of(result.dimensions, winning.settings))
            text = tuned_text(unit, new_vars, winning, baseline, result.workload, result.slo, result.decision, name)
            old_text = path.read_text(encoding="utf-8") if path.exists() else ""
            diff = "".join(difflib.unified_diff(old_text.splitlines(keepends=True), text.splitlines(keepends=True),
                                                fromfile=f"{path} (kept)", tofile=f"{path} (tuned)"))
            progress(diff or f"{path}: unchanged")
            datafiles.write_whole(path, text)
            result.diff += diff
            result.tuned_files.append(str(path))
    # What the host runs from now on: the inventory (with the file just written) under the run's own --set.
    current = inventory.load(inv.path) if inv.path else inv
    if winning is not None:
        recipe = tuned_recipe(unit, current.settings(unit.server, base), on, winning,
                              next((t for t in result.trials if not t.settings), None), result.workload, result.slo,
                              result.decision)
        result.recipe_file = str(keep_recipe(folder / RECIPES, recipe))
        progress(f"{unit.name}: the winner as a recipe: {result.recipe_file}")
    deployed = rolling.deploy(current, [current.host(name) for name in unit.hosts],
                              dataclasses.replace(options, overrides=dict(base), quiet=True), timeout=timeout)
    why = not_serving(deployed, unit)
    result.ok = why is None
    what = describe(winning.settings) if winning is not None else "its original settings (no trial passed)"
    result.final = f"runs {what}" if why is None else f"could not be put back on {what}: {why[1]}"
    if plot and result.trials:
        name = f"endpoint-{unit.endpoint}" if unit.endpoint else inventory.tuned_file_name(unit.server)[:-len(".yaml")]
        result.plot = draw(result, folder / f"{name}.png")
    return result


def draw(result: Tuned, path: Path) -> str | None:
    """Throughput against p95 latency, one point per measured level, the chosen point marked (PNG)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        progress_line("no plot: matplotlib is not installed (pip install 'provision[tune]')")
        return None
    figure, axis = plt.subplots(figsize=(7, 4.5), dpi=110)
    for trial in result.trials:
        points = [(lv.ttft_p95_s * 1000, lv.tokens_per_s) for lv in trial.levels if lv.ttft_p95_s is not None]
        if points:
            axis.plot(*zip(*points), marker="o", linestyle="-", alpha=0.7, label=describe(trial.settings)[:40])
    chosen = result.winner.best(result.slo) if result.winner else None
    if chosen is not None and chosen.ttft_p95_s is not None:
        axis.scatter([chosen.ttft_p95_s * 1000], [chosen.tokens_per_s], s=220, marker="*", color="black", zorder=5,
                     label="chosen")
    if result.slo.ttft_p95_ms is not None:
        axis.axvline(result.slo.ttft_p95_ms, color="red", linestyle="--", linewidth=1, label="TTFT p95 bound")
    axis.set_xlabel("time to first token, p95 (ms)")
    axis.set_ylabel("output tokens/s")
    axis.set_title(f"{hints.command('tune')}: {result.unit.server} ({result.workload.name} workload)")
    axis.legend(fontsize=7, loc="best")
    axis.grid(alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return str(path)
