"""Several services on one host, on the recorded 2x RTX 5090 workstation: the inventory's targets and
layers, the gate's rules across services, what is rendered, and the plan that moves a one-server host
to services (and back) restarting nothing that did not change."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from provision import catalog, checks, context, fanout, inventory, plan, render, services
from provision.errors import InventoryError
from provision.facts import HostFacts
from provision.parsers import UnitState
from tests.conftest import FIXTURES
from tests.test_checks import recorded
from tests.test_checks import settings as checks_settings

MODEL = "Qwen/Qwen2.5-7B-Instruct-AWQ"

TWO_MODELS = """
hosts:
  ws:
    address: 192.0.2.10
    profile: rtx5090
    vars: {max_model_len: 8192}
    services:
      coder:
        gpus: [0]
        vars: {model: Qwen/Qwen2.5-Coder-7B-Instruct-AWQ, port: 8001}
      chat:
        gpus: [1]
        vars: {model: Qwen/Qwen2.5-7B-Instruct-AWQ, port: 8002}
"""

ONE_SERVER = """
hosts:
  ws:
    address: 192.0.2.10
    profile: rtx5090
    vars: {max_model_len: 8192, model: Qwen/Qwen2.5-Coder-7B-Instruct-AWQ, port: 8001}
"""


def load(tmp_path: Path, text: str) -> inventory.Inventory:
    path = tmp_path / "hosts.yaml"
    path.write_text(textwrap.dedent(text))
    return inventory.load(path)


def gated(inv: inventory.Inventory, listing: HostFacts | None = None) -> dict[str, context.Context]:
    """Each target's context on the recorded workstation (the same facts for every service), its unit
    directory listed as on `listing`."""
    workstation = recorded("rtx5090x2-tr7960x")
    if listing is not None:
        workstation = dataclasses.replace(workstation, dirs=listing.dirs)
    return context.contexts(inv, {target.name: workstation for target in inv.select(everything=True)}, {})


def verdicts(ctx: context.Context) -> dict[str, checks.Finding]:
    return {finding.id: finding for finding in checks.evaluate(ctx)}


def as_rendered(*states: render.DesiredState, running: bool = True) -> HostFacts:
    """A host that has every file and unit of `states` in place, as the plan reads it."""
    files: dict[str, Any] = {}
    units: dict[str, UnitState] = {}
    listing: list[str] = []
    for state in states:
        files.update({f.path: {"exists": True, "sha256": hashlib.sha256(f.content.encode()).hexdigest(),
                               "mode": f.mode, "owner": f.owner, "group": f.group, "content": f.content}
                      for f in state.files})
        files.update({d.path: {"exists": True, "is_dir": True, "mode": d.mode, "owner": d.owner, "group": d.group}
                      for d in state.directories})
        units.update({u: UnitState(u, "loaded", "active" if running else "inactive", "running", "enabled", 0, "x")
                      for u in state.units})
        listing += [f.path.rsplit("/", 1)[1] for f in state.files if f.path.startswith(render.UNIT_DIR + "/")]
    return HostFacts(host="ws", files=files, users={states[0].user: {"exists": True}}, units=units,
                     dirs={render.UNIT_DIR: tuple(sorted(listing))})


def seen_by(host: HostFacts, ctx: context.Context) -> HostFacts:
    """The host as one server's probe sees it: the units it asks about (its own, and the host's own
    names where it carries them), the rest only as files in the unit directory."""
    asked = set(render.units_of(ctx.naming))
    return dataclasses.replace(host, units={name: state for name, state in host.units.items() if name in asked})


def states(inv: inventory.Inventory, listing: HostFacts | None = None) -> dict[str, render.DesiredState]:
    return {name: render.desired_state(ctx) for name, ctx in gated(inv, listing).items()}


def test_a_host_name_stands_for_its_services_each_with_its_own_layer(tmp_path: Path) -> None:
    inv = load(tmp_path, TWO_MODELS)
    assert [h.name for h in inv.select(hosts=["ws"])] == ["ws/coder", "ws/chat"]
    assert [h.name for h in inv.select(everything=True)] == ["ws/coder", "ws/chat"]
    assert [h.name for h in inv.select(hosts=["ws/chat"])] == ["ws/chat"]
    coder, chat = inv.settings("ws/coder"), inv.settings("ws/chat")
    assert (coder.model, coder.port, coder.max_model_len) == ("Qwen/Qwen2.5-Coder-7B-Instruct-AWQ", 8001, 8192)
    assert coder.origin["model"] == "service coder" and coder.origin["max_model_len"] == "host"
    # The GPUs become CUDA's own selection, beside the profile's environment (merged, not replaced).
    assert coder.environment["CUDA_VISIBLE_DEVICES"] == "0" and chat.environment["CUDA_VISIBLE_DEVICES"] == "1"
    assert coder.environment["NCCL_DMABUF_ENABLE"] == "1"
    assert inv.siblings("ws/coder") == ["ws/chat"]
    assert inv.naming("ws/coder") == services.Naming("coder", carrier=True)
    assert inv.naming("ws/chat") == services.Naming("chat", carrier=False)


@pytest.mark.parametrize("text, says", [
    ("services: {Coder: {}}", "lower-case letters"),
    ("services: {}", "at least one"),
    ("services: {coder: {gpus: [0, 0]}}", "GPU indices"),
    ("services: {coder: {gpus: 1}}", "GPU indices"),
    ("services: {coder: {gpu: [1]}}", "unknown key"),
    ("services: {coder: {gpus: [1], vars: {environment: {CUDA_VISIBLE_DEVICES: '0'}}}}", "both choose"),
    ("services: {coder: {vars: {port: 99999}}}", "port"),
])
def test_a_bad_service_is_an_inventory_error_naming_it(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(InventoryError) as raised:
        load(tmp_path, f"hosts:\n  ws:\n    address: 192.0.2.10\n    profile: rtx5090\n    {text}\n")
    assert says in str(raised.value) and "ws" in str(raised.value)


def test_a_host_with_services_is_in_no_cluster(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="declares services"):
        load(tmp_path, TWO_MODELS + "clusters:\n  c: {hosts: [ws]}\n")


def test_two_models_on_two_gpus_pass_the_gate_each_on_its_own_gpu(tmp_path: Path) -> None:
    # Both are Qwen2.5 7B checkpoints (the coder one too): each with config.json as the hub gives it, so
    # memory.fits estimates the KV cache (without one it could not judge it: tests/test_kvcache.py).
    shape = json.loads((FIXTURES / "model_configs" / "qwen2.5-7b-instruct.json").read_text())["config"]
    found = {name: verdicts(dataclasses.replace(ctx, model_config=shape))
             for name, ctx in gated(load(tmp_path, TWO_MODELS)).items()}
    for name in ("ws/coder", "ws/chat"):
        assert {rule: found[name][rule].status for rule in
                ("services.gpus", "services.ports", "services.shared_gpu", "gpu.count", "memory.fits")} == {
            "services.gpus": "pass", "services.ports": "pass", "services.shared_gpu": "pass",
            "gpu.count": "pass", "memory.fits": "pass"}, name
        assert checks.verdict(list(found[name].values())) != "blocked"
    assert found["ws/coder"]["services.gpus"].evidence["gpus"] == [0]
    assert found["ws/chat"]["services.gpus"].evidence["gpus"] == [1]


SHARED = """
hosts:
  ws:
    address: 192.0.2.10
    profile: rtx5090
    vars: {{max_model_len: 8192, model: {model}}}
    services:
      coder:
        gpus: [0]
        vars: {{port: 8001{coder}}}
      chat:
        gpus: [0, 1]
        vars: {{port: {chat_port}, tensor_parallel_size: 2{chat}}}
