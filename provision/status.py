"""Cluster status: every host in parallel, one remote execution each, a deadline for all.

The fact probe gathers the host's part (kernel, driver, GPUs, memory, the units, the model's current
revision) and asks the server itself over loopback on the host: /health, /v1/models and /metrics twice
a short window apart, so counters become rates (tokens/s). Parsing is pure (`parsers.parse_metrics`,
`figures`, `host_status`) and tested on /metrics recorded from real vLLM. A host that does not answer within the
deadline is reported as such while the others are not kept waiting.

A server whose engine is wedged still answers /health (provision/stall.py): each host's /metrics samples
are judged by `stall.progress`, and a host whose counter looks still after the first window is asked
again, alone, until it moves or the stall window has passed (`follow_up`).
"""
from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from provision import (
    checks,
    endpoints,
    engines,
    facts,
    hints,
    inventory,
    parsers,
    remote,
    render,
    secrets,
    server,
    services,
    stall,
    weights,
)
from provision.catalog import ITERATION_STATS, MetricNames
from provision.context import Context
from provision.endpoints import EndpointPlan
from provision.errors import ProvisionError, error_text
from provision.facts import HostFacts
from provision.inventory import Settings
from provision.parsers import UnitState
from provision.profiles import Profile
from provision.runner import Result, Runner

STATUS_FACTS = tuple(f for f in facts.FACTS if f.name in ("uname", "meminfo", "nvidia_driver", "gpus", "units"))


@dataclass(frozen=True)
class Figures:
    """The server's own figures: requests now, rates over the window, the caches."""

    running: float | None = None
    waiting: float | None = None
    generation_tokens_per_s: float | None = None
    prompt_tokens_per_s: float | None = None
    kv_cache_usage_pct: float | None = None
    prefix_cache_hit_pct: float | None = None  # since the server started
    generation_tokens_total: float | None = None
    kv_capacity_tokens: int | None = None  # the server's own KV cache size (vllm:cache_config_info)
    # Requests the server itself counts as failed since it started (None: its engine counts none).
    failed_requests: float | None = None


VLLM_METRICS = engines.ENGINES["vllm"].metrics
METRICS_READ = VLLM_METRICS.read  # vLLM's; each engine's are engine.metrics.read
def figures(first: Mapping[str, float], second: Mapping[str, float], window: float,
            capacity: int | None = None, names: MetricNames = VLLM_METRICS) -> Figures:
    """Pure: two metrics samples `window` seconds apart -> the figures status shows, read with the
    engine's names (each field's alternatives in order: vLLM's V1 names, then V0's)."""
    def rate(*metric: str) -> float | None:
        before, after = parsers.first_of(first, *metric), parsers.first_of(second, *metric)
        if before is None or after is None or window <= 0:
            return None
        return max(0.0, after - before) / window

    kv = parsers.first_of(second, *names.kv_usage)
    hits, queries = parsers.prefix_counts(second, names.prefix_hits, names.prefix_queries)
    return Figures(
        running=parsers.first_of(second, *names.running),
        waiting=parsers.first_of(second, *names.waiting),
        generation_tokens_per_s=rate(*names.generated),
        prompt_tokens_per_s=rate(*names.prompted),
        kv_cache_usage_pct=None if kv is None else round(kv * 100, 2),
        prefix_cache_hit_pct=round(hits / queries * 100, 2) if hits is not None and queries else None,
        generation_tokens_total=parsers.first_of(second, *names.generated),
        kv_capacity_tokens=capacity,
        failed_requests=sum(second[name] for name in names.failed if name in second)
        if any(name in second for name in names.failed) else None,
    )


