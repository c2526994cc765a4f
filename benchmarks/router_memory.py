"""The router's memory per request in flight, by max_body_mb: the config the tool renders
(render.router_config) run by this machine's haproxy, in front of two stand-in replicas, with N
requests held in flight; against the same config at HAProxy's default 16 kB buffer (the tool's config
before the body limit), measured in the same run.

    python3 benchmarks/router_memory.py                          # 200 in flight; max_body_mb 1, 2, 8
    python3 benchmarks/router_memory.py --requests 500 --sizes 0.5,2 --body-kb 300

Two phases per size: "waiting", each replica silent for --hold seconds before answering (a request
queued or in prefill), and "streaming", each replica answering at once and sending a server-sent
event every 0.2 s for --hold seconds (a generation). The figure is haproxy's resident memory (VmRSS)
in the middle of each phase, less its idle figure, divided by the requests in flight. Needs only
haproxy (the project's first command installs it) and the tool's own packages.
"""
from __future__ import annotations

import argparse
import http.client
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from provision import endpoints, inventory, render

DEFAULT_BUFFER = 16384  # HAProxy's tune.bufsize when the config sets none


class Replica(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *_: object) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        hold = float(body.get("hold", 1))
        try:
            if body.get("phase") == "waiting":
                time.sleep(hold)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            deadline = time.monotonic() + (hold if body.get("phase") == "streaming" else 0)
            while True:
                event = b'data: {"choices": [{"delta": {"content": "x"}}]}\n\n'
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.2)
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass


class Replicas(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass  # haproxy's idle connections to it, reset when it stops: no news


def resident_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def measure(config: str, port: int, requests: int, body_kb: int, hold: float) -> dict[str, float]:
    """haproxy's resident MB idle, then with `requests` in flight in each phase."""
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "haproxy.cfg"
        path.write_text(config.replace(endpoints.ADMIN_SOCKET, str(Path(scratch) / "admin.sock")))
        process = subprocess.Popen(["haproxy", "-f", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(1.0)
            figures = {"idle": resident_mb(process.pid)}
            for phase in ("waiting", "streaming"):
                body = json.dumps({"messages": [{"role": "user", "content": "x" * (body_kb * 1024)}],
                                   "model": "m", "phase": phase, "hold": hold, "stream": True}).encode()
                threads = [threading.Thread(target=_post, args=(port, body)) for _ in range(requests)]
                for thread in threads:
                    thread.start()
                time.sleep(hold / 2)
                figures[phase] = resident_mb(process.pid)
                for thread in threads:
                    thread.join()
            return figures
        finally:
            process.terminate()
            process.wait(timeout=10)


def _post(port: int, body: bytes) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        connection.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        connection.getresponse().read()
    finally:
        connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="requests in flight at once")
    parser.add_argument("--sizes", default="1,2,8", help="max_body_mb values, comma-separated")
    parser.add_argument("--body-kb", type=int, default=1, help="each request's body, kB")
    parser.add_argument("--hold", type=float, default=3.0, help="seconds each phase holds its requests")
    args = parser.parse_args()
    if shutil.which("haproxy") is None:
        sys.exit("haproxy is not installed (apt-get install -y haproxy)")
    servers = [Replicas(("127.0.0.1", 0), Replica) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    replicas = tuple(endpoints.Replica(f"r{index}", "here", "127.0.0.1", server.server_address[1], "m")
                     for index, server in enumerate(servers, 1))
    rows = []
    for size in [None, *(float(text) for text in args.sizes.split(","))]:
        port = free_port()
        plan = endpoints.EndpointPlan("bench", "here", "127.0.0.1", port, 60.0, replicas,
                                      max_body_mb=size or inventory.Endpoint.max_body_mb)
        config = render.router_config("here", [plan], keys=False)
        bufsize = endpoints.buffer_size([plan])
        if size is None:  # the baseline: the same config at HAProxy's default buffer
            config = config.replace(f"tune.bufsize {bufsize}", f"tune.bufsize {DEFAULT_BUFFER}")
            bufsize = DEFAULT_BUFFER
        figures = measure(config, port, args.requests, args.body_kb, args.hold)
        rows.append((size, bufsize, figures))
    base = {phase: (rows[0][2][phase] - rows[0][2]["idle"]) / args.requests for phase in ("waiting", "streaming")}
    print(f"haproxy {haproxy_version()}; {args.requests} requests in flight, {args.body_kb} kB bodies")
    print(f"{'max_body_mb':>11} {'bufsize':>9} {'idle MB':>8} {'waiting MB':>11} {'MB/req':>7} {'x base':>7} "
          f"{'streaming MB':>13} {'MB/req':>7} {'x base':>7}")
    for size, bufsize, figures in rows:
        line = f"{'16 kB' if size is None else f'{size:g}':>11} {bufsize:>9} {figures['idle']:>8.0f}"
        for phase in ("waiting", "streaming"):
            each = (figures[phase] - figures["idle"]) / args.requests
            line += f" {figures[phase]:>{11 if phase == 'waiting' else 13}.0f} {each:>7.2f} {each / max(base[phase], 1e-3):>7.0f}"
        print(line)
    for server in servers:
        server.shutdown()


def free_port() -> int:
    """A free loopback port (closed again before haproxy binds it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def haproxy_version() -> str:
    done = subprocess.run(["haproxy", "-v"], capture_output=True, text=True, check=False)
    return done.stdout.split("\n")[0].split("version")[-1].split()[0] if done.stdout else "?"


if __name__ == "__main__":
    main()
