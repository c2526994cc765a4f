"""The relay on loopback: the host program's server and receiver (provision/host/relay.py) run here,
with real sockets and files; and the controller's routes (provision/relay.py), which are pure."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from provision import programs, relay
from provision.host import relay as host_relay

SIZE = 3 << 20


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Relay:
    """A relay server in a thread of this process, over `final` and `partial` under tmp_path."""

    def __init__(self, root: Path, files: dict[str, int], peers: int = 1, stall: float = 2) -> None:
        self.final, self.partial = root / "final", root / "partial"
        self.final.mkdir(parents=True)
        self.partial.mkdir(parents=True)
        self.spec = {"action": "serve", "final": str(self.final), "partial": str(self.partial), "suffix": ".part",
                     "files": files, "address": "127.0.0.1", "secret": "s3cret", "peers": peers, "idle": 30,
                     "stall": stall, "watch": False}  # in this process: no session of its own to watch
        self.port: int | None = None
        self.result: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.result = host_relay.serve(self.spec)

    def start(self, capsys: pytest.CaptureFixture[str]) -> str:
        self.thread.start()
        for _ in range(200):
            out = capsys.readouterr().out
            for line in filter(None, out.splitlines()):  # the blank lines are the relay's heartbeat
                event = json.loads(line)
                if event.get("event") == "serving":
                    self.port = int(event["port"])
            if self.port:
                return f"http://127.0.0.1:{self.port}/s3cret"
            time.sleep(0.01)
        raise AssertionError("the relay did not start")


def write_slowly(path: Path, data: bytes, step: int = 256 << 10, pause: float = 0.02, stop_at: int | None = None,
                 then: Path | None = None) -> threading.Thread:
    """A file arriving piece by piece (stopping at `stop_at`), renamed to `then` when whole."""
    def run() -> None:
        with path.open("wb") as handle:
            for offset in range(0, len(data), step):
                if stop_at is not None and offset >= stop_at:
                    return
                handle.write(data[offset:offset + step])
                handle.flush()
                time.sleep(pause)
        if then is not None:
            os.rename(path, then)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def data() -> Iterator[bytes]:
    yield os.urandom(SIZE)


def test_a_relay_passes_a_file_on_while_it_still_arrives(tmp_path: Path, data: bytes,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    server = Relay(tmp_path / "up", {"model.safetensors": SIZE})
    url = server.start(capsys)
    part = server.partial / "model.safetensors.part"
    writer = write_slowly(part, data, then=server.final / "model.safetensors")
    time.sleep(0.05)
    entry = {"path": "model.safetensors", "size": SIZE, "digest": sha256(data)}
    route = host_relay.Route([{"kind": "peer", "name": "up", "url": url}])
    started = time.monotonic()
    host_relay.receive(entry, str(tmp_path / "down.part"), route, host_relay.Progress(SIZE),
                       {"peer": host_relay.fetch_peer})
    writer.join()
    assert (tmp_path / "down.part").read_bytes() == data
    assert route.received == {"up": SIZE} and route.left == []
    # It began before the upstream copy was whole: 12 pieces 20 ms apart; a copy after it would start late.
    assert time.monotonic() - started < 5
    host_relay.tell_done(route.sources)
    server.thread.join(5)
    assert server.result["served_peers"] == 1 and server.result["sent"] == SIZE


def test_a_relay_that_stalls_is_left_for_the_next_source_which_resumes(tmp_path: Path, data: bytes,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    stalled = Relay(tmp_path / "stalled", {"model.safetensors": SIZE}, stall=0.5)
    good = Relay(tmp_path / "good", {"model.safetensors": SIZE}, stall=0.5)
    stalled_url, good_url = stalled.start(capsys), good.start(capsys)
    write_slowly(stalled.partial / "model.safetensors.part", data, pause=0, stop_at=SIZE // 2).join()
    (good.final / "model.safetensors").write_bytes(data)
    entry = {"path": "model.safetensors", "size": SIZE, "digest": sha256(data)}
    route = host_relay.Route([{"kind": "peer", "name": "stalled", "url": stalled_url, "stall": 0.5},
                              {"kind": "peer", "name": "good", "url": good_url, "stall": 0.5}])
    host_relay.receive(entry, str(tmp_path / "down.part"), route, host_relay.Progress(SIZE),
                       {"peer": host_relay.fetch_peer})
    assert (tmp_path / "down.part").read_bytes() == data
    # The half the stalled relay sent was kept; the next source sent only the rest.
    assert route.received == {"stalled": SIZE // 2, "good": SIZE - SIZE // 2}
    assert [step["source"] for step in route.left] == ["stalled"] and route.left[0]["next"] == "good"


def test_a_relay_sending_bad_bytes_is_caught_by_the_digest_and_left(tmp_path: Path, data: bytes,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Wheels: a relay's copy with one chunk corrupted fails its sha256 at the receiver, which throws the
    copy away and takes the file from the next source; only verified files take their name."""
    bad = bytearray(data)
    bad[SIZE // 3:SIZE // 3 + 4096] = os.urandom(4096)
    corrupt = Relay(tmp_path / "corrupt", {"w-1.0-py3-none-any.whl": SIZE})
    good = Relay(tmp_path / "good", {"w-1.0-py3-none-any.whl": SIZE})
    (corrupt.final / "w-1.0-py3-none-any.whl").write_bytes(bytes(bad))
    (good.final / "w-1.0-py3-none-any.whl").write_bytes(data)
    sources = [{"kind": "peer", "name": "corrupt", "url": corrupt.start(capsys)},
               {"kind": "peer", "name": "good", "url": good.start(capsys)}]
    directory = tmp_path / "wheels"
    report = host_relay.receive_files({"directory": str(directory), "sources": sources, "files": [
        {"path": "w-1.0-py3-none-any.whl", "size": SIZE, "digest": sha256(data)}]})
    assert (directory / "w-1.0-py3-none-any.whl").read_bytes() == data
    assert not (directory / "w-1.0-py3-none-any.whl.partial").exists()
    assert report["from"] == {"corrupt": SIZE, "good": SIZE} and report["rerouted"][0]["source"] == "corrupt"
    index = json.loads((directory / "MANIFEST.json").read_text())
    assert index == {"w-1.0-py3-none-any.whl": hashlib.sha256(data).hexdigest()}


def test_every_source_failing_keeps_the_part_for_the_next_run(tmp_path: Path, data: bytes) -> None:
    entry = {"path": "model.safetensors", "size": SIZE, "digest": sha256(data)}
    part = tmp_path / "down.part"
    part.write_bytes(data[:1000])  # what an earlier run left
    route = host_relay.Route([{"kind": "peer", "name": "gone", "url": "http://127.0.0.1:9/x", "stall": 1}])
    with pytest.raises(OSError, match="transfer broke off after 1000 of"):
        host_relay.receive(entry, str(part), route, host_relay.Progress(SIZE), {"peer": host_relay.fetch_peer})
    assert part.read_bytes() == data[:1000]


def test_a_part_file_the_full_disk_refuses_is_named_with_its_bytes(tmp_path: Path, data: bytes,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk can refuse the part file itself (the lab's cpu-1 hit it on a 0-byte
    special_tokens_map.json.part): the error names the file, what was received and that it is kept."""
    import builtins
    import errno

    entry = {"path": "special_tokens_map.json", "size": 414, "digest": sha256(data)}
    part = tmp_path / "special_tokens_map.json.part"
    real_open = builtins.open

    def full(path: object, mode: str = "r", *args: object, **kwargs: object) -> object:
        if str(path) == str(part) and "a" in mode:
            real_open(path, mode).close()  # the file is made, nothing goes into it
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, mode, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(builtins, "open", full)
    route = host_relay.Route([{"kind": "peer", "name": "hub", "url": "http://127.0.0.1:9/x", "stall": 1}])
    with pytest.raises(OSError) as refused:
        host_relay.receive(entry, str(part), route, host_relay.Progress(414), {"peer": host_relay.fetch_peer})
    assert str(refused.value) == (
        f"special_tokens_map.json: its part file {part} cannot be written (0 of 414 bytes received, kept for the "
        "next run to resume): OSError: [Errno 28] No space left on device")


def test_a_relay_chain_each_host_from_the_one_before_with_fallbacks_up_to_the_first() -> None:
    hosts = [f"h{n}" for n in range(1, 8)]
    routes = relay.upstreams(hosts, relay.RELAY)
    assert routes["h1"] == [] and routes["h2"] == ["h1"] and routes["h3"] == ["h2", "h1"]
    assert routes["h7"] == ["h6", "h5", "h4", "h1"]  # FALLBACKS nearest, then the first host
    counts = relay.downstream_counts(routes)
    assert counts["h1"] == 6 and counts["h6"] == 1 and "h7" not in counts  # h1 is everyone's last relay
    assert relay.upstreams(hosts[:3], relay.STAR) == {"h1": [], "h2": ["h1"], "h3": ["h1"]}
    assert relay.upstreams(hosts[:3], relay.HUB) == {"h1": [], "h2": [], "h3": []}
    assert relay.peer_sources("h3", routes, {"h1": "http://a/s"}) == [{"kind": "peer", "name": "h1", "url": "http://a/s"}]


def test_hosts_holding_it_all_head_the_chain_and_serve_before_the_origin() -> None:
    assert relay.routes_with_holders(["c"], relay.RELAY, ["a", "b"]) == {"c": ["b", "a"]}
    assert relay.routes_with_holders(["c", "d"], relay.RELAY, ["a"]) == {"c": ["a"], "d": ["c", "a"]}
    assert relay.routes_with_holders(["c", "d"], relay.STAR, ["a"]) == {"c": ["a"], "d": ["a"]}
    assert relay.routes_with_holders(["c"], relay.HUB, ["a"]) == {"c": []}


def test_wheels_enter_a_cluster_once_per_architecture_and_hosts_alone_get_their_own() -> None:
    from provision import venv

    wheel = venv.Wheel("w-1.0-py3-none-any.whl", "a" * 64, 10)
    missing = ((Path("/house") / wheel.name, wheel),)

    def job(host: str, group: str, address: str | None, transfer: str = "relay") -> venv.WheelJob:
        return venv.WheelJob(host, group, address, transfer, missing, {})

    jobs = [job("a", "c1 x86_64", "10.0.0.1"), job("b", "c1 x86_64", "10.0.0.2"), job("s", "c1 aarch64", "10.0.0.3"),
            job("c", "c1 x86_64", None), job("d", "c2 x86_64", "10.0.1.1", "hub"), job("e", "c2 x86_64", "10.0.1.2", "hub")]
    assert [[j.host for j in group] for group in venv.wheel_groups(jobs)] == [["a", "b"], ["s"], ["c"], ["d"], ["e"]]


def serve_spec(root: Path) -> dict[str, Any]:
    (root / "final").mkdir(parents=True)
    return {"action": "serve", "final": str(root / "final"), "partial": str(root / "partial"), "suffix": ".part",
            "files": {"model.safetensors": 10}, "address": "127.0.0.1", "secret": "s3cret", "peers": 1,
            "idle": 600}


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def ended(pid: int) -> bool:
    """Exited (a zombie no one reaped yet counts: it serves nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_until(predicate: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_a_relay_server_ends_soon_after_its_controllers_session_closes(tmp_path: Path) -> None:
    """The program as a host runs it (`python3 -` with the shipped text on stdin), its peer never
    saying done: once the controller's end of its stdout is gone (the SSH channel closed), it stops
    serving within seconds instead of idling for 600 s."""
    relay_server = subprocess.Popen([sys.executable, "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL)
    assert relay_server.stdin is not None and relay_server.stdout is not None
    relay_server.stdin.write(relay.program(serve_spec(tmp_path)).encode())
    relay_server.stdin.close()
    try:
        port = int(json.loads(relay_server.stdout.readline())["port"])
        assert listening(port)
        relay_server.stdout.close()  # the controller vanished
        relay_server.wait(timeout=5)
        assert not listening(port)
    finally:
        relay_server.kill()
        relay_server.wait()


def test_a_relay_server_ends_soon_after_the_process_that_started_it_is_killed(tmp_path: Path) -> None:
    """The session's process killed while the relay's stdout stays writable (here a file): the relay,
    handed to another parent, stops serving within seconds."""
    out = tmp_path / "relay.out"
    starter = ("import subprocess, sys; out = open(sys.argv[1], 'wb'); "
               "relay = subprocess.Popen([sys.executable, '-'], stdin=subprocess.PIPE, stdout=out); "
               "relay.stdin.write(sys.stdin.buffer.read()); relay.stdin.close(); "
               "print(relay.pid, flush=True); relay.wait()")
    parent = subprocess.Popen([sys.executable, "-c", starter, str(out)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    assert parent.stdin is not None and parent.stdout is not None
    parent.stdin.write(programs.ship(("relay",), "relay_main", serve_spec(tmp_path)).encode())
    parent.stdin.close()
    pid = int(parent.stdout.readline())
    try:
        assert wait_until(lambda: out.read_text().strip() != "", 10)
        port = int(json.loads(out.read_text().splitlines()[0])["port"])
        assert listening(port)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert wait_until(lambda: ended(pid), 5), "the relay still runs"
        assert not listening(port)
    finally:
        parent.stdout.close()
        if not ended(pid):
            os.kill(pid, signal.SIGKILL)
