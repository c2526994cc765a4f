"""Endpoints: one address in front of several clusters' servers. Pure: inventory and settings in, plans out.

An endpoint (the inventory's `endpoints:`) runs HAProxy on one host. Each cluster it names is a replica
of the model that cluster serves (its served_model_name); a request goes to the replicas of the model
its JSON body names, by HAProxy's own json_query, and to the first model's when it names none (GET
/v1/models); one naming a model the endpoint does not serve gets 404, in OpenAI's error shape, naming
those it serves. A body over the endpoint's max_body_mb gets 413 before it reaches a replica. Among a
model's replicas the router sends to the one with the fewest requests in flight, or, with `routing:
prefix-affinity`, to the one a consistent hash of the conversation's first messages picks (its prefix
cache holds the conversation's history). HAProxy checks each replica's /health, retries a request
whose replica refused or dropped it on another, and takes a replica out and back through its runtime
API on a UNIX socket on the router host, which is how a rolling deploy drains a replica
(provision/host/router.py).

    plan(endpoint, inventory, settings) -> EndpointPlan     what the router host renders and the roll reads
"""
from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from provision import services
from provision.errors import InventoryError
from provision.inventory import Endpoint, Host, Inventory, Settings

ROUTER_UNIT = "provision-router.service"
CONFIG_DIR = "/etc/provision-router"
CONFIG_FILE = f"{CONFIG_DIR}/haproxy.cfg"
KEYS_CREDENTIAL = "api-keys"
# Root's alone; the unit reads it as a systemd credential of the same name, so the reload's config check
# finds it with CREDENTIALS_DIRECTORY set to this folder.
KEYS_FILE = f"{CONFIG_DIR}/{KEYS_CREDENTIAL}"
RUNTIME_DIR = "/run/provision-router"
ADMIN_SOCKET = f"{RUNTIME_DIR}/admin.sock"
# HAProxy reads model names in an ACL as words: the names an endpoint routes by keep to these.
MODEL_NAME = re.compile(r"^[A-Za-z0-9._:/@+-]{1,200}$")
MIB = 1024 * 1024
# The router reads a request's model from its body, which must therefore be whole in one HAProxy
# buffer: a part past the buffer is not seen (with the default 16 kB buffer a chat of ~15 kB whose
# "model" follows "messages", as the OpenAI client writes it, lost its model), and a retry resends the
# body from a copy of that buffer. The buffer is the largest body allowed plus room for the headers,
# which are held to HEADERS_MAX (431 beyond); a body that fills what is left is over the limit (413).
HEADERS_MAX = 32 * 1024
HEADER_ROOM = 64 * 1024
# prefix-affinity on /v1/completions hashes the prompt's first bytes (a raw prompt has no turns): long
# enough to tell apart prompts that share a template, short enough that a conversation's first prompt
# already holds them.
PROMPT_PREFIX_BYTES = 1024


@dataclass(frozen=True)
class Replica:
    """One cluster's server as the router sees it."""

    cluster: str  # the cluster's name, or a service's as HOST:SERVICE: HAProxy's server name
    host: str  # the cluster's head: the host that serves the API
    address: str  # where the router reaches it
    port: int
    model: str  # the name it serves the model as: what a request's "model" names
    unreachable: str | None = None  # why the router cannot reach it, where it cannot


@dataclass(frozen=True)
class Backend:
    """The replicas of one model: HAProxy's backend for requests naming it."""

    name: str
    model: str
    replicas: tuple[Replica, ...]


@dataclass(frozen=True)
class EndpointPlan:
    name: str
    host: str
    bind_host: str
    port: int
    drain_timeout: float
    replicas: tuple[Replica, ...]
    router: Host | None = None  # the router host as the inventory has it: what a roll connects to
    routing: str = Endpoint.routing  # the inventory's endpoint settings (inventory.ENDPOINT_SPECS)
    max_body_mb: float = Endpoint.max_body_mb
    request_timeout: float = Endpoint.request_timeout
    receive_timeout: float = Endpoint.receive_timeout
    metrics_port: int = Endpoint.metrics_port  # HAProxy's Prometheus exporter, on bind_host

    @property
    def body_limit(self) -> int:
        """The largest request body the router takes, in bytes."""
        return int(self.max_body_mb * MIB)

    @property
    def backends(self) -> tuple[Backend, ...]:
        """One backend per model, in the order the inventory first names it."""
        models = list(dict.fromkeys(replica.model for replica in self.replicas))
        return tuple(Backend(f"{self.name}-{index}", model,
                             tuple(r for r in self.replicas if r.model == model))
                     for index, model in enumerate(models, 1))

    def backend_for(self, model: str | None) -> Backend:
        """The replicas of `model` (None: the first model's); an InventoryError names the models routed."""
        found = next((b for b in self.backends if model is None or b.model == model), None)
        if found is None:
            routed = ", ".join(b.model for b in self.backends) or "none"
            raise InventoryError(f"endpoint {self.name} routes no model {model!r} (it routes: {routed})",
                                 file="command line", key="--model")
        return found

    def backend_of(self, cluster: str) -> Backend:
        return next(b for b in self.backends if any(r.cluster == cluster for r in b.replicas))

    @property
    def listens_beyond_loopback(self) -> bool:
        return not ipaddress.ip_address(self.bind_host).is_loopback

    @property
    def local_address(self) -> str:
        """Where a program on the router host reaches it."""
        return local_address(self.bind_host)

    @property
    def address(self) -> str:
        """Where clients reach it: the router host's address where it listens on every address."""
        if ipaddress.ip_address(self.bind_host).is_unspecified and self.router and self.router.connection == "ssh":
            return self.router.address
        return self.local_address