"""


@pytest.mark.parametrize("coder, chat, chat_port, rule, status, says", [
    ("", "", 8002, "services.shared_gpu", "fail", "declare(s) no gpu_memory_utilization"),
    (", gpu_memory_utilization: 0.5", ", gpu_memory_utilization: 0.5", 8002, "services.shared_gpu", "fail",
     "GPU 0: ws/coder 0.5 + ws/chat 0.5 = 1.0 of its memory, more than the profile's 0.92"),
    (", gpu_memory_utilization: 0.46", ", gpu_memory_utilization: 0.46", 8002, "services.shared_gpu", "pass",
     "within 0.92"),
    (", gpu_memory_utilization: 0.46", ", gpu_memory_utilization: 0.46", 8001, "services.ports", "fail",
     "port 8001 is also ws/chat's"),
])
def test_services_sharing_a_gpu_declare_shares_within_the_profile_and_own_ports(
        tmp_path: Path, coder: str, chat: str, chat_port: int, rule: str, status: str, says: str) -> None:
    inv = load(tmp_path, SHARED.format(model=MODEL, coder=coder, chat=chat, chat_port=chat_port))
    found = verdicts(gated(inv)["ws/coder"])[rule]
    assert found.status == status and says in found.message, found.message


def test_the_memory_fit_counts_a_shared_gpu_by_the_service_s_share(tmp_path: Path) -> None:
    """A 32B AWQ fits one 32 GB RTX 5090 at the profile's 0.92, not in a 0.46 share of it."""
    alone = verdicts(gated(load(tmp_path, SHARED.format(
        model="Qwen/Qwen2.5-32B-Instruct-AWQ", coder="", chat="", chat_port=8002)))["ws/coder"])
    shared = verdicts(gated(load(tmp_path, SHARED.format(
        model="Qwen/Qwen2.5-32B-Instruct-AWQ", coder=", gpu_memory_utilization: 0.46",
        chat=", gpu_memory_utilization: 0.46", chat_port=8002)))["ws/coder"])
    assert alone["memory.fits"].status == "pass"
    assert shared["memory.fits"].status == "fail" and shared["memory.fits"].blocks


