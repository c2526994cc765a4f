"""`invoke metrics`: the inventory's scrape targets, and the Prometheus that reads them.

inventory -> targets (provision/metrics.py, pure) -> [--apply: the Prometheus host's files as they are (one
round trip) -> the plan, shown -> written, Prometheus reloaded -> its own view of each target].

Without --apply nothing is contacted: the targets, where Prometheus reaches each, the ones it cannot and
why, and the scrape configuration (what a site's own Prometheus adds beside the targets files).
"""
from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from provision import facts, hints, metrics, programs, remote
from provision import secrets as secret_store
from provision.errors import InventoryError, ProvisionError, UnreachableHost, error_text
from provision.fanout import for_each_host
from provision.inventory import Host, Inventory, Prometheus
from provision.plan import GENERATIONS_STATE, diff

PROGRAM_TIMEOUT = 180.0


# What each host is asked: the exporters it runs, and for node-exporter's textfile its managed units and
# its generations record.
ASKED = ("exporters", "units")


def hosts_facts(inventory: Inventory, accept_new_host_keys: bool) -> tuple[dict[str, facts.HostFacts], list[str]]:
    """Each host's exporters, managed units and generations record (one round trip each, all at once), and
    the hosts that did not answer (left out, said: never hiding the others)."""
    wanted = tuple(fact for fact in facts.FACTS if fact.name in ASKED)

    def ask(host: Host) -> facts.HostFacts:
        runner = remote.connect(host, inventory.ssh, accept_new_host_keys=accept_new_host_keys)
        try:
            return facts.gather(runner, facts=wanted, inspect={"files": [GENERATIONS_STATE]})
        finally:
            runner.close()

    found = for_each_host(list(inventory.hosts.values()), lambda host: host.name, ask)
    return dict(found.values), [f"{name}: {error_text(error)}" for name, error in found.errors.items()]


def exporters(found: Mapping[str, facts.HostFacts]) -> dict[str, tuple[str, ...]]:
    return {name: host.exporters for name, host in found.items() if host.exporters}


def write_textfiles(inventory: Inventory, found: Mapping[str, facts.HostFacts], accept_new_host_keys: bool,
                    now: float) -> dict[str, str | None]:
    """node-exporter's textfile (metrics.TEXTFILE) on each host that runs it: {host: None, or why not}."""

    def write(name: str) -> str | None:
        host = found[name]
        state = host.files.get(GENERATIONS_STATE, {})
        try:
            record = json.loads(str(state.get("content") or "{}"))
        except json.JSONDecodeError:
            record = None
        content = metrics.textfile(host.units or {}, record if isinstance(record, dict) else None, now)
        program = _program([metrics.HostFile(metrics.TEXTFILE, content)], None, dry=False)
        runner = remote.connect(inventory.hosts[name], inventory.ssh, accept_new_host_keys=accept_new_host_keys)
        try:
            answer, result = programs.run(runner, program, PROGRAM_TIMEOUT, lambda event: None)
        finally:
            runner.close()
        return answer.get("error") if answer else f"the metrics program said nothing ({programs.tail(result)})"

    names = [name for name, host in found.items() if "node" in (host.exporters or ())]
    done = for_each_host(names, lambda name: name, write)
    return {**dict(done.values), **{name: error_text(error) for name, error in done.errors.items()}}


def declared(inventory: Inventory) -> Prometheus:
    """The inventory's `prometheus:`; without one, an InventoryError (exit 2) saying what to add."""
    if inventory.prometheus is None:
        raise InventoryError("the inventory declares no Prometheus: add `prometheus: {host: NAME}` (the host "
                             "that runs it, or a site's own with manage: false)", file=inventory.path or "inventory",
                             key="prometheus")
    return inventory.prometheus


def scrape_of(inventory: Inventory, exporters: Mapping[str, tuple[str, ...]] | None = None
              ) -> tuple[metrics.Scrape, str | None]:
    """The inventory's targets, and the API key the keyed ones need (None: the secrets hold none)."""
    declared(inventory)
    key = secret_store.load(inventory.secrets).api_key
    return metrics.plan(inventory, inventory.settings, api_key=bool(key), exporters=exporters), key


def targets_json(scrape: metrics.Scrape) -> dict[str, Any]:
    prometheus = scrape.prometheus
    return {"prometheus": {"host": prometheus.host, "manage": prometheus.manage,
                           "address": f"{prometheus.bind_host}:{prometheus.port}",
                           "targets_dir": prometheus.targets_dir},
            "targets": [{"job": t.job, "host": t.host, "address": t.address, "path": t.path, "keyed": t.keyed,
                         "labels": dict(t.labels), "unreachable": t.unreachable} for t in scrape.targets],
            "not_scraped": list(scrape.not_scraped),
            "scrape_configs": metrics.scrape_configs(scrape, prometheus.targets_dir)}


@dataclass
class Applied:
    """What --apply did on the Prometheus host."""

    host: str
    planned: list[str] = field(default_factory=list)  # the plan's lines, diffs masked
    written: list[str] = field(default_factory=list)
    action: str = ""
    error: str | None = None
    health: list[dict[str, Any]] = field(default_factory=list)  # Prometheus's /api/v1/targets, per target
    unknown: list[str] = field(default_factory=list)  # hosts whose exporters could not be asked, and why
    textfiles: dict[str, str | None] = field(default_factory=dict)  # node-exporter's, per host: None or why not