@dataclass(frozen=True)
class HostStatus:
    host: str
    role: str  # "server" (serves the API), "worker" (another node of a multi-node server), "unknown"
    reachable: bool
    healthy: bool
    problem: str | None = None
    kernel: str | None = None
    driver: str | None = None
    gpus: tuple[dict[str, Any], ...] = ()
    unit: dict[str, Any] = field(default_factory=dict)
    health: str | None = None
    model: str | None = None
    revision: str | None = None
    figures: Figures | None = None
    seconds: float | None = None
    # The gate's estimate of the KV cache's tokens (memory.fits, from the model's config.json on the host),
    # beside the server's own figure (figures.kv_capacity_tokens).
    kv_estimate_tokens: int | None = None
    engine: str | None = None  # the engine the host's settings name (vllm, trtllm, llamacpp)
    # The generation the host runs ({"id", "state", "by", "created", "overrides"}) and how it departs
    # from the inventory: a run's --set, a tune trial, a verdict never given (drift, one line each).
    generation: dict[str, Any] | None = None
    drift: tuple[str, ...] = ()
    # The stuck rule's verdict (provision/stall.py) and the /metrics samples it judged (kept by --watch
    # for its next refresh; not in --json).
    progress: stall.Progress | None = None
    samples: tuple[stall.Sample, ...] = ()
    # Why a host serves nothing by design (None: it should serve): neither healthy nor a failure.
    idle: str | None = None


def current_generation(state_text: str | None) -> dict[str, Any] | None:
    """Pure: the host's generations state.json -> the current generation's summary (None: none kept)."""
    try:
        state = json.loads(state_text or "")
        return dict(next(g for g in state["generations"] if g["id"] == state["current"]))
    except (ValueError, StopIteration, KeyError, TypeError):
        return None


def drift_of(generation: Mapping[str, Any] | None, now: float) -> tuple[str, ...]:
    """Pure: how what the host runs departs from what the inventory declares, in words: a generation
    applied with --set (its keys), by a tune trial, or pending (its run waits for readiness, or stopped
    before the verdict: killed, its connection lost)."""
    if not generation:
        return ()
    number, by, created = generation.get("id"), generation.get("by") or "a run", generation.get("created") or "?"
    lines = []
    if generation.get("state") == "pending":
        if (generation.get("deadline") or 0) < now:
            lines.append(f"generation {number} is pending: the {by} of {created} stopped before its readiness "
                         f"verdict (`{hints.command('deploy')}` gives it, `{hints.command('rollback')}` goes back)")
        else:
            lines.append(f"generation {number} is pending: the {by} of {created} waits for its readiness")
    elif generation.get("state") not in ("good", "applied", "found", None):
        lines.append(f"generation {number} is {generation.get('state')}")
    if by == "tune trial":
        lines.append(f"runs a tune trial's settings (generation {number}, {created}), not the inventory's: "
                     f"`{hints.command('deploy')}` puts the inventory's back")
    elif generation.get("overrides"):
        lines.append(f"runs settings the inventory does not declare: generation {number} ({by}, {created}) "
                     f"was applied with --set {', '.join(generation['overrides'])} (`{hints.command('plan')}` shows the "
                     "difference)")
    return tuple(lines)


def installed_by_tool(state_text: str | None, unit: str) -> bool:
    """Pure: whether a generation the host keeps changed `unit` (the tool installed it there). A
    generation of weights or a venv alone (`invoke weights`, `invoke venv`) installs no unit."""
    try:
        kept = json.loads(state_text or "").get("generations") or []
        return bool(unit) and any(unit in str(change) for generation in kept
                                  for change in generation.get("changes") or [])
    except (ValueError, AttributeError, TypeError):
        return False


