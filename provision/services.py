"""Several servers on one host: each service's names on the host. Pure.

A host that declares `services:` in the inventory serves each one as its own server: the inventory
gives each a target of its own, named HOST/SERVICE (`invoke deploy --host ws/coder`; `--host ws` is
all of them). What a host without services has keeps its names (vllm.service, /etc/vllm/vllm.env,
/var/lib/provision/generations); a service's live beside them, its name in each:

    unit            vllm@coder.service (llama-server@coder.service, trtllm-serve@coder.service)
    environment     /etc/vllm/coder.env
    generations     /var/lib/provision/services/coder/generations (its own rollback)

The `@` form cannot collide with a unit of the tool's own (vllm-ray-head.service) nor with a name a
host without services uses, so a host can move between the two shapes and the plan says what moved.
The first service of a host also carries the host's own names: it removes a former single server's
units and files (renamed, in its plan) and runs the host's endpoint router, if any.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

SEPARATOR = "/"
NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,30}$")  # part of a unit and a file name: nothing to quote
SERVICE_ROOT = "/var/lib/provision/services"
HOST_GENERATIONS = "/var/lib/provision/generations"
CONFIG_DIR = "/etc/vllm"
HOST_ENV_FILE = f"{CONFIG_DIR}/vllm.env"


def target_name(host: str, service: str) -> str:
    return f"{host}{SEPARATOR}{service}"


def split(target: str) -> tuple[str, str | None]:
    """("ws", "coder") for "ws/coder"; ("ws", None) for a host without services."""
    host, _, service = target.partition(SEPARATOR)
    return host, service or None


@dataclass(frozen=True)
class Naming:
    """Where one server's files, units and generations live on its host; `service` None: the host's own
    names (a host without services), `carrier` where this server also owns the host's own names."""

    service: str | None = None
    carrier: bool = True

    def unit(self, unit: str) -> str:
        """vllm.service -> vllm@coder.service for a service; the name itself otherwise."""
        if self.service is None:
            return unit
        stem, dot, kind = unit.rpartition(".")
        return f"{stem}@{self.service}{dot}{kind}"

    def units(self, units: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(self.unit(unit) for unit in units)

    @property
    def env_file(self) -> str:
        return HOST_ENV_FILE if self.service is None else f"{CONFIG_DIR}/{self.service}.env"

    @property
    def generations(self) -> str:
        return HOST_GENERATIONS if self.service is None else f"{SERVICE_ROOT}/{self.service}/generations"

    @property
    def state_file(self) -> str:
        """The generations' record, which the probe reads with the managed files."""
        return f"{self.generations}/state.json"


HOST = Naming()


def naming_of(target: str, first_service: str | None = None) -> Naming:
    """The names of the server `target` names; `first_service` is its host's first service (the one
    that carries the host's own names)."""
    _, service = split(target)
    return Naming(service, carrier=service is None or service == first_service)


SERVICE_UNIT = re.compile(r"^(?P<unit>[a-z-]+)@(?P<service>[a-z0-9][a-z0-9-]{0,30})\.service$")


def service_units_in(names: list[str] | tuple[str, ...], engine_units: tuple[str, ...]) -> dict[str, str]:
    """The units of services found among a unit directory's entries: {unit file name: service}, for
    the tool's engine units only (vllm@NAME.service, not someone's getty@tty1.service)."""
    stems = {unit.removesuffix(".service") for unit in engine_units}
    found = {}
    for name in names:
        matched = SERVICE_UNIT.match(name)
        if matched and matched.group("unit") in stems:
            found[name] = matched.group("service")
    return found
