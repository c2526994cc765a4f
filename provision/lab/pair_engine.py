"""The lab's stand-in for vLLM's own multi-node launch, packed into the stand-in `vllm` wheel
(lab/wheels.py) as `vllm/_lab_pair.py`: the modules the tool renders start it (`python -m
vllm.entrypoints.launchers.api_server.entry` on the head, `python -m vllm.entrypoints.cli.main serve
--headless` on the others) with the rendered arguments.

vLLM's CPU build cannot start a worker node from the line the tool renders (its CLI asks
importlib.metadata for the distribution `vllm` and dies: engine_contracts.yaml, the row of
vllm.entrypoints.cli.main), so the lab proves the units' start, order and failure handling with this. It
does what vLLM 0.32.0's CPU build did across two lab hosts (TP 2 over Gloo, started by hand with that
lookup answered for it; docs/engines.md):
- the head serves only once every worker node has joined it at --master-addr:--master-port;
- a worker killed: the head still answers /health; its next request fails (HTTP 500, "Connection closed
  by peer ... This is typically caused by a remote worker crashing") and the server exits with status 0;
- the head killed: the worker neither notices nor ends (it stayed active, silent, minutes on);
- a head started again alone waits for a worker node that never comes (the old one does not rejoin).
Standard library only: it runs in the lab host's venv, nothing else installed.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

JOIN_TIMEOUT = 600.0  # how long either side waits for the other, as torch.distributed's store does


def say(text: str) -> None:
    print(text, flush=True)


def arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vllm (lab stand-in)")
    parser.add_argument("command", nargs="?")
    for flag in ("--model", "--served-model-name", "--host", "--master-addr"):
        parser.add_argument(flag)
    for flag, default in (("--port", 8000), ("--nnodes", 1), ("--node-rank", 0), ("--master-port", 29501)):
        parser.add_argument(flag, type=int, default=default)
    parser.add_argument("--headless", action="store_true")
    args, _ = parser.parse_known_args(argv)
    return args


LOST: list[str] = []  # the worker nodes the head lost, as the next step would find them


def head(argv: list[str]) -> None:
    """Wait for every worker node, then serve the API."""
    args = arguments(argv)
    if args.nnodes > 1:
        listener = socket.create_server(("", args.master_port))
        listener.settimeout(JOIN_TIMEOUT)
        say(f"head: waiting for {args.nnodes - 1} worker node(s) at {args.master_addr}:{args.master_port}")
        for _ in range(args.nnodes - 1):
            peer, address = listener.accept()
            rank = peer.recv(16).decode().strip()
            say(f"head: worker node {rank} joined from {address[0]}")
            threading.Thread(target=watch, args=(peer, address[0]), daemon=True).start()
    serve(args)


def watch(peer: socket.socket, address: str) -> None:
    peer.settimeout(None)
    while peer.recv(1):
        pass
    LOST.append(address)  # said by the next request, as vLLM's engine finds it at its next step


def worker(argv: list[str]) -> None:
    """Join the head; then wait, whether the head is there or not."""
    args = arguments(argv)
    deadline = time.monotonic() + JOIN_TIMEOUT
    while True:
        try:
            peer = socket.create_connection((args.master_addr, args.master_port), timeout=5)
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                sys.exit(f"worker node {args.node_rank}: no head at {args.master_addr}:{args.master_port}: {exc}")
            time.sleep(1)
    peer.sendall(f"{args.node_rank}\n".encode())
    peer.settimeout(None)
    say(f"worker node {args.node_rank}: joined the head at {args.master_addr}:{args.master_port}")
    while peer.recv(1):
        pass
    while True:  # the head went away: vLLM's worker node neither notices nor ends
        time.sleep(3600)


def end_soon() -> None:
    """Exit with status 0 once the failed request's answer is out, as vLLM's API server did."""
    time.sleep(0.5)
    os._exit(0)


def serve(args: argparse.Namespace) -> None:
    name = args.served_model_name or args.model
    key = os.environ.get("VLLM_API_KEY")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *values: object) -> None:
            pass

        def answer(self, status: int, body: str, kind: str = "application/json") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def allowed(self) -> bool:
            if key and self.path.startswith("/v1/") and self.headers.get("Authorization") != f"Bearer {key}":
                self.answer(401, json.dumps({"error": "Unauthorized"}))
                return False
            return True

        def do_GET(self) -> None:
            if self.path == "/health":
                self.answer(200, "")
            elif self.path == "/metrics":
                self.answer(200, "vllm:num_requests_running 0.0\nvllm:num_requests_waiting 0.0\n"
                                 "vllm:generation_tokens_total 0.0\nvllm:prompt_tokens_total 0.0\n",
                            "text/plain")
            elif self.path == "/v1/models" and self.allowed():
                self.answer(200, json.dumps({"object": "list", "data": [{"id": name, "object": "model"}]}))
            elif not self.path.startswith("/v1/"):
                self.answer(404, "")

        def do_POST(self) -> None:
            if not self.allowed():
                return
            if LOST:  # the engine's step needs the lost node: the request fails, then the server ends
                self.answer(500, json.dumps({"error": {"message": f"Connection closed by peer [{LOST[0]}]. This is "
                                                                  "typically caused by a remote worker crashing.",
                                                       "code": 500}}))
                say(f"head: EngineDeadError: connection closed by peer [{LOST[0]}]; shutting down")
                threading.Thread(target=end_soon, daemon=True).start()
                return
            asked = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            choice = {"index": 0, "text": " lab", "finish_reason": "length"}
            if not asked.get("stream"):
                self.answer(200, json.dumps({"object": "text_completion", "model": name, "choices": [choice],
                                             "usage": {"prompt_tokens": 1, "completion_tokens": 1}}))
                return
            chunk = json.dumps({"object": "text_completion", "model": name, "choices": [choice]})
            self.answer(200, f"data: {chunk}\n\ndata: [DONE]\n\n", "text/event-stream")

    server = ThreadingHTTPServer((args.host or "127.0.0.1", args.port), Handler)
    say(f"head: serving {name} at {args.host}:{args.port}")
    server.serve_forever()