def test_tensor_parallel_is_held_within_the_service_s_gpus(tmp_path: Path) -> None:
    inv = load(tmp_path, TWO_MODELS.replace("port: 8001}", "port: 8001, tensor_parallel_size: 2}"))
    found = verdicts(gated(inv)["ws/coder"])["gpu.count"]
    assert found.status == "fail" and found.message.startswith("1 GPU(s) but TP x PP needs 2")


def test_each_service_renders_its_own_unit_environment_and_gpus(tmp_path: Path) -> None:
    rendered = states(load(tmp_path, TWO_MODELS))
    coder, chat = rendered["ws/coder"], rendered["ws/chat"]
    assert coder.units == ("vllm@coder.service",) and chat.units == ("vllm@chat.service",)
    assert coder.server_unit == "vllm@coder.service"
    paths = {f.path: f for f in coder.files}
    unit = paths[f"{render.UNIT_DIR}/vllm@coder.service"].content
    assert "EnvironmentFile=/etc/vllm/coder.env" in unit and "--port 8001" in unit
    assert 'CUDA_VISIBLE_DEVICES="0"' in paths["/etc/vllm/coder.env"].content
    assert paths["/etc/vllm/coder.env"].mode == 0o600
    # No file of one service is the other's, and neither is the host's own environment file.
    assert not {f.path for f in coder.files} & {f.path for f in chat.files}
    assert render.ENV_FILE in coder.absent_files and render.ENV_FILE not in chat.absent_files
    assert "vllm.service" in coder.absent_units and "vllm.service" not in chat.absent_units


def test_a_one_server_host_moves_to_services_saying_what_is_renamed(tmp_path: Path) -> None:
    before = states(load(tmp_path, ONE_SERVER))["ws"]
    host = as_rendered(before)
    after = states(load(tmp_path, TWO_MODELS))
    contexts = gated(load(tmp_path, TWO_MODELS))
    coder = plan.build(after["ws/coder"], seen_by(host, contexts["ws/coder"]))
    steps = [(c.kind, c.target) for c in coder]
    assert ("stop", "vllm.service") in steps and ("start", "vllm@coder.service") in steps
    stop = next(c for c in coder if c.kind == "stop")
    assert stop.reason.startswith("renamed vllm.service -> vllm@coder.service")
    assert next(c for c in coder if c.kind == "start").reason == "renamed from vllm.service"
    assert ("remove", render.ENV_FILE) in steps and ("remove", f"{render.UNIT_DIR}/vllm.service") in steps
    # The other service is new: its own files and unit, nothing of the host's touched.
    chat = plan.build(after["ws/chat"], seen_by(host, contexts["ws/chat"]))
    assert {c.kind for c in chat} == {"file", "daemon-reload", "enable", "start"}
    assert all("chat" in c.target or c.kind == "daemon-reload" for c in chat)


