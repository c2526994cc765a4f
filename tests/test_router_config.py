"""The router's config as the tool renders it (render.router_config), run by a real haproxy here in
front of small HTTP servers that say which replica answered: routing by the model a request names (404
for one not served), the body limit (413, declared or sent in chunks), the timeouts (408, 504), and the
buffer trap: a model named after a long "messages" array, as the OpenAI client writes it, still routes.
"""
from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import Any

import pytest

from provision import endpoints, render
from tests.fakes import JsonAnswers

KEY = "test-key-1"


def read_body(handler: JsonAnswers) -> bytes:
    """The request's body, whether HAProxy forwards it with a length or in chunks."""
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        data = b""
        while size := int(handler.rfile.readline().strip() or b"0", 16):
            data += handler.rfile.read(size)
            handler.rfile.readline()
        handler.rfile.readline()
        return data
    return handler.rfile.read(int(handler.headers.get("Content-Length", 0)))


class Server(ThreadingHTTPServer):
    """A replica: answers which one it is, the model it was asked for and the body's length; records
    each request's "id"."""

    def __init__(self, name: str) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.name = name
        self.seen: list[Any] = []

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the router gave up on a slow answer (504): the write fails, as it should


class Handler(JsonAnswers):
    server: Server

    def do_GET(self) -> None:
        self.answer(200, {"replica": self.server.name, "path": self.path})

    def do_POST(self) -> None:
        data = read_body(self)
        try:
            body = json.loads(data)
        except ValueError:
            body = {}  # a body not JSON: the limit's tests send bare bytes
        self.server.seen.append(body.get("id"))
        time.sleep(float(body.get("sleep", 0)))
        self.answer(200, {"replica": self.server.name, "model": body.get("model"), "length": len(data)})


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Router:
    ports: dict[str, int]  # endpoint name -> port
    servers: dict[str, Server]
    plans: dict[str, endpoints.EndpointPlan]

    def post(self, endpoint: str, body: dict[str, Any] | bytes, *, key: str | None = KEY,
             path: str = "/v1/chat/completions") -> tuple[int, dict[str, Any]]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        return self.ask(endpoint, "POST", path, data, headers)

    def ask(self, endpoint: str, method: str, path: str, data: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
        connection = http.client.HTTPConnection("127.0.0.1", self.ports[endpoint], timeout=30)
        try:
            connection.request(method, path, body=data, headers=headers or {"Authorization": f"Bearer {KEY}"})
            response = connection.getresponse()
            return response.status, json.loads(response.read())
        finally:
            connection.close()


def replicas(servers: dict[str, Server], *names_models: tuple[str, str]) -> tuple[endpoints.Replica, ...]:
    return tuple(endpoints.Replica(name, "here", "127.0.0.1", servers[name].server_address[1], model)
                 for name, model in names_models)


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    binary = shutil.which("haproxy")
    if binary is None:
        pytest.fail("haproxy is not installed here: these tests run a real one "
                    "(apt-get install -y haproxy, as the project's first command does)")
    servers = {name: Server(name) for name in ("alpha-1", "alpha-2", "beta-1", "quick-1")}
    for server in servers.values():
        threading.Thread(target=server.serve_forever, daemon=True).start()
    ports = {name: free_port() for name in ("models", "quick")}
    plans = {
        # Two models, the first with two replicas: the default limits and timeouts.
        "models": endpoints.EndpointPlan("models", "here", "127.0.0.1", ports["models"], 60.0, replicas(
            servers, ("alpha-1", "alpha"), ("alpha-2", "alpha"), ("beta-1", "beta"))),
        # The timeouts at a second, to see them strike.
        "quick": endpoints.EndpointPlan("quick", "here", "127.0.0.1", ports["quick"], 60.0, replicas(
            servers, ("quick-1", "alpha")), request_timeout=1.0, receive_timeout=1.0),
    }
    directory = tmp_path_factory.mktemp("router")
    (directory / endpoints.KEYS_CREDENTIAL).write_text(KEY + "\n", encoding="utf-8")
    admin = directory / "admin.sock"
    config = directory / "haproxy.cfg"
    config.write_text(render.router_config("here", list(plans.values()), keys=True, admin_socket=str(admin)),
                      encoding="utf-8")
    log = directory / "haproxy.log"
    with log.open("w", encoding="utf-8") as output:
        process = subprocess.Popen([binary, "-f", str(config)], stdout=output, stderr=subprocess.STDOUT,
                                   env={**os.environ, "CREDENTIALS_DIRECTORY": str(directory)})
    try:
        deadline = time.monotonic() + 10
        while not admin.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"haproxy did not start: {log.read_text(encoding='utf-8')}")
            time.sleep(0.05)
        yield Router(ports, servers, plans)
    finally:
        process.terminate()
        process.wait(timeout=10)
        for server in servers.values():
            server.shutdown()
            server.server_close()


