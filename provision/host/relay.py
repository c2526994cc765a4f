"""Passing files on ON the host: serve what this host holds or is still receiving, receive from a list
of sources with the next one taking over. Shipped ahead of weights.py (which receives models with it)
and run alone through relay_main (every relay server; receiving wheels); standard library only.

A relay serves a file while its own copy is still arriving: a range past the bytes on disk waits for
them (up to `stall` seconds without growth), so a chain of hosts moves one copy at the speed of its
slowest link instead of one copy per hop. Every host hashes each file it received on its own disk; a
relay that stops answering or sends bytes that fail the digest is left for the next source in the list
(its own upstream, then the origin), resuming the kept part file.

    {"action": "serve", "final": DIR, "partial": DIR, "suffix": ".part", "files": {NAME: SIZE},
     "address": ADDR, "secret": S, "peers": N, "idle": 120, "stall": 20, "watch": true}
    {"action": "receive", "directory": DIR, "files": [{"path", "size", "digest": "sha256:HEX"}],
     "sources": [{"kind": "peer", "name": HOST, "url": URL, "stall": 20}], "index": "MANIFEST.json"}
"""
from __future__ import annotations

import http.client
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

from provision.host.common import emit, make_directories, sha256_of, write_atomically

STALL = 20  # seconds a relay waits for its own copy to grow, and a receiver for the relay to answer
HEARTBEAT = 1.0  # seconds between a relay server's checks that the controller's session is still there


class Progress:
    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.fetched = 0
        self.last = 0.0
        self.lock = threading.Lock()

    def add(self, count: int, fetched: bool = True) -> None:
        with self.lock:
            self.done += count
            if fetched:
                self.fetched += count
            now = time.time()
            if now - self.last >= 0.3 or self.done >= self.total:
                self.last = now
                emit("progress", done=self.done, total=self.total)


class Sink:
    """Where a transfer's bytes go: the part file, the progress, and the bytes per source."""

    def __init__(self, handle: BinaryIO, progress: Progress, route: Route) -> None:
        self._handle = handle
        self.progress = progress
        self.route = route

    def write(self, data: bytes | memoryview) -> int:
        written = self._handle.write(data)
        self.progress.add(len(data))
        self.route.count(len(data))
        return written

    def restart(self) -> None:
        """The source ignored the range: start the file over."""
        kept = self._handle.tell()
        self._handle.seek(0)
        self._handle.truncate()
        self.progress.add(-kept, fetched=False)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)


class Route:
    """The sources of one host's transfer, nearest first; the current one until it fails."""

    def __init__(self, sources: Sequence[Mapping[str, Any]]) -> None:
        if not sources:
            raise ValueError("a transfer needs at least one source")
        self.sources = list(sources)
        self.index = 0
        self.received: dict[str, int] = {}
        self.left: list[dict[str, str]] = []

    @property
    def current(self) -> Mapping[str, Any]:
        return self.sources[self.index]

    def name(self, source: Mapping[str, Any] | None = None) -> str:
        source = source or self.current
        return str(source.get("name") or source["kind"])

    def count(self, received: int) -> None:
        key = self.name()
        self.received[key] = self.received.get(key, 0) + received

    def leave(self, why: str) -> bool:
        """Go on with the next source; False when this was the last one."""
        if self.index + 1 >= len(self.sources):
            return False
        before = self.name()
        self.index += 1
        self.left.append({"source": before, "why": why, "next": self.name()})
        emit("rerouted", source=before, why=why, next=self.name())
        return True


def fetch_peer(source: Mapping[str, Any], entry: Mapping[str, Any], sink: Sink, resume: int) -> None:
    """The file from a relay, by HTTP range from `resume`; a short answer is an error (the caller resumes)."""
    import urllib.request
    from urllib.parse import quote

    request = urllib.request.Request(str(source["url"]).rstrip("/") + "/" + quote(entry["path"]))
    if resume:
        request.add_header("Range", f"bytes={resume}-")
    with urllib.request.urlopen(request, timeout=source.get("stall", STALL) + 10) as response:
        if resume and response.status != 206:
            sink.restart()
            resume = 0
        buffer = memoryview(bytearray(1 << 20))  # one buffer for the whole file: no allocation per block
        while True:
            count = response.readinto(buffer)
            if not count:
                break
            sink.write(buffer[:count])
            resume += count
    if resume < entry["size"]:
        raise OSError(f"the relay stopped after {resume} of {entry['size']} bytes")


if TYPE_CHECKING:  # a name for annotations only: collections.abc.Callable[...] fails on Python 3.7 at run time
    Fetcher = Callable[[Mapping[str, Any], Mapping[str, Any], Sink, int], None]


