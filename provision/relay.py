"""Passing files along a cluster: who receives from whom, and the relay servers on the hosts.

The weights (from the hub) and the venv's wheels (from the controller) enter a cluster once, at the
first host of a chain; every other host receives from the host before it while that host is still
receiving (host/relay.py serves a file as it arrives). Each uplink then carries one copy and every
host gets the bytes at the speed of the slowest link on the way, about one copy's time in all instead
of one per host. A host whose relay fails goes on from the relay's own upstream, then the origin.
"""
from __future__ import annotations

import logging
import secrets as random_secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from provision import programs
from provision.errors import RelayError, UnreachableHost
from provision.runner import Runner

RELAY, STAR, HUB = "relay", "star", "hub"
# Upstreams a host may fall back to, nearest first, before the origin: a chain survives this many
# failed hosts in a row ahead of any host.
FALLBACKS = 3
T = TypeVar("T")
log = logging.getLogger("provision.relay")


def upstreams(members: Sequence[str], strategy: str) -> dict[str, list[str]]:
    """Pure: for each host of a group (in order, the first entering the bytes), the hosts it receives
    from, nearest first; the origin (hub or controller) comes after them.
    relay: a chain; the host before, then the ones before it (up to FALLBACKS), then the first.
    star: every other host from the first, once the first has all of it.
    hub: none: every host from the origin."""
    if strategy == HUB:
        return {member: [] for member in members}
    if strategy == STAR:
        return {member: ([] if index == 0 else [members[0]]) for index, member in enumerate(members)}
    found: dict[str, list[str]] = {}
    for index, member in enumerate(members):
        nearest = list(reversed(members[max(0, index - FALLBACKS):index]))
        if index and members[0] not in nearest:
            nearest.append(members[0])
        found[member] = nearest
    return found


def routes_with_holders(hosts: Sequence[str], strategy: str, holders: Sequence[str] = ()) -> dict[str, list[str]]:
    """Pure: `upstreams` of the hosts that receive, with the hosts that already hold every file
    (verified) at the head of the chain: they are the first sources, before the origin. A rerun where
    one host of a cluster lost a file takes it from its peers, not the hub. hub: no peer at all."""
    found = upstreams([*holders, *hosts], strategy)
    return {host: found[host] for host in hosts}


def downstream_counts(routes: Mapping[str, Sequence[str]]) -> dict[str, int]:
    """Pure: how many hosts may ask each host for bytes (it serves until each of them said done)."""
    counts: dict[str, int] = {}
    for sources in routes.values():
        for source in sources:
            counts[source] = counts.get(source, 0) + 1
    return counts


def program(spec: Mapping[str, Any]) -> str:
    return programs.ship(("relay",), "relay_main", spec)


def run(runner: Runner, text: str, python: str, what: str, on_progress: Callable[[int, int], None],
        on_event: Callable[[dict[str, Any]], None] = lambda event: None) -> dict[str, Any]:
    """A relay-using host program to its result; progress and other events as they come."""
    def event(found: dict[str, Any]) -> None:
        if found.get("event") == "progress":
            on_progress(int(found["done"]), int(found["total"]))
        else:
            on_event(found)

    try:
        result, done = programs.run(runner, text, 24 * 3600, event, python=python)
    except UnreachableHost as exc:  # say which step the connection was lost in
        raise UnreachableHost(runner.host, f"during {what}: {exc.reason}") from exc
    if not result:
        raise RelayError(f"{runner.host}: {what} ended without an answer (exit {done.exited}): "
                         f"{programs.tail(done)}")
    if not result.get("ok"):
        raise RelayError(f"{runner.host}: {result.get('error')}")
    return result


class Server:
    """A host serving `files` ({name: size}) to the hosts of its cluster (host/relay.py `serve`): the
    finished ones under `final`, those still arriving as NAME+`suffix` under `partial`; in a thread of
    its own while the transfers run. Its URL carries a random secret and dies with the run."""

    def __init__(self, runner: Runner, address: str, final: str, partial: str, suffix: str, files: Mapping[str, int],
                 peers: int) -> None:
        self.secret = random_secrets.token_urlsafe(24)
        self.text = program({"action": "serve", "final": final, "partial": partial, "suffix": suffix,
                             "files": dict(files), "address": address, "secret": self.secret, "peers": peers,
                             "idle": 600})
        self.runner = runner
        self.address = address
        self.port: int | None = None
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        def on_event(event: dict[str, Any]) -> None:
            if event.get("event") == "serving":
                self.port = int(event["port"])
                self.ready.set()
        try:
            run(self.runner, self.text, "python3", "serving its cluster", lambda done, total: None, on_event)
        except BaseException as exc:  # noqa: BLE001  reported through .error; the thread must not die silently
            self.error = exc
        finally:
            self.ready.set()

    def start(self, timeout: float = 60) -> str:
        self.thread.start()
        self.ready.wait(timeout)
        if self.port is None:
            raise RelayError(f"{self.runner.host}: could not serve its cluster: {self.error or 'no answer'}")
        return f"http://{self.address}:{self.port}/{self.secret}"


def carry(hosts: Sequence[str], strategy: str, server: Callable[[str, int], Server],
          work: Callable[[str, list[dict[str, Any]]], T],
          holders: Sequence[str] = ()) -> tuple[dict[str, T], dict[str, BaseException]]:
    """Every host's transfer, `work(host, its relays as sources)`, with a relay server (`server(host,
    how many may ask)`) on each host others receive from, `holders` (hosts that hold it all already)
    first. relay: all hosts at once; star: the first, then the rest (all at once from a holder). A
    wave's relays start when it does (a star's first host serves once it has all); one that cannot
    start is left out of its downstream hosts' sources."""
    from provision.fanout import for_each_host

    routes = routes_with_holders(hosts, strategy, holders)
    peers = downstream_counts(routes)
    urls: dict[str, str] = {}
    servers: dict[str, Server] = {}
    values: dict[str, T] = {}
    errors: dict[str, BaseException] = {}

    def start(host: str) -> str:
        servers[host] = server(host, peers[host])
        return servers[host].start()

    def run_wave(wave: Sequence[str]) -> None:
        done = for_each_host(wave, lambda host: host, lambda host: work(host, peer_sources(host, routes, urls)))
        values.update(done.values)
        errors.update(done.errors)

    for wave in ([hosts[:1], hosts[1:]] if strategy == STAR and not holders else [hosts]):
        # Hosts that receive from no relay (the first) start at once, while the relays start.
        first = [host for host in wave if not routes[host]]
        ahead = threading.Thread(target=run_wave, args=(first,), daemon=True)
        ahead.start()
        wanted = sorted({up for host in wave for up in routes[host]} - set(servers))
        started = for_each_host(wanted, lambda host: host, start)
        urls.update(started.values)
        for host, exc in started.errors.items():
            log.info("%s: no relay: %s", host, exc)
        run_wave([host for host in wave if routes[host]])
        ahead.join()
    # The servers are not waited for: each ends once every host that may ask said it is done (or after
    # `idle` seconds without a request), and waiting for their programs to exit would only delay the
    # hosts' next step, which may run beside them on the same connections.
    return values, errors


def peer_sources(host: str, routes: Mapping[str, Sequence[str]], urls: Mapping[str, str]) -> list[dict[str, Any]]:
    """A host's relays as sources, nearest first, leaving out those whose server did not start."""
    return [{"kind": "peer", "name": upstream, "url": urls[upstream]}
            for upstream in routes.get(host, ()) if upstream in urls]
