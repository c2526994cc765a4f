"""Metrics: what Prometheus scrapes of the inventory, and how. Pure: inventory and settings in, targets and
files out.

Every server the tool deploys serves its engine's own metrics page (vLLM's /metrics, llama-server's with
--metrics, SGLang's with --enable-metrics, TensorRT-LLM's /prometheus/metrics from 1.3.0rc on), every
endpoint's router serves HAProxy's exporter on its metrics_port, and a host may run
prometheus-node-exporter (its facts say). The inventory's `prometheus:` names the
host whose Prometheus scrapes them. From there each target is reached as the router reaches a replica
(endpoints.replica_address): on that host over loopback, on another where it listens beyond loopback; a
server that listens on loopback only on another host cannot be scraped, and is said to be so.

The targets go to Prometheus as file-based service discovery (one JSON file per job, read again by
Prometheus when it changes), labelled host, cluster, service, engine, model and endpoint; the key file
(the secrets file's api_key, root's and Prometheus's alone, mode 0600) is named by the jobs whose targets
check it, never written into the configuration or a command line.

    plan(inventory, settings_of, exporters) -> Scrape      the targets, by job
    target_files(scrape) -> {file name: JSON text}          file_sd's files
    scrape_configs(scrape, targets_dir) -> list of dicts    prometheus.yml's scrape_configs
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from provision import catalog, endpoints, engines, services
from provision.inventory import Inventory, Prometheus, Settings

# The jobs, in the order Prometheus's configuration lists them: (name, what it scrapes).
JOBS = (("servers", "the engines' own metrics pages"),
        ("routers", "the endpoints' routers (HAProxy's exporter)"),
        ("node", "prometheus-node-exporter, where a host runs it"))
KEY_FILE = "api-key"
# Where the exporters listen by default (the package's own default: https://github.com/prometheus/node_exporter).
EXPORTER_PORTS = {"node": 9100}


@dataclass(frozen=True)
class Target:
    """One page Prometheus scrapes."""

    job: str
    host: str  # the inventory's host (HOST/SERVICE for a service's server)
    address: str  # host:port, as Prometheus reaches it
    labels: Mapping[str, str]
    path: str = "/metrics"
    keyed: bool = False  # the page checks the API key: Prometheus sends it from the key file
    unreachable: str | None = None  # why Prometheus cannot reach it, where it cannot

    @property
    def file_job(self) -> str:
        """The job, split by whether it sends the key (a scrape config has one authorization)."""
        return f"{self.job}-keyed" if self.keyed else self.job


@dataclass(frozen=True)
class Scrape:
    prometheus: Prometheus
    targets: tuple[Target, ...]
    not_scraped: tuple[str, ...] = ()  # servers with no page Prometheus reads, and why
    keyed: bool = False  # some target needs the key file

    @property
    def reachable(self) -> tuple[Target, ...]:
        return tuple(target for target in self.targets if not target.unreachable)

    @property
    def unreachable(self) -> tuple[Target, ...]:
        return tuple(target for target in self.targets if target.unreachable)


def _reach(server_host: str, prometheus: Prometheus, bind_host: str, address: str, port: int) -> tuple[str, str | None]:
    where, why = endpoints.replica_address(server_host, prometheus.host, bind_host, address, reader="Prometheus")
    host = f"[{where}]" if ":" in where else where
    return f"{host}:{port}", why


def servers(inventory: Inventory) -> list[str]:
    """Every target that serves an API: each host's (or each of its services'), a multi-node cluster's
    head only, and only where a model is set."""
    found = []
    for host in inventory.hosts:
        for target in inventory.targets_of(host):
            cluster = inventory.cluster_of(target)
            if cluster is not None and cluster.head != target:
                continue
            found.append(target)
    return found


def _server_target(inventory: Inventory, target: str, settings: Settings, prometheus: Prometheus,
                   api_key: bool) -> Target | str:
    engine = engines.ENGINES[settings.engine]
    names = engine.metric_names(settings)
    if names.format != catalog.PROMETHEUS:
        return (f"{target}: {engine.title} at this release answers {names.path} as JSON iteration statistics, "
                "not Prometheus's text format (TensorRT-LLM 1.3.0rc and later serve /prometheus/metrics)")
    machine = services.split(target)[0]
    address, why = _reach(machine, prometheus, str(settings.bind_host), inventory.host(target).address,
                          int(settings.port))
    cluster = inventory.cluster_of(target)
    endpoint = inventory.endpoint_of(cluster.name if cluster else target) or inventory.endpoint_of(target)
    labels = {"host": machine, "cluster": cluster.name if cluster else "", "service": services.split(target)[1] or "",
              "engine": engine.name, "model": str(settings.served_model_name or settings.model or ""),
              "endpoint": endpoint.name if endpoint else ""}
    return Target("servers", target, address, {k: v for k, v in labels.items() if v}, names.path,
                  keyed=names.needs_key and api_key, unreachable=why)


def _router_targets(inventory: Inventory, prometheus: Prometheus, api_key: bool) -> list[Target]:
    found = []
    for endpoint in inventory.endpoints.values():
        router = inventory.hosts[endpoint.host]
        address, why = _reach(endpoint.host, prometheus, endpoint.bind_host, router.address, endpoint.metrics_port)
        # The router checks the secrets file's key in front of its metrics as in front of its API.
        found.append(Target("routers", endpoint.host, address, {"host": endpoint.host, "endpoint": endpoint.name},
                            keyed=api_key, unreachable=why))
    return found


def _exporter_targets(inventory: Inventory, prometheus: Prometheus,
                      exporters: Mapping[str, Sequence[str]]) -> list[Target]:
    found = []
    for host, running in exporters.items():
        for job in running:
            address, why = _reach(host, prometheus, "0.0.0.0", inventory.hosts[host].address, EXPORTER_PORTS[job])
            found.append(Target(job, host, address, {"host": host}, unreachable=why))
    return found


def plan(inventory: Inventory, settings_of: Callable[[str], Settings], *, api_key: bool,
         exporters: Mapping[str, Sequence[str]] | None = None) -> Scrape:
    """What the inventory's Prometheus scrapes: every server with a model, every endpoint's router, and the
    exporters the hosts' facts show running (`exporters`: {host: ["node"]}); `api_key`: the
    secrets file holds one (the servers that check it on their metrics page, and routers beyond
    loopback, get it)."""
    prometheus = inventory.prometheus
    if prometheus is None:
        raise ValueError("the inventory has no prometheus section")
    targets: list[Target] = []
    not_scraped = []
    for target in servers(inventory):
        settings = settings_of(target)
        if not settings.model:
            continue
        made = _server_target(inventory, target, settings, prometheus, api_key)
        if isinstance(made, str):
            not_scraped.append(made)
        else:
            targets.append(made)
    targets += _router_targets(inventory, prometheus, api_key)
    targets += _exporter_targets(inventory, prometheus, exporters or {})
    return Scrape(prometheus, tuple(targets), tuple(not_scraped), keyed=any(t.keyed for t in targets))


def target_files(scrape: Scrape) -> dict[str, str]:
    """file_sd's files, one per job (and key), each a JSON list of {targets, labels}: the reachable
    targets; `__metrics_path__` where a page is not at /metrics."""
    files: dict[str, list[dict[str, Any]]] = {}
    for job, _ in JOBS:
        for keyed in (False, True):
            name = f"{job}-keyed" if keyed else job
            entries = [{"targets": [t.address],
                        "labels": {**t.labels, **({"__metrics_path__": t.path} if t.path != "/metrics" else {})}}
                       for t in scrape.reachable if t.file_job == name]
            if entries:
                files[f"{name}.json"] = entries
    return {name: json.dumps(entries, indent=2, sort_keys=True) + "\n" for name, entries in files.items()}


def scrape_configs(scrape: Scrape, targets_dir: str) -> list[dict[str, Any]]:
    """prometheus.yml's scrape_configs for the files target_files makes, read from `targets_dir`."""
    configs = []
    for name in target_files(scrape):
        job = name.removesuffix(".json")
        config: dict[str, Any] = {"job_name": f"provision-{job}",
                                  "file_sd_configs": [{"files": [f"{targets_dir}/{name}"]}]}
        if job.endswith("-keyed"):
            config["authorization"] = {"type": "Bearer", "credentials_file": f"{targets_dir}/{KEY_FILE}"}
        configs.append(config)
    return configs