def _plan_lines(files: list[metrics.HostFile], differs: list[str], current: Mapping[str, str | None]) -> list[str]:
    lines = []
    for item in files:
        if item.path not in differs:
            continue
        if item.secret:
            lines.append(f"file {item.path}: the API key (mode {item.mode:o}, owner {item.owner}; not shown)")
            continue
        old = current.get(item.path)
        lines.append(f"file {item.path}: {'new' if old is None else 'changed'}"
                     + (f" (then {item.then} {metrics.UNIT})" if item.then else ""))
        if old is not None:
            lines.append(diff(item.path, old, item.content).rstrip())
    return lines


def _program(files: list[metrics.HostFile], prometheus: Prometheus | None, dry: bool) -> str:
    """host/metrics.py with its spec: `files` for the Prometheus the tool runs (its unit reloaded or
    restarted, ready awaited), for a site's own or for a host's node-exporter (`prometheus` None: files
    alone)."""
    runs = prometheus is not None and prometheus.manage
    spec = {"files": [item.spec() for item in files], "dry": dry, "unit": metrics.UNIT if runs else None,
            "config": metrics.CONFIG if prometheus else None, "promtool": metrics.PROMTOOL, "wait": 60,
            "ready": f"http://{metrics.local_address(prometheus)}:{prometheus.port}/-/ready" if prometheus else ""}
    return programs.ship(["metrics"], "main", spec)


HEALTH_WAIT = 20.0  # seconds a Prometheus just (re)started or reloaded may take to scrape each target once


def _targets_page(address: str, port: int) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://{address}:{port}/api/v1/targets?state=active", timeout=10) as answer:
        data = json.load(answer)
    found = []
    for target in data.get("data", {}).get("activeTargets", []):
        labels = target.get("labels", {})
        found.append({"job": labels.get("job", ""), "instance": labels.get("instance", ""),
                      "host": labels.get("host", ""), "health": target.get("health", "unknown"),
                      "error": target.get("lastError", "")})
    return sorted(found, key=lambda item: (item["job"], item["instance"]))


def _health(runner: Any, scrape: metrics.Scrape) -> list[dict[str, Any]]:
    """Prometheus's own view of each target (/api/v1/targets), asked over the host's loopback: once it
    knows every target (itself and the reachable ones) and has scraped each once, or as it is after
    HEALTH_WAIT (a Prometheus just restarted or reloaded reads its targets files, then scrapes)."""
    prometheus = scrape.prometheus
    expected = 1 + len(scrape.reachable)
    deadline = time.monotonic() + HEALTH_WAIT
    found: list[dict[str, Any]] = []
    with remote.forwarded(runner, metrics.local_address(prometheus), prometheus.port) as (address, port):
        while True:
            try:
                found = _targets_page(address, port)
            except OSError:
                if time.monotonic() > deadline:
                    raise
            if len(found) >= expected and all(item["health"] != "unknown" for item in found):
                return found
            if time.monotonic() > deadline:
                return found
            time.sleep(0.5)


def apply(inventory: Inventory, scrape: metrics.Scrape, api_key: str | None, *, accept_new_host_keys: bool,
          progress: Callable[[str], None]) -> Applied:
    """Put the files on the Prometheus host where they differ, have Prometheus read them, and ask it how
    each target answers. One round trip where nothing differs (the health question aside)."""
    prometheus = scrape.prometheus
    host = inventory.hosts[prometheus.host]
    files = metrics.host_files(scrape, prometheus.host, api_key)
    done = Applied(prometheus.host)
    runner = remote.connect(host, inventory.ssh, accept_new_host_keys=accept_new_host_keys)
    try:
        seen, result = programs.run(runner, _program(files, prometheus, dry=True), PROGRAM_TIMEOUT, lambda event: None)
        if not seen:
            raise ProvisionError(f"{prometheus.host}: the metrics program said nothing ({programs.tail(result)})")
        if prometheus.manage and not seen.get("installed"):
            done.error = (f"Prometheus is not installed on {prometheus.host}: "
                          f"`{hints.command(f'prepare --host {prometheus.host}')}` installs it")
            return done
        done.planned = _plan_lines(files, list(seen.get("differs", [])), seen.get("current", {}))
        if seen.get("differs") or not seen.get("active"):
            progress(f"{prometheus.host}: writing {len(seen.get('differs', []))} file(s)")
            answer, result = programs.run(runner, _program(files, prometheus, dry=False), PROGRAM_TIMEOUT,
                                          lambda event: None)
            if not answer:
                raise ProvisionError(f"{prometheus.host}: the metrics program said nothing ({programs.tail(result)})")
            done.written, done.action, done.error = answer.get("written", []), answer.get("action", ""), \
                answer.get("error")
        if prometheus.manage and done.error is None:
            try:
                done.health = _health(runner, scrape)
            except (OSError, ValueError) as exc:  # URLError is an OSError; a page not JSON a ValueError
                done.error = (f"Prometheus on {prometheus.host} did not answer /api/v1/targets: {exc} "
                              f"(journalctl -u {metrics.UNIT} on {prometheus.host} says why)")
    except UnreachableHost as exc:
        done.error = str(exc)
    finally:
        runner.close()
    return done


def applied_json(done: Applied) -> dict[str, Any]:
    return {"host": done.host, "ok": done.error is None, "planned": done.planned, "written": done.written,
            "action": done.action, "error": done.error, "health": done.health, "exporters_unknown": done.unknown,
            "textfiles": done.textfiles}
