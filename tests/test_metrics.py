"""What Prometheus scrapes of an inventory (provision/metrics.py), the files its host gets, and the host program
that writes them (provision/host/metrics.py), on inventories shaped like the lab's and the field's."""
from __future__ import annotations

import getpass
import io
import json
import os
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import yaml

from provision import inventory, metrics, render
from provision.errors import InventoryError
from provision.host import metrics as host_metrics

# cpu-2 runs llama.cpp on loopback and the endpoint's router (beyond loopback, with the key), cpu-3 the second
# replica beyond loopback, cpu-1 vLLM on loopback, trt a TensorRT-LLM 1.2 server (JSON statistics only).
INVENTORY = """
secrets: secrets.yaml
hosts:
  cpu-1: {address: 10.0.0.1, profile: cpu}
  cpu-2: {address: 10.0.0.2, profile: cpu}
  cpu-3: {address: 10.0.0.3, profile: cpu}
  trt: {address: 10.0.0.4, profile: hopper, vars: {engine: trtllm, model: org/m, engine_spec: tensorrt-llm==1.2.0}}
clusters:
  lab-cpu: {hosts: [cpu-1], vars: {model: lab/tiny-llama, served_model_name: tiny-llama}}
  lab-llama: {hosts: [cpu-2], vars: {engine: llamacpp, model: lab/tiny-gguf, served_model_name: tiny-gguf}}
  lab-llama-b: {hosts: [cpu-3], vars: {engine: llamacpp, model: lab/tiny-gguf, served_model_name: tiny-gguf,
                                       bind_host: 0.0.0.0, port: 8001}}
endpoints:
  lab-tiny: {host: cpu-2, clusters: [lab-llama, lab-llama-b], bind_host: 0.0.0.0, port: 9000}
prometheus: {host: cpu-2, retention: 30d, scrape_interval: 5s}
"""
KEY = "sk-test-" + "0123456789abcdef" * 2


def load(tmp_path: Path, text: str = INVENTORY, **prometheus: Any) -> inventory.Inventory:
    document = yaml.safe_load(text)
    document["prometheus"].update(prometheus)
    (tmp_path / "hosts.yaml").write_text(yaml.safe_dump(document))
    secrets = tmp_path / "secrets.yaml"
    secrets.write_text(f"api_key: {KEY}\n")
    secrets.chmod(0o600)
    return inventory.load(tmp_path / "hosts.yaml")


def scrape(tmp_path: Path, exporters: dict[str, list[str]] | None = None, **prometheus: Any) -> metrics.Scrape:
    inv = load(tmp_path, **prometheus)
    return metrics.plan(inv, inv.settings, api_key=True, exporters=exporters)


def by_host(found: metrics.Scrape, job: str = "servers") -> dict[str, metrics.Target]:
    return {target.host: target for target in found.targets if target.job == job}


def test_each_server_is_reached_from_the_prometheus_host_as_it_listens(tmp_path: Path) -> None:
    servers = by_host(scrape(tmp_path))
    assert servers["cpu-2"].address == "127.0.0.1:8000" and not servers["cpu-2"].unreachable  # its own host
    assert servers["cpu-3"].address == "10.0.0.3:8001" and not servers["cpu-3"].unreachable  # beyond loopback
    assert servers["cpu-1"].unreachable and "listens on 127.0.0.1 only" in servers["cpu-1"].unreachable
    assert "Prometheus runs on cpu-2" in servers["cpu-1"].unreachable


def test_the_labels_say_which_server_it_is(tmp_path: Path) -> None:
    servers = by_host(scrape(tmp_path))
    assert dict(servers["cpu-3"].labels) == {"host": "cpu-3", "cluster": "lab-llama-b", "engine": "llamacpp",
                                             "model": "tiny-gguf", "endpoint": "lab-tiny"}
    assert dict(servers["cpu-1"].labels) == {"host": "cpu-1", "cluster": "lab-cpu", "engine": "vllm",
                                             "model": "tiny-llama"}