# Prometheus as Debian and Ubuntu package it: its unit runs `prometheus $ARGS` from the defaults file as
# user prometheus, reads CONFIG, and reloads it on SIGHUP (the unit's ExecReload); promtool ships beside it.
UNIT = "prometheus.service"
CONFIG = "/etc/prometheus/prometheus.yml"
DEFAULTS = "/etc/default/prometheus"
PROMTOOL = "/usr/bin/promtool"
USER = "prometheus"


@dataclass(frozen=True)
class HostFile:
    """A file the Prometheus host gets, and what its change asks of Prometheus."""

    path: str
    content: str
    owner: str = "root"
    mode: int = 0o644
    secret: bool = False
    then: str = ""  # "reload" (the configuration), "restart" (its command line) or "" (read when changed)

    def spec(self) -> dict[str, Any]:
        return {"path": self.path, "content": self.content, "owner": self.owner, "group": self.owner,
                "mode": self.mode, "secret": self.secret, "then": self.then}


def local_address(prometheus: Prometheus) -> str:
    """Where a program on the Prometheus host reaches Prometheus."""
    return endpoints.local_address(prometheus.bind_host)


def prometheus_config(scrape: Scrape, host: str) -> str:
    """prometheus.yml for a Prometheus the tool runs: itself, then the inventory's jobs."""
    import yaml

    prometheus = scrape.prometheus
    document = {"global": {"scrape_interval": prometheus.scrape_interval,
                           "evaluation_interval": prometheus.scrape_interval},
                "scrape_configs": [{"job_name": "prometheus", "static_configs": [
                    {"targets": [f"{local_address(prometheus)}:{prometheus.port}"], "labels": {"host": host}}]},
                                   *scrape_configs(scrape, prometheus.targets_dir)]}
    header = (f"# Rendered by provision for {host} from the inventory's prometheus: and every server and router\n"
              "# it declares. Local edits are replaced by the tool's next `metrics --apply`; change the\n"
              f"# inventory instead. The targets are in {prometheus.targets_dir}, read again when they change.\n")
    return header + yaml.safe_dump(document, sort_keys=False, default_flow_style=False)


