"""Asking a host's vLLM server: ready (health and a real one-token completion) and bench (streamed
completions). Both run on the host through host/serve.py, over loopback; figures are computed here."""
from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from provision import engines, hints, programs, secrets, services
from provision.endpoints import EndpointPlan
from provision.errors import NotReady, ProvisionError
from provision.inventory import Settings
from provision.parsers import prefix_counts, read_sample
from provision.runner import Runner


def server_url(address: str, port: int) -> str:
    """The one place a server's URL is written: http://ADDRESS:PORT, an IPv6 address in brackets."""
    return f"http://{'[' + address + ']' if ':' in address else address}:{port}"


def local_address(settings: Settings) -> str:
    """Where the server answers on its own host (a wildcard listener answers on loopback too)."""
    address = str(settings.bind_host)
    return "127.0.0.1" if address in ("0.0.0.0", "::") else address


def base_url(settings: Settings) -> str:
    """The server's URL on its own host."""
    return server_url(local_address(settings), settings.port)


def served_name(settings: Settings) -> str:
    return str(settings.served_model_name or settings.model)


LOOPBACK = ("127.0.0.1", "::1", "localhost")


def how_to_query(host: str, address: str, settings: Settings, key_source: str | None,
                 scope: str, inventory_option: str = "") -> list[str]:
    """What to paste to ask a served model, each line working where it is printed (the controller):
    `invoke ask` (through the tool's own SSH, with the key the tool holds), curl only where the server
    listens beyond loopback, the status command. `scope`: the deploy's own target options;
    `inventory_option`: its --inventory, where it named one. `key_source`: where the API key came from (secrets.sources), None without a key; the key
    itself is never printed, only how to pass it."""
    bind = str(settings.bind_host)
    reach = address if bind in ("0.0.0.0", "::") else bind
    url = base_url(settings) if bind in LOOPBACK else server_url(reach, settings.port)
    where = f" {inventory_option}" if inventory_option else ""
    ask = hints.command(f"ask --host {host}{where} --prompt 'Hello, my name is'")
    lines = [f"{host} serves {served_name(settings)!r} at {url}. Ask it from here:", f"  {ask}"]
    if bind in LOOPBACK:
        lines.append(f"  (it listens on loopback on {host} only: a request from elsewhere is refused)")
    else:
        body = f'{{"model": "{served_name(settings)}", "prompt": "Hello, my name is", "max_tokens": 16}}'
        before, key = _key_for_curl(key_source)
        lines.append(f"  or over HTTP: {before}curl -s {url}/v1/completions -H 'Content-Type: application/json'{key} "
                     f"-d '{body}'")
        if before:
            lines.append(f"  (the key is read from {key_source} into curl's stdin: in no command line, on no screen)")
    lines.append(f"Watch it: {hints.command(f'status {scope}{where}')}")
    return lines


def _key_for_curl(key_source: str | None) -> tuple[str, str]:
    """What goes before curl and what among its options, to send the API key where it is. From the
    secrets file: this tool's own interpreter writes the header line into `curl -H @-` (curl 7.55+), so
    the key is in no process's argv and on no screen; a new shell has no $VLLM_API_KEY to expand. From
    the environment: $VLLM_API_KEY, set where the deploy ran."""
    if key_source is None:
        return "", ""
    path = secrets.file_of(key_source)
    if path is None:
        return "", ' -H "Authorization: Bearer $VLLM_API_KEY"'
    python = shlex.quote(sys.executable)
    return f"{python} -m provision.secrets header {shlex.quote(os.path.abspath(path))} | ", " -H @-"


def behind_endpoint(host: str, plan: EndpointPlan, key_source: str | None, inventory_option: str = "") -> list[str]:
    """A replica's clients use its endpoint: the router's URL, and the bench that goes through it."""
    where = f" {inventory_option}" if inventory_option else ""
    url = server_url(plan.address, plan.port)
    lines = [(f"{host} is a replica of endpoint {plan.name}: clients use {url} (the router on {plan.host}), "
              "which drains it before each restart")]
    if plan.listens_beyond_loopback and key_source:
        before, key = _key_for_curl(key_source)
        lines.append(f"  with the API key of {key_source}: {before}curl -s {url}/v1/models{key}")
    lines.append(f"  through it: {hints.command(f'bench --endpoint {plan.name}{where}')}")
    return lines


