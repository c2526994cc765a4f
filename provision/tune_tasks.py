"""`invoke tune`: trials of serving settings on the real host, the fastest within a latency bound kept.
Parse the flags, call provision.tune, print through provision.report."""
from __future__ import annotations

from invoke.context import Context
from invoke.exceptions import Exit

from provision.errors import ProvisionError, TuneError
from provision.taskargs import (
    HOST_TASK_FLAGS,
    HostFlags,
    TuneFlags,
    exit_unless,
    host_task,
)


@host_task("tune", *HOST_TASK_FLAGS, asked=TuneFlags,
           help={"space": "YAML list of settings and their values to try (default: the engine's for the profile, tune_spaces.yaml)",
            "workload": "YAML workload: requests, concurrency, prompt_words, shared_prefix_words, "
                        "output_tokens, seed (default: chat-like, seed 0)",
            "slo-ttft-ms": "bound on the p95 time to first token (ms); a level above it does not count",
            "slo-itl-ms": "bound on the p95 inter-token latency (ms)",
            "budget": "minutes one host's tuning may take, the way back to the winner included: a step starts "
                      "only if the times measured so far say it ends in time (a candidate: a restart, a "
                      "benchmark, a restart back; a restart not yet measured by tune is the host's last deploys', "
                      "else --timeout). Useful from: two benchmarks of the host as it is (the noise) plus one "
                      "candidate, e.g. with --timeout 120 and a 20 s benchmark about 6 minutes; the run "
                      "prints the --budget its next step needed when it stops",
            "timeout": "seconds each trial's server has to become ready (default 600)",
            "no-plot": "no PNG of throughput against latency",
            "endpoint": "an endpoint of the inventory instead of hosts: each trial rolled over the replicas of one "
                        "model behind it (drained, as deploy does), the load sent through its router from the "
                        "router's host; the winner kept for every replica",
            "model": "with --endpoint: the model whose replicas are tuned (default: the endpoint's first)"})
def tune_(c: Context, flags: HostFlags, asked: TuneFlags) -> None:
    """Find and keep the fastest settings within a latency bound.

    The trials run on the host itself. Each trial is a deploy (rendered unit, restart, readiness) and a benchmark; a failed trial is
    rolled back and recorded. The winner goes to tuned/HOST.yaml beside the inventory (diff shown) and
    the host is left running it (or its original settings when none passed). Hosts one at a time.
    With --endpoint, the replicas of one model behind it are tuned together, measured as clients see them."""
    from provision import report, tune, tune_rules
    minutes, ttft, itl = (_positive(value, flag) for value, flag in (
        (asked.budget, "--budget"), (asked.slo_ttft_ms, "--slo-ttft-ms"), (asked.slo_itl_ms, "--slo-itl-ms")))
    if asked.timeout <= 0:
        raise Exit("error: --timeout must be positive", code=2)
    if asked.endpoint and (flags.host or flags.cluster or flags.all):
        raise Exit("error: tune takes --endpoint NAME or hosts (--host, --cluster, --all), not both", code=2)
    if asked.model and not asked.endpoint:
        raise Exit("error: --model names one of an endpoint's models: it goes with --endpoint NAME", code=2)
    chosen = flags.select(targets=not asked.endpoint)
    run = flags.options(chosen)
    space = asked.space
    tuning = tune.Tuning(space, tune.load_workload(asked.workload), tune_rules.Slo(ttft, itl),
                          budget_s=minutes * 60 if minutes else None, timeout=asked.timeout, plot=not asked.no_plot)
    units = ([tune.endpoint_unit(chosen.inventory, asked.endpoint, asked.model, chosen.overrides)] if asked.endpoint
             else tune.units_of(chosen.inventory, chosen.targets))
    for unit in units:  # a bad file, or flags another engine's, refused before any host is contacted
        tune.space_of(chosen.inventory, unit, run, space)
    results: list[tune.Tuned] = []
    errors: dict[str, BaseException] = {}
    for unit in units:  # one at a time: the others keep serving
        try:
            results.append(tune.tune(chosen.inventory, unit, run, tuning))
        except ProvisionError as exc:
            errors[unit.name] = exc
    if flags.json:
        print(report.dump_json(report.tuned_json(results, errors)))
    else:
        report.print_tuned(results, errors, report.console())
    if errors and all(isinstance(error, TuneError) for error in errors.values()):
        raise Exit(code=2)  # the workload fits no host's served context: nothing was changed (printed above)
    exit_unless(not errors and all(result.ok and result.winner is not None for result in results))


def _positive(value: str | None, flag: str) -> float | None:
    """A number flag invoke hands over as text (its default is None): positive, or exit 2."""
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        raise Exit(f"error: {flag} takes a number, not {value!r}", code=2) from None
    if number <= 0:
        raise Exit(f"error: {flag} must be positive", code=2)
    return number
