"""A stand-in for vLLM's OpenAI server on the benchmark hosts (standard library only).

The benchmarks measure provisioning tools, not vLLM: sixteen real vLLM servers do not fit on a
two-core machine. Each benchmark host gets this file as `vllm.entrypoints.openai.api_server` in
the service venv before any timing, so the unit every tool writes starts a process that stays up
and answers the endpoints a status reads: /health, /v1/models and /metrics (a page recorded from
real vLLM, next to this file on the host as metrics.txt).
"""
from __future__ import annotations

import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args, _ = parser.parse_known_args()  # the rest of vLLM's flags mean nothing here
    metrics = (Path(__file__).with_name("metrics.txt")).read_bytes()
    models = json.dumps({"object": "list", "data": [
        {"id": args.served_model_name or args.model, "object": "model", "root": args.model}]}).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body, kind = {"/health": (b"", "text/plain"), "/v1/models": (models, "application/json"),
                          "/metrics": (metrics, "text/plain; version=0.0.4")}.get(self.path, (None, ""))
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