@dataclass(frozen=True)
class Answer:
    """One completion as `invoke ask` shows it."""

    host: str
    model: str
    text: str
    finish_reason: str | None
    completion_tokens: int | None
    seconds: float


def answer_of(host: str, answer: Mapping[str, Any]) -> Answer:
    """Pure: the host's reply to an ask -> the completion's text and counts (OpenAI completions shape)."""
    body = answer.get("body") or {}
    choices = body.get("choices") or [{}]
    usage = body.get("usage") or {}
    tokens = usage.get("completion_tokens")
    return Answer(host=host, model=str(body.get("model") or ""), text=str(choices[0].get("text") or ""),
                  finish_reason=choices[0].get("finish_reason"),
                  completion_tokens=int(tokens) if isinstance(tokens, int) else None,
                  seconds=float(answer.get("seconds") or 0))


def ask(runner: Runner, settings: Settings, api_key: str | None, prompt: str, max_tokens: int,
        timeout: float = 60) -> Answer:
    """One completion from the host's server, asked on the host over loopback (where it listens)."""
    spec = {"action": "ask", "base": base_url(settings), "model": served_name(settings), "api_key": api_key,
            "prompt": prompt, "max_tokens": max_tokens, "timeout": timeout}
    answer = _run(runner, spec, lambda event: None, timeout + 60)
    if not answer.get("ok"):
        error = str(answer.get("error"))
        if "refused" in error.lower():
            error = (f"nothing answers at {spec['base']} on the host (connection refused): "
                     f"`{hints.command(f'status --host {runner.host}')}` says whether it serves")
        raise ProvisionError(f"{runner.host}: {error}")
    return answer_of(runner.host, answer)


def _run(runner: Runner, spec: Mapping[str, Any], on_progress: Callable[[dict[str, Any]], None],
         timeout: float) -> dict[str, Any]:
    program = programs.ship(("serve",), "serve_main", spec)
    answer, done = programs.run(runner, program, timeout, lambda event: on_progress(event)
                                if event.get("event") == "progress" else None)
    if not answer:
        raise ProvisionError(f"{runner.host}: no answer from the server check (exit {done.exited}): "
                             f"{programs.tail(done)}")
    return answer


def endpoint(settings: Settings, naming: services.Naming = services.HOST) -> dict[str, str]:
    """Where a server of these settings answers, as a generation records it: {"base", "model", "unit"}."""
    return {"base": base_url(settings), "model": served_name(settings),
            "unit": naming.unit(engines.engine_of(settings).server_unit)}


def wait_ready(runner: Runner, settings: Settings, api_key: str | None, timeout: float,
               on_progress: Callable[[dict[str, Any]], None] = lambda event: None,
               naming: services.Naming = services.HOST) -> float:
    """Seconds until /health answered and a one-token completion came back; NotReady otherwise. The
    unit watched is the target's own (a service's is NAME@SERVICE): an end of it is an answer."""
    return wait_ready_at(runner, endpoint(settings, naming), api_key, timeout, on_progress)


def wait_ready_at(runner: Runner, where: Mapping[str, Any], api_key: str | None, timeout: float,
                  on_progress: Callable[[dict[str, Any]], None] = lambda event: None) -> float:
    """wait_ready at a recorded endpoint (a restored generation's own base URL, model and unit)."""
    spec = {"action": "ready", "base": where["base"], "model": where["model"], "api_key": api_key,
            "timeout": timeout, "unit": where["unit"]}
    answer = _run(runner, spec, on_progress, timeout + 60)
    if not answer.get("ok"):
        raise NotReady(f"{runner.host}: {answer.get('error')}")
    return float(answer["seconds"])


@dataclass(frozen=True)
class BenchReport:
    requests: int
    succeeded: int
    seconds: float
    output_tokens: int
    tokens_per_s: float
    ttft_mean_s: float | None
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    latency_p50_s: float | None
    ttft_p95_s: float | None
    itl_p50_s: float | None  # inter-token latency: the gaps between a stream's tokens after the first
    itl_p95_s: float | None
    server_generation_tokens: float | None  # the server's own counter, over the run
    server_prefix_cache_hit_pct: float | None
    errors: tuple[str, ...] = ()


