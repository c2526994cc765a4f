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
ready, ask and bench stream and read each answer to its end (StreamReader): a server can answer
HTTP 200 and then send an error inside the stream, or be cut off; either is a failed request, with
the server's words.
context: /v1/models as served (its max_model_len), and each probe's prompt tokens as the server counts
them (a one-token completion's usage.prompt_tokens, or why the server refused it).
Output: JSON lines, {"event": "progress", ...} and one {"event": "result", ...}.
"""
from __future__ import annotations

import http.client
import json
import re
import socket
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


def _describe(exc: BaseException, spec: dict[str, Any], asked: str = "POST", path: str = "/v1/completions") -> str:
    """An exception from a request, in words; a 401 says what to set (the server wants a key); a
    request nothing answered names what was asked (`asked` METHOD on the spec's base and `path`)."""
    if isinstance(exc, urllib.error.HTTPError) and exc.code == 401:
        exc.close()
        if spec.get("api_key"):
            return ("the server refused the API key sent (HTTP 401): api_key differs from the "
                    "server's VLLM_API_KEY")
        return ("the server wants an API key (HTTP 401): set api_key (the inventory's secrets file, "
                "or VLLM_API_KEY in the environment)")
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.read(900).decode('utf-8', 'replace')}"  # the server's message whole
    if isinstance(exc, StreamFailed):
        return str(exc)
    unanswered = _unanswered(exc)
    if unanswered is not None:
        return f"asked {asked} {spec['base']}{path}: {unanswered}"
    return f"{type(exc).__name__}: {exc}"


def _unanswered(exc: BaseException) -> str | None:
    """What answered a request that got no HTTP answer at all, in words; None for anything else."""
    reason = exc.reason if isinstance(exc, urllib.error.URLError) and not isinstance(exc, urllib.error.HTTPError) \
        else exc
    if isinstance(reason, ConnectionRefusedError):
        return "nothing answered: connection refused (no server listens on that port: not deployed, or stopped)"
    if isinstance(reason, TimeoutError):
        return "nothing answered before the timeout (the server is busy, starting, or the address unreachable)"
    if isinstance(reason, (ConnectionResetError, http.client.RemoteDisconnected)):
        return "the connection was closed without an HTTP answer (the server went away mid-request)"
    if isinstance(reason, socket.gaierror):
        return f"the address does not resolve ({reason.strerror})"
    if isinstance(exc, urllib.error.URLError):
        return f"no HTTP answer ({reason})"
    return None


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


# The unit's state, its restart count and how its main process last ended (ExecMainCode is the kernel's
# CLD_* code: 1 exited, 2 killed, 3 dumped core).
SHOWN_PROPERTIES = "ActiveState,SubState,NRestarts,ExecMainCode,ExecMainStatus,InvocationID"


def _unit(unit: str) -> dict[str, str]:
    """The unit's state and restart count as `systemctl show` says them; {} without systemd."""
    import subprocess
    try:
        return parse_show(subprocess.run(["systemctl", "show", "-p", SHOWN_PROPERTIES, unit],
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
    ("failed", "crashed", "exited") or None while it may still come up. A server that exits waits out
    RestartSec in SubState auto-restart: that is its answer, not ten more seconds of waiting until
    systemd starts it again and NRestarts counts it. A unit that is no longer active at all ended too,
    whatever its exit status: a server that exits with status 0 (vLLM's API server does once its engine
    died) under a unit that does not restart it stays inactive, and nothing will answer."""
    if values.get("ActiveState") == "failed":
        return "failed"
    restarts = restart_count(values)
    if values.get("SubState") == "auto-restart" or (
            restarts is not None and restarts_before is not None and restarts > restarts_before):
        return "crashed"
    if values.get("ActiveState") in ("inactive", "deactivating"):
        return "exited"
    return None


# systemd's own exit status when it could not place the new process in the unit's control group
# (systemd.exec(5): 219 CGROUP); the server never ran. In a container whose systemd could not kill the
# unit's previous control group ("Failed to kill control group ... Input/output error"), the next
# start has failed so while that run's processes were still leaving; systemd's own restart then worked.
CGROUP_FAILED = "219"


def cgroup_failed(values: dict[str, str]) -> bool:
    """Pure: the unit waits out RestartSec because systemd could not place its process in its control
    group (the server never started): systemd's restart is worth one wait."""
    return (values.get("SubState") == "auto-restart" and values.get("ExecMainCode") == "1"
            and values.get("ExecMainStatus") == CGROUP_FAILED)


def judged(values: dict[str, str], restarts_before: int | None,
           awaited: int | None) -> tuple[str | None, int | None, int | None]:
    """Pure: one look at a server's unit during readiness -> how it ended (crashed()'s answer, or None),
    and the restart count to judge the next look by. `awaited` is NRestarts when systemd failed to
    place the server in its control group: the server never ran, so systemd's own restart after
    RestartSec is waited for, once; a second such failure is the answer."""
    if cgroup_failed(values) and awaited in (None, restart_count(values)):
        awaited = restart_count(values) or 0
        return None, awaited + 1, awaited
    return crashed(values, restarts_before), restarts_before, awaited


def how_it_ended(values: dict[str, str]) -> str | None:
    """Pure: ExecMainCode and ExecMainStatus -> the main process's end in words ("exit status 0",
    "killed by signal 4 (SIGILL)"), None where systemd says nothing (a process never started)."""
    code, status = values.get("ExecMainCode", ""), values.get("ExecMainStatus", "")
    if not status.isdigit() or code not in ("1", "2", "3"):
        return None
    if code == "1":
        return f"exit status {status}" + (" (systemd could not place it in its control group)"
                                          if status == CGROUP_FAILED else "")
    name = SIGNALS.get(int(status))
    signal = f"signal {status}" + (f" ({name})" if name else "")
    return f"killed by {signal}" if code == "2" else f"dumped core on {signal}"


# The signals a server's end shows in practice (x86-64 and aarch64 Linux numbers).
SIGNALS = {4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}


def ended_after_start(unit: str, ended: str, values: dict[str, str], journal: str) -> str:
    """Pure: a server's end during readiness in words: how (failed, crashed, exited), the main process's
    exit, the restarts systemd made, and the journal's reason."""
    how = how_it_ended(values)
    restarts = restart_count(values)
    details = [part for part in (how, f"{restarts} restart(s)" if restarts else None) if part]
    said = f" ({', '.join(details)})" if details else ""
    return f"{unit} {ended} after start{said}: {journal or 'its journal says nothing'}"


def _journal_tail(unit: str, invocation: str | None = None, wait: float = 3.0) -> str:
    """Why the unit's last run ended, from its journal: that run's lines alone where systemd names it
    (`invocation`, the unit's InvocationID: its process's output and systemd's notices about it). Read
    right after systemd saw the process end, the journal can still lack that run's end (journald takes
    the process's output and systemd's notices in its own time): read again, for up to `wait` seconds,
    until the end is there, and once more a moment later for the process's last words."""
    import subprocess
    match = [f"_SYSTEMD_INVOCATION_ID={invocation}", "+", f"INVOCATION_ID={invocation}"] if invocation else ["-u", unit]
    deadline = time.time() + wait
    ended_at: float | None = None
    while True:
        try:
            # Enough lines for one run of vLLM's: its shutdown after a dead worker prints 70 lines and more.
            text = subprocess.run(["journalctl", *match, "--no-pager", "-n", "400", "-o", "cat"],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  check=False).stdout.decode("utf-8", "replace")
        except OSError:
            return ""
        if invocation and not text.strip():  # a journal that keeps no invocation ids: the unit's lines
            match, invocation = ["-u", unit], None
            continue
        now = time.time()
        if run_ended_in(text) and ended_at is None:
            ended_at = now
        if (ended_at is not None and now - ended_at >= 0.5) or now >= deadline:
            return why_it_stopped(text)
        time.sleep(0.25)


def run_ended_in(journal: str) -> bool:
    """Pure: whether the journal holds the end of the unit's last run: systemd's "Main process exited"
    (or "Deactivated successfully") after its last "Started" line."""
    lines = journal.splitlines()
    started = [index for index, line in enumerate(lines) if re.match(r"Started \S+\.service\b", line)]
    after = lines[started[-1] + 1:] if started else lines
    return any("Main process exited" in line or "Deactivated successfully" in line for line in after)


def why_it_stopped(journal: str) -> str:
    """Pure: a unit's journal (`-o cat`) -> the lines that say why its last run ended."""
    # systemd in a container whose cgroup it cannot wholly control says "Failed to kill control group
    # ..., ignoring" at every stop: it is never why the server ended.
    lines = [line for line in journal.splitlines() if line.strip() and "Failed to kill control group" not in line]
    # The failed run's own words: after a restart the newest lines are systemd's restart notices,
    # which say nothing of why. A process killed by a signal (OOM, SIGSEGV) prints no error: systemd's
    # "Main process exited, code=..., status=..." is then the reason.
    restarted = [index for index, line in enumerate(lines) if "Scheduled restart job" in line]
    if restarted:
        lines = lines[:restarted[-1]]
    # That run's lines alone: from systemd's "Started UNIT - DESCRIPTION." on (an earlier run's error
    # is not this one's reason).
    started = [index for index, line in enumerate(lines) if re.match(r"Started \S+\.service\b", line)]
    if started:
        lines = lines[started[-1] + 1:] or lines[started[-1]:]
    # A process's death is the root of the errors printed after it (vLLM's engine and API server shut
    # down with tracebacks of their own, and a killed worker prints nothing): said first.
    causes = [line for line in lines if any(word in line for word in CAUSE_WORDS)]
    if causes:
        return " | ".join(causes[:2])[:600]
    # vLLM's API server ends on "Engine core initialization failed. See root cause above": the cause
    # is the engine process's own last exception, printed before it ("(EngineCore pid=N)
    # FileNotFoundError: ... 'ninja'"), then the server's words and systemd's.
    roots = [line for line in lines if ENGINE_EXCEPTION.match(line)]
    if roots and any("root cause above" in line for line in lines):
        said = [line for line in lines if "root cause above" in line]
        ended = [line for line in lines if SYSTEMD_SAYS.match(line) and "Main process exited" in line]
        return " | ".join([roots[-1], *said[-1:], *ended[-1:]])[:600]
    # The engine's own last error first ("error: invalid argument: --no-such-flag"), then how systemd saw
    # the process end; systemd's other lines only where the engine said nothing.
    own = [line for line in lines if not SYSTEMD_SAYS.match(line)]
    engine_errors = [line for line in own if any(word in line for word in ERROR_WORDS)]
    exits = [line for line in lines if SYSTEMD_SAYS.match(line) and "Main process exited" in line]
    if engine_errors:
        return " | ".join([*engine_errors[-2:], *exits[-1:]])[:600]
    errors = [line for line in lines if any(word in line for word in ERROR_WORDS)]
    return " | ".join((errors or lines)[-3:])[:600]


# systemd's own journal lines about a unit (`-o cat`): "llama-server.service: Main process exited, ...",
# "Started UNIT - ...", "Stopped ...": never the engine's words.
SYSTEMD_SAYS = re.compile(r"^(\S+\.(service|scope|slice|socket): |(Started|Stopped|Stopping|Starting) \S+\.service\b)")
ERROR_WORDS = ("rror", "Traceback", "Main process exited", "Killed", "Out of memory", "core-dump", "signal")
# vLLM's engine naming a dead worker ("Worker proc VllmWorker-0 died unexpectedly (exit code: -4)"), and
# Python's faulthandler on a SIGILL ("Fatal Python error: Illegal instruction").
CAUSE_WORDS = ("died unexpectedly", "Illegal instruction", "Fatal Python error")
# The last line of an exception's traceback in one of vLLM's engine or worker processes.
ENGINE_EXCEPTION = re.compile(r"^\((EngineCore|Worker|VllmWorker)[^)]*\) ([\w.]+(Error|Exception|Interrupt)): ")


def ready(spec: dict[str, Any]) -> dict[str, Any]:
    started = time.time()
    deadline = started + spec.get("timeout", 600)
    last = ""
    stage = "health"
    unit = spec.get("unit")
    restarts_before = restart_count(_unit(unit)) if unit else None
    awaited: int | None = None  # NRestarts when systemd failed to place the server in its cgroup
    while time.time() < deadline:
        if unit:  # a crash is an answer: no need to wait out the timeout
            values = _unit(unit)
            ended, restarts_before, awaited = judged(values, restarts_before, awaited)
            if ended:
                return {"ok": False, "seconds": round(time.time() - started, 1),
                        "error": ended_after_start(unit, ended, values, _journal_tail(unit, values.get("InvocationID") or None))}
        if stage == "health":
            status, text = _get(spec["base"] + "/health", timeout=5)
            last = f"/health: {status if status is not None else text}"
            if status == 200:
                stage = "completion"
                continue
        else:
            try:  # streamed and read to its end: an error inside a 200 is not readiness
                reply = _streamed(spec, "Hello", 1, max(5, deadline - time.time()), ignore_eos=False)
                return {"ok": True, "seconds": round(time.time() - started, 1), "text": reply.text}
            except Exception as exc:  # noqa: BLE001  any failed attempt means "not ready yet": try again
                last = "completion: " + _describe(exc, spec)
        emit("progress", stage=stage, elapsed=round(time.time() - started, 1), last=last)
        time.sleep(2)
    return {"ok": False, "seconds": round(time.time() - started, 1),
            "error": f"not ready within {int(spec.get('timeout', 600))}s ({last})"}


class StreamFailed(Exception):
    """A streamed answer that failed after its HTTP 200: an error sent inside the stream, or a stream
    that ended without saying it was done."""


def error_in(chunk: Any) -> str | None:
    """Pure: one streamed chunk -> the error it carries, in the server's words, or None.

    llama-server sends {"error": {"code": 500, "message": "Context size has been exceeded.", ...}} and
    closes the stream (no [DONE]); vLLM 0.32 sends its ErrorResponse, {"error": {"message", "type",
    "code"}}, and then [DONE] as after any answer (entrypoints/openai/completion/serving.py), so a
    [DONE] alone never means it went well; vLLM before 0.10 sent {"object": "error", "message": ...}."""
    if not isinstance(chunk, dict):
        return f"a chunk that is not a JSON object: {str(chunk)[:200]!r}"
    error = chunk.get("error")
    if isinstance(error, dict):
        code = error.get("code")
        return (f"HTTP {code} " if code else "") + str(error.get("message") or error)[:600]
    if error:
        return str(error)[:600]
    if chunk.get("object") == "error":
        return str(chunk.get("message") or chunk)[:600]
    return None


class StreamReader:
    """Pure: a streamed completion or chat answer (server-sent events), fed one line at a time.

    It ended well when it said so (a finish reason, or [DONE]) and carried no error; `failure()` says
    why not: an error chunk (the server's words), a finish reason of "error" or "abort", or a stream cut
    before either (a server killed, a connection reset). Text comes from completions' `text` and chats'
    `delta.content`."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.usage: dict[str, Any] | None = None
        self.model: str | None = None
        self.finish_reason: str | None = None
        self.done = False
        self.error: str | None = None
        self.chunks = 0

    def feed(self, line: str) -> bool:
        """Read one line; True when it carried text (a token, on these servers)."""
        line = line.strip()
        if not line.startswith("data:"):
            return False
        payload = line[5:].strip()
        if payload == "[DONE]":
            self.done = True
            return False
        try:
            chunk = json.loads(payload)
        except ValueError:
            chunk = payload
        error = error_in(chunk)
        if error is not None:
            self.error = self.error or error
            return False
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        self.model = chunk.get("model") or self.model
        text = False
        for choice in chunk.get("choices") or []:
            piece = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
            if piece:
                self.parts.append(piece)
                text = True
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        self.chunks += text
        return text

    def failure(self) -> str | None:
        """Why the answer failed, or None where it ended well."""
        if self.error is not None:
            return f"error in the stream after HTTP 200: {self.error}"
        if self.finish_reason in ("error", "abort"):
            return f"the stream ended with finish reason {self.finish_reason!r} after {self.chunks} chunk(s)"
        if self.finish_reason is None and not self.done:
            return f"the stream was cut: no finish reason and no [DONE] after {self.chunks} chunk(s)"
        return None

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def as_body(self) -> dict[str, Any]:
        """The answer in a completion's shape (model, choices[0].text and finish_reason, usage)."""
        return {"model": self.model, "choices": [{"text": self.text, "finish_reason": self.finish_reason}],
                "usage": self.usage or {}}


def _streamed(spec: dict[str, Any], prompt: str, max_tokens: int, timeout: float, *, ignore_eos: bool,
              on_text: Any = None) -> StreamReader:
    """One streamed completion read to its end; StreamFailed where it failed after its HTTP 200."""
    body = {"model": spec["model"], "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True
    request = urllib.request.Request(spec["base"] + "/v1/completions", json.dumps(body).encode(), _headers(spec))
    reader = StreamReader()
    with urllib.request.urlopen(request, timeout=timeout) as response:
        for raw in response:
            if reader.feed(raw.decode("utf-8", "replace")) and on_text is not None:
                on_text()
    failure = reader.failure()
    if failure is not None:
        raise StreamFailed(failure)
    return reader


def _stream(spec: dict[str, Any], prompt: str, max_tokens: int) -> tuple[float | None, float, int, list[float]]:
    """One streamed completion: (seconds to the first token, total seconds, tokens, the gaps between
    chunks after the first: the inter-token latencies, a chunk being a token on these servers)."""
    started = time.time()
    times: list[float] = []
    reader = _streamed(spec, prompt, max_tokens, 600, ignore_eos=True,
                       on_text=lambda: times.append(time.time() - started))
    tokens = (reader.usage or {}).get("completion_tokens")
    gaps = [later - earlier for earlier, later in zip(times, times[1:])]
    return (times[0] if times else None), time.time() - started, \
        tokens if isinstance(tokens, int) else reader.chunks, gaps


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
    return {"ok": not errors, "requests": count, "succeeded": len(results), "failed": len(errors),
            "errors": counted(errors)[:5],
            "seconds": round(wall, 3), "ttft_s": [round(r[0], 4) for r in results if r[0] is not None],
            "latency_s": [round(r[1], 4) for r in results], "tokens": [r[2] for r in results],
            "itl_s": [round(gap, 5) for r in results for gap in r[3]],
            "metrics_before": before, "metrics_after": _metrics(spec)}


def counted(errors: list[str]) -> list[str]:
    """Pure: every failed request's reason -> each reason once, most frequent first, with its count
    where it happened more than once ("6 x error in the stream after HTTP 200: ...")."""
    tally: dict[str, int] = {}
    for error in errors:
        tally[error] = tally.get(error, 0) + 1
    ordered = sorted(tally.items(), key=lambda item: -item[1])
    return [error if times == 1 else f"{times} x {error}" for error, times in ordered]


def ask(spec: dict[str, Any]) -> dict[str, Any]:
    """One completion, streamed and read to its end (an error inside a 200 is a failed ask), its body
    in a completion's shape."""
    started = time.monotonic()
    try:
        reader = _streamed(spec, spec["prompt"], int(spec["max_tokens"]), float(spec.get("timeout") or 60),
                           ignore_eos=False)
    except Exception as exc:  # noqa: BLE001  said in words (a 401 names what to set)
        return {"ok": False, "error": _describe(exc, spec)}
    return {"ok": True, "body": reader.as_body(), "seconds": round(time.monotonic() - started, 3)}


def context(spec: dict[str, Any]) -> dict[str, Any]:
    """What the server says of its context: the raw /v1/models answer and, per probe text, the prompt
    tokens it counted (the controller parses both)."""
    request = urllib.request.Request(spec["base"] + "/v1/models", headers=_headers(spec))
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            models: str | None = response.read(200_000).decode("utf-8", "replace")
    except Exception as exc:  # noqa: BLE001  an answer in words: the controller decides
        models = None
        models_error = _describe(exc, spec, "GET", "/v1/models")
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