def test_a_change_to_one_service_restarts_that_service_alone(tmp_path: Path) -> None:
    rendered = states(load(tmp_path, TWO_MODELS))
    host = as_rendered(*rendered.values())
    contexts = gated(load(tmp_path, TWO_MODELS))
    assert all(plan.build(state, seen_by(host, contexts[name])) == [] for name, state in rendered.items())
    changed_inv = load(tmp_path, TWO_MODELS.replace("port: 8002", "port: 8003"))
    changed = states(changed_inv)
    changed_contexts = gated(changed_inv)
    assert plan.build(changed["ws/coder"], seen_by(host, changed_contexts["ws/coder"])) == []
    chat = plan.build(changed["ws/chat"], seen_by(host, changed_contexts["ws/chat"]))
    assert [(c.kind, c.target) for c in chat] == [
        ("file", f"{render.UNIT_DIR}/vllm@chat.service"), ("daemon-reload", "systemd"),
        ("restart", "vllm@chat.service")]


def test_a_service_dropped_from_the_inventory_is_stopped_and_removed_by_the_host_s_first(tmp_path: Path) -> None:
    host = as_rendered(*states(load(tmp_path, TWO_MODELS)).values())
    only_coder = load(tmp_path, TWO_MODELS.split("      chat:")[0])
    (coder,) = states(only_coder, host).values()
    changes = plan.build(coder, seen_by(host, gated(only_coder)["ws/coder"]))
    assert [(c.kind, c.target) for c in changes] == [
        ("stop", "vllm@chat.service"), ("remove", f"{render.UNIT_DIR}/vllm@chat.service"),
        ("remove", "/etc/vllm/chat.env"), ("daemon-reload", "systemd")]
    # And back to one server: both services go, the host's own unit comes back.
    (plain,) = states(load(tmp_path, ONE_SERVER), host).values()
    back = plan.build(plain, host)
    steps = [(c.kind, c.target) for c in back]
    assert ("stop", "vllm@coder.service") in steps and ("stop", "vllm@chat.service") in steps
    assert ("remove", "/etc/vllm/coder.env") in steps and ("start", "vllm.service") in steps


def test_a_hosts_services_share_one_probe_that_asks_what_each_of_them_asks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ast
    import json

    from provision import lab, remote, run
    from tests.fakes import FakeRunner, ok, probe_answer_from_recording

    answer = probe_answer_from_recording(lab.load_machine("rtx5090x2-tr7960x"))
    runners: list[FakeRunner] = []

    def connect(host: inventory.Host, *_: Any, **__: Any) -> FakeRunner:
        runners.append(FakeRunner(host.name, lambda argv, stdin: ok(answer, argv)))
        return runners[-1]

    monkeypatch.setattr(remote, "connect", connect)
    inv = load(tmp_path, TWO_MODELS + ONE_SERVER.replace("hosts:\n  ws:", "  other:").replace("192.0.2.10", "192.0.2.11"))
    gathered = run.gather(inv, inv.select(everything=True), run.Options(quiet=True))
    assert gathered.ok and list(gathered.values) == ["ws/coder", "ws/chat", "other"]
    assert sorted((runner.host, runner.executions) for runner in runners) == [("other", 1), ("ws/coder", 1)]
    assert gathered.values["ws/chat"].host == "ws/chat"  # the same answer, named for each service
    # One probe asks each service's units (and the host's own names, which the first one carries).
    program = str(next(r for r in runners if r.host == "ws/coder").calls[0][1])
    spec = json.loads(ast.literal_eval(program.rstrip().rsplit("json.loads(", 1)[1][:-2]))
    asked = spec["commands"]["units"]
    assert {"vllm@coder.service", "vllm@chat.service", "vllm.service"} <= set(asked), asked
    assert {"/etc/vllm/coder.env", "/etc/vllm/chat.env"} <= set(spec["inspect"]["files"])
    assert {"/etc/systemd/system/vllm@coder.service.d", "/etc/systemd/system/vllm@chat.service.d"} <= \
        set(spec["inspect"]["dirs"]), spec["inspect"]["dirs"]