def idle_by_design(found: HostStatus, provisioned: bool, declares_model: bool) -> HostStatus:
    """Pure: a host whose unit is not installed serves nothing by design when the tool never
    installed that unit there (no generation kept on the host changed it) or the inventory gives it
    no model: idle, not unhealthy. A host the tool did provision whose unit is gone stays unhealthy, with what to do."""
    unit = found.unit.get("name", "the server unit")
    deploy = f"`{hints.command(f'deploy --host {found.host}')}` deploys it"
    if found.reachable and found.unit.get("installed") is None and not provisioned and found.generation is None \
            and found.health != "ok":
        # systemctl could not answer (no systemd as PID 1, say), and nothing of the tool is on the host:
        # what was never deployed, not an unknown failure.
        then = deploy if declares_model else (f"it names no model to serve yet: "
                                              f"`{hints.command(f'check --host {found.host}')}` says the line to add")
        return dataclasses.replace(found, problem=None, idle=(
            f"never provisioned by the tool (no generation on the host; systemd could not say whether {unit} "
            f"is there): {then}"))
    if not found.reachable or found.unit.get("installed") is not False:
        return found
    if not declares_model:
        return dataclasses.replace(found, problem=None, idle="the inventory gives it no model to serve")
    if not provisioned:
        return dataclasses.replace(found, problem=None, idle=(
            f"never provisioned by the tool (no generation on the host installed {unit}): {deploy}"))
    number = f" (generation {found.generation['id']})" if found.generation else ""
    return dataclasses.replace(found, problem=f"{unit} is gone, yet the tool provisioned the host{number}: "
                                              f"`{hints.command(f'deploy --host {found.host}')}` puts it back")


def serving_as_declared(found: Mapping[str, HostStatus]) -> bool:
    """Every host that should serve does (idle hosts serve nothing by design): status's exit 0."""
    return all(item.healthy or item.idle is not None for item in found.values())


def _gpu_rows(host_facts: HostFacts) -> tuple[dict[str, Any], ...]:
    rows = []
    memory = host_facts.memory
    for gpu in host_facts.gpus or ():
        used, total, source = gpu.memory_used_mib, gpu.memory_total_mib, "nvidia-smi"
        if total is None and memory is not None:  # GB10: unified memory, nvidia-smi says [N/A]
            total, used = memory.total // 2**20, (memory.total - memory.available) // 2**20
            source = "/proc/meminfo"
        rows.append({"index": gpu.index, "name": gpu.name, "memory_used_mib": used, "memory_total_mib": total,
                     "memory_from": source, "temperature_c": gpu.temperature_c,
                     "utilization_pct": gpu.utilization_pct, "power_w": gpu.power_w,
                     "power_limit_w": gpu.power_limit_w, "recorded": gpu.recorded})
    return tuple(rows)


def since_of(state: UnitState | None) -> str | None:
    """When a unit entered the state shown: its start for a running unit; for a stopped or failed one,
    when its process ended (ActiveEnterTimestamp keeps the last start in every state)."""
    if state is None:
        return None
    if state.active_state in ("inactive", "failed"):
        return state.exited_at
    return state.active_since


def crash_of(state: UnitState) -> str:
    """Pure: a unit waiting out RestartSec -> how its last run ended, in words ("crashed at ... (killed
    by signal 9), restarting: restart 1 pending"). systemd counts the restart (NRestarts) and sets the
    new start time only when it starts the process again."""
    how = (f"killed by signal {state.exit_status}" if state.result == "signal"
           else f"exit status {state.exit_status}" if state.exit_status is not None else state.result or "ended")
    pending = (state.restarts or 0) + 1
    return f"crashed at {state.exited_at or 'an unknown time'} ({how}), restarting: restart {pending} pending"


def silent(unit: str) -> str:
    """A server whose process runs and accepts connections but answers nothing: stopped (SIGSTOP) or
    wedged in a way that holds its HTTP thread too. On an H200 a SIGSTOPped llama-server read so: the
    unit active and running, /health timing out (not refused), the GPU at its idle draw."""
    return (f"stuck: {unit} runs but /health did not answer (its process is stopped or wedged); "
            f"`journalctl -u {unit}` on the host shows its last lines, `systemctl restart {unit}` clears it")


def unauthorized(key_sent: bool) -> str:
    """What an HTTP 401 from vLLM means for the person running the tool."""
    if key_sent:
        return ("the server refused the API key sent (HTTP 401): api_key differs from the server's "
                "VLLM_API_KEY; provision the host again or fix the key")
    return ("the server wants an API key (HTTP 401): set api_key (the inventory's secrets file, "
            "or VLLM_API_KEY in the environment)")


