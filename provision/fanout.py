"""Run one function per host in parallel; never abort half-way.

`for_each_host` returns every host's value or exception, so one failing host never hides or stops the
report on the others (the shape of Fabric's GroupResult).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

from provision import services
from provision.errors import causes, error_text

T = TypeVar("T")
H = TypeVar("H")

log = logging.getLogger("provision.fanout")

MAX_WORKERS = 32  # SSH sessions are I/O bound; beyond this a controller's sshd limits bite first


@dataclass(frozen=True)
class HostResults(Generic[T]):
    """{host name: value} for the hosts that succeeded and {host name: exception} for the rest."""

    order: tuple[str, ...]
    values: Mapping[str, T]
    errors: Mapping[str, BaseException]

    @property
    def ok(self) -> bool:
        return not self.errors


def for_each_host(items: Iterable[H], name: Callable[[H], str], work: Callable[[H], T],
                  workers: int | None = None) -> HostResults[T]:
    """Call `work(item)` for every host at once (one thread each, up to MAX_WORKERS). The services of
    one host (HOST/SERVICE) run one after the other in one thread: they share its venv, user,
    directories and lock, and a host serves one change at a time."""
    items = list(items)
    order = tuple(name(item) for item in items)
    values: dict[str, T] = {}
    errors: dict[str, BaseException] = {}
    if not items:
        return HostResults(order, values, errors)
    by_host: dict[str, list[H]] = {}
    for item in items:
        by_host.setdefault(services.split(name(item))[0], []).append(item)

    def in_turn(batch: list[H]) -> None:
        for item in batch:
            try:
                values[name(item)] = work(item)
            except Exception as exc:  # noqa: BLE001 - every failure is reported per host, never lost
                errors[name(item)] = exc
                if exc.__cause__ is not None:  # the report says the error; --verbose what it came from
                    log.debug("%s: %s (caused by %s)", name(item), error_text(exc), " <- ".join(causes(exc)))

    size = workers or min(len(by_host), MAX_WORKERS)
    with ThreadPoolExecutor(max_workers=size) as pool:
        for future in [pool.submit(in_turn, batch) for batch in by_host.values()]:
            future.result()
    return HostResults(order, {host: values[host] for host in order if host in values},
                       {host: errors[host] for host in order if host in errors})