def test_a_service_s_generations_are_its_own(tmp_path: Path) -> None:
    inv = load(tmp_path, TWO_MODELS)
    contexts = gated(inv)
    from provision.run.planning import scope_of

    coder = scope_of(contexts["ws/coder"].settings, contexts["ws/coder"].naming)
    chat = scope_of(contexts["ws/chat"].settings, contexts["ws/chat"].naming)
    assert coder.root == "/var/lib/provision/services/coder/generations" and chat.root.endswith("/chat/generations")
    assert "/etc/vllm/chat.env" in chat.files and render.ENV_FILE not in chat.files
    assert render.ENV_FILE in coder.files  # the first carries the host's own names (a migration's rollback)
    # every engine's server unit, as the catalog names them, instanced for the service
    assert set(chat.units) == {f"{entry.server_unit.removesuffix('.service')}@chat.service"
                               for entry in catalog.ENGINES.values()}
    assert {"vllm@chat.service", "llama-server@chat.service", "trtllm-serve@chat.service"} <= set(chat.units)


def test_the_services_of_one_host_run_in_turn_and_hosts_at_once() -> None:
    running: dict[str, int] = {}
    most: dict[str, int] = {}
    lock = threading.Lock()
    seen_hosts: set[frozenset[str]] = set()

    def work(name: str) -> str:
        host = name.split("/")[0]
        with lock:
            running[host] = running.get(host, 0) + 1
            most[host] = max(most.get(host, 0), running[host])
            seen_hosts.add(frozenset(h for h, n in running.items() if n))
        time.sleep(0.05)
        with lock:
            running[host] -= 1
        if name == "a/two":
            raise RuntimeError("failed")
        return name

    names = ["a/one", "a/two", "a/three", "b", "c/one"]
    results = fanout.for_each_host(names, lambda n: n, work)
    assert most == {"a": 1, "b": 1, "c": 1}  # one service of a host at a time
    assert any(len(hosts) > 1 for hosts in seen_hosts)  # hosts in parallel
    assert results.order == tuple(names) and set(results.values) == {"a/one", "a/three", "b", "c/one"}
    assert str(results.errors["a/two"]) == "failed"  # a failing service never stops its host's next


ONE_URL = TWO_MODELS + """
endpoints:
  ws:
    host: ws
    services: [ws/coder, ws/chat]
    port: 9000
"""


def test_one_endpoint_routes_to_both_services_by_model_from_beside_the_first(tmp_path: Path) -> None:
    import os
    import shutil
    import subprocess

    from provision import endpoints

    inv = load(tmp_path, ONE_URL)
    contexts = gated(inv)
    coder, chat = contexts["ws/coder"], contexts["ws/chat"]
    (routed,) = coder.endpoints
    assert chat.endpoints == () and coder.behind == routed and chat.behind == routed
    assert [(b.model, [r.cluster for r in b.replicas]) for b in routed.backends] == [
        ("Qwen/Qwen2.5-Coder-7B-Instruct-AWQ", ["ws:coder"]), ("Qwen/Qwen2.5-7B-Instruct-AWQ", ["ws:chat"])]
    assert [(r.address, r.port) for r in routed.replicas] == [("127.0.0.1", 8001), ("127.0.0.1", 8002)]
    rendered = {name: render.desired_state(ctx) for name, ctx in contexts.items()}
    assert rendered["ws/coder"].units == ("vllm@coder.service", endpoints.ROUTER_UNIT)
    assert endpoints.ROUTER_UNIT not in rendered["ws/chat"].units + rendered["ws/chat"].absent_units
    config = next(f for f in rendered["ws/coder"].files if f.path == endpoints.CONFIG_FILE).content
    assert shutil.which("haproxy"), "haproxy is not installed: the README's first command installs it"
    path = tmp_path / "haproxy.cfg"
    path.write_text(config)
    done = subprocess.run(["haproxy", "-c", "-f", str(path)], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ), check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "server ws:coder 127.0.0.1:8001 check" in config and "server ws:chat 127.0.0.1:8002 check" in config