def host_status(host: str, role: str, host_facts: HostFacts, serving: Mapping[str, Any] | None,
                model_root: str | None, seconds: float, key_sent: bool = False,
                engine: engines.Engine = engines.ENGINES["vllm"], names: MetricNames | None = None,
                naming: services.Naming = services.HOST) -> HostStatus:
    """Pure: the probe's answer -> what status shows, and whether the host is healthy. `names`: the
    metric names of the host's release (engine.metric_names(settings)); the engine's default otherwise.
    Nine parameters: each is one separate reading of the host (its role, facts, server answer, model
    root, seconds, whether a key was sent, engine and metric names), and the tests build a row from
    the few they vary; a holder of them all would be built for this call alone."""
    names = names or engine.metrics
    machine: dict[str, Any] = {
        "kernel": host_facts.kernel, "driver": host_facts.driver.version if host_facts.driver else None,
        "gpus": _gpu_rows(host_facts), "seconds": round(seconds, 2)}
    unit_name = naming.unit(engine.server_unit) if role == "server" else worker_unit(engine, host_facts)
    if unit_name is None:  # a worker the head's server starts its processes on (TensorRT-LLM over MPI)
        return HostStatus(host, role, True, True, None, health="-", **machine, unit={
            "name": "-", "active": "n/a", "installed": True, "note": f"{engine.title} ranks started by the head"})
    state = (host_facts.units or {}).get(unit_name)
    # None: systemctl could not answer (facts' note), which says nothing of whether the unit is there.
    installed = None if host_facts.units is None else state is not None and state.load_state != "not-found"
    unit = {"name": unit_name, "active": state.active_state if state else "unknown",
            "sub": state.sub_state if state else None, "restarts": state.restarts if state else None,
            "since": since_of(state), "installed": installed}
    if state is not None and state.restarting:  # the start time and count are the run that just ended
        unit.update(since=None, crashed=crash_of(state))
    revision = None
    if model_root:
        revision = (host_facts.weights.get(model_root) or {}).get("current")
    common: dict[str, Any] = {**machine, "unit": unit, "revision": revision}
    if state is not None and not installed:  # never provisioned: say so, not "inactive" or "worker"
        return HostStatus(host, role, True, False, f"{unit_name} is not installed: provision the host first",
                          health="-", **common)
    if role != "server":
        healthy = unit["active"] == "active"
        return HostStatus(host, role, True, healthy, None if healthy else f"{unit_name} is {unit['active']}",
                          **common)
    serving = serving or {}
    health = serving.get("health") or {}
    if health.get("status") == 200:
        health_text = "ok"
    elif health.get("status") is None:
        refused = "refused" in str(health.get("error", "")).lower()
        health_text = "not answering" + (" (connection refused)" if refused else "")
    else:
        health_text = f"HTTP {health.get('status')}"
    model = None
    try:
        listed = json.loads((serving.get("models") or {}).get("body") or "{}").get("data") or []
        model = listed[0]["id"] if listed else None
    except (json.JSONDecodeError, AttributeError, KeyError, TypeError):
        model = None
    bodies = [sample.get("body") or "" for sample in serving.get("metrics") or [] if sample.get("status") == 200]
    samples = [sample for sample in (parsers.read_sample(body, names.format) for body in bodies) if sample is not None]
    info = names.cache_info
    capacity = parsers.kv_capacity(parsers.info_labels(bodies[-1], info)) if bodies and info else None
    found = (figures(samples[0], samples[1], float(serving.get("window") or 0), capacity, names)
             if len(samples) == 2
             else None)
    refused_key = (serving.get("models") or {}).get("status") == 401
    healthy = unit["active"] == "active" and health_text == "ok" and not refused_key
    problem = None if healthy else (f"{unit_name} {unit['crashed']}" if unit.get("crashed")
                                    else f"{unit_name} is {unit['active']}" if unit["active"] != "active"
                                    else silent(unit_name) if health_text == "not answering"
                                    and unit["sub"] == "running"
                                    else f"/health {health_text}" if health_text != "ok"
                                    else unauthorized(key_sent))
    return HostStatus(host, role, True, healthy, problem, health=health_text, model=model, figures=found,
                      **common)


