"""A Runner at the project's own boundary, for the fast unit layer (the lab tests use real SSH)."""
from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

from provision.facts import FACTS
from provision.runner import Result, command_line


class FakeRunner:
    """Answers each command from `respond(argv, stdin)`; records every call and counts executions."""

    def __init__(self, host: str, respond: Callable[[Sequence[str], str | None], Result]) -> None:
        self.host = host
        self.executions = 0
        self.calls: list[tuple[list[str], str | None]] = []
        self.respond = respond

    def run(self, argv: Sequence[str], *, stdin: str | None = None, timeout: float | None = None,
            env: Mapping[str, str] | None = None, on_line: Any = None) -> Result:
        self.executions += 1
        self.calls.append((list(argv), stdin))
        return self.respond(argv, stdin)

    def close(self) -> None:
        return None


def probe_answer_from_recording(recording: Mapping[str, Any], python: str = "3.12.3") -> str:
    """What the probe prints on the machine a recording came from (outputs keyed by fact name)."""
    results = {}
    for entry in recording["outputs"]:
        results[entry["fact"]] = {key: entry.get(key) for key in
                                  ("exit", "stdout", "stderr", "missing", "timed_out")}
    # A file read is the same whichever fact reads it (the lab replays files by path, too).
    by_file = {entry["file"]: results[entry["fact"]] for entry in recording["outputs"] if entry.get("file")}
    for fact in FACTS:
        if fact.file in by_file and fact.name not in results:
            results[fact.name] = by_file[fact.file]
    return json.dumps({"python": python, "results": results, "paths": {}})


def ok(stdout: str, argv: Sequence[str] = ("true",)) -> Result:
    return Result(command_line(argv), 0, stdout, "", 0.01)


class JsonAnswers(BaseHTTPRequestHandler):
    """A loopback HTTP handler that answers JSON (`answer`) and logs nothing: the base of the tests' fake
    servers and workers."""

    def log_message(self, *_: object) -> None:
        pass

    def answer(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _Pages(BaseHTTPRequestHandler):
    pages: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        if self.path == "/metrics":
            body = (self.pages.pop(0) if len(self.pages) > 1 else self.pages[0]).encode()
        else:
            body = b'{"data": [{"id": "tiny-llama"}]}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


class ReplayedMetrics:
    """A loopback server that plays vLLM: /metrics answers the given pages in turn (the last one for
    ever), any other path a model list; the probe's serving part asks it as it asks a host's server."""

    def __init__(self, pages: list[str]) -> None:
        handler = type("Handler", (_Pages,), {"pages": list(pages)})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)

    def __enter__(self) -> int:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return int(self.server.server_address[1])

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()
