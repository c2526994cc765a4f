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
p95 inter-token latency stay within the bound. Trials are kept per hardware fingerprint and workload in
tuned/trials/: a second run resumes, and hosts of one kind share what was measured.
"""
from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from provision import __version__, contracts, engines, inventory, remote, rolling, secrets, server
from provision.errors import InventoryError, ProvisionError
from provision.facts import HostFacts
from provision.run import Options, gate, progress_line

SPACES = "tune_spaces.yaml"  # package data: the default space per engine and profile
DEFAULT_SPACE = "default"  # an engine's space for the profiles it names no space of its own for
IMPROVES = 1.02  # a value must beat the best so far by 2% to count as helping (bench noise is about that)
WORDS = ("the", "model", "server", "cluster", "memory", "cache", "token", "request", "answer", "question",
         "network", "driver", "kernel", "batch", "latency", "throughput", "prompt", "system", "user", "node",
         "explain", "compare", "summarise", "list", "why", "how", "what", "when", "which", "because")


class TuneError(InventoryError):
    """A space or workload file that cannot be used (exit 2: nothing was changed)."""


@dataclass(frozen=True)
class Dimension:
    name: str
    values: tuple[Any, ...]
    flag: str | None = None  # a server flag (kept in server_flags) ...
    setting: str | None = None  # ... or an inventory setting
    needs: Mapping[str, str] = field(default_factory=dict)  # {"compute_capability": ">=8.9"}

    def overrides(self, value: Any) -> dict[str, Any]:
        return {"server_flags": {self.flag: value}} if self.flag else {str(self.setting): value}


@dataclass(frozen=True)
class Workload:
    name: str = "chat"
    seed: int = 0
    requests: int = 32
    concurrency: tuple[int, ...] = (1, 8, 32)
    prompt_words: tuple[int, int] = (50, 500)  # each request's own text, words from min to max
    shared_prefix_words: int = 40  # a system prompt every request starts with (the prefix cache)
    output_tokens: int = 128

    def prompts(self) -> list[str]:
        """The same prompts on every run and host: the seed fixes them."""
        rng = random.Random(self.seed)
        prefix = " ".join(rng.choice(WORDS) for _ in range(self.shared_prefix_words))
        low, high = self.prompt_words
        return [f"{prefix} {' '.join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))}".strip()
                for _ in range(self.requests)]


@dataclass(frozen=True)
class Slo:
    ttft_p95_ms: float | None = None
    itl_p95_ms: float | None = None

    def misses(self, level: Level) -> str | None:
        """Why a level misses the bound, or None when it holds."""
        if self.ttft_p95_ms is not None and (level.ttft_p95_s is None or level.ttft_p95_s * 1000 > self.ttft_p95_ms):
            return f"TTFT p95 {_ms(level.ttft_p95_s)} > {self.ttft_p95_ms:g} ms"
        if self.itl_p95_ms is not None and (level.itl_p95_s is None or level.itl_p95_s * 1000 > self.itl_p95_ms):
            return f"ITL p95 {_ms(level.itl_p95_s)} > {self.itl_p95_ms:g} ms"
        return None


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


@dataclass(frozen=True)
class Level:
    """One concurrency level of a trial's benchmark."""

    concurrency: int
    tokens_per_s: float
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    itl_p95_s: float | None
    succeeded: int
    requests: int


@dataclass(frozen=True)
class Trial:
    key: str
    settings: Mapping[str, Any]  # dimension name -> value; {} is the host's settings as they are
    outcome: str  # measured | failed | skipped
    reason: str = ""
    levels: tuple[Level, ...] = ()
    seconds: float = 0.0
    resumed: bool = False

    def best(self, slo: Slo) -> Level | None:
        """The level with the most tokens/s within the bound (every request answered)."""
        passing = [lv for lv in self.levels if lv.succeeded == lv.requests and slo.misses(lv) is None]
        return max(passing, key=lambda lv: lv.tokens_per_s, default=None)

    def score(self, slo: Slo) -> float | None:
        best = self.best(slo)
        return best.tokens_per_s if best else None

    def verdict(self, slo: Slo) -> str:
        if self.outcome != "measured":
            return f"{self.outcome}: {self.reason}"
        if self.best(slo):
            return "passed"
        missed = [slo.misses(lv) or f"{lv.requests - lv.succeeded} request(s) failed" for lv in self.levels]
        return "missed the bound: " + "; ".join(f"c={lv.concurrency} {why}" for lv, why in zip(self.levels, missed))


# ---------------------------------------------------------------------------------------------
# Space and workload files


