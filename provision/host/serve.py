"""Talks to the vLLM server ON its host, over loopback (the server may listen nowhere else). Sent on
stdin to `python3 -`; standard library only. The controller appends `serve_main(SPEC_JSON)`:

    {"action": "ready", "base": "http://127.0.0.1:8000", "model": NAME, "api_key": KEY|null, "timeout": 600}
    {"action": "bench", "base", "model", "api_key", "prompt": "...", "count": 16, "concurrency": 4,
     "max_tokens": 32, "prompts": [...] (optional: one per request, instead of prompt + its number)}
    {"action": "ask", "base", "model", "api_key", "prompt": "...", "max_tokens": 16, "timeout": 60}
    {"action": "context", "base", "model", "api_key", "probes": ["text", ...]}

ready: waits for /health, then for a real one-token completion (readiness, not only liveness).
ask: one completion, its whole answer (what a person pastes a request to see).
bench: streamed completions, timing the first token of each, with /metrics read before and after.
context: /v1/models as served (its max_model_len), and each probe's prompt tokens as the server counts
them (a one-token completion's usage.prompt_tokens, or why the server refused it).
Output: JSON lines, {"event": "progress", ...} and one {"event": "result", ...}.
"""
from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from provision.host.common import emit


def _headers(spec: dict[str, Any]) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if spec.get("api_key"):
        headers["Authorization"] = "Bearer " + spec["api_key"]
    return headers


def _describe(exc: BaseException, spec: dict[str, Any]) -> str:
    """An exception from a request, in words; a 401 says what to set (the server wants a key)."""
    if isinstance(exc, urllib.error.HTTPError) and exc.code == 401:
        exc.close()
        if spec.get("api_key"):
            return ("the server refused the API key sent (HTTP 401): vllm_api_key differs from the "
                    "server's VLLM_API_KEY")
        return ("the server wants an API key (HTTP 401): set vllm_api_key (the inventory's secrets file, "
                "or VLLM_API_KEY in the environment)")
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.read(900).decode('utf-8', 'replace')}"  # the server's message whole
    return f"{type(exc).__name__}: {exc}"


