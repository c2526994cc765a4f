"""The router's config as the tool renders it (render.router_config), run by a real haproxy here in
front of small HTTP servers that say which replica answered: routing by the model a request names (404
for one not served), the body limit (413, declared or sent in chunks), the timeouts (408, 504), and the
buffer trap: a model named after a long "messages" array, as the OpenAI client writes it, still routes.
"""
from __future__ import annotations

import dataclasses
import http.client
import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from provision import endpoints, render
from tests.fakes import JsonAnswers
from tests.test_router_host import free_port, haproxy_binary

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

    def __init__(self, name: str, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), Handler)
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


@dataclass
class Router:
    ports: dict[str, int]  # endpoint name -> port
    servers: dict[str, Server]
    plans: dict[str, endpoints.EndpointPlan]
    admin: Path  # the runtime API's socket

    def state(self, backend: str, server: str) -> str:
        """The server's status as `show stat` says it (UP, DOWN, "DOWN 1/2", MAINT...)."""
        with socket.socket(socket.AF_UNIX) as connection:
            connection.connect(str(self.admin))
            connection.sendall(b"show stat\n")
            text = b""
            while data := connection.recv(65536):
                text += data
        for line in text.decode().splitlines():
            fields = line.split(",")
            if fields[:2] == [backend, server]:
                return fields[17]
        raise AssertionError(f"no server {backend}/{server} in: {text.decode()}")

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
    binary = haproxy_binary()
    servers = {name: Server(name) for name in ("alpha-1", "alpha-2", "beta-1", "quick-1", "aff-1", "aff-2",
                                                "down-1", "down-2")}
    for server in servers.values():
        threading.Thread(target=server.serve_forever, daemon=True).start()
    ports = {name: free_port() for name in ("models", "quick", "affinity", "affinity-down")}
    plans = {
        # Two models, the first with two replicas: the default limits and timeouts.
        "models": endpoints.EndpointPlan("models", "here", "127.0.0.1", ports["models"], 60.0, replicas(
            servers, ("alpha-1", "alpha"), ("alpha-2", "alpha"), ("beta-1", "beta"))),
        # The timeouts at a second, to see them strike.
        "quick": endpoints.EndpointPlan("quick", "here", "127.0.0.1", ports["quick"], 60.0, replicas(
            servers, ("quick-1", "alpha")), request_timeout=1.0, receive_timeout=1.0),
        # A model's two replicas by prefix (its second model's one replica: nothing to pick).
        "affinity": endpoints.EndpointPlan("affinity", "here", "127.0.0.1", ports["affinity"], 60.0, replicas(
            servers, ("aff-1", "alpha"), ("aff-2", "alpha"), ("beta-1", "beta")), routing="prefix-affinity"),
        # The same, for the test that takes a replica down.
        "affinity-down": endpoints.EndpointPlan("affinity-down", "here", "127.0.0.1", ports["affinity-down"], 60.0,
                                                replicas(servers, ("down-1", "alpha"), ("down-2", "alpha")),
                                                routing="prefix-affinity"),
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
        yield Router(ports, servers, plans, admin)
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


def test_an_idle_kept_alive_connection_is_closed_after_receive_timeout(router: Router) -> None:
    with socket.create_connection(("127.0.0.1", router.ports["quick"]), timeout=10) as connection:
        connection.sendall(f"GET /v1/models HTTP/1.1\r\nHost: router\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode())
        assert connection.recv(65536).split(b" ")[1] == b"200"
        started = time.monotonic()
        assert connection.recv(65536) == b""  # closed by the router, without a 408: nothing was asked
        assert 0.9 < time.monotonic() - started < 2.5  # receive_timeout: 1 s


def test_a_silent_replica_gets_504_after_request_timeout_and_no_retry(router: Router) -> None:
    started = time.monotonic()
    status, answer = router.post("quick", chat("alpha", sleep=2.5, id="silent"))
    took = time.monotonic() - started
    assert (status, answer["error"]["code"]) == (504, "timeout")
    assert 0.9 < took < 2.0, took  # request_timeout: 1 s, once: not again on another try
    assert router.servers["quick-1"].seen.count("silent") == 1


# -- what the config is rendered from -----------------------------------------------------------

def test_least_connections_is_the_default_and_prefix_affinity_hashes_where_there_is_a_choice() -> None:
    plan = endpoints.EndpointPlan("e", "h", "127.0.0.1", 9000, 60.0, (
        endpoints.Replica("a1", "h", "10.0.0.1", 8000, "a"), endpoints.Replica("a2", "h", "10.0.0.2", 8000, "a"),
        endpoints.Replica("b1", "h", "10.0.0.3", 8000, "b")))
    backends = render.router_config("h", [plan], keys=False).split("\nbackend ")[1:]
    assert ["balance leastconn" in text for text in backends] == [True, True]
    affinity = dataclasses.replace(plan, routing="prefix-affinity")
    backends = render.router_config("h", [affinity], keys=False).split("\nbackend ")[1:]
    assert ["balance hash var(txn.prefix)" in text and "hash-type consistent" in text for text in backends] == [
        True, False]
    assert "balance leastconn" in backends[1]  # one replica: nothing to pick


def test_the_buffer_holds_the_largest_body_of_the_routers_endpoints_and_times_read_as_haproxys() -> None:
    small = endpoints.EndpointPlan("a", "h", "127.0.0.1", 9000, 60.0, (), max_body_mb=0.5)
    large = endpoints.EndpointPlan("b", "h", "127.0.0.1", 9001, 60.0, (), max_body_mb=8)
    assert endpoints.buffer_size([small, large]) == 8 * endpoints.MIB + endpoints.HEADER_ROOM
    assert endpoints.buffer_size([small]) == endpoints.MIB // 2 + endpoints.HEADER_ROOM
    assert [endpoints.haproxy_time(s) for s in (900, 900.0, 0.5, 1.25)] == ["900s", "900s", "500ms", "1250ms"]


# -- prefix affinity ----------------------------------------------------------------------------

SYSTEM = "You are a careful assistant. Answer in one short sentence, and never make anything up."


def conversation(number: int, turns: int, *, system: bool = True) -> list[dict[str, Any]]:
    """The messages of conversation `number` at turn `turns` (1: its first question): its own first
    question, then each answer and the next question, as a chat client resends them."""
    messages = [{"role": "system", "content": SYSTEM}] if system else []
    for turn in range(turns):
        if turn:
            messages.append({"role": "assistant", "content": f"answer {turn - 1} of conversation {number}"})
        messages.append({"role": "user", "content": f"conversation {number}, question {turn}: why is the sky blue?"})
    return messages


def order(count: int, turn: int) -> list[int]:
    """0 .. count-1 rotated by the turn, every other turn backwards."""
    numbers = [(number + turn) % count for number in range(count)]
    return numbers[::-1] if turn % 2 else numbers


@pytest.mark.parametrize("system", [True, False], ids=["a-shared-system-prompt", "no-system-prompt"])
def test_a_conversations_turns_stay_on_one_replica_and_conversations_spread(router: Router, system: bool) -> None:
    """Thirteen conversations sharing one system prompt (or none), four turns each, the history
    growing, taken in another order each turn (least connections, which alternates between idle
    replicas, would move them): every turn of one goes where its first went, and the thirteen use
    both replicas."""
    placed: dict[int, set[str]] = {}
    for turn in range(1, 5):
        for number in order(13, turn):
            status, answer = router.post("affinity", {"messages": conversation(number, turn, system=system),
                                                      "model": "alpha", "stream": True})
            assert status == 200
            placed.setdefault(number, set()).add(answer["replica"])
    assert all(len(replicas) == 1 for replicas in placed.values()), placed
    assert set().union(*placed.values()) == {"aff-1", "aff-2"}, placed


def test_a_parts_list_content_and_a_completions_prompt_are_hashed_too(router: Router) -> None:
    def parts(number: int, turns: int) -> list[dict[str, Any]]:
        return [{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]}
                for m in conversation(number, turns)]

    placed: dict[str, set[str]] = {}
    for turn in range(1, 4):
        for number in order(13, turn):
            placed.setdefault(f"parts {number}", set()).add(
                router.post("affinity", {"messages": parts(number, turn), "model": "alpha"})[1]["replica"])
            # A raw prompt grows as a conversation does; its first 1,024 bytes are its key.
            prompt = f"Document {number}: " + "lorem ipsum " * 100 + "".join(
                f"\nQ{t}: why?\nA{t}: because." for t in range(turn))
            placed.setdefault(f"prompt {number}", set()).add(router.post(
                "affinity", {"model": "alpha", "prompt": prompt, "max_tokens": 8}, path="/v1/completions")[1]["replica"])
    assert all(len(replicas) == 1 for replicas in placed.values()), placed
    for kind in ("parts", "prompt"):
        assert set().union(*(r for key, r in placed.items() if key.startswith(kind))) == {"aff-1", "aff-2"}, placed


def test_a_replica_down_moves_only_its_own_conversations_and_they_come_back(router: Router) -> None:
    """Consistent hashing: when its health check takes a replica out, its conversations go to the
    other, the other's stay where they were; when it is back, its own return to it."""
    def places() -> dict[int, str]:
        return {number: router.post("affinity-down", {"messages": conversation(number, 2), "model": "alpha"})[1][
            "replica"] for number in range(12)}

    before = places()
    assert set(before.values()) == {"down-1", "down-2"}, before
    stopped = router.servers["down-1"]
    port = stopped.server_address[1]
    stopped.shutdown()
    stopped.server_close()
    during = places()  # answered all the same: refused connections are retried on the other replica
    assert set(during.values()) == {"down-2"}
    wait_for(lambda: router.state("affinity-down-1", "down-1").startswith("DOWN"))
    assert places() == {number: "down-2" for number in range(12)}
    back = Server("down-1", port)
    threading.Thread(target=back.serve_forever, daemon=True).start()
    router.servers["down-1"] = back
    wait_for(lambda: router.state("affinity-down-1", "down-1") == "UP")
    assert places() == before


def wait_for(condition: Any, seconds: float = 15) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the router's health checks never got there"
        time.sleep(0.1)
