"""The rules `invoke tune` judges by, pure (figures in, decisions out; provision/tune.py does the work):

    served_context(answer, model, rendered) -> ServedContext   what the server serves (its /v1/models
                                               max_model_len) and how it counts the workload's words
    fit(workload, context) -> (Workload, note)  the workload cut so its longest request fits, or refused
    Costs.of(trials), room(step, ...)           a step starts only if it ends, its way back included,
                                               within what is left of the budget (times measured)
    decide(trials, slo) -> Decision             the winner, the runner-up it beat, the margin and the
                                               spread (the noise of a trial run twice)

Why a fit: a prompt longer than the served context is refused by the server (HTTP 400), so a workload
made for a long context measures nothing on a short one. Why the noise: two runs of the same settings
differ; a candidate kept for beating the host's own settings by less than that is kept by chance.
"""
from __future__ import annotations

import dataclasses
import json
import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from provision.errors import TuneError

FLOOR = 0.02  # a lead below 2% never counts, however quiet the repeats were (two runs are few)
SAFETY = 1.1  # a prompt's words are a random draw: room for 10% more tokens per word than the mean
MIN_OUTPUT = 4  # fewer tokens out measure no decoding worth comparing
PROBE_WORDS = ("the", "model", "server", "cluster", "memory", "cache", "token", "request", "answer", "question",
               "network", "driver", "kernel", "batch", "latency", "throughput", "prompt", "system", "user", "node",
               "explain", "compare", "summarise", "list", "why", "how", "what", "when", "which", "because")


# ---------------------------------------------------------------------------------------------
# What a trial measured, and the bound it is judged by


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
        prefix = " ".join(rng.choice(PROBE_WORDS) for _ in range(self.shared_prefix_words))
        low, high = self.prompt_words
        return [f"{prefix} {' '.join(rng.choice(PROBE_WORDS) for _ in range(rng.randint(low, high)))}".strip()
                for _ in range(self.requests)]


@dataclass(frozen=True)
class Slo:
    ttft_p95_ms: float | None = None
    itl_p95_ms: float | None = None

    def misses(self, level: Level) -> str | None:
        """Why a level misses the bound, or None when it holds."""
        if self.ttft_p95_ms is not None and (level.ttft_p95_s is None or level.ttft_p95_s * 1000 > self.ttft_p95_ms):
            return f"TTFT p95 {milliseconds(level.ttft_p95_s)} > {self.ttft_p95_ms:g} ms"
        if self.itl_p95_ms is not None and (level.itl_p95_s is None or level.itl_p95_s * 1000 > self.itl_p95_ms):
            return f"ITL p95 {milliseconds(level.itl_p95_s)} > {self.itl_p95_ms:g} ms"
        return None


def milliseconds(seconds: float | None) -> str:
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
    errors: tuple[str, ...] = ()  # the server's answers to the failed requests (the first few)

    def why_missed(self, slo: Slo) -> str | None:
        if self.succeeded < self.requests:
            why = request_errors(self.errors)
            return f"{self.requests - self.succeeded} request(s) failed" + (f": {why}" if why else "")
        return slo.misses(self)


def merged(levels: Sequence[Level]) -> Level:
    """One concurrency level over several runs: tokens/s the mean, latencies the worst, requests summed."""
    if len(levels) == 1:
        return levels[0]

    def worst(values: Sequence[float | None]) -> float | None:
        return None if any(v is None for v in values) else max(v for v in values if v is not None)

    return Level(levels[0].concurrency, round(sum(lv.tokens_per_s for lv in levels) / len(levels), 2),
                 worst([lv.ttft_p50_s for lv in levels]), worst([lv.ttft_p95_s for lv in levels]),
                 worst([lv.itl_p95_s for lv in levels]), sum(lv.succeeded for lv in levels),
                 sum(lv.requests for lv in levels), tuple(e for lv in levels for e in lv.errors)[:5])