def _get(url: str, timeout: float = 5) -> tuple[int | None, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            status: int = response.status
            return status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (OSError, http.client.HTTPException, ValueError) as exc:  # refused, reset, timed out, garbled
        return None, f"{type(exc).__name__}: {exc}"


def _complete(spec: dict[str, Any], max_tokens: int, prompt: str, timeout: float) -> Any:
    body = json.dumps({"model": spec["model"], "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0}).encode()
    request = urllib.request.Request(spec["base"] + "/v1/completions", body, _headers(spec))
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read().decode("utf-8", "replace"))


def _unit(unit: str) -> dict[str, str]:
    """The unit's state and restart count as `systemctl show` says them; {} without systemd."""
    import subprocess
    try:
        return parse_show(subprocess.run(["systemctl", "show", "-p", "ActiveState,SubState,NRestarts", unit],
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         check=False).stdout.decode())
    except OSError:
        return {}


def parse_show(shown: str) -> dict[str, str]:
    """Pure: `systemctl show -p ...` of one unit -> its KEY=VALUE lines as a dict."""
    return dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)


def restart_count(values: dict[str, str]) -> int | None:
    """Pure: NRestarts (None where systemd does not say)."""
    restarts = values.get("NRestarts", "")
    return int(restarts) if restarts.isdigit() else None


def crashed(values: dict[str, str], restarts_before: int | None) -> str | None:
    """Pure: ActiveState, SubState and NRestarts of a server started for readiness -> how it ended
    ("failed", "crashed") or None while it may still come up. A server that exits waits out RestartSec
    in SubState auto-restart: that is its answer, not ten more seconds of waiting until systemd starts
    it again and NRestarts counts it."""
    if values.get("ActiveState") == "failed":
        return "failed"
    restarts = restart_count(values)
    if values.get("SubState") == "auto-restart" or (
            restarts is not None and restarts_before is not None and restarts > restarts_before):
        return "crashed"
    return None


def _journal_tail(unit: str) -> str:
    import subprocess
    try:
        text = subprocess.run(["journalctl", "-u", unit, "--no-pager", "-n", "40", "-o", "cat"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              check=False).stdout.decode("utf-8", "replace")
    except OSError:
        return ""
    return why_it_stopped(text)


def why_it_stopped(journal: str) -> str:
    """Pure: a unit's journal (`-o cat`) -> the lines that say why its last run ended."""
    lines = [line for line in journal.splitlines() if line.strip()]
    # The failed run's own words: after a restart the newest lines are systemd's restart notices,
    # which say nothing of why. A process killed by a signal (OOM, SIGSEGV) prints no error: systemd's
    # "Main process exited, code=..., status=..." is then the reason.
    restarted = [index for index, line in enumerate(lines) if "Scheduled restart job" in line]
    if restarted:
        lines = lines[:restarted[-1]]
    errors = [line for line in lines if any(word in line for word in ERROR_WORDS)]
    return " | ".join((errors or lines)[-3:])[:600]


ERROR_WORDS = ("rror", "Traceback", "Main process exited", "Killed", "Out of memory", "core-dump", "signal")


def ready(spec: dict[str, Any]) -> dict[str, Any]:
    started = time.time()
    deadline = started + spec.get("timeout", 600)
    last = ""
    stage = "health"
    unit = spec.get("unit")
    restarts_before = restart_count(_unit(unit)) if unit else None
    while time.time() < deadline:
        if unit:  # a crash is an answer: no need to wait out the timeout
            values = _unit(unit)
            ended = crashed(values, restarts_before)
            if ended:
                restarts = restart_count(values)
                counted = f" ({restarts} restart(s))" if restarts else ""
                return {"ok": False, "seconds": round(time.time() - started, 1),
                        "error": f"{unit} {ended} after start{counted}: {_journal_tail(unit)}"}
        if stage == "health":
            status, text = _get(spec["base"] + "/health", timeout=5)
            last = f"/health: {status if status is not None else text}"
            if status == 200:
                stage = "completion"
                continue
        else:
            try:
                reply = _complete(spec, 1, "Hello", timeout=max(5, deadline - time.time()))
                if reply.get("choices"):
                    return {"ok": True, "seconds": round(time.time() - started, 1),
                            "text": reply["choices"][0].get("text", "")}
                last = "completion without choices"
            except Exception as exc:  # noqa: BLE001  any failed attempt means "not ready yet": try again
                last = "completion: " + _describe(exc, spec)
        emit("progress", stage=stage, elapsed=round(time.time() - started, 1), last=last)
        time.sleep(2)
    return {"ok": False, "seconds": round(time.time() - started, 1),
            "error": f"not ready within {int(spec.get('timeout', 600))}s ({last})"}


def _stream(spec: dict[str, Any], prompt: str, max_tokens: int) -> tuple[float | None, float, int, list[float]]:
    """One streamed completion: (seconds to the first token, total seconds, tokens, the gaps between
    chunks after the first: the inter-token latencies, a chunk being a token on these servers)."""
    body = json.dumps({"model": spec["model"], "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True},
                       "ignore_eos": True}).encode()
    request = urllib.request.Request(spec["base"] + "/v1/completions", body, _headers(spec))
    started = time.time()
    first: float | None = None
    tokens: int | None = None
    chunks = 0
    gaps: list[float] = []
    last = 0.0
    with urllib.request.urlopen(request, timeout=600) as response:
        for raw in response:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if data.get("choices") and data["choices"][0].get("text"):
                chunks += 1
                now = time.time() - started
                if first is None:
                    first = now
                else:
                    gaps.append(now - last)
                last = now
            if data.get("usage"):
                tokens = data["usage"].get("completion_tokens")
    return first, time.time() - started, tokens if tokens is not None else chunks, gaps


def _metrics(spec: dict[str, Any]) -> str:
    """The engine's metrics page (llama.cpp's wants the API key); none where metrics_path is null (a
    router in front of several servers)."""
    path = spec.get("metrics_path", "/metrics")
    if path is None:
        return ""
    request = urllib.request.Request(spec["base"] + path, headers=_headers(spec))
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return str(response.read().decode("utf-8", "replace")) if response.status == 200 else ""
    except (OSError, http.client.HTTPException, ValueError):
        return ""


def bench(spec: dict[str, Any]) -> dict[str, Any]:
    count, concurrency = spec.get("count", 16), max(1, spec.get("concurrency", 4))
    before = _metrics(spec)
    results: list[tuple[float | None, float, int, list[float]]] = []
    errors: list[str] = []
    lock = threading.Lock()
    queue = list(range(count))

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                index = queue.pop()
            try:
                prompts = spec.get("prompts")  # a workload's own prompts, one per request
                prompt = prompts[index % len(prompts)] if prompts else f"{spec.get('prompt', 'Hello')} ({index})"
                outcome = _stream(spec, prompt, spec.get("max_tokens", 32))
                with lock:
                    results.append(outcome)
                    emit("progress", done=len(results) + len(errors), total=count)
            except Exception as exc:  # noqa: BLE001  a failed request is counted; the thread goes on
                with lock:
                    errors.append(_describe(exc, spec))

    started = time.time()
    threads = [threading.Thread(target=worker) for _ in range(min(concurrency, count))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.time() - started
    return {"ok": not errors, "requests": count, "succeeded": len(results), "errors": errors[:5],
            "seconds": round(wall, 3), "ttft_s": [round(r[0], 4) for r in results if r[0] is not None],
            "latency_s": [round(r[1], 4) for r in results], "tokens": [r[2] for r in results],
            "itl_s": [round(gap, 5) for r in results for gap in r[3]],
            "metrics_before": before, "metrics_after": _metrics(spec)}


def ask(spec: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    try:
        body = _complete(spec, int(spec["max_tokens"]), spec["prompt"], float(spec.get("timeout") or 60))
    except Exception as exc:  # noqa: BLE001  said in words (a 401 names what to set)
        return {"ok": False, "error": _describe(exc, spec)}
    return {"ok": True, "body": body, "seconds": round(time.monotonic() - started, 3)}


def context(spec: dict[str, Any]) -> dict[str, Any]:
    """What the server says of its context: the raw /v1/models answer and, per probe text, the prompt
    tokens it counted (the controller parses both)."""
    request = urllib.request.Request(spec["base"] + "/v1/models", headers=_headers(spec))
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            models: str | None = response.read(200_000).decode("utf-8", "replace")
    except Exception as exc:  # noqa: BLE001  an answer in words: the controller decides
        models = None
        models_error = _describe(exc, spec)
    else:
        models_error = ""
    probes: list[dict[str, Any]] = []
    for text in spec.get("probes", []):
        try:
            usage = _complete(spec, 1, text, timeout=60).get("usage") or {}
            probes.append({"prompt_tokens": usage.get("prompt_tokens")})
        except Exception as exc:  # noqa: BLE001  a refused probe says why
            probes.append({"error": _describe(exc, spec)})
    return {"ok": True, "models": models, "models_error": models_error, "probes": probes}


ACTIONS = {"ready": ready, "bench": bench, "ask": ask, "context": context}


def serve_main(spec: dict[str, Any]) -> None:
    try:
        result = ACTIONS[spec["action"]](spec)
    except Exception as exc:  # noqa: BLE001  the result line says what broke, never a bare traceback
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    emit("result", **result)