def receive(entry: Mapping[str, Any], part: str, route: Route, progress: Progress,
            fetchers: Mapping[str, Fetcher]) -> None:
    """One file into its part file from the route's sources, resuming what is kept. Raises OSError
    when the last source failed too (the part file is kept). The caller hashes the file on disk: what
    is served from it is what was written, not what the network delivered."""
    try:  # a full disk refuses the part file itself (a 0-byte file is made, then nothing is written)
        make_directories(os.path.dirname(part))
        if os.path.exists(part) and os.path.getsize(part) > entry["size"]:
            os.remove(part)
        opened = open(part, "ab")  # noqa: SIM115  closed by the with below, once it is known to open
    except OSError as exc:
        kept = os.path.getsize(part) if os.path.exists(part) else 0
        raise OSError(f"{entry['path']}: its part file {part} cannot be written ({kept} of {entry['size']} "
                      f"bytes received, kept for the next run to resume): {_short(exc)}") from exc
    with opened as handle:
        sink = Sink(handle, progress, route)
        progress.add(handle.tell(), fetched=False)
        while True:
            have = handle.tell()
            if have >= entry["size"] and entry["size"] > 0:
                return
            try:
                fetchers[route.current["kind"]](route.current, entry, sink, have)
                handle.flush()
                if handle.tell() >= entry["size"]:
                    return
                raise OSError(f"{route.name()} ended after {handle.tell()} of {entry['size']} bytes")
            except Exception as exc:  # the transport's own errors (hub, relay): the next source resumes
                try:
                    handle.flush()
                except OSError:
                    pass  # a full disk refuses the rest of the buffer too; what reached the file stays
                why = _short(exc)
                if not route.leave(f"{entry['path']}: {why}"):
                    raise OSError(f"{entry['path']}: transfer broke off after {os.path.getsize(part)} of "
                                  f"{entry['size']} bytes (kept for the next run to resume): {why}") from exc


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