@dataclass(frozen=True)
class Trial:
    key: str
    settings: Mapping[str, Any]  # dimension name -> value; {} is the host's settings as they are
    outcome: str  # measured | failed | skipped
    reason: str = ""
    levels: tuple[Level, ...] = ()
    seconds: float = 0.0
    resumed: bool = False
    repeats: tuple[tuple[Level, ...], ...] = ()  # more runs of the same benchmark on the same server
    deploy_s: float = 0.0  # the trial's deploy, until the server answered (or was rolled back)
    restarted: bool = False  # the deploy changed the server (else it ran these settings already)
    bench_s: float = 0.0  # the benchmark runs, together

    @property
    def runs(self) -> tuple[tuple[Level, ...], ...]:
        return (self.levels, *self.repeats) if self.levels else ()

    def _same(self, concurrency: int) -> list[Level | None]:
        return [next((lv for lv in run if lv.concurrency == concurrency), None) for run in self.runs]

    def best(self, slo: Slo) -> Level | None:
        """The level with the most tokens/s (the mean of the runs) that held the bound in every run,
        every request answered; merged over the runs."""
        passing = []
        for level in self.levels:
            same = self._same(level.concurrency)
            if all(lv is not None and lv.why_missed(slo) is None for lv in same):
                passing.append(merged([lv for lv in same if lv is not None]))
        return max(passing, key=lambda lv: lv.tokens_per_s, default=None)

    def score(self, slo: Slo) -> float | None:
        best = self.best(slo)
        return best.tokens_per_s if best else None

    def spread(self, slo: Slo) -> float | None:
        """(max - min) / mean of the runs' tokens/s at the chosen level: None with one run."""
        best = self.best(slo)
        if best is None or len(self.runs) < 2:
            return None
        values = [lv.tokens_per_s for lv in self._same(best.concurrency) if lv is not None]
        mean = sum(values) / len(values)
        return (max(values) - min(values)) / mean if mean else None

    def verdict(self, slo: Slo) -> str:
        if self.outcome != "measured":
            return f"{self.outcome}: {self.reason}"
        if self.best(slo):
            spread = self.spread(slo)
            return "passed" + (f" in {len(self.runs)} runs (spread {spread * 100:.1f}%)" if spread is not None else "")
        missed = []
        for level in self.levels:
            for number, same in enumerate(self._same(level.concurrency), 1):
                why = "no level of this concurrency" if same is None else same.why_missed(slo)
                if why:
                    missed.append(f"c={level.concurrency} {why}" + (f" (run {number})" if number > 1 else ""))
                    break
        return "missed the bound: " + "; ".join(missed)


# ---------------------------------------------------------------------------------------------
# The served context


@dataclass(frozen=True)
class ServedContext:
    """What one request may hold on the server, and how the server counts the workload's words.

    ServedContext(max_model_len=256, source="the server's /v1/models", tokens_per_word=1.0, overhead=0)"""

    max_model_len: int | None
    source: str  # where max_model_len came from, in words
    tokens_per_word: float | None  # the server's own count over the workload's vocabulary
    overhead: int = 0  # tokens every prompt has beside its words (a BOS token)
    error: str = ""  # why the words could not be counted


def probe_texts(words: Sequence[str] = PROBE_WORDS) -> tuple[str, str]:
    """The vocabulary once and twice: the difference of their counts is the words' tokens, the rest
    of the first count what every prompt carries beside its words."""
    once = " ".join(words)
    return once, f"{once} {once}"


def served_context(answer: Mapping[str, Any], model: str, rendered: int | None,
                   words: Sequence[str] = PROBE_WORDS) -> ServedContext:
    """host/serve.py's `context` answer -> ServedContext. The server's /v1/models max_model_len first
    (vLLM's model card has it); else what the settings rendered (--max-model-len); else unknown."""
    served: int | None = None
    why_not = answer.get("models_error") or ""
    try:
        cards = json.loads(answer.get("models") or "null")
    except ValueError:
        cards, why_not = None, "its /v1/models answer is not JSON"
    if isinstance(cards, dict) and isinstance(cards.get("data"), list):
        listed = [card for card in cards["data"] if isinstance(card, dict)]
        card = next((c for c in listed if c.get("id") == model), listed[0] if listed else None)
        value = card.get("max_model_len") if card else None
        served = value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
    if served is not None:
        limit, source = served, "the server's /v1/models"
    elif rendered:
        limit, source = rendered, "the settings' max_model_len" + (f" ({why_not})" if why_not else "")
    else:
        limit, source = None, "unknown" + (f" ({why_not})" if why_not else ": no max_model_len served or set")
    probes = answer.get("probes") or []
    counts = [p.get("prompt_tokens") if isinstance(p, dict) else None for p in probes]
    once, twice = (counts + [None, None])[:2]
    if (len(counts) == 2 and isinstance(once, int) and isinstance(twice, int)
            and not isinstance(once, bool) and not isinstance(twice, bool)):
        per_word = (twice - once) / len(words)
        if per_word > 0:
            return ServedContext(limit, source, round(per_word, 4), max(0, once - round(per_word * len(words))))
    errors = [str(p["error"]) for p in probes if isinstance(p, dict) and p.get("error")]
    return ServedContext(limit, source, None, 0, request_errors(errors) if errors else
                         f"the server counted no prompt tokens (probes: {json.dumps(probes)[:200]})")