def defaults_file(prometheus: Prometheus, host: str) -> str:
    """The package's defaults file: Prometheus's command line (where it listens, how long it keeps)."""
    return (f"# Rendered by provision for {host} from the inventory's prometheus: (bind_host, port, retention).\n"
            "# Local edits are replaced by the tool's next `metrics --apply`.\n"
            f'ARGS="--web.listen-address={prometheus.bind_host}:{prometheus.port} '
            f'--storage.tsdb.retention.time={prometheus.retention}"\n')


def host_files(scrape: Scrape, host: str, api_key: str | None) -> list[HostFile]:
    """What the Prometheus host gets: the targets files and the key file (a site's own Prometheus gets
    only these), and for a Prometheus the tool runs, its configuration and command line."""
    prometheus = scrape.prometheus
    files = [HostFile(f"{prometheus.targets_dir}/{name}", text) for name, text in target_files(scrape).items()]
    if scrape.keyed and api_key:
        files.append(HostFile(f"{prometheus.targets_dir}/{KEY_FILE}", api_key + "\n", owner=USER, mode=0o600,
                              secret=True))
    if prometheus.manage:
        files.append(HostFile(DEFAULTS, defaults_file(prometheus, host), then="restart"))
        files.append(HostFile(CONFIG, prometheus_config(scrape, host), then="reload"))
    return files


# What the tool knows of a host that no engine exports, for node-exporter's textfile collector (Debian's
# and Ubuntu's read /var/lib/prometheus/node-exporter/*.prom, the package's built-in directory), written
# where the host runs node-exporter each time `metrics --apply` looks: a snapshot, with its time.
TEXTFILE = "/var/lib/prometheus/node-exporter/provision.prom"


def textfile(units: Mapping[str, Any], generations: Mapping[str, Any] | None, now: float) -> str:
    """The Prometheus text format of the host's managed units (`units`: facts' UnitState by name, those
    loaded) and its generations record (host/generations.py's state: the current generation and its
    state), at `now`."""
    lines = [("# HELP provision_unit_restarts Restarts systemd counted for a unit the tool manages (NRestarts), "
             "when provision last looked."),
             "# TYPE provision_unit_restarts gauge"]
    loaded = {name: unit for name, unit in sorted(units.items()) if unit.load_state == "loaded"}
    lines += [f'provision_unit_restarts{{unit="{name}"}} {unit.restarts or 0}' for name, unit in loaded.items()]
    lines += ["# HELP provision_unit_active 1 where a unit the tool manages was active when provision last looked.",
              "# TYPE provision_unit_active gauge"]
    lines += [f'provision_unit_active{{unit="{name}"}} {int(unit.active_state == "active")}'
              for name, unit in loaded.items()]
    current = _current_generation(generations)
    if current is not None:
        lines += [("# HELP provision_generation The generation of the host's files in effect, by its state "
                  "(promoted, pending, applied, ...)."),
                  "# TYPE provision_generation gauge",
                  f'provision_generation{{state="{current.get("state", "unknown")}"}} {int(current["id"])}']
    lines += ["# HELP provision_textfile_timestamp_seconds When provision wrote this file.",
              "# TYPE provision_textfile_timestamp_seconds gauge",
              f"provision_textfile_timestamp_seconds {now:.0f}"]
    return "\n".join(lines) + "\n"


def _current_generation(generations: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    if not generations:
        return None
    return next((item for item in generations.get("generations", [])
                 if isinstance(item, dict) and item.get("id") == generations.get("current")
                 and isinstance(item.get("id"), int)), None)