def local_address(bind_host: str) -> str:
    """Where a program on the same host reaches a listener bound to `bind_host`: loopback for one that
    listens on every address, else the address itself."""
    return "127.0.0.1" if ipaddress.ip_address(bind_host).is_unspecified else bind_host


def buffer_size(plans: Sequence[EndpointPlan]) -> int:
    """HAProxy's tune.bufsize for a router serving `plans` (one per process): the largest body limit
    among them plus room for the headers, so that every body it lets through is whole in one buffer."""
    largest = max((plan.body_limit for plan in plans), default=Endpoint.max_body_mb * MIB)
    return int(largest) + HEADER_ROOM


def haproxy_time(seconds: float) -> str:
    """Seconds as HAProxy's time format: 900 -> "900s", 0.5 -> "500ms"."""
    return f"{int(seconds)}s" if float(seconds).is_integer() else f"{round(seconds * 1000)}ms"


def replica_address(server_host: str, router_host: str, bind_host: str,
                    inventory_address: str, reader: str = "the router") -> tuple[str, str | None]:
    """Where a router (or another `reader`: "Prometheus") on `router_host` reaches a server on
    `server_host` that listens on `bind_host`, and why it cannot where it cannot (a server on another
    host that listens on loopback only)."""
    bound = ipaddress.ip_address(bind_host)
    if server_host == router_host:
        return ("127.0.0.1" if bound.is_unspecified or bound.version == 4 and bound.is_loopback
                else bind_host), None
    if bound.is_loopback:
        return bind_host, (f"it listens on {bind_host} only, and {reader} runs on {router_host}: "
                           f"set bind_host for cluster hosts to an address {router_host} reaches")
    return (inventory_address if bound.is_unspecified else bind_host), None


def server_name(target: str) -> str:
    """A server's name in the router: its cluster's name, or a service's as HOST:SERVICE (HAProxy
    refuses '/' in a server's name)."""
    return target.replace(services.SEPARATOR, ":")


def plan(endpoint: Endpoint, inventory: Inventory, settings_of: Callable[[str], Settings]) -> EndpointPlan:
    """The endpoint with each of its clusters' servers: their head, address, port and model name, from
    the settings the run resolved for each head (`settings_of`)."""
    replicas = []
    servers = [(name, inventory.clusters[name].head) for name in endpoint.clusters] + [
        (server_name(target), target) for target in endpoint.services]
    for name, head in servers:
        settings = settings_of(head)
        address, unreachable = replica_address(services.split(head)[0], endpoint.host, str(settings.bind_host),
                                               inventory.host(head).address)
        replicas.append(Replica(name, head, address, int(settings.port),
                                str(settings.served_model_name or settings.model or ""), unreachable))
    return EndpointPlan(endpoint.name, endpoint.host, endpoint.bind_host, endpoint.port,
                        endpoint.drain_timeout, tuple(replicas), inventory.hosts[endpoint.host],
                        routing=endpoint.routing, max_body_mb=endpoint.max_body_mb,
                        request_timeout=endpoint.request_timeout, receive_timeout=endpoint.receive_timeout,
                        metrics_port=endpoint.metrics_port)


def named(inventory: Inventory, name: str) -> EndpointPlan:
    """The inventory's endpoint `name`, planned from the inventory's settings (a task that names one)."""
    if name not in inventory.endpoints:
        known = ", ".join(sorted(inventory.endpoints)) or "none"
        raise InventoryError(f"unknown endpoint {name!r} (known: {known})", file="command line", key="--endpoint")
    return plan(inventory.endpoints[name], inventory, inventory.settings)


def plans_for(inventory: Inventory, host: str, settings: Mapping[str, Settings],
              resolve: Callable[[str], Settings]) -> tuple[tuple[EndpointPlan, ...], EndpointPlan | None]:
    """The endpoints whose router runs on `host`, and the one `host`'s server is behind (where it heads
    a cluster an endpoint names); each replica's settings those the run resolved, else `resolve`d."""

    def settings_of(name: str) -> Settings:
        return settings[name] if name in settings else resolve(name)

    machine, service = services.split(host)
    # A host's router runs beside its first service (which carries the host's own names).
    routed = tuple(plan(endpoint, inventory, settings_of) for endpoint in inventory.endpoints_on(machine)) \
        if inventory.naming(host).carrier else ()
    cluster = inventory.cluster_of(host)
    endpoint = inventory.endpoint_of(cluster.name) if cluster and cluster.head == host else \
        inventory.endpoint_of(host) if service is not None else None
    return routed, plan(endpoint, inventory, settings_of) if endpoint else None


def heads_behind(inventory: Inventory, hosts: list[str]) -> list[str]:
    """The cluster heads and services whose settings the routers on `hosts` (targets: a service's
    router is its host's) render from."""
    return [inventory.clusters[member].head if member in inventory.clusters else member
            for host in hosts for endpoint in inventory.endpoints_on(services.split(host)[0])
            for member in endpoint.members]