def test_llama_cpp_and_the_router_get_the_key_vllm_does_not_need_it(tmp_path: Path) -> None:
    found = scrape(tmp_path)
    servers = by_host(found)
    assert servers["cpu-2"].keyed and servers["cpu-3"].keyed  # llama-server's /metrics answers 401 without it
    assert not servers["cpu-1"].keyed  # vLLM checks the key on /v1 only
    (router,) = [target for target in found.targets if target.job == "routers"]
    assert router.keyed and router.address == "127.0.0.1:8405" and router.labels == {"host": "cpu-2",
                                                                                       "endpoint": "lab-tiny"}


def test_without_a_key_in_the_secrets_nothing_is_keyed(tmp_path: Path) -> None:
    inv = load(tmp_path)
    found = metrics.plan(inv, inv.settings, api_key=False)
    assert not any(target.keyed for target in found.targets) and not found.keyed
    assert all(not name.endswith("-keyed.json") for name in metrics.target_files(found))


def test_a_server_whose_page_prometheus_cannot_read_is_said_not_scraped(tmp_path: Path) -> None:
    found = scrape(tmp_path)
    assert "trt" not in by_host(found)
    assert any(line.startswith("trt: TensorRT-LLM") and "JSON" in line for line in found.not_scraped)


def test_the_targets_files_hold_the_reachable_targets_by_job_and_key(tmp_path: Path) -> None:
    files = metrics.target_files(scrape(tmp_path, exporters={"cpu-3": ["node"]}))
    assert sorted(files) == ["node.json", "routers-keyed.json", "servers-keyed.json"]
    servers = json.loads(files["servers-keyed.json"])
    assert [entry["targets"] for entry in servers] == [["127.0.0.1:8000"], ["10.0.0.3:8001"]]
    assert json.loads(files["node.json"]) == [{"labels": {"host": "cpu-3"}, "targets": ["10.0.0.3:9100"]}]


def test_the_scrape_configs_name_the_key_file_never_the_key(tmp_path: Path) -> None:
    found = scrape(tmp_path, exporters={"cpu-3": ["node"]})
    configs = {config["job_name"]: config for config in metrics.scrape_configs(found, "/etc/prometheus/provision")}
    assert configs["provision-servers-keyed"]["authorization"] == {
        "type": "Bearer", "credentials_file": "/etc/prometheus/provision/api-key"}
    assert "authorization" not in configs["provision-node"]
    files = metrics.host_files(found, "cpu-2", KEY)
    key_file = next(item for item in files if item.path.endswith("/api-key"))
    assert (key_file.content, key_file.owner, key_file.mode, key_file.secret) == (KEY + "\n", "prometheus", 0o600, True)
    assert all(KEY not in item.content for item in files if item is not key_file)


def test_prometheus_s_own_files_carry_the_inventory_s_settings(tmp_path: Path) -> None:
    files = {item.path: item for item in metrics.host_files(scrape(tmp_path, bind_host="0.0.0.0"), "cpu-2", KEY)}
    assert files[metrics.DEFAULTS].then == "restart" and files[metrics.CONFIG].then == "reload"
    assert ('ARGS="--web.listen-address=0.0.0.0:9090 --storage.tsdb.retention.time=30d"'
            in files[metrics.DEFAULTS].content)
    config = yaml.safe_load(files[metrics.CONFIG].content)
    assert config["global"]["scrape_interval"] == "5s"
    assert config["scrape_configs"][0]["static_configs"][0]["targets"] == ["127.0.0.1:9090"]
    assert [job["job_name"] for job in config["scrape_configs"][1:]] == ["provision-servers-keyed",
                                                                         "provision-routers-keyed"]


def test_a_site_s_own_prometheus_gets_the_targets_and_the_key_alone(tmp_path: Path) -> None:
    paths = [item.path for item in metrics.host_files(scrape(tmp_path, manage=False, targets_dir="/srv/sd"),
                                                      "cpu-2", KEY)]
    assert paths == ["/srv/sd/servers-keyed.json", "/srv/sd/routers-keyed.json", "/srv/sd/api-key"]


@pytest.mark.parametrize(("setting", "value", "words"), [
    ("retention", "forever", "expected a duration"), ("port", 0, "expected an integer from 1 to 65535"),
    ("host", "nope", "names unknown host 'nope'"), ("targets_dir", "relative/dir", "absolute"),
    ("colour", "red", "unknown key"),
])
def test_a_bad_prometheus_setting_is_an_inventory_error(tmp_path: Path, setting: str, value: Any, words: str) -> None:
    with pytest.raises(InventoryError) as refused:
        load(tmp_path, **{setting: value})
    assert words in str(refused.value) and "prometheus" in str(refused.value)