def _yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise TuneError(f"cannot read: {str(exc).splitlines()[0]}", file=str(path)) from None


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
                raise TuneError(f"{item['name']}: {exc}", file=source) from None
        needs = item.get("needs") or {}
        if not isinstance(needs, dict) or not set(needs) <= {"compute_capability"}:
            raise TuneError(f"{item['name']}: needs takes compute_capability: '>=8.9'", file=source)
        found.append(Dimension(item["name"], tuple(item["values"]), item.get("flag"), item.get("setting"),
                               {str(k): str(v) for k, v in needs.items()}))
    return tuple(found)


def load_space(path: str | None, profile: str, engine: str = "vllm") -> tuple[Dimension, ...]:
    """The space a file gives, else the engine's default for the profile: the flags are the engine's
    own (llama-server's --parallel is not vLLM's --max-num-seqs), so a space is chosen by engine first."""
    if path:
        return dimensions_of(_yaml(Path(path)), path)
    spaces = yaml.safe_load((resources.files("provision") / SPACES).read_text(encoding="utf-8"))
    by_profile = spaces.get(engine) or {}
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
    check_space(dimensions, settings.engine, contracts.load().release(settings.engine, settings.vllm_spec),
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
           slo: Slo, skip: Callable[[Dimension, Any], str | None], more: Callable[[], bool],
           record: Callable[[Trial], None]) -> list[Trial]:
    """The host as it is first, then each dimension in order: its values in order, the best kept. A
    dimension is left once a value fails (the next would ask more of the host) or two in a row do not
    beat the best by IMPROVES. `more` says whether the budget allows another trial."""
    trials = [measure({})]
    record(trials[0])
    best_settings: dict[str, Any] = {}
    best = trials[0].score(slo)
    for dimension in dimensions:
        misses = 0
        for value in dimension.values:
            if value == current.get(dimension.name) or not more():
                continue
            settings = {**best_settings, dimension.name: value}
            why = skip(dimension, value)
            trial = Trial(key_of(settings), settings, "skipped", why) if why else measure(settings)
            trials.append(trial)
            record(trial)
            if trial.outcome == "skipped":
                continue
            score = trial.score(slo)
            if score is not None and (best is None or score > best * IMPROVES):
                best, best_settings, misses = score, settings, 0
                continue
            misses += 1
            if trial.outcome == "failed" or misses >= 2:
                break
    return trials


def key_of(settings: Mapping[str, Any]) -> str:
    return json.dumps(settings, sort_keys=True, default=str)


def winner(trials: Sequence[Trial], slo: Slo) -> Trial | None:
    """The trial kept: in the order tried, a later one wins only by beating the best by IMPROVES (a
    difference within the benchmark's noise keeps the earlier, nearer the host's own settings)."""
    best: Trial | None = None
    best_score = 0.0
    for trial in trials:
        score = trial.score(slo) if trial.outcome == "measured" else None
        if score is not None and (best is None or score > best_score * IMPROVES):
            best, best_score = trial, score
    return best


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
    """What one tuning serves: the host that answers, and every host its deploy touches (a multi-node
    cluster's nodes)."""

    server: str
    hosts: tuple[str, ...]


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


def fingerprint(profile: str, host_facts: HostFacts, settings: inventory.Settings,
                overrides: Mapping[str, Any] | None = None) -> str:
    """Hosts with the same hardware and served model measure alike: their trials are shared (a run's
    --set is part of what was measured)."""
    gpus = sorted(f"{gpu.name}" for gpu in host_facts.gpus or ())
    cpu = host_facts.cpu
    what = {"profile": profile, "arch": host_facts.arch, "gpus": gpus, "overrides": dict(overrides or {}),
            "cpus": len(getattr(cpu, "cpus", ()) or ()) if cpu is not None else None, "memory": host_facts.memory.total // 2**30
            if host_facts.memory else None, "engine": settings.engine, "model": settings.model,
            "revision": settings.model_revision, "spec": settings.vllm_spec, "max_model_len": settings.max_model_len}
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
                levels = tuple(Level(**lv) for lv in raw.pop("levels", []))
                trial = Trial(**{**raw, "levels": levels})
                self.trials[trial.key] = trial
        except FileNotFoundError:
            pass
        except (ValueError, TypeError, AttributeError) as exc:
            raise TuneError(f"cannot read the kept trials ({exc}): move the file away to start over",
                            file=str(path)) from None

    def get(self, key: str) -> Trial | None:
        found = self.trials.get(key)
        return dataclasses.replace(found, resumed=True) if found else None

    def keep(self, trial: Trial) -> None:
        if trial.outcome == "skipped" or trial.resumed:
            return
        self.trials[trial.key] = trial
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        rows = [dataclasses.asdict(t) | {"resumed": False} for t in self.trials.values()]
        temporary.write_text(json.dumps({"trials": rows}, indent=1, default=str) + "\n", encoding="utf-8")
        temporary.replace(self.path)