def longest_request(workload: Workload, context: ServedContext) -> int:
    """Tokens of the workload's longest request as this server counts them (with SAFETY), output included."""
    words = workload.shared_prefix_words + workload.prompt_words[1]
    return context.overhead + math.ceil(words * (context.tokens_per_word or 0) * SAFETY) + workload.output_tokens


def fit(workload: Workload, context: ServedContext) -> tuple[Workload, str]:
    """The workload as measured: as given when its longest request fits the served context, else every
    length (shared prefix, prompt words, output tokens) cut by one factor, its shape kept. TuneError
    when the server cannot count its words or nothing useful fits."""
    limit = context.max_model_len
    if limit is None:
        return workload, f"served context {context.source}: the workload runs as given"
    if context.tokens_per_word is None:
        raise TuneError(f"the server does not count the workload's prompt tokens ({context.error}): cannot fit "
                        f"the workload to its {limit} tokens", file="the workload")
    need = longest_request(workload, context)
    if need <= limit:
        return workload, f"fits: its longest request is {need} of the {limit} tokens served ({context.source})"
    scale = (limit - context.overhead) / max(1, need - context.overhead)
    cut = workload
    while scale > 0:
        low, high = workload.prompt_words
        cut = dataclasses.replace(workload, shared_prefix_words=math.floor(workload.shared_prefix_words * scale),
                                  prompt_words=(math.floor(low * scale), math.floor(high * scale)),
                                  output_tokens=math.floor(workload.output_tokens * scale))
        if longest_request(cut, context) <= limit:
            break
        scale -= 0.01
    if scale <= 0 or cut.output_tokens < MIN_OUTPUT or cut.shared_prefix_words + cut.prompt_words[1] < 1:
        raise TuneError(f"the server serves {limit} tokens a request ({context.source}); the workload's longest "
                        f"request needs {need} and cut to fit it keeps fewer than {MIN_OUTPUT} tokens out: give a "
                        "workload of shorter prompts and outputs (--workload FILE)", file="the workload")
    low, high = cut.prompt_words
    return cut, (f"cut to fit the {limit} tokens served ({context.source}; {context.tokens_per_word:g} token(s) a "
                 f"word): prompts of {low}-{high} words after a shared {cut.shared_prefix_words}, "
                 f"{cut.output_tokens} tokens out (asked: {workload.prompt_words[0]}-{workload.prompt_words[1]} "
                 f"after {workload.shared_prefix_words}, {workload.output_tokens} out, whose longest request "
                 f"needs {need})")


_MESSAGE = re.compile(r'"(?:message|detail)"\s*:\s*"((?:[^"\\]|\\.)*)')


def request_errors(errors: Sequence[str]) -> str:
    """A bench's failed requests in words: each distinct reason once, the server's own message taken
    out of its JSON error body ("HTTP 400 {...}" -> "HTTP 400: This model's maximum context ...")."""
    reasons: dict[str, int] = {}
    for text in errors:
        found = re.match(r"HTTP (\d{3}) ?(.*)", text, re.DOTALL)
        reason = text.strip()
        if found:
            message = _MESSAGE.search(found.group(2))
            body = message.group(1).replace('\\"', '"') if message else found.group(2).strip()
            reason = f"HTTP {found.group(1)}: {body}".strip().rstrip(":")
        reasons[reason] = reasons.get(reason, 0) + 1
    return " | ".join(f"{reason}" + (f" (x{count})" if count > 1 else "") for reason, count in reasons.items())[:400]


# ---------------------------------------------------------------------------------------------
# The budget


@dataclass(frozen=True)
class Costs:
    """Seconds measured, in this run or kept with the trials of this hardware: the longest of each."""

    restart_s: float | None = None  # a deploy that changed the server, until it answered (or was rolled back)
    deploy_s: float | None = None  # a deploy that changed nothing (the way back when the host runs the winner)
    bench_s: float | None = None  # one run of the workload's benchmark

    @classmethod
    def of(cls, trials: Sequence[Trial]) -> Costs:
        restarts = [t.deploy_s for t in trials if t.restarted and t.deploy_s > 0]
        unchanged = [t.deploy_s for t in trials if not t.restarted and t.deploy_s > 0]
        benches = [t.bench_s / len(t.runs) for t in trials if t.runs and t.bench_s > 0]
        return cls(max(restarts, default=None), max(unchanged, default=None), max(benches, default=None))


