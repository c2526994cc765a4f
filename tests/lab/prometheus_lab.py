"""Prometheus on a lab host, put there by the tool (`prepare`, then `metrics --apply`), and asked through its
own HTTP API: the lab tests of both groups (vLLM on cpu-1; llama.cpp and the endpoint on cpu-2 and cpu-3)
use these."""
from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from provision import dashboards, inventory, lab
from tests.lab.conftest import group_inventory, invoke_json, on_host, run_invoke

# Scraped every second: a replica's few seconds out of the router during a roll are seen.
SCRAPE_INTERVAL = "1s"
PORT = 9090


def prometheus_inventory(the_lab: lab.Lab, group: str, host: str, folder: Path) -> Path:
    """The group's lab inventory with Prometheus on `host`, listening on the lab network (the tests ask
    it from this machine)."""
    path = group_inventory(the_lab, group, folder)
    document = yaml.safe_load(path.read_text())
    document["prometheus"] = {"host": host, "bind_host": "0.0.0.0", "port": PORT, "scrape_interval": SCRAPE_INTERVAL,
                              "retention": "1d"}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def put_prometheus(path: Path, host: str) -> dict[str, Any]:
    """`prepare` (it installs Debian's prometheus: the gate's metrics.prometheus), then `metrics --apply`;
    its JSON document."""
    done = run_invoke("prepare", "--host", host, "--inventory", str(path), timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    code, applied, text = invoke_json("metrics", "--apply", "--inventory", str(path), timeout=600)
    assert code == 0 and applied["applied"]["ok"], text
    return applied


def remove_prometheus(inv: inventory.Inventory, host: str) -> None:
    """The host as the lab booted it: Prometheus's package, its dependencies, data and files gone."""
    on_host(inv, host, ["apt-get", "purge", "-y", "-q", "--autoremove", "prometheus"])
    on_host(inv, host, ["rm", "-rf", "/etc/prometheus", "/var/lib/prometheus", "/etc/default/prometheus"])
    on_host(inv, host, ["userdel", "prometheus"])  # the package's user: Debian's purge keeps it


def query(url: str, expr: str) -> list[dict[str, Any]]:
    """An instant query's result (Prometheus's /api/v1/query); a query Prometheus refuses fails here."""
    address = f"{url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(address, timeout=30) as answer:
        data = json.load(answer)
    assert data["status"] == "success", (expr, data)
    result: list[dict[str, Any]] = data["data"]["result"]
    return result


def wait_until_up(url: str, jobs: set[str], seconds: float = 90) -> dict[str, dict[str, str]]:
    """Every target of `jobs` up (`up == 1` on its last scrape): {instance: labels}. Fails naming the ones
    that are not, with Prometheus's own last error."""
    deadline = time.monotonic() + seconds
    while True:
        found = {item["metric"]["instance"]: (item["metric"], item["value"][1])
                 for item in query(url, "up") if item["metric"]["job"].removeprefix("provision-").split("-")[0] in jobs}
        down = {instance: labels for instance, (labels, value) in found.items() if value != "1"}
        if found and not down and {labels["job"].removeprefix("provision-").split("-")[0]
                                   for labels, _ in found.values()} == jobs:
            return {instance: labels for instance, (labels, _) in found.items()}
        if time.monotonic() > deadline:
            with urllib.request.urlopen(f"{url}/api/v1/targets", timeout=30) as answer:
                targets = json.load(answer)["data"]["activeTargets"]
            raise AssertionError(f"not every target of {sorted(jobs)} is up: "
                                 f"{[(t['labels'].get('job'), t['scrapeUrl'], t['health'], t['lastError']) for t in targets]}")
        time.sleep(1)


def unanswered_panels(url: str, name: str) -> list[str]:
    """The panels of the shipped dashboard `name` whose query returns no series from this Prometheus (the
    Grafana variables filled in as Grafana's "All" would): each one a panel drawn empty."""
    empty = []
    for panel in dashboards.queries(name):
        expr = dashboards.expand(panel.expr, rate_interval="1m")
        if not query(url, expr):
            empty.append(f"{panel.title}: {expr}")
    return empty