def _percentile(values: list[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def bench_report(answer: Mapping[str, Any], names: engines.MetricNames = engines.ENGINES["vllm"].metrics) -> BenchReport:
    """Pure: the host's raw timings and the engine's metrics before and after -> the figures."""
    import statistics  # with decimal and fractions: bench alone needs it, status imports this module too

    ttft = [float(v) for v in answer.get("ttft_s", [])]
    latency = [float(v) for v in answer.get("latency_s", [])]
    itl = [float(v) for v in answer.get("itl_s", [])]
    tokens = sum(int(t) for t in answer.get("tokens", []))
    seconds = float(answer.get("seconds") or 0)
    before = read_sample(answer.get("metrics_before", ""), names.format) or {}
    after = read_sample(answer.get("metrics_after", ""), names.format) or {}
    generated = None
    counter = next((name for name in names.generated if name in after), None)
    if counter is not None:
        generated = after[counter] - before.get(counter, 0.0)
    hits, queries = prefix_counts(after, names.prefix_hits, names.prefix_queries)
    return BenchReport(
        requests=int(answer.get("requests", 0)), succeeded=int(answer.get("succeeded", 0)), seconds=seconds,
        output_tokens=tokens, tokens_per_s=round(tokens / seconds, 2) if seconds else 0.0,
        ttft_mean_s=round(statistics.mean(ttft), 4) if ttft else None,
        ttft_p50_s=_percentile(ttft, 0.5), ttft_p90_s=_percentile(ttft, 0.9),
        latency_p50_s=_percentile(latency, 0.5), ttft_p95_s=_percentile(ttft, 0.95),
        itl_p50_s=_percentile(itl, 0.5), itl_p95_s=_percentile(itl, 0.95), server_generation_tokens=generated,
        server_prefix_cache_hit_pct=round(hits / queries * 100, 2) if hits is not None and queries else None,
        errors=tuple(answer.get("errors", [])))


@dataclass(frozen=True)
class Requests:
    """A benchmark's load: `count` streamed completions of `max_tokens`, `concurrency` at a time, each
    `prompt` and the request's number, or one of `prompts` (one per request) where given."""

    count: int
    concurrency: int
    max_tokens: int
    prompt: str = ""
    prompts: Sequence[str] = ()


def bench(runner: Runner, settings: Settings, api_key: str | None, load: Requests,
          on_progress: Callable[[dict[str, Any]], None]) -> BenchReport:
    """`load`'s completions against the host's server, streamed; its timings and the engine's figures."""
    names = engines.engine_of(settings).metric_names(settings)
    spec = {"action": "bench", "base": base_url(settings), "model": served_name(settings), "api_key": api_key,
            "prompt": load.prompt, "count": load.count, "concurrency": load.concurrency,
            "max_tokens": load.max_tokens, "metrics_path": names.path, "prompts": list(load.prompts)}
    return bench_report(_run(runner, spec, on_progress, 3600), names)


def bench_endpoint(runner: Runner, plan: EndpointPlan, model: str, api_key: str | None, load: Requests,
                   on_progress: Callable[[dict[str, Any]], None]) -> BenchReport:
    """`load`'s completions through an endpoint's router, from its host (where the endpoint listens for
    sure). No server figures: the router's /metrics would be one replica's."""
    spec = {"action": "bench", "base": server_url(plan.local_address, plan.port), "model": model, "api_key": api_key,
            "prompt": load.prompt, "count": load.count, "concurrency": load.concurrency,
            "max_tokens": load.max_tokens, "metrics_path": None, "prompts": list(load.prompts)}
    return bench_report(_run(runner, spec, on_progress, 3600))


def context(runner: Runner, settings: Settings, api_key: str | None, probes: Sequence[str]) -> dict[str, Any]:
    """The server's own word on its context (host/serve.py's `context`): the raw /v1/models answer and
    each probe's prompt tokens as it counts them. Raw: tune.served_context parses it."""
    spec = {"action": "context", "base": base_url(settings), "model": served_name(settings), "api_key": api_key,
            "probes": list(probes)}
    return _run(runner, spec, lambda event: None, 120 + 60 * len(probes))


UNITS = tuple(unit.removesuffix(".service") for engine in engines.ENGINES.values() for unit in engine.units)


def journal(runner: Runner, unit: str, lines: int, follow: bool,
            on_line: Callable[[str], None] | None = None) -> str:
    """A unit's journal on the host; with follow, each new line goes to on_line until interrupted."""
    argv = ["journalctl", "-u", f"{unit}.service", "--no-pager", "-n", str(lines), *(["-f"] if follow else [])]
    done = runner.run(argv, timeout=None if not follow else 7 * 24 * 3600, on_line=on_line if follow else None)
    return str(done.stdout)