def recorded_restart_s(state_text: str | None, newest: int = 5) -> float | None:
    """Pure: the host's generations state.json -> the longest restart (apply until the server answered)
    that its newest `newest` good generations recorded, None where none did. Deploys, tune's own trials
    included, keep it with each generation they promote: a restart measured on this hardware before
    this run (on the H200 host, 4-9 s, where a tune with none measured counted --timeout, 120 s)."""
    try:
        kept = json.loads(state_text or "").get("generations") or []
        times = [float(g["restart_s"]) for g in kept if g.get("state") == "good" and g.get("restart_s")]
    except (ValueError, AttributeError, TypeError, KeyError):
        return None
    return max(times[-newest:]) if times else None


def step_cost(step: str, *, costs: Costs, timeout: float, back_restarts: bool) -> tuple[float | None, str]:
    """The most seconds `step` may take, its way back included, and the sum in words (None: unknown).

    step "trial": a candidate (a restart into it, a benchmark, a restart back: the worst way back);
    step "repeat": one more benchmark of the settings running now (`back_restarts`: they are a
    candidate's, so the way back is a restart; the host's own: a deploy that changes nothing).
    A restart not measured yet on this hardware counts as `timeout`, the most a trial waits for one."""
    if costs.bench_s is None:
        return None, "no benchmark measured yet to estimate a trial by"
    restart = costs.restart_s if costs.restart_s is not None else timeout
    restart_words = f"{restart:.0f} s a restart" + (
        "" if costs.restart_s is not None else f" (none measured yet on this hardware: --timeout {timeout:g})")
    if step == "trial":
        need = 2 * restart + costs.bench_s
        return need, (f"a candidate trial takes up to {need:.0f} s ({restart_words}, into it and back, "
                      f"{costs.bench_s:.0f} s a benchmark)")
    back = restart if back_restarts or costs.deploy_s is None else costs.deploy_s
    need = costs.bench_s + back
    return need, f"a repeat takes up to {need:.0f} s ({costs.bench_s:.0f} s a benchmark, {back:.0f} s the way back)"


def room(step: str, *, left_s: float, costs: Costs, timeout: float, back_restarts: bool) -> str | None:
    """None when `step` fits in the `left_s` seconds of the budget, else why not, in words."""
    need, words = step_cost(step, costs=costs, timeout=timeout, back_restarts=back_restarts)
    if need is None:
        return words
    return None if need <= left_s else f"{words}; {max(0.0, left_s):.0f} s of the budget are left"


def minutes_for(elapsed_s: float, need_s: float) -> str:
    """The --budget (minutes, rounded up to a tenth) that leaves room for a step of need_s after elapsed_s."""
    return f"{math.ceil((elapsed_s + need_s) / 6) / 10:g}"


# ---------------------------------------------------------------------------------------------
# The noise


def noise_of(trials: Sequence[Trial], slo: Slo) -> float | None:
    """The spread of the first trial run more than once (the host as it is, run again): the noise."""
    return next((spread for t in trials if (spread := t.spread(slo)) is not None), None)


def threshold(noise: float | None, *trials: Trial, slo: Slo) -> float:
    """What a lead must exceed: the noise, the two trials' own spreads, at least FLOOR."""
    own = [s for t in trials if (s := t.spread(slo)) is not None]
    return max([FLOOR, noise or 0.0, *own])


def leads(trial: Trial, leader: Trial | None, noise: float | None, slo: Slo) -> bool:
    """Whether `trial` takes the lead: it holds the bound and beats the leader by more than the noise
    (a leader outside the bound is beaten by any trial inside it). No noise measured: no lead over a
    leader within the bound (nothing says the difference is more than chance)."""
    score = trial.score(slo) if trial.outcome == "measured" else None
    if score is None:
        return False
    best = leader.score(slo) if leader is not None and leader.outcome == "measured" else None
    if leader is None or best is None:
        return True
    return noise is not None and score > best * (1 + threshold(noise, trial, leader, slo=slo))


