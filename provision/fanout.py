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
    """Call `work(item)` for every item at once (one thread each, up to MAX_WORKERS)."""
    items = list(items)
    order = tuple(name(item) for item in items)
    values: dict[str, T] = {}
    errors: dict[str, BaseException] = {}
    if not items:
        return HostResults(order, values, errors)
    size = workers or min(len(items), MAX_WORKERS)
    with ThreadPoolExecutor(max_workers=size) as pool:
        futures = {name(item): pool.submit(work, item) for item in items}
        for host, future in futures.items():
            try:
                values[host] = future.result()
            except Exception as exc:  # noqa: BLE001 - every failure is reported per host, never lost
                errors[host] = exc
                if exc.__cause__ is not None:  # the report says the error; --verbose what it came from
                    log.debug("%s: %s (caused by %s)", host, error_text(exc), " <- ".join(causes(exc)))
    return HostResults(order, values, errors)
