"""A stand-in for vLLM's OpenAI server on the benchmark hosts (standard library only).

The benchmarks measure provisioning tools, not vLLM: sixteen real vLLM servers do not fit on a
two-core machine. Each benchmark host gets this file as the module the rendered unit starts
(`vllm.entrypoints.launchers.api_server.entry`) in the service venv before any timing, so the unit
every tool writes starts a process that stays up and answers the endpoints a status reads: /health,
/v1/models and /metrics. The metrics are two pages recorded from real vLLM under load, a window
apart (metrics.txt beside this file, JSON {"first": ..., "second": ...}); each read goes on from the
last by the step between them, so a server at work shows counters that move (a page that never
changed would read as a wedged engine).
"""
from __future__ import annotations

import argparse
import itertools
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def advanced(first: str, second: str, step: int) -> str:
    """The second page with every sample that grew from the first grown `step` times as much again
    (counters, histogram buckets and sums); the rest (gauges, text) as in the second."""
    before = {}
    for line in first.splitlines():
        key, _, value = line.rpartition(" ")
        if key and not line.startswith("#"):
            before[key] = value
    lines = []
    for line in second.splitlines():
        key, _, value = line.rpartition(" ")
        try:
            grown = float(value) - float(before[key])
        except (KeyError, ValueError):
            grown = 0.0
        lines.append(f"{key} {float(value) + step * grown}" if grown > 0 else line)
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args, _ = parser.parse_known_args()  # the rest of vLLM's flags mean nothing here
    pages = json.loads(Path(__file__).with_name("metrics.txt").read_text())
    reads = itertools.count(1)
    models = json.dumps({"object": "list", "data": [
        {"id": args.served_model_name or args.model, "object": "model", "root": args.model}]}).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body, kind = {"/health": (b"", "text/plain"), "/v1/models": (models, "application/json"),
                          "/metrics": (b"", "text/plain; version=0.0.4")}.get(self.path, (None, ""))
            if self.path == "/metrics":
                body = advanced(pages["first"], pages["second"], next(reads)).encode()
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