@dataclass
class Tuned:
    """One unit's tuning: its trials, the winner, the file written (and its diff), the plot, the end state."""

    unit: Unit
    trials: list[Trial]
    slo: Slo
    workload: Workload
    dimensions: tuple[Dimension, ...]
    winner: Trial | None = None
    tuned_file: str | None = None
    diff: str = ""
    plot: str | None = None
    interrupted: str | None = None  # "interrupted" | "budget" when the search stopped early
    final: str = ""  # what the host runs now, in words
    ok: bool = True


def measure_levels(runner: Any, settings: inventory.Settings, api_key: str | None, workload: Workload,
                   progress: Callable[[str], None]) -> tuple[Level, ...]:
    prompts = workload.prompts()
    # A server just restarted answers its first requests slower (caches, allocator, compiled paths):
    # a few short ones first, not counted, so every trial is measured warm.
    server.bench(runner, settings, api_key, "", min(4, workload.requests), 1, 4, lambda event: None, prompts=prompts)
    levels = []
    for concurrency in workload.concurrency:
        progress(f"  bench: {workload.requests} requests, concurrency {concurrency}")
        found = server.bench(runner, settings, api_key, "", workload.requests, concurrency, workload.output_tokens,
                             lambda event: None, prompts=prompts)
        levels.append(Level(concurrency, found.tokens_per_s, found.ttft_p50_s, found.ttft_p95_s, found.itl_p95_s,
                            found.succeeded, found.requests))
    return tuple(levels)


def tune(inv: inventory.Inventory, unit: Unit, options: Options, *, space: str | None, workload: Workload,
         slo: Slo, budget_s: float | None, timeout: float, plot: bool = True,
         progress: Callable[[str], None] = progress_line) -> Tuned:
    """Trials on one unit, the winner kept and deployed; the host runs the winner, or what it ran before."""
    server_host = inv.host(unit.server)
    gated = gate(inv, [server_host], dataclasses.replace(options, quiet=True))
    if unit.server in gated.errors:
        raise gated.errors[unit.server]
    ctx = gated.contexts[unit.server]
    dimensions = load_space(space, ctx.profile.name, ctx.settings.engine)
    check_space(dimensions, ctx.settings.engine, contracts.load().release(ctx.settings.engine, ctx.settings.vllm_spec),
                space or SPACES)
    base = dict(options.overrides)
    settings_now = inv.settings(unit.server, base)
    current = current_values(dimensions, settings_now)
    folder = Path(inv.tuned_dir or "tuned")
    store = TrialStore(folder / "trials" / f"{ctx.profile.name}-{fingerprint(ctx.profile.name, ctx.facts, settings_now, base)}"
                       f"-{workload_key(workload)}.json")
    held = secrets.load(inv.secrets)
    started = time.monotonic()
    durations: list[float] = []
    result = Tuned(unit, [], slo, workload, dimensions)
    targets = [inv.host(name) for name in unit.hosts]

    def measure(trial_settings: dict[str, Any]) -> Trial:
        # Kept and compared by what the host runs in the end (its current values under the trial's), so a
        # later run, whose current values a kept winner changed, finds the same trials again.
        absolute = {name: value for name, value in {**current, **trial_settings}.items() if value is not None}
        key = key_of(absolute)
        kept = store.get(key)
        if kept is not None:
            progress(f"{unit.server}: {describe(trial_settings)}: measured before ({kept.outcome})")
            return kept
        progress(f"{unit.server}: trial {describe(trial_settings)} ...")
        begun = time.monotonic()
        overrides = merge(base, overrides_of(dimensions, trial_settings))
        deployed = rolling.deploy(inv, targets, dataclasses.replace(options, overrides=overrides, quiet=True),
                                  timeout=timeout, by="tune trial")  # named so in `rollback --list`
        outcome = deployed.outcomes.get(unit.server)
        if not deployed.ok or outcome is None or outcome.state not in ("ready", "unchanged"):
            detail = (outcome.detail if outcome and outcome.detail else
                      "; ".join(str(e) for e in deployed.errors.values()) or "not deployed")
            state = outcome.state if outcome else "failed"
            outcome_word = "skipped" if state == "blocked" else "failed"
            trial = Trial(key, absolute, outcome_word, _clip(f"{state}: {detail}"),
                          seconds=round(time.monotonic() - begun, 1))
        else:
            runner = remote.connect(server_host, inv.ssh)
            try:
                levels = measure_levels(runner, inv.settings(unit.server, overrides), held.vllm_api_key, workload,
                                        progress)
            except ProvisionError as exc:
                levels, failure = (), str(exc)
            else:
                failure = ""
            finally:
                runner.close()
            trial = Trial(key, absolute, "failed" if failure else "measured", failure, levels,
                          round(time.monotonic() - begun, 1))
        durations.append(trial.seconds)
        return trial

    def more() -> bool:
        if budget_s is None:
            return True
        estimate = sum(durations) / len(durations) if durations else 0.0
        if time.monotonic() - started + estimate > budget_s:
            result.interrupted = result.interrupted or "budget"
            return False
        return True

    def keep(trial: Trial) -> None:
        store.keep(trial)
        result.trials.append(trial)
        progress(f"{unit.server}: {describe(trial.settings)}: {trial.verdict(slo)}"
                 + (f" ({trial.score(slo):.1f} tokens/s)" if trial.score(slo) else ""))

    def skip(dimension: Dimension, value: Any) -> str | None:
        return unworkable(dimension, value, ctx.facts)

    try:
        search(dimensions, current, measure, slo, skip, more, keep)
    except KeyboardInterrupt:
        result.interrupted = "interrupted"
        progress(f"{unit.server}: interrupted: putting the best settings found so far in place ...")
    result.winner = winner(result.trials, slo)
    return finish(inv, unit, options, result, base, timeout, plot, progress)


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
               slo: Slo) -> str:
    best = trial.best(slo)
    assert best is not None
    header = [
        f"# Kept by `invoke tune` on {time.strftime('%Y-%m-%d %H:%M')} (provision {__version__}) for {unit.server}.",
        (f"# Workload {workload.name}: {workload.requests} requests, prompts of {workload.prompt_words[0]}-"
        f"{workload.prompt_words[1]} words after a shared {workload.shared_prefix_words}, {workload.output_tokens} "
        f"tokens out, concurrency {list(workload.concurrency)}, seed {workload.seed}."),
        (f"# Bound: TTFT p95 {'no bound' if slo.ttft_p95_ms is None else f'<= {slo.ttft_p95_ms:g} ms'}, "
         f"ITL p95 {'no bound' if slo.itl_p95_ms is None else f'<= {slo.itl_p95_ms:g} ms'}."),
        f"# Measured: {best.tokens_per_s:.1f} tokens/s at concurrency {best.concurrency}, TTFT p50 "
        f"{_ms(best.ttft_p50_s)}, p95 {_ms(best.ttft_p95_s)}, ITL p95 {_ms(best.itl_p95_s)}"
        + (f"; the host as it was: {baseline.score(slo):.1f} tokens/s." if baseline and baseline.score(slo) else "."),
        "# Delete this file to go back to the inventory's own settings (then `invoke deploy`).",
    ]
    body = yaml.safe_dump({"host": unit.server, "vars": dict(vars_)}, sort_keys=True, default_flow_style=False)
    return "\n".join(header) + "\n" + body