def test_a_changed_endpoint_reloads_its_router_and_restarts_no_server(tmp_path: Path) -> None:
    from provision import endpoints

    host = as_rendered(*states(load(tmp_path, ONE_URL)).values())
    moved_inv = load(tmp_path, ONE_URL.replace("port: 9000", "port: 9001"))
    moved, contexts = states(moved_inv), gated(moved_inv)
    coder = plan.build(moved["ws/coder"], seen_by(host, contexts["ws/coder"]))
    # The config is new; the router re-reads it (HAProxy's new workers), the old ones finish what they hold.
    assert [(c.kind, c.target) for c in coder] == [("file", endpoints.CONFIG_FILE), ("reload", endpoints.ROUTER_UNIT)]
    assert coder[-1].reason.endswith("changed (a reload: what the unit holds is finished, not cut)")
    assert coder[-1].data == {"because": [endpoints.CONFIG_FILE]}
    assert plan.build(moved["ws/chat"], seen_by(host, contexts["ws/chat"])) == []
    # A replica's new port: its server restarts, the router (whose config names the port) reloads.
    ported_inv = load(tmp_path, ONE_URL.replace("port: 8001", "port: 8011"))
    ported, contexts = states(ported_inv), gated(ported_inv)
    steps = [(c.kind, c.target) for c in plan.build(ported["ws/coder"], seen_by(host, contexts["ws/coder"]))]
    assert ("restart", "vllm@coder.service") in steps and ("reload", endpoints.ROUTER_UNIT) in steps
    assert ("restart", endpoints.ROUTER_UNIT) not in steps


@pytest.mark.parametrize("endpoint, says", [
    ("services: [ws/nope]", "unknown service 'ws/nope'"),
    ("services: []", "clusters, services or both"),
    ("services: [ws/coder, ws/coder]", "each once"),
])
def test_an_endpoint_naming_a_service_wrongly_is_an_inventory_error(tmp_path: Path, endpoint: str, says: str) -> None:
    with pytest.raises(InventoryError, match=re.escape(says)):
        load(tmp_path, TWO_MODELS + f"endpoints:\n  e:\n    host: ws\n    {endpoint}\n")


def test_tuned_settings_of_one_service_are_read_for_that_service_alone(tmp_path: Path) -> None:
    (tmp_path / "tuned").mkdir()
    assert inventory.tuned_file_name("ws/coder") == "ws@coder.yaml"
    (tmp_path / "tuned" / "ws@coder.yaml").write_text("host: ws/coder\nvars: {max_model_len: 4096}\n")
    inv = load(tmp_path, TWO_MODELS)
    coder, chat = inv.settings("ws/coder"), inv.settings("ws/chat")
    assert coder.max_model_len == 4096 and coder.origin["max_model_len"].endswith("tuned/ws@coder.yaml")
    assert chat.max_model_len == 8192


def test_readiness_watches_the_service_s_own_unit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A service's server is NAME@SERVICE: readiness watching the host's plain unit would read the one a
    rename just stopped as a server that exited."""
    from provision import server

    watched: list[str] = []
    monkeypatch.setattr(server, "wait_ready_at", lambda runner, where, *args: watched.append(where["unit"]) or 1.0)
    settings = checks_settings("cpu", engine="llamacpp", model="lab/tiny-gguf")
    server.wait_ready(object(), settings, None, 10, naming=services.Naming("a", carrier=True))  # type: ignore[arg-type]
    server.wait_ready(object(), settings, None, 10)  # type: ignore[arg-type]
    assert watched == ["llama-server@a.service", "llama-server.service"]