def watch_controller(gone: threading.Event, interval: float = HEARTBEAT) -> threading.Thread:
    """Set `gone` once the session that started this program is over: its SSH channel closed (sshd
    then closes the pipe of our stdout, and a write to it fails) or its process gone (we are handed to
    another parent). stdin tells nothing: `python3 -` read it to its end before running the program.
    An empty line is what the controller's reader skips (programs.run reads JSON lines)."""
    parent = os.getppid()

    def run() -> None:
        while not gone.is_set():
            try:
                sys.stdout.write("\n")
                sys.stdout.flush()
            except (OSError, ValueError):
                gone.set()
                return
            if os.getppid() != parent:
                gone.set()
                return
            time.sleep(interval)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def serve(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Serve the named files to the cluster's other hosts, finished or still arriving, until each
    host that may ask said it is done, nobody asked for `idle` seconds, or the controller's session
    that started it is gone (watch_controller: a relay never outlives the run)."""
    from http.server import BaseHTTPRequestHandler, HTTPServer
    from socketserver import TCPServer, ThreadingMixIn
    from urllib.parse import unquote

    sizes: dict[str, int] = {str(k): int(v) for k, v in spec["files"].items()}
    prefix = "/" + spec["secret"] + "/"
    stall = float(spec.get("stall", STALL))
    state: dict[str, float] = {"done": 0, "last": time.time(), "sent": 0}
    guard = threading.Lock()

    def touch(sent: int = 0) -> None:
        with guard:
            state["last"] = time.time()
            state["sent"] += sent

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            touch()
            path = unquote(self.path)
            if not path.startswith(prefix):
                self.send_error(404)
                return
            name = path[len(prefix):]
            if name == "_done":
                with guard:
                    state["done"] += 1
                self.send_response(204)
                self.end_headers()
                return
            if name not in sizes:
                self.send_error(404)
                return
            handle = _open_growing(spec, name, time.time() + stall)
            if handle is None:
                self.send_error(404)
                return
            with handle:
                self._send(spec, name, handle, sizes[name])

        def _send(self, spec: Mapping[str, Any], name: str, handle: BinaryIO, size: int) -> None:
            start = 0
            ranged = self.headers.get("Range", "")
            if ranged.startswith("bytes=") and ranged[6:].rstrip("-").isdigit():
                start = min(int(ranged[6:].rstrip("-")), size)
            self.send_response(206 if ranged else 200)
            self.send_header("Content-Length", str(size - start))
            if ranged:
                self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
            self.end_headers()
            self.wfile.flush()
            sent, grew = start, time.time()
            while sent < size:
                # The kernel copies from the page cache to the socket (sendfile): no byte passes
                # through Python, which matters when every host of a chain relays on its way.
                count = os.sendfile(self.connection.fileno(), handle.fileno(), sent, min(8 << 20, size - sent))
                if count:
                    sent += count
                    grew = time.time()
                    touch(count)
                    continue
                # At the end of what has arrived here: wait for more, unless this copy stalled or was
                # set aside (a failed digest): the receiver then goes on from another source.
                if time.time() - grew > stall or not _still_arriving(spec, name, handle):
                    self.close_connection = True
                    return
                touch()
                time.sleep(0.02)

    class Server(ThreadingMixIn, HTTPServer):
        daemon_threads = True

        def server_bind(self) -> None:
            # HTTPServer's own asks DNS for the address's name (socket.getfqdn): seconds lost on hosts
            # whose resolver does not answer for cluster addresses, before a single byte is served.
            TCPServer.server_bind(self)
            self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    server = Server((spec["address"], 0), Handler)
    server.timeout = 0.05  # how soon the last host's "done" (counted in its request's thread) ends the loop
    emit("serving", port=server.server_address[1])
    gone = threading.Event()
    if spec.get("watch", True):  # off only where serve() runs inside another program (tests)
        watch_controller(gone)
    while (state["done"] < spec["peers"] and time.time() - state["last"] < spec.get("idle", 120)
           and not gone.is_set()):
        server.handle_request()
    server.server_close()
    found = {"served_peers": int(state["done"]), "sent": int(state["sent"])}
    return {**found, "ended": "the controller's session is gone"} if gone.is_set() else found


def _paths(spec: Mapping[str, Any], name: str) -> tuple[str, str]:
    return (os.path.join(spec["final"], name),
            os.path.join(spec["partial"], name + spec.get("suffix", ".part")))


def _open_growing(spec: Mapping[str, Any], name: str, deadline: float) -> BinaryIO | None:
    """The finished file, else the one arriving; waits for either to appear until `deadline`."""
    while True:
        for path in _paths(spec, name):
            try:
                return open(path, "rb")
            except OSError:
                continue
        if time.time() >= deadline:
            return None
        time.sleep(0.05)


def _still_arriving(spec: Mapping[str, Any], name: str, handle: BinaryIO) -> bool:
    """The open copy is still the part file being written (or became the finished file): not a copy
    set aside after a failed digest, nor one a new transfer replaced."""
    inode = os.fstat(handle.fileno()).st_ino
    final, part = _paths(spec, name)
    for path in (part, final):
        try:
            if os.stat(path).st_ino == inode:
                return path == part
        except OSError:
            continue
    return False


def tell_done(sources: Sequence[Mapping[str, Any]]) -> None:
    """Each relay serves until every host that may ask said it is done (or it idles out)."""
    import urllib.request
    for source in sources:
        if source.get("kind") == "peer":
            try:
                urllib.request.urlopen(str(source["url"]).rstrip("/") + "/_done", timeout=5).close()
            except (OSError, http.client.HTTPException):
                pass  # a relay that does not hear it stops when it idles out


def receive_files(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Files into a directory from relays (the venv's wheels): each verified by sha256 before it takes
    its name, then recorded in the directory's index of verified files."""
    directory = spec["directory"]
    make_directories(directory, 0o755)
    route = Route(spec["sources"])
    progress = Progress(sum(int(entry["size"]) for entry in spec["files"]))
    fetchers: dict[str, Fetcher] = {"peer": fetch_peer}
    index_path = os.path.join(directory, spec.get("index", "MANIFEST.json"))
    try:
        with open(index_path) as handle:
            verified: dict[str, str] = json.load(handle)
    except (OSError, ValueError):
        verified = {}
    for entry in spec["files"]:
        part = os.path.join(directory, entry["path"] + ".partial")
        for attempt in (1, 2):
            receive(entry, part, route, progress, fetchers)
            digest = "sha256:" + sha256_of(part)
            if digest == entry["digest"]:
                os.chmod(part, 0o644)
                os.rename(part, os.path.join(directory, entry["path"]))
                verified[entry["path"]] = digest.split(":", 1)[1]
                break
            os.remove(part)
            left = route.leave(f"{entry['path']}: its hash is not {entry['digest'][:19]}...")
            if attempt == 2 or not left:
                raise OSError(f"{entry['path']}: sha256 mismatch from every source tried")
    write_atomically(index_path, json.dumps(verified, indent=1, sort_keys=True).encode(), 0o644, 0, 0)
    return {"fetched": progress.fetched, "from": route.received, "rerouted": route.left}


def relay_main(spec: dict[str, Any]) -> None:
    result: dict[str, Any] = {"ok": True, "error": None}
    try:
        result.update(serve(spec) if spec["action"] == "serve" else receive_files(spec))
    except OSError as exc:
        result.update(ok=False, error=str(exc))
    finally:
        if spec["action"] == "receive":
            tell_done(spec["sources"])
    try:
        emit("result", **result)
    except OSError:
        # Nobody reads it (the controller's session is gone): leave quietly, not with a traceback
        # at the interpreter's own last flush of stdout.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