def within_noise(trial: Trial, leader: Trial, noise: float | None, slo: Slo) -> bool:
    """A trial above the leader by no more than the noise: one more run can tell."""
    score, best = trial.score(slo), leader.score(slo)
    return (score is not None and best is not None and best < score
            and (noise is None or score <= best * (1 + threshold(noise, trial, leader, slo=slo))))


@dataclass(frozen=True)
class Decision:
    winner: Trial | None
    runner_up: Trial | None  # the leader the winner displaced; the best other trial when nothing was displaced
    margin: float | None  # the winner's tokens/s over the runner-up's, minus 1
    spread: float | None  # the noise: (max - min) / mean of a trial run twice (the host as it is first)
    threshold: float  # what a lead had to exceed
    beyond_noise: bool  # the winner beat the runner-up by more than the threshold
    note: str

    def as_json(self, slo: Slo) -> dict[str, Any]:
        return {"winner": self.winner.key if self.winner else None,
                "runner_up": dict(self.runner_up.settings) if self.runner_up else None,
                "runner_up_tokens_per_s": self.runner_up.score(slo) if self.runner_up else None,
                "margin": None if self.margin is None else round(self.margin, 4),
                "spread": None if self.spread is None else round(self.spread, 4),
                "threshold": round(self.threshold, 4), "beyond_noise": self.beyond_noise, "note": self.note}


def margin_words(decision: Decision, slo: Slo) -> str:
    """The winner against the runner-up and the noise, in one line (the tuned file, the report)."""
    spread = "not measured" if decision.spread is None else f"{decision.spread * 100:.1f}%"
    if decision.runner_up is None or decision.margin is None:
        return f"no runner-up within the bound; spread {spread}"
    return (f"{decision.margin * 100:+.1f}% over the runner-up ({_describe(decision.runner_up)}, "
            f"{decision.runner_up.score(slo) or 0:.1f} tokens/s); spread {spread}, a lead had to exceed "
            f"{decision.threshold * 100:.1f}%: " + ("beyond the noise" if decision.beyond_noise else "within the noise"))


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.1f}%"


def decide(trials: Sequence[Trial], slo: Slo) -> Decision:
    """In the order tried, a trial takes the lead only by beating the leader beyond the noise (`leads`);
    the winner is the last leader. The host as it is (the first trial: the search measures it first;
    its settings are its current values of the dimensions) stays unless a candidate beat it so: a
    difference within the noise keeps the settings nearer the host's own."""
    noise = noise_of(trials, slo)
    host = trials[0] if trials else None
    leader: Trial | None = None
    displaced: Trial | None = None
    for trial in trials:
        if leads(trial, leader, noise, slo):
            displaced = leader if leader is not None and leader.score(slo) is not None else None
            leader = trial
    if leader is None:
        return Decision(None, None, None, noise, FLOOR, False, "no trial held the bound with every request answered")
    spread_words = (f"spread {abs(noise) * 100:.1f}% between two runs of the same settings" if noise is not None
                    else "spread not measured (no trial could be run twice)")
    if displaced is not None:
        margin = (leader.score(slo) or 0) / (displaced.score(slo) or 1) - 1
        limit = threshold(noise, leader, displaced, slo=slo)
        return Decision(leader, displaced, margin, noise, limit, True,
                        f"beats {_describe(displaced)} by {_pct(margin)}, beyond the noise ({spread_words}; a lead "
                        f"must exceed {limit * 100:.1f}%)")
    others = [t for t in trials if t is not leader and t.outcome == "measured" and t.score(slo) is not None]
    runner = max(others, key=lambda t: t.score(slo) or 0.0, default=None)
    if runner is None:
        kept = "the host as it is" if leader is host else _describe(leader)
        return Decision(leader, None, None, noise, threshold(noise, leader, slo=slo), False,
                        f"{kept}: the only trial within the bound ({spread_words})")
    margin = (leader.score(slo) or 0) / (runner.score(slo) or 1) - 1
    limit = threshold(noise, leader, runner, slo=slo)
    kept = "the host's own settings kept" if leader is host else f"{_describe(leader)} kept (tried first)"
    return Decision(leader, runner, margin, noise, limit, margin > limit,
                    f"no candidate beat it beyond the noise: the best other, {_describe(runner)}, is at "
                    f"{_pct((runner.score(slo) or 0) / (leader.score(slo) or 1) - 1)} ({spread_words}; a lead "
                    f"must exceed {limit * 100:.1f}%): {kept}")


def _describe(trial: Trial) -> str:
    return ", ".join(f"{name}={value}" for name, value in trial.settings.items()) or "the host as it is"
