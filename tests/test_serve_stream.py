"""Streamed answers read to their end (provision/host/serve.py's StreamReader), on streams recorded
from llama-server b11434 (the lab's build, through the lab-tiny endpoint): a request that answered
HTTP 200 and then failed inside its stream is a failed request, with the server's words."""
from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.host import serve

STREAMS = Path(__file__).parent / "fixtures" / "streams"


def read(name: str) -> serve.StreamReader:
    reader = serve.StreamReader()
    for line in (STREAMS / name).read_text().splitlines():
        reader.feed(line)
    return reader


def test_a_recorded_chat_and_completion_end_well_with_their_text() -> None:
    chat, completion = read("llamacpp-b11434-chat.txt"), read("llamacpp-b11434-completion.txt")
    assert chat.failure() is None and chat.done and chat.finish_reason == "length"
    assert chat.chunks == 4 and chat.text.startswith(" ten")
    assert completion.failure() is None and completion.text.startswith(" four") and completion.chunks == 4
    body = completion.as_body()
    assert body["model"] == "tiny-gguf" and body["choices"][0]["finish_reason"] == "length"


def test_an_error_inside_a_200_stream_is_a_failure_in_the_servers_words() -> None:
    """Eight clients' chats through lab-tiny at --ctx-size 256 shared by four slots: tokens, then the
    error chunk, and no [DONE]."""
    exceeded = read("llamacpp-b11434-chat-context-exceeded.txt")
    assert exceeded.chunks >= 1 and not exceeded.done
    assert exceeded.failure() == ("error in the stream after HTTP 200: HTTP 500 Context size has been exceeded.")


def test_vllm_sends_its_error_and_then_done_which_is_still_a_failure() -> None:
    """vLLM 0.32's completion stream: create_streaming_error_response (an ErrorResponse: {"error":
    {"message", "type", "param", "code"}}) and then "data: [DONE]" (entrypoints/openai/completion/
    serving.py); before 0.10 the chunk was {"object": "error", "message": ...}."""
    reader = serve.StreamReader()
    for line in ['data: {"id":"cmpl-1","object":"text_completion","model":"m","choices":[{"index":0,"text":" a"}]}',
                 ('data: {"error": {"message": "Internal server error", "type": "InternalServerError", '
                 '"param": null, "code": 500}}'), "data: [DONE]"]:
        reader.feed(line)
    assert reader.done and reader.failure() == "error in the stream after HTTP 200: HTTP 500 Internal server error"
    old = serve.StreamReader()
    old.feed('data: {"object": "error", "message": "boom", "type": "BadRequestError", "code": 400}')
    assert old.failure() == "error in the stream after HTTP 200: boom"


def test_a_stream_cut_before_its_end_is_a_failure_and_a_finish_reason_of_abort_too() -> None:
    lines = (STREAMS / "llamacpp-b11434-completion.txt").read_text().splitlines()
    cut = serve.StreamReader()
    for line in lines[:3]:  # a server killed after its first tokens
        cut.feed(line)
    assert cut.failure() == "the stream was cut: no finish reason and no [DONE] after 2 chunk(s)"
    aborted = serve.StreamReader()
    aborted.feed('data: {"choices":[{"text":"","finish_reason":"abort"}]}')
    aborted.feed("data: [DONE]")
    assert aborted.failure() == "the stream ended with finish reason 'abort' after 0 chunk(s)"
    garbled = serve.StreamReader()
    garbled.feed("data: <html>502 Bad Gateway</html>")
    assert "not a JSON object" in (garbled.failure() or "")


def test_failed_requests_are_counted_by_reason_most_frequent_first() -> None:
    assert serve.counted(["b", "a", "b", "c", "b", "a"]) == ["3 x b", "2 x a", "c"]
    assert serve.counted([]) == []


class _Replaying(http.server.BaseHTTPRequestHandler):
    """A server answering every POST with HTTP 200 and a recorded stream (`stream` on the server)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = self.server.stream.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def replaying() -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Replaying)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def _spec(server: http.server.ThreadingHTTPServer, **extra: object) -> dict[str, object]:
    return {"base": f"http://127.0.0.1:{server.server_address[1]}", "model": "tiny-gguf", "api_key": None,
            "metrics_path": None, **extra}


def test_bench_ask_and_readiness_count_an_error_inside_a_200_as_a_failed_request(
        replaying: http.server.ThreadingHTTPServer) -> None:
    replaying.stream = (STREAMS / "llamacpp-b11434-chat-context-exceeded.txt").read_text()
    benched = serve.bench(_spec(replaying, count=6, concurrency=3, max_tokens=16))
    assert not benched["ok"] and benched["succeeded"] == 0 and benched["failed"] == 6
    assert benched["errors"] == ["6 x error in the stream after HTTP 200: HTTP 500 Context size has been exceeded."]
    asked = serve.ask(_spec(replaying, prompt="Hello", max_tokens=16, timeout=10))
    assert asked == {"ok": False, "error": "error in the stream after HTTP 200: HTTP 500 Context size has been exceeded."}
    ready = serve.ready(_spec(replaying, timeout=3))
    assert not ready["ok"] and "Context size has been exceeded" in ready["error"], ready


def test_bench_and_ask_read_a_good_stream_whole(replaying: http.server.ThreadingHTTPServer) -> None:
    replaying.stream = (STREAMS / "llamacpp-b11434-completion.txt").read_text()
    benched = serve.bench(_spec(replaying, count=4, concurrency=2, max_tokens=4))
    assert benched["ok"] and benched["succeeded"] == 4 and benched["failed"] == 0 and benched["errors"] == []
    assert len(benched["ttft_s"]) == 4 and len(benched["itl_s"]) == 4 * 3
    asked = serve.ask(_spec(replaying, prompt="Hello", max_tokens=4, timeout=10))
    assert asked["ok"] and json.dumps(asked["body"]).count("four") == 1
    assert asked["body"]["choices"][0]["finish_reason"] == "length"