def test_the_router_s_metrics_port_may_not_be_a_port_it_already_listens_on(tmp_path: Path) -> None:
    text = INVENTORY.replace("bind_host: 0.0.0.0, port: 9000}", "bind_host: 0.0.0.0, port: 9000, metrics_port: 9000}")
    with pytest.raises(InventoryError) as refused:
        load(tmp_path, text)
    assert "listens on port 9000 of host 'cpu-2' too" in str(refused.value)


def test_the_router_renders_its_exporter_where_it_listens_behind_the_key(tmp_path: Path) -> None:
    from provision import endpoints

    inv = load(tmp_path)
    plan = endpoints.named(inv, "lab-tiny")
    config = render.router_config("cpu-2", [plan], keys=True)
    front = config.split("frontend lab-tiny-metrics", 1)[1].split("\nbackend ", 1)[0]
    assert "bind 0.0.0.0:8405" in front
    assert front.index("status 401") < front.index("use-service prometheus-exporter")


def run_host_program(spec: dict[str, Any]) -> dict[str, Any]:
    out = io.StringIO()
    with redirect_stdout(out):
        host_metrics.main(spec)
    result: dict[str, Any] = json.loads(out.getvalue().splitlines()[-1])
    return result


def test_the_host_program_says_what_differs_then_writes_it_and_then_nothing_differs(tmp_path: Path) -> None:
    me = getpass.getuser()
    files = [{"path": str(tmp_path / "sd" / "servers.json"), "content": "[]\n", "owner": me, "group": me,
              "mode": 0o644, "secret": False, "then": ""},
             {"path": str(tmp_path / "sd" / "api-key"), "content": KEY + "\n", "owner": me, "group": me,
              "mode": 0o600, "secret": True, "then": ""}]
    spec = {"files": files, "unit": None, "config": None, "promtool": "/usr/bin/promtool", "ready": ""}
    seen = run_host_program({**spec, "dry": True})
    assert seen["differs"] == [files[0]["path"], files[1]["path"]] and not (tmp_path / "sd").exists()
    assert seen["current"] == {files[0]["path"]: None}  # a secret's content is never sent back
    done = run_host_program({**spec, "dry": False})
    assert done["ok"] and done["written"] == seen["differs"]
    assert os.stat(files[1]["path"]).st_mode & 0o777 == 0o600
    assert run_host_program({**spec, "dry": True})["differs"] == []
    os.chmod(files[1]["path"], 0o644)  # a mode changed by hand is put back
    assert run_host_program({**spec, "dry": True})["differs"] == [files[1]["path"]]


def test_the_fact_parsers_read_debian_s_prometheus_and_systemd_s_answers() -> None:
    from provision import parsers

    recorded = (Path(__file__).parent / "fixtures" / "prometheus" / "debian12-prometheus-version.txt").read_text()
    assert parsers.parse_prometheus_version(recorded) == "2.42.0"
    answered = ("Id=prometheus-node-exporter.service\nLoadState=loaded\nActiveState=active\n")
    assert parsers.parse_exporter_units(answered) == ("node",)
    assert parsers.parse_exporter_units(answered.replace("=active", "=inactive")) == ()


def test_node_exporter_s_textfile_says_the_units_and_the_generation_in_effect() -> None:
    from provision import parsers

    units = parsers.parse_systemctl_show(
        "Id=llama-server.service\nLoadState=loaded\nActiveState=active\nNRestarts=2\n\n"
        "Id=vllm.service\nLoadState=not-found\nActiveState=inactive\nNRestarts=0\n")
    record = {"current": 4, "generations": [{"id": 3, "state": "promoted"}, {"id": 4, "state": "pending"}]}
    text = metrics.textfile(units, record, 1_800_000_000.4)
    assert 'provision_unit_restarts{unit="llama-server.service"} 2' in text
    assert 'provision_unit_active{unit="llama-server.service"} 1' in text
    assert "vllm.service" not in text  # not installed: nothing to say of it
    assert 'provision_generation{state="pending"} 4' in text
    assert text.endswith("provision_textfile_timestamp_seconds 1800000000\n")
    assert "provision_generation" not in metrics.textfile(units, None, 0)
