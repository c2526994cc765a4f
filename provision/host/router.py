"""Talks to HAProxy's runtime API ON the router host, over its UNIX socket (the rendered config's
`stats socket /run/provision-router/admin.sock mode 600 level admin`). Sent on stdin to `python3 -`;
standard library only, python3 >= 3.8. The controller appends `router_main(SPEC_JSON)`:

    {"action": "state", "socket": PATH}
    {"action": "drain", "socket", "backend", "server", "timeout": 120, "poll": 0.2}
    {"action": "ready", "socket", "backend", "server", "timeout": 60, "poll": 0.2}

state: HAProxy's version and every server of every backend: its address, state, requests in flight (scur)
and queued (qcur), and its last health check.
drain: `set server B/S state drain` (no new requests; those in flight go on), then `show stat` polled
until that server holds none in flight or queued, or the timeout passes; then `state maint` either way:
the result says whether it drained ({"drained", "waited_s", "in_flight_left"}).
ready: `set server B/S state ready`, then polled until its health check has passed (state UP, no check
failing) or the timeout passes ({"up", "waited_s", "state"}).
Output: JSON lines, {"event": "progress", ...} while waiting and one {"event": "result", ...}; a broken
socket or an answer of HAProxy's that is an error ends in a result with "error": one line.

The runtime API takes one command per connection here: connect, send it and a newline, read to EOF.
`show stat` is CSV under a header line "# pxname,svname,..."; a server's status is UP, DOWN, DRAIN,
MAINT, NOLB, "no check", or "UP 1/3" / "DOWN 2/3" while its checks move it from one to the other.
"""
from __future__ import annotations

import csv
import re
import socket
import time
from typing import Any, Callable

from provision.host.common import emit

SOCKET_TIMEOUT = 10.0


class RouterError(Exception):
    """One line that says what went wrong with HAProxy; the result's "error"."""


class NotRunning(RouterError):
    """No HAProxy listens on the socket (not installed yet, or stopped): nothing is routed through it."""


# -- parsing (pure) -----------------------------------------------------------------------------

def parse_version(text: str) -> str:
    """`show version` answers the bare version ("2.6.12-1+deb12u4"); `haproxy -v`'s first line
    ("HAProxy version 2.6.12-1+deb12u4 2026/10/17 - https://haproxy.org/") is read too."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise RouterError("HAProxy answered `show version` with nothing")
    first = lines[0]
    match = re.match(r"^(?:HA-?Proxy version\s+)?(\d+\.\d+[^\s]*)", first, re.IGNORECASE)
    if not match:
        raise RouterError(f"HAProxy answered `show version` with {first!r}")
    return match.group(1)


def parse_stat(text: str) -> list[dict[str, str]]:
    """`show stat` CSV, one dict per line (frontends, servers, backends), keyed by the header's names."""
    lines = text.splitlines()
    start = next((index for index, line in enumerate(lines) if line.strip()), None)
    if start is None or not lines[start].startswith("# pxname,svname,"):
        shown = lines[start].strip() if start is not None else "nothing"
        raise RouterError(f"HAProxy answered `show stat` with {shown!r}, not its CSV")
    header = lines[start][2:].split(",")
    rows = []
    for fields in csv.reader(line for line in lines[start + 1:] if line.strip()):
        rows.append({name: value for name, value in zip(header, fields) if name})
    return rows


def normalise_state(status: str) -> str:
    """HAProxy's status in one word: "UP 1/3" (up, a check failing) -> UP, "DOWN 2/3" (down, checks
    passing) -> DOWN, "MAINT (resolution)" / "MAINT (via be/s)" -> MAINT, "no check" (a server without
    health checks, taking requests) -> UP; the rest (DRAIN, NOLB, ...) as given."""
    text = status.strip()
    if text.lower() == "no check":
        return "UP"
    return text.split(" ", 1)[0].upper() if text else "UNKNOWN"