def chat(model: str | None, *, history: int = 0, **extra: Any) -> dict[str, Any]:
    """A chat request as the OpenAI Python client writes it: "messages" first, "model" after them."""
    messages = [{"role": "system", "content": "You are terse."}] + [
        {"role": "user", "content": f"turn {index}: " + "x" * 1000} for index in range(history)]
    return {"messages": messages, **({"model": model} if model is not None else {}), "max_tokens": 8, **extra}


# -- routing by model ---------------------------------------------------------------------------

def test_a_request_goes_to_the_replicas_of_the_model_it_names(router: Router) -> None:
    assert {router.post("models", chat("alpha", id=i))[1]["replica"] for i in range(6)} == {"alpha-1", "alpha-2"}
    assert router.post("models", chat("beta"))[1]["replica"] == "beta-1"


def test_a_request_naming_no_model_goes_to_the_first_models_replicas(router: Router) -> None:
    assert router.post("models", chat(None))[1]["replica"].startswith("alpha-")
    assert router.post("models", chat(""))[1]["replica"].startswith("alpha-")  # an empty name: none
    status, answer = router.ask("models", "GET", "/v1/models")
    assert status == 200 and answer["replica"].startswith("alpha-") and answer["path"] == "/v1/models"


def test_a_model_not_served_here_gets_404_naming_those_served(router: Router) -> None:
    status, answer = router.post("models", chat("gamma"))
    assert status == 404
    assert answer == {"error": {"message": "the model 'gamma' is not served here; served: alpha, beta",
                                "type": "invalid_request_error", "code": "model_not_found"}}
    # The name is the client's: escaped into the JSON, cut to 200 bytes.
    status, answer = router.post("models", chat('a"b\\c\n' + "z" * 300))
    assert status == 404
    assert answer["error"]["message"].startswith("the model 'a\"b\\c\n" + "z" * 194 + "' is not served")
    status, answer = router.post("models", {"model": 7, "prompt": "hi"}, path="/v1/completions")
    assert (status, answer["error"]["code"]) == (404, "model_not_found")


def test_the_model_named_after_a_long_conversation_still_routes(router: Router) -> None:
    """The buffer trap: HAProxy's json_query sees only what is in its buffer (16 kB by default, where
    this request went to the first model's replicas). The buffer holds the largest body allowed."""
    for history in (100, 1900):  # ~100 kB and ~1.9 MiB of messages before "model"
        body = json.dumps(chat("beta", history=history)).encode()
        assert body.index(b'"model"') > history * 1000
        status, answer = router.post("models", body)
        assert (status, answer["replica"], answer["length"]) == (200, "beta-1", len(body))


def test_the_api_key_is_asked_before_anything_else(router: Router) -> None:
    status, answer = router.post("models", chat("gamma"), key="wrong")
    assert status == 401 and answer["error"]["code"] == "invalid_api_key"


# -- the body limit -----------------------------------------------------------------------------