def samples_of(serving: Mapping[str, Any] | None, names: MetricNames,
               counters: stall.Counters) -> tuple[stall.Sample, ...]:
    """Pure: the probe's serving answer -> the stuck rule's samples: each /metrics page that read, with
    when it was read on the host's clock."""
    serving = serving or {}
    found = []
    for page, at in zip(serving.get("metrics") or [], serving.get("sampled_at") or []):
        values = parsers.read_sample(page.get("body") or "", names.format) if page.get("status") == 200 else None
        if values is not None:
            found.append(stall.sample(float(at), values, counters))
    return tuple(found)


def judged(found: HostStatus, progress: stall.Progress, samples: Sequence[stall.Sample]) -> HostStatus:
    """Pure: a server's status with the stuck rule's verdict. Stuck makes the host unhealthy (exit 1)
    although /health answers: that is the point of the rule."""
    stuck = progress.state == "stuck"
    problem = found.problem
    if stuck and found.healthy:
        unit = found.unit.get("name") or "the server's unit"
        known = ", as in vLLM #37729" if found.engine in (None, "vllm") else ""
        problem = (f"stuck: {progress.detail}, yet /health answers (a wedged engine{known}); "
                   f"`{hints.command(f'logs --host {found.host}')}` shows its last lines, `systemctl restart {unit}` on "
                   "the host clears it")
    return dataclasses.replace(found, healthy=found.healthy and not stuck, problem=problem, progress=progress,
                               samples=tuple(samples))


def status_facts(naming: services.Naming) -> tuple[facts.Fact, ...]:
    """The facts status reads, its units those of the server's names (a service's, or the host's)."""
    return facts.with_units(STATUS_FACTS, render.units_of(naming))


def probe_spec(settings: Settings, api_key: str | None, window: float, timeout: float,
               naming: services.Naming = services.HOST) -> dict[str, Any]:
    """What one host's status execution collects (a probe spec with the server part)."""
    spec = facts.probe_spec(status_facts(naming), [], timeout)
    names = engines.engine_of(settings).metric_names(settings)
    spec["inspect"] = {"files": [naming.state_file]}  # which generation runs, and how it came
    if weights.managed(settings):
        spec["inspect"] = {"weights": [weights.root_of(settings)],
                           "files": [served_config(settings), naming.state_file]}
    spec["serving"] = {"base": server.base_url(settings), "api_key": api_key, "window": window,
                       "timeout": min(3.0, timeout), "metrics_path": names.path,
                       # JSON is not filtered line by line on the host: it comes back whole.
                       "keep": list(names.read) if names.format != ITERATION_STATS else []}
    return spec


def served_config(settings: Settings) -> str:
    return f"{weights.root_of(settings)}/current/config.json"


def kv_estimate(host: str, profile: Profile, settings: Settings, host_facts: HostFacts) -> int | None:
    """The gate's estimate of the KV cache in tokens (memory.fits), from the config.json and the
    manifest of the revision the host serves: the same figure `invoke check` showed before the start."""
    if not weights.managed(settings):
        return None
    try:
        config = json.loads(host_facts.files.get(served_config(settings), {}).get("content") or "")
    except ValueError:
        return None
    manifest = (host_facts.weights.get(weights.root_of(settings)) or {}).get("files") or {}
    sizes = {path: int(entry.get("size") or 0) for path, entry in manifest.items() if isinstance(entry, dict)}
    ctx = Context(host=host, profile=profile, settings=settings, facts=host_facts, model_config=config,
                  weights_bytes=weights.tensor_bytes(sizes) if sizes else None)
    found = checks.memory_fits(ctx)
    tokens = found.evidence.get("context_tokens")
    return int(tokens) if isinstance(tokens, int) else None


@dataclass(frozen=True)
class Sampling:
    """How status reads a host: seconds between the two /metrics samples (`window`), seconds each host
    may take (`timeout`), and how long the generated-token count may stand still (`stall_window`)."""

    window: float = 1.0
    timeout: float = 5
    stall_window: float = stall.STALL_WINDOW