def _count(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        return 0


def servers(rows: list[dict[str, str]]) -> list[dict[str, Any]]:
    """The server lines of `show stat` (not FRONTEND, BACKEND), as the state action reports them."""
    found = []
    for row in rows:
        if row.get("svname") in ("FRONTEND", "BACKEND") or row.get("type") not in (None, "2"):
            continue
        status = row.get("status", "")
        # "* L7OK": the last check passed and the next is running now (HAProxy marks one in progress).
        check = row.get("check_status", "")
        found.append({"backend": row.get("pxname", ""), "server": row.get("svname", ""),
                      "address": row.get("addr", ""), "state": normalise_state(status), "status": status,
                      "in_flight": _count(row.get("scur", "")), "queued": _count(row.get("qcur", "")),
                      "check": check[2:] if check.startswith("* ") else check, "failures": failures(row)})
    return found


# What went wrong with a server's requests since the router started, by `show stat`'s own columns
# (HAProxy 2.6 management guide, 9.1): 5xx answers, answers cut or unreadable (eresp), connections
# refused (econ), requests the server aborted (srv_abrt), and retries/redispatches, which a client
# never saw fail. An error a server sends inside an HTTP 200 stream is none of these: the engine's
# own counter says it where it has one (status's "errors").
FAILURE_COLUMNS = {"http_5xx": "hrsp_5xx", "response_errors": "eresp", "connection_errors": "econ",
                   "server_aborts": "srv_abrt", "retried": "wretr", "redispatched": "wredis"}


def failures(row: dict[str, str]) -> dict[str, int]:
    """Pure: one server's `show stat` row -> its failure counters (FAILURE_COLUMNS)."""
    return {name: _count(row.get(column, "")) for name, column in FAILURE_COLUMNS.items()}


def find_server(found: list[dict[str, Any]], backend: str, server: str) -> dict[str, Any]:
    """The named server, or a RouterError naming what exists."""
    in_backend = [entry for entry in found if entry["backend"] == backend]
    if not in_backend:
        backends = sorted({entry["backend"] for entry in found})
        raise RouterError(f"HAProxy has no backend {backend!r} with servers "
                          f"(backends: {', '.join(backends) or 'none'})")
    for entry in in_backend:
        if entry["server"] == server:
            return entry
    names = ", ".join(entry["server"] for entry in in_backend)
    raise RouterError(f"backend {backend!r} has no server {server!r} (its servers: {names})")


# -- the runtime API ------------------------------------------------------------------------------

def ask(path: str, command: str) -> str:
    """One command on the runtime socket, HAProxy's whole answer."""
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(SOCKET_TIMEOUT)
    try:
        try:
            client.connect(path)
        except FileNotFoundError:
            raise NotRunning(f"no HAProxy runtime socket at {path} (is haproxy running with "
                              f"`stats socket {path}`?)") from None
        except ConnectionRefusedError:
            raise NotRunning(f"HAProxy's runtime socket {path} refuses connections "
                              f"(haproxy is not running)") from None
        except PermissionError:
            raise RouterError(f"no permission to use HAProxy's runtime socket {path} (run as root)") from None
        except OSError as exc:
            raise RouterError(f"cannot connect to HAProxy's runtime socket {path}: {exc}") from None
        chunks = []
        try:
            client.sendall((command + "\n").encode())
            while True:
                chunk = client.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except OSError as exc:
            raise RouterError(f"HAProxy's runtime socket {path} broke during `{command}`: {exc}") from None
        return b"".join(chunks).decode("utf-8", "replace")
    finally:
        client.close()


def set_state(path: str, backend: str, server: str, state: str) -> None:
    """`set server B/S state X`; HAProxy answers an empty line when it took it, else its message."""
    command = f"set server {backend}/{server} state {state}"
    answer = ask(path, command).strip()
    if answer:
        raise RouterError(f"HAProxy refused `{command}`: {' '.join(answer.split())}")


def read_servers(path: str) -> list[dict[str, Any]]:
    return servers(parse_stat(ask(path, "show stat")))


# -- actions --------------------------------------------------------------------------------------

def _state(spec: dict[str, Any]) -> dict[str, Any]:
    path = spec["socket"]
    return {"version": parse_version(ask(path, "show version")), "servers": read_servers(path)}


def _wait(spec: dict[str, Any], done: Callable[[dict[str, Any]], bool], stage: str) -> dict[str, Any]:
    """Poll the server until done(entry) or the spec's timeout; the last entry, with waited_s."""
    path, backend, server = spec["socket"], spec["backend"], spec["server"]
    timeout, poll = float(spec.get("timeout", 60)), float(spec.get("poll", 0.2))
    started = time.monotonic()
    last_said: tuple[str, int, int] | None = None
    said_at = 0.0
    while True:
        entry = find_server(read_servers(path), backend, server)
        waited = time.monotonic() - started
        if done(entry) or waited >= timeout:
            entry["waited_s"] = round(waited, 2)
            return entry
        now = (entry["status"], entry["in_flight"], entry["queued"])
        if now != last_said or time.monotonic() - said_at >= 5:  # on a change, else every 5 s
            emit("progress", stage=stage, backend=backend, server=server, state=entry["state"],
                 status=entry["status"], in_flight=entry["in_flight"], queued=entry["queued"],
                 waited_s=round(waited, 1))
            last_said, said_at = now, time.monotonic()
        time.sleep(max(0.0, min(poll, timeout - waited)))


def _drain(spec: dict[str, Any]) -> dict[str, Any]:
    path, backend, server = spec["socket"], spec["backend"], spec["server"]
    find_server(read_servers(path), backend, server)  # a wrong name said as such, before any change
    set_state(path, backend, server, "drain")
    entry = _wait(spec, lambda found: found["in_flight"] == 0 and found["queued"] == 0, "drain")
    set_state(path, backend, server, "maint")
    left = entry["in_flight"] + entry["queued"]
    return {"drained": left == 0, "waited_s": entry["waited_s"], "in_flight_left": left}


def _ready(spec: dict[str, Any]) -> dict[str, Any]:
    path, backend, server = spec["socket"], spec["backend"], spec["server"]
    find_server(read_servers(path), backend, server)
    set_state(path, backend, server, "ready")
    # Fully UP: "UP 1/3" is a server whose checks are failing, not one that has come back.
    entry = _wait(spec, lambda found: found["status"] in ("UP", "no check"), "ready")
    up = entry["status"] in ("UP", "no check")
    return {"up": up, "waited_s": entry["waited_s"], "state": entry["state"], "status": entry["status"],
            "check": entry["check"]}


ACTIONS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "state": _state, "drain": _drain, "ready": _ready}


def router_main(spec: dict[str, Any]) -> None:
    try:
        action = ACTIONS.get(spec.get("action", ""))
        if action is None:
            raise RouterError(f"no router action {spec.get('action')!r} (known: {', '.join(ACTIONS)})")
        result = action(spec)
    except NotRunning as exc:
        result = {"ok": False, "error": str(exc), "not_running": True}
    except RouterError as exc:
        result = {"ok": False, "error": str(exc)}
    except Exception as exc:  # noqa: BLE001  the result line says what broke, never a bare traceback
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    else:
        result = {"ok": True, **result}
    emit("result", **result)