def send_large(port: int, size: int, *, chunked: bool) -> tuple[int, dict[str, Any], float]:
    """`size` bytes of body sent while the answer is read, as curl and httpx (the OpenAI client's) do;
    the status, the answer's JSON and the seconds it took."""
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nAuthorization: Bearer {KEY}\r\n"
            "Content-Type: application/json\r\n"
            + ("Transfer-Encoding: chunked\r\n\r\n" if chunked else f"Content-Length: {size}\r\n\r\n"))
    piece = b"x" * 65536

    def send(connection: socket.socket) -> None:
        try:
            for _ in range(size // len(piece)):
                connection.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            if chunked:
                connection.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # the router answered and closed before the rest: what is tested

    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        started = time.monotonic()
        connection.sendall(head.encode())
        sender = threading.Thread(target=send, args=(connection,), daemon=True)
        sender.start()
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < _length(answer):
            data = connection.recv(65536)
            if not data:
                break
            answer += data
        took = time.monotonic() - started
        sender.join(timeout=10)
    head_part, _, body = answer.partition(b"\r\n\r\n")
    return int(head_part.split()[1]), json.loads(body), took


def _length(answer: bytes) -> int:
    for line in answer.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 1 << 30


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_past_the_limit_gets_413_at_once(router: Router, chunked: bool) -> None:
    status, answer, took = send_large(router.ports["models"], 10_000_000, chunked=chunked)
    assert status == 413 and took < 2, (status, took)
    assert answer == {"error": {"message": "the request body is larger than this endpoint takes "
                                           "(2 MiB: max_body_mb)",
                                "type": "invalid_request_error", "code": "request_too_large"}}
    limit = router.plans["models"].body_limit
    status, answer, _ = send_large(router.ports["models"], limit + 65536, chunked=chunked)
    assert status == 413  # just past it: a chunked one fills the buffer past the limit
    status, answer, _ = send_large(router.ports["models"], limit, chunked=chunked)
    assert status == 200 and answer["length"] == limit  # the limit itself passes (not JSON: no model)


def test_headers_past_32_kb_get_431(router: Router) -> None:
    status, answer = router.ask("models", "GET", "/v1/models",
                                headers={"Authorization": f"Bearer {KEY}", "X-Big": "a" * 40_000})
    assert (status, answer["error"]["code"]) == (431, "headers_too_large")


# -- the timeouts -------------------------------------------------------------------------------

def test_a_client_that_sends_its_body_too_slowly_gets_408(router: Router) -> None:
    with socket.create_connection(("127.0.0.1", router.ports["quick"]), timeout=10) as connection:
        started = time.monotonic()
        connection.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nAuthorization: Bearer {KEY}"
                           "\r\nContent-Length: 100\r\n\r\n{\"model\": ".encode())
        answer = connection.recv(65536)
        took = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert 0.9 < took < 2.5, took  # receive_timeout: 1 s
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == "request_timeout"


def test_a_silent_replica_gets_504_after_request_timeout_and_no_retry(router: Router) -> None:
    started = time.monotonic()
    status, answer = router.post("quick", chat("alpha", sleep=2.5, id="silent"))
    took = time.monotonic() - started
    assert (status, answer["error"]["code"]) == (504, "timeout")
    assert 0.9 < took < 2.0, took  # request_timeout: 1 s, once: not again on another try
    assert router.servers["quick-1"].seen.count("silent") == 1


# -- what the config is rendered from -----------------------------------------------------------

def test_the_buffer_holds_the_largest_body_of_the_routers_endpoints_and_times_read_as_haproxys() -> None:
    small = endpoints.EndpointPlan("a", "h", "127.0.0.1", 9000, 60.0, (), max_body_mb=0.5)
    large = endpoints.EndpointPlan("b", "h", "127.0.0.1", 9001, 60.0, (), max_body_mb=8)
    assert endpoints.buffer_size([small, large]) == 8 * endpoints.MIB + endpoints.HEADER_ROOM
    assert endpoints.buffer_size([small]) == endpoints.MIB // 2 + endpoints.HEADER_ROOM
    assert [endpoints.haproxy_time(s) for s in (900, 900.0, 0.5, 1.25)] == ["900s", "900s", "500ms", "1250ms"]