def gather_one(runner: Runner, host: str, role: str, settings: Settings, api_key: str | None, sampling: Sampling,
               profile: Profile | None = None, history: Sequence[stall.Sample] = (),
               naming: services.Naming = services.HOST) -> HostStatus:
    """One server's status in one execution; `history`: its samples of earlier refreshes (--watch)."""
    window, timeout, stall_window = sampling.window, sampling.timeout, sampling.stall_window
    started = time.monotonic()
    spec = probe_spec(settings, api_key, window, timeout, naming)
    result: Result = runner.run(list(facts.PROBE_PYTHON), stdin=facts.probe_program(spec), timeout=timeout + window + 5)
    host_facts = facts.facts_from_probe(host, result, status_facts(naming))
    serving = json.loads(result.stdout).get("serving")
    root = weights.root_of(settings) if weights.managed(settings) else None
    engine = engines.engine_of(settings)
    found = host_status(host, role, host_facts, serving, root, time.monotonic() - started, key_sent=bool(api_key),
                        engine=engine, names=engine.metric_names(settings), naming=naming)
    generation = current_generation((host_facts.files.get(naming.state_file) or {}).get("content"))
    found = dataclasses.replace(found, engine=engine.name, generation=generation,
                                drift=drift_of(generation, time.time()))
    state_text = (host_facts.files.get(naming.state_file) or {}).get("content")
    found = idle_by_design(found, provisioned=installed_by_tool(state_text, str(found.unit.get("name", ""))),
                           declares_model=bool(settings.model))
    if role == "server" and profile is not None:
        found = dataclasses.replace(found, kv_estimate_tokens=kv_estimate(host, profile, settings, host_facts))
    if role == "server" and found.health == "ok":
        names, counters = stall_reading(settings)
        samples = (*history, *samples_of(serving, names, counters))
        found = judged(found, stall.progress(samples, stall_window, counters), samples)
    return found


def stall_reading(settings: Settings) -> tuple[MetricNames, stall.Counters]:
    """The metric names a server's engine serves and the stuck rule's counters among them, for its release."""
    engine = engines.engine_of(settings)
    names = engine.metric_names(settings)
    return names, stall.counters(engine, names, settings.engine_spec)


FOLLOW_UP_STEP = 5.0  # seconds between a still host's samples while status waits for the stall window


def follow_up(runner: Runner, settings: Settings, api_key: str | None, found: HostStatus, stall_window: float,
              timeout: float) -> HostStatus:
    """A server whose counter stood still with requests running (state "stalled") is asked for /metrics
    again, alone (no facts), until the counter moves, the requests end or the stall window has passed."""
    names, counters = stall_reading(settings)
    samples, progress = found.samples, found.progress
    while progress is not None and progress.state == "stalled":
        pause = min(FOLLOW_UP_STEP, max(0.5, stall_window - (progress.seconds or 0.0)))
        spec = {"timeout": timeout, "serving": probe_spec(settings, api_key, pause, timeout)["serving"]}
        result: Result = runner.run(list(facts.PROBE_PYTHON), stdin=facts.probe_program(spec), timeout=timeout + pause + 5)
        if not result.ok:
            break  # the first answer stands; the next status asks again
        more = samples_of(facts.probe_answer(result.stdout).get("serving"), names, counters)
        if not more:
            break  # /metrics stopped answering meanwhile: the first answer stands
        samples = (*samples, *more)
        progress = stall.progress(samples, stall_window, counters)
    return judged(found, progress, samples) if progress is not None else found


def with_deadline(names: Sequence[str], work: Callable[[str], HostStatus], deadline: float,
                  failed: Callable[[str, str], HostStatus]) -> dict[str, HostStatus]:
    """Each host in its own (daemon) thread; whoever has not answered by the deadline is reported as
    such, and the command returns: one dead host never holds up the report."""
    results: dict[str, HostStatus] = {}
    lock = threading.Lock()

    def run(name: str) -> None:
        try:
            value = work(name)
        except Exception as exc:  # noqa: BLE001 - reported for that host, never lost
            value = failed(name, str(exc) or type(exc).__name__)
        with lock:
            results[name] = value

    threads = [threading.Thread(target=run, args=(name,), daemon=True) for name in names]
    for thread in threads:
        thread.start()
    end = time.monotonic() + deadline
    for thread in threads:
        thread.join(max(0.0, end - time.monotonic()))
    with lock:
        return {name: results.get(name) or failed(name, f"no answer within {deadline:g}s") for name in names}


