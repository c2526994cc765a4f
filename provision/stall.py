"""A wedged engine looks healthy: the stuck rule of `status`, pure.

vLLM V1 runs its API server and its EngineCore as separate processes. /health and /v1/models are the
API server's: when the EngineCore deadlocks (vLLM #37729) or hangs in a kernel, both keep answering 200
while nothing is generated (stall.yaml beside this module: the field reports, each with its source and
how it was verified; the lab measured the same with the EngineCore stopped). The engine's own counters
tell: its generation-token counter stops while its running-requests gauge stays above 0, since the API
server sets both from the engine's outputs and none come.

The rule, on one host's /metrics samples in time order:

    stuck        the counter has not moved for at least the window, and requests ran at every sample
    stalled      the same, for less than the window so far (not yet judged stuck)
    generating   the counter moved between the last two samples while requests run
    no requests  nothing is running now (an idle server is not stuck)
    not judged   the engine's contract table has no generation counter or running gauge for its
                 release (llama.cpp; TensorRT-LLM 1.2 counts no tokens), or too few samples read

The window (STALL_WINDOW, `status --stall-window`) must be longer than the 1 s between status' two
samples: a first token comes after the prompt's prefill, and vLLM V1 runs the decodes of the other
requests in the same engine steps as a prefill's chunks, so the counter stands still only while every
running request is still in its prefill. One long prompt alone can take tens of seconds to prefill on a
DGX Spark. The default is the 60 s vLLM's own proposed health ping waits before it calls the same hang
(PR #36451): long enough for such a prefill, short beside a wedge that lasts until someone restarts
the server. `status` pays for it only on a host that looks still: it asks that host again until its
counter moves or the window has passed; `--watch` keeps each host's samples between refreshes instead.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from provision import contracts, datafiles
from provision.engines import Engine, MetricNames
from provision.errors import ProvisionError

DATA = "stall.yaml"
STATES = ("stuck", "stalled", "generating", "no requests", "not judged")


@dataclass(frozen=True)
class Sample:
    """One /metrics page, as the rule reads it: when it was read (seconds on the host's clock), the
    generation-token counter and the running-requests gauge (None: not on the page)."""

    at: float
    generated: float | None
    running: float | None


@dataclass(frozen=True)
class Counters:
    """The names the rule reads on a host, or why it cannot judge that host (`missing`)."""

    generated: str | None = None
    running: str | None = None
    missing: str | None = None


@dataclass(frozen=True)
class Progress:
    """The rule's answer for one host, e.g. Progress("stuck", 61.2, 60.0, "vllm:generation_tokens_total
    has not moved for 61.2 s (at 730) while 4 requests ran")."""

    state: str
    seconds: float | None = None  # how long the counter has stood still with requests running
    window: float | None = None
    detail: str = ""


@dataclass(frozen=True)
class Rule:
    """stall.yaml: the reports the rule is built on, and what the lab measured."""

    reports: tuple[Mapping[str, str], ...]
    measured: str


@functools.cache
def rule() -> Rule:
    """The shipped stall.yaml, validated once per process (a report without a source or without what
    was verified of it is refused)."""
    data = datafiles.load(resources.files("provision").joinpath(DATA).read_text(encoding="utf-8"))
    return parse_rule(data)


def parse_rule(data: Any) -> Rule:
    if not isinstance(data, dict) or set(data) != {"reports", "measured"}:
        raise ProvisionError(f"{DATA}: expected the keys reports and measured")
    reports = data["reports"]
    if not isinstance(reports, list) or not reports:
        raise ProvisionError(f"{DATA}: reports must be a non-empty list")
    for index, report in enumerate(reports):
        if (not isinstance(report, dict) or set(report) != {"source", "says", "verified"}
                or not str(report["source"]).startswith("https://")
                or not all(isinstance(report[key], str) and report[key].strip() for key in ("says", "verified"))):
            raise ProvisionError(f"{DATA}: report {index + 1}: expected source (a link), says and verified")
    if not isinstance(data["measured"], str) or not data["measured"].strip():
        raise ProvisionError(f"{DATA}: measured must say what the lab measured")
    return Rule(reports=tuple(reports), measured=data["measured"])


# The default window, in seconds (why 60: the module's docstring).
STALL_WINDOW = 60.0


def counters(engine: Engine, names: MetricNames, spec: str | None) -> Counters:
    """The generation counter and running gauge the rule reads on a host whose engine is `engine`,
    served at the release `spec` pins (the target otherwise), by the contract table: only names the
    table says that release serves. An engine without both is not judged, and the answer says why."""
    table = contracts.load()
    release = table.release(engine.name, spec)
    generated = next(iter(names.generated), None)
    running = next(iter(names.running), None)
    for kind, name in (("generation-token counter", generated), ("running-requests gauge", running)):
        if name is None:
            return Counters(missing=f"{engine.title} {release} serves no {kind}: not judged")
        serves = table.accepts(engine.name, "metric", name, release)
        if serves is None:
            return Counters(missing=f"engine_contracts.yaml has no row for {engine.title}'s {name}: not judged")
        if not serves:
            return Counters(missing=f"{engine.title} {release} does not serve {name} "
                                    "(engine_contracts.yaml): not judged")
    return Counters(generated=generated, running=running)


def sample(at: float, values: Mapping[str, float], names: Counters) -> Sample:
    """One parsed metrics page (parsers.parse_metrics) -> the rule's reading of it."""
    return Sample(at=at, generated=values.get(names.generated) if names.generated else None,
                  running=values.get(names.running) if names.running else None)


def progress(samples: Sequence[Sample], window: float, names: Counters) -> Progress:
    """Pure: a host's samples (any order; ordered here by time) -> the rule's verdict."""
    if names.missing:
        return Progress("not judged", window=window, detail=names.missing)
    read = sorted((s for s in samples if s.generated is not None and s.running is not None), key=lambda s: s.at)
    if len(read) < 2:
        return Progress("not judged", window=window, detail=f"{len(read)} readable /metrics sample(s) of "
                        f"{names.generated} and {names.running}: two are needed")
    last = read[-1]
    assert last.running is not None and last.generated is not None  # for mypy: filtered above
    if last.running <= 0:
        return Progress("no requests", 0.0, window, f"{names.running} is 0")
    if read[-2].generated != last.generated:  # moved (a restarted server's counter moves back: moved too)
        return Progress("generating", 0.0, window, f"{names.generated} at {last.generated:g}")
    # Back to the first sample of the still run during which requests ran at every sample; a stall is
    # measured from there (requests that began after the sample before it: from their first sample).
    start = len(read) - 1
    while start > 0 and read[start - 1].generated == last.generated and (read[start - 1].running or 0) > 0:
        start -= 1
    still = last.at - read[start].at
    running = f"{last.running:g} request{'s' if last.running != 1 else ''}"
    detail = (f"{names.generated} has not moved for {still:.1f} s (at {last.generated:g}) while "
              f"{running} ran")
    return Progress("stuck" if still >= window else "stalled", round(still, 2), window, detail)


def keep(samples: Sequence[Sample], window: float) -> tuple[Sample, ...]:
    """The samples `--watch` carries to its next refresh: those of the last window and one before it,
    enough for the rule to measure a stall of the whole window."""
    ordered = sorted(samples, key=lambda s: s.at)
    if not ordered:
        return ()
    horizon = ordered[-1].at - window
    inside = [index for index, s in enumerate(ordered) if s.at >= horizon]
    first = max(0, (inside[0] if inside else len(ordered)) - 1)
    return tuple(ordered[first:])