def finish(inv: inventory.Inventory, unit: Unit, options: Options, result: Tuned, base: Mapping[str, Any],
           timeout: float, plot: bool, progress: Callable[[str], None]) -> Tuned:
    """Keep the winner (diff first), deploy what the host should run now, draw the plot."""
    folder = Path(inv.tuned_dir or "tuned")
    path = folder / f"{unit.server}.yaml"
    winning = result.winner
    if winning is not None:
        old_vars = dict(inv.tuned.get(unit.server, {}))
        new_vars = merge(old_vars, overrides_of(result.dimensions, winning.settings))
        baseline = next((t for t in result.trials if not t.settings), None)
        text = tuned_text(unit, new_vars, winning, baseline, result.workload, result.slo)
        old_text = path.read_text(encoding="utf-8") if path.exists() else ""
        result.diff = "".join(difflib.unified_diff(old_text.splitlines(keepends=True), text.splitlines(keepends=True),
                                                   fromfile=f"{path} (kept)", tofile=f"{path} (tuned)"))
        progress(result.diff or f"{path}: unchanged")
        folder.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(text, encoding="utf-8")
        temporary.replace(path)
        result.tuned_file = str(path)
    # What the host runs from now on: the inventory (with the file just written) under the run's own --set.
    current = inventory.load(inv.path) if inv.path else inv
    deployed = rolling.deploy(current, [current.host(name) for name in unit.hosts],
                              dataclasses.replace(options, overrides=dict(base), quiet=True), timeout=timeout)
    outcome = deployed.outcomes.get(unit.server)
    result.ok = deployed.ok and outcome is not None and outcome.state in ("ready", "unchanged")
    what = describe(winning.settings) if winning is not None else "its original settings (no trial passed)"
    result.final = (f"runs {what}" if result.ok else
                    f"could not be put back on {what}: {outcome.detail if outcome else deployed.errors}")
    if plot and result.trials:
        result.plot = draw(result, folder / f"{unit.server}.png")
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
    axis.set_title(f"invoke tune: {result.unit.server} ({result.workload.name} workload)")
    axis.legend(fontsize=7, loc="best")
    axis.grid(alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return str(path)