def unreachable(host: str, role: str, why: str) -> HostStatus:
    return HostStatus(host, role, False, False, why)


# The kinds of "could not ask the host", in the words the table shows; the whole text stays in --json.
_REASONS = (("host key", "host key refused"), ("authentication failed", "login refused"),
            ("refused", "connection refused"), ("no answer", "timed out"), ("did not answer", "timed out"),
            ("timed out", "timed out"), ("no route", "no route to host"), ("connection lost", "connection lost"))


def short_reason(why: str) -> str:
    """'cpu-1: unreachable: cannot connect to root@10.0.0.5:22: connection refused (…)' -> 'connection refused'."""
    lowered = why.lower()
    return next((words for needle, words in _REASONS if needle in lowered), "cannot connect")


def as_json(status: HostStatus) -> dict[str, Any]:
    data: dict[str, Any] = parsers.json_ready(status)
    data.pop("samples", None)  # the rule's raw readings: its verdict is `progress`
    return data


def worker_unit(engine: engines.Engine, host_facts: HostFacts) -> str | None:
    """The unit a worker node runs: of the engine's worker units (one per launch) the one installed there,
    else the engine's default."""
    units = host_facts.units or {}
    return next((name for name in engine.worker_units
                 if name in units and units[name].load_state != "not-found"), engine.worker_unit)


# How a worker node's row names what it runs, by its unit.
WORKER_NOTES = {"vllm-worker.service": "vLLM headless worker", "vllm-ray-worker.service": "Ray worker"}


def as_one_server(found: Mapping[str, HostStatus], inv: inventory.Inventory) -> dict[str, HostStatus]:
    """Pure: a multi-node cluster's rows judged as the one server they are. Each worker row says which
    node holds the API; a head that answers while a worker does not is not healthy (its engine cannot
    run a step without that node), with the worker's problem and the command that restarts them all."""
    result = dict(found)
    for cluster in inv.clusters.values():
        if not cluster.multi_node or cluster.head not in found:
            continue
        workers = [name for name in cluster.hosts if name != cluster.head and name in found]
        for name in workers:
            row = found[name]
            what = WORKER_NOTES.get(str(row.unit.get("name")), "worker")
            result[name] = dataclasses.replace(row, unit={**row.unit, "note": f"{what}; API on {cluster.head}"})
        down = [name for name in workers if not found[name].healthy]
        head = found[cluster.head]
        if down and head.healthy:
            said = "; ".join(f"{name}: {found[name].problem or 'not healthy'}" for name in down)
            result[cluster.head] = dataclasses.replace(head, healthy=False, problem=(
                f"answers, but without {', '.join(down)} ({said}): the nodes serve as one; "
                f"`{hints.command(f'deploy --cluster {cluster.name}')}` starts them together"))
    return result


def role_of(inv: inventory.Inventory, name: str) -> str:
    cluster = inv.cluster_of(name)
    return "worker" if cluster and cluster.multi_node and name != cluster.head else "server"


def gather_status(inv: inventory.Inventory, targets: list[inventory.Host], overrides: dict[str, Any],
                  held: secrets.Secrets, sampling: Sampling,
                  history: Mapping[str, Sequence[stall.Sample]] | None = None) -> dict[str, HostStatus]:
    """Every host's status under one deadline. Once (`history` None): a server that looks stalled is
    then asked again until the stuck rule can tell (at most the stall window, under a second deadline;
    only those hosts wait). --watch passes each host's earlier samples as `history` and waits for none."""
    window, timeout, stall_window = sampling.window, sampling.timeout, sampling.stall_window
    ssh = inventory.SshSettings(**{**inv.ssh.__dict__, "connect_timeout": min(inv.ssh.connect_timeout, timeout)})

    def one(name: str) -> HostStatus:
        target = inv.host(name)
        runner = remote.connect(target, ssh)
        try:
            return gather_one(runner, name, role_of(inv, name), inv.settings(name, overrides),
                              held.api_key, sampling, target.profile, (history or {}).get(name, ()),
                              inv.naming(name))
        finally:
            runner.close()

    found = as_one_server(with_deadline([t.name for t in targets], one, timeout + window + 2,
                                        lambda name, why: unreachable(name, role_of(inv, name), why)), inv)
    stalled = [name for name, item in found.items() if item.progress and item.progress.state == "stalled"]
    if history is not None or not stalled:
        return found

    def again(name: str) -> HostStatus:
        runner = remote.connect(inv.host(name), ssh)
        try:
            return follow_up(runner, inv.settings(name, overrides), held.api_key, found[name], stall_window,
                             timeout)
        finally:
            runner.close()

    def kept(name: str, why: str) -> HostStatus:  # the first answer stands, with why it could not be judged
        first = found[name]
        assert first.progress is not None
        return dataclasses.replace(first, progress=dataclasses.replace(
            first.progress, detail=f"{first.progress.detail}; asked again: {why}"))

    return {**found, **with_deadline(stalled, again, stall_window + timeout + FOLLOW_UP_STEP + 2, kept)}


@dataclass(frozen=True)
class EndpointStatus:
    """One endpoint as its router sees it: each replica's state there (UP, DRAIN, MAINT, DOWN) and its
    requests in flight; `error` where the router did not answer."""

    name: str
    host: str
    url: str
    replicas: tuple[Mapping[str, Any], ...] = ()
    error: str | None = None

    @property
    def healthy(self) -> bool:
        return self.error is None and bool(self.replicas) and all(r["state"] == "UP" for r in self.replicas)

    @property
    def answers(self) -> bool:
        """The router answered and sends to at least one replica."""
        return self.error is None and any(r["state"] == "UP" for r in self.replicas)


def endpoint_status(plan: EndpointPlan, seen: Sequence[Mapping[str, Any]]) -> EndpointStatus:
    """Pure: the router's servers (`router.servers`) read as the endpoint's replicas, in the inventory's order."""
    by_server = {(item.get("backend"), item.get("server")): item for item in seen}
    replicas = []
    for backend in plan.backends:
        for replica in backend.replicas:
            item = by_server.get((backend.name, replica.cluster))
            replicas.append({"cluster": replica.cluster, "host": replica.host, "model": replica.model,
                             "address": f"{replica.address}:{replica.port}",
                             "state": str(item.get("state")) if item else "not in the router",
                             "in_flight": int(item.get("in_flight") or 0) if item else 0,
                             "failures": dict(item.get("failures") or {}) if item else {}})
    return EndpointStatus(plan.name, plan.host, server.server_url(plan.address, plan.port), tuple(replicas))


def gather_endpoints(inv: inventory.Inventory, targets: list[inventory.Host], timeout: float) -> list[EndpointStatus]:
    """The endpoints whose router runs on one of the targets, each asked through its router host's runtime
    API (one more remote execution per router host)."""
    from provision import router

    names = {target.name for target in targets}
    chosen = [endpoint for endpoint in inv.endpoints.values() if endpoint.host in names]
    ssh = inventory.SshSettings(**{**inv.ssh.__dict__, "connect_timeout": min(inv.ssh.connect_timeout, timeout)})

    def one(endpoint: inventory.Endpoint) -> EndpointStatus:
        plan = endpoints.plan(endpoint, inv, inv.settings)
        runner = remote.connect(inv.host(endpoint.host), ssh)
        try:
            return endpoint_status(plan, router.servers(runner))
        except ProvisionError as exc:
            return EndpointStatus(plan.name, plan.host, server.server_url(plan.address, plan.port),
                                  error=error_text(exc))
        finally:
            runner.close()

    return [one(endpoint) for endpoint in chosen]


def endpoint_json(found: EndpointStatus) -> dict[str, Any]:
    return {"host": found.host, "url": found.url, "healthy": found.healthy, "error": found.error,
            "replicas": [dict(replica) for replica in found.replicas]}
