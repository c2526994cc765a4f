"""Rollback and a failed deploy's way back, at the project's own boundary: a fake host answers the
programs ops and server send it (apply, reject, rollback, the readiness check), read from their specs."""
from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from provision import context, facts, inventory, plan, rolling, run, secrets
from provision.runner import Result, command_line

RESTARTED = plan.Change("restart", "vllm.service", "unit changed", {"because": ["/etc/vllm/vllm.env"]})


def spec_of(program: str) -> tuple[str, dict[str, Any]]:
    """The call and spec a shipped program ends with: `main(json.loads('…'))`."""
    last = program.rstrip().splitlines()[-1]
    call, _, rest = last.partition("(json.loads(")
    return call, json.loads(ast.literal_eval(rest.removesuffix("))")))


class FakeHost:
    """Answers each program from `answer(call, spec)`; a result event goes to on_line, as the host's does."""

    def __init__(self, answer: Callable[[str, dict[str, Any]], dict[str, Any]],
                 states: Mapping[str, str | None] | None = None) -> None:
        self.host = "cpu-1"
        self.answer = answer
        self.asked: list[tuple[str, dict[str, Any]]] = []
        self.states = states  # the generation records' sha256 under the roll lock (default: none there)

    def run(self, argv: Any, *, stdin: str | None = None, timeout: float | None = None,
            env: Mapping[str, str] | None = None, on_line: Any = None) -> Result:
        call, spec = spec_of(stdin or "")
        self.asked.append((call, spec))
        if call == "hold_main":  # the deploy's roll lock: held, the generation records as the facts read them
            held = {"event": "held", "states": {path: (self.states or {}).get(path) for path in spec["state_files"]}}
            if on_line is not None:
                on_line(json.dumps(held))
            return Result(command_line(argv), 0, json.dumps(held), "", 0.01)
        answer = self.answer(call, spec)
        if on_line is not None:
            on_line(json.dumps({"event": "result", **answer}))
        return Result(command_line(argv), 0, json.dumps(answer), "", 0.01)

    def close(self) -> None:
        return None


@pytest.fixture
def inv(tmp_path: Path) -> inventory.Inventory:
    path = tmp_path / "inventory.yaml"
    path.write_text("hosts:\n  cpu-1: {address: 10.0.0.5, profile: cpu, vars: {model: lab/tiny-llama, "
                    "fetch_weights: false}}\n  cpu-2: {address: 10.0.0.6, profile: cpu, vars: {model: "
                    "lab/tiny-llama, fetch_weights: false}}\n")
    return inventory.load(path)


def planned_for(inv: inventory.Inventory, names: list[str], overrides: Mapping[str, Any],
                changes: Mapping[str, list[plan.Change]]) -> dict[str, run.HostPlan]:
    """Each host's plan as planning leaves it: its context (the gate's settings), its inventory entry and
    its declared settings on it."""
    found = context.contexts(inv, {name: facts.HostFacts(name) for name in names}, overrides)
    return {name: run.HostPlan(list(changes.get(name, [])), scope=run.scope_of(found[name].settings),
                               context=found[name], target=inv.host(name), declared=inv.settings(name, {}))
            for name in names}


def restored(serve_port: int | None, running: tuple[str, ...] = ("vllm.service",)) -> dict[str, Any]:
    serve = ({"base": f"http://127.0.0.1:{serve_port}", "model": "lab/tiny-llama", "unit": "vllm.service"}
             if serve_port else None)
    return {"ok": True, "done": [], "skipped": [], "failed": None, "restored": ["/etc/vllm/vllm.env"],
            "to": 4, "serve": serve, "running": list(running)}


def serves_on(port: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The readiness check: ready at `port`, connection refused anywhere else."""
    return lambda spec: ({"ok": True, "seconds": 1.5} if spec["base"].endswith(f":{port}")
                         else {"ok": False, "error": f"{spec['base']}/health: connection refused"})


def rolled_back_on(port: int) -> Callable[[str, dict[str, Any]], dict[str, Any]]:
    """A host whose apply makes generation 5, whose server answers on `port` alone, and whose reject
    restores the generation serving there."""
    ready = serves_on(port)

    def answer(call: str, spec: dict[str, Any]) -> dict[str, Any]:
        if call == "serve_main":
            return ready(spec)
        if spec["action"] == "apply":
            return {"ok": True, "done": [0], "skipped": [], "failed": None, "generation": 5, "unfinished": None}
        assert spec["action"] == "reject", spec["action"]
        return restored(port)
    return answer


def test_a_failed_deploys_way_back_is_judged_on_the_restored_generations_own_port(
        inv: inventory.Inventory) -> None:
    """--set port=8123 (taken) crashed; the restored generation serves on :8000 and must be asked there."""
    host = FakeHost(rolled_back_on(8000))
    plans = planned_for(inv, ["cpu-1"], {"port": 8123}, {"cpu-1": [RESTARTED]})
    plans["cpu-1"].serve = {"base": "http://127.0.0.1:8123", "model": "lab/tiny-llama", "unit": "vllm.service"}
    outcomes = {"cpu-1": rolling.Outcome("cpu-1")}
    planned = run.Planned(["cpu-1"], plans, {"cpu-1": []}, {}, secrets.Secrets())
    errors = rolling.roll_one(["cpu-1"], rolling.Roll(planned, outcomes, timeout=5), lambda name: host,
                              lambda text: lambda done, total: None, {})
    assert "cpu-1" in errors and outcomes["cpu-1"].state == "rolled back"
    assert outcomes["cpu-1"].detail.endswith("the previous version is ready again"), outcomes["cpu-1"].detail
    checked = [spec["base"] for call, spec in host.asked if call == "serve_main"]
    assert checked == ["http://127.0.0.1:8123", "http://127.0.0.1:8000"]  # the way back: its own port


def test_a_generation_recorded_without_its_endpoint_is_asked_where_the_inventory_declares(
        inv: inventory.Inventory) -> None:
    back = rolling.ops.Outcome(done=(), to=4, serve=None, running=("vllm.service",))
    assert rolling.restored_endpoint(back, inv.settings("cpu-1", {}))["base"] == "http://127.0.0.1:8000"
    stopped = rolling.ops.Outcome(done=(), to=4, serve=restored(8000)["serve"], running=())
    assert rolling.restored_endpoint(stopped, inv.settings("cpu-1", {})) is None  # it runs no server


def test_rollback_goes_host_by_host_and_stops_at_one_whose_restored_generation_does_not_serve(
        inv: inventory.Inventory, monkeypatch: pytest.MonkeyPatch) -> None:
    ready = {"cpu-1": serves_on(9999), "cpu-2": serves_on(8000)}  # cpu-1's restored server never answers
    hosts: dict[str, FakeHost] = {}

    def host_for(target: inventory.Host) -> FakeHost:
        def answer(call: str, spec: dict[str, Any]) -> dict[str, Any]:
            return ready[target.name](spec) if call == "serve_main" else restored(8000)
        hosts[target.name] = FakeHost(answer)
        hosts[target.name].host = target.name
        return hosts[target.name]

    monkeypatch.setattr(rolling.remote.Pool, "connect", lambda self, target: host_for(target))
    results = rolling.rollback(inv, [inv.host("cpu-1"), inv.host("cpu-2")], run.Options(), timeout=5)
    assert not results.ok
    assert "generation 4 restored" in str(results.errors["cpu-1"])
    assert "does not serve" in str(results.errors["cpu-1"])
    assert "not rolled back" in str(results.errors["cpu-2"]) and "cpu-2" not in hosts  # never touched


def test_rollback_says_done_only_after_the_restored_server_answered(
        inv: inventory.Inventory, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def answer(call: str, spec: dict[str, Any]) -> dict[str, Any]:
        asked.append(call if call == "serve_main" else spec["action"])
        return serves_on(8000)(spec) if call == "serve_main" else restored(8000)

    monkeypatch.setattr(rolling.remote.Pool, "connect", lambda self, target: FakeHost(answer))
    results = rolling.rollback(inv, [inv.host("cpu-1")], run.Options(), timeout=5)
    assert results.ok and results.values["cpu-1"].ready_s == 1.5
    assert asked == ["rollback", "serve_main"]


def rolled_back(left: int | None) -> dict[str, Any]:
    return {**restored(8000), "left": left}


def test_a_restored_generation_that_does_not_serve_is_left_for_the_one_that_was_running(
        inv: inventory.Inventory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Generation 4 crashes on start; the host goes back to 7, which ran before the rollback, and rc 1."""
    asked: list[tuple[str, Any]] = []
    checks = iter([{"ok": False, "error": "vllm.service crashed after start (1 restart(s))"},
                   {"ok": True, "seconds": 42.0}])

    def answer(call: str, spec: dict[str, Any]) -> dict[str, Any]:
        if call == "serve_main":
            asked.append(("ready", spec["base"]))
            return next(checks)
        asked.append((spec["action"], (spec.get("to"), spec.get("forward"))))
        return rolled_back(7) if not spec.get("forward") else {**restored(8000), "to": 7, "left": 4}

    monkeypatch.setattr(rolling.remote.Pool, "connect", lambda self, target: FakeHost(answer))
    results = rolling.rollback(inv, [inv.host("cpu-1")], run.Options(), timeout=5)
    assert not results.ok
    said = str(results.errors["cpu-1"])
    assert asked == [("rollback", (None, False)), ("ready", "http://127.0.0.1:8000"),
                     ("rollback", (7, True)), ("ready", "http://127.0.0.1:8000")], asked
    assert "generation 4 restored" in said and "crashed after start" in said
    assert "back on generation 7, the one that was running: it answers /health and a completion again" in said


def test_a_way_back_that_fails_too_is_said(inv: inventory.Inventory, monkeypatch: pytest.MonkeyPatch) -> None:
    def answer(call: str, spec: dict[str, Any]) -> dict[str, Any]:
        if call == "serve_main":
            return {"ok": False, "error": "not ready within 5s (/health: connection refused)"}
        return rolled_back(7) if not spec.get("forward") else {"ok": False, "failed": {
            "index": -1, "kind": "rollback", "target": "", "error": "generation 7 is not the one the last "
            "rollback left: the host holds generation 9 now"}}

    monkeypatch.setattr(rolling.remote.Pool, "connect", lambda self, target: FakeHost(answer))
    results = rolling.rollback(inv, [inv.host("cpu-1"), inv.host("cpu-2")], run.Options(), timeout=5)
    said = str(results.errors["cpu-1"])
    assert "going back to generation 7, the one that was running, failed too" in said, said
    assert "holds generation 9 now" in said
    assert "not rolled back" in str(results.errors["cpu-2"])


def test_a_rollback_from_a_host_with_nothing_running_before_says_so(
        inv: inventory.Inventory, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def answer(call: str, spec: dict[str, Any]) -> dict[str, Any]:
        asked.append(call if call == "serve_main" else spec["action"])
        return serves_on(9999)(spec) if call == "serve_main" else rolled_back(None)

    monkeypatch.setattr(rolling.remote.Pool, "connect", lambda self, target: FakeHost(answer))
    results = rolling.rollback(inv, [inv.host("cpu-1")], run.Options(), timeout=5)
    assert "nothing else ran before it to go back to" in str(results.errors["cpu-1"])
    assert asked == ["rollback", "serve_main"]  # no way back was tried


def test_rollback_list_marks_the_current_generation_and_names_trials() -> None:
    import io

    from rich.console import Console

    from provision import report

    listing = {"current": 5, "default": 3, "generations": [
        {"id": 1, "state": "found", "by": "found on the host", "current": False, "target": False,
         "default": False, "trial": False, "note": "what the host had"},
        {"id": 3, "state": "good", "by": "deploy", "current": False, "target": True, "default": True,
         "trial": False},
        {"id": 4, "state": "good", "by": "tune trial", "current": False, "target": True, "default": False,
         "trial": True},
        {"id": 5, "state": "good", "by": "deploy", "current": True, "target": False, "default": False,
         "trial": False}]}
    out = Console(file=io.StringIO(), width=200, color_system=None)
    report.print_generations("cpu-1", listing, out)
    lines = {line.split("│")[1].strip(): line for line in out.file.getvalue().splitlines()
             if line.count("│") > 2 and line.split("│")[1].strip()[:1].isdigit()}
    assert "runs now" in lines["5 (current)"] and "rollback target" not in out.file.getvalue()
    assert "default target" in lines["3"]
    assert "with --to 4 (a tune trial's settings)" in lines["4"]
    assert "with --to 1" in lines["1"]


def test_a_host_without_generations_says_there_is_none_yet() -> None:
    """`generations` on a host never deployed drew an empty table, headings and no row: it says there
    is none yet and what makes one."""
    import io

    from rich.console import Console

    from provision import report

    out = Console(file=io.StringIO(), width=80, color_system=None)
    report.print_generations("cpu-1", {"current": None, "default": None, "generations": []}, out)
    assert " ".join(out.file.getvalue().split()) == ("cpu-1: no generations yet: each deploy or provision that "
                                                     "changes the host records one, for rollback to restore")


def test_generations_is_rollback_list_by_the_name_people_reach_for(
        inv: inventory.Inventory, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`generations` prints what `rollback --list` prints, from the same host answer, and asks the host
    for nothing but the list; its own -h says what it is and offers no flag of a restore."""
    from invoke.program import Program

    from provision import remote
    from provision.cli import ns

    listing = {"current": 3, "default": 2, "generations": [
        {"id": 2, "state": "good", "by": "deploy", "current": False, "target": True, "default": True, "trial": False},
        {"id": 3, "state": "good", "by": "deploy", "current": True, "target": False, "default": False,
         "trial": False}]}
    asked: list[str] = []

    def answer(call: str, spec: dict[str, Any]) -> dict[str, Any]:
        asked.append(spec["action"])
        return {"ok": True, "done": [], "skipped": [], "failed": None, "generations": listing}

    monkeypatch.setattr(remote, "connect", lambda host, ssh, **_: FakeHost(answer))

    def printed(*argv: str) -> str:
        try:
            Program(namespace=ns, name="provision", binary="provision").run(["provision", *argv])
        except SystemExit as exc:
            assert not exc.code, capsys.readouterr()
        return capsys.readouterr().out

    where = ("--host", "cpu-1", "--host", "cpu-2", "--inventory", inv.path or "")
    for shape in ((), ("--json",)):
        listed = printed("generations", *where, *shape)
        assert listed == printed("rollback", "--list", *where, *shape) and "cpu-2" in listed
    assert json.loads(listed)["hosts"]["cpu-1"] == listing
    assert asked == ["list"] * 8
    helped = printed("generations", "-h")
    assert "List each host's generations" in helped and "rollback --list" in helped
    assert "--host" in helped and "--to" not in helped and "--timeout" not in helped


def test_deploy_after_its_gate_asks_the_inventory_nothing(
        inv: inventory.Inventory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Everything deploy's roll knows of a host travels on its plan: once planned, the inventory is not
    asked again (a host resolved twice could be judged by other settings than the gate's). cpu-1 rolls
    and fails its readiness (rolled back, its way back waited for), cpu-2 is unchanged and gated."""
    plans = planned_for(inv, ["cpu-1", "cpu-2"], {"port": 8123}, {"cpu-1": [RESTARTED]})
    planned = run.Planned(["cpu-1", "cpu-2"], plans, {"cpu-1": [], "cpu-2": []}, {}, secrets.Secrets())
    monkeypatch.setattr(rolling.remote.Pool, "connect", lambda self, target: FakeHost(rolled_back_on(8000)))
    asked: list[str] = []
    for method in ("host", "cluster", "cluster_of", "groups_of", "select", "settings"):
        monkeypatch.setattr(inventory.Inventory, method,
                            lambda self, *args, _name=method, **kwargs: asked.append(_name))
    outcomes: dict[str, rolling.Outcome] = {}
    with rolling.remote.Pool(inv.ssh) as pool:
        result = rolling.roll_out(planned, run.Options(quiet=True), pool, rolling.Roll(planned, outcomes, timeout=5),
                                  0.0)
    assert result.outcomes["cpu-1"].state == "rolled back", result.outcomes["cpu-1"]
    assert "cpu-2" in result.errors  # unchanged, but it too answers on :8000 only, not the run's :8123
    assert asked == []


ENDPOINT_INVENTORY = """
hosts:
  cpu-1: {address: 10.0.0.5, profile: cpu}
  cpu-2: {address: 10.0.0.6, profile: cpu}
clusters:
  a: {hosts: [cpu-1], vars: {model: lab/tiny-llama, fetch_weights: false, bind_host: 0.0.0.0}}
  b: {hosts: [cpu-2], vars: {model: lab/tiny-llama, fetch_weights: false, bind_host: 0.0.0.0}}
endpoints:
  tiny: {host: cpu-2, clusters: [a, b], drain_timeout: 30}
"""


def _roll_behind_endpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                          serves: Callable[[dict[str, Any]], dict[str, Any]]) -> tuple[rolling.Deployed, list[str]]:
    """cpu-1 (cluster a) restarts behind endpoint tiny, whose router runs on cpu-2 (not a target): every
    program each host is sent, in order, as 'host: what'."""
    path = tmp_path / "inventory.yaml"
    path.write_text(ENDPOINT_INVENTORY)
    inv = inventory.load(path)
    plans = planned_for(inv, ["cpu-1"], {}, {"cpu-1": [RESTARTED]})
    planned = run.Planned(["cpu-1"], plans, {"cpu-1": []}, {}, secrets.Secrets())
    log: list[str] = []

    def host(name: str) -> FakeHost:
        def answer(call: str, spec: dict[str, Any]) -> dict[str, Any]:
            if call == "router_main":
                log.append(f"{name}: router {spec['action']} {spec.get('backend')}/{spec.get('server')}")
                return ({"drained": True, "waited_s": 0.4, "in_flight_left": 0} if spec["action"] == "drain"
                        else {"up": True, "waited_s": 1.0, "state": "UP"})
            if call == "serve_main":
                log.append(f"{name}: ready? {spec['base']}")
                return serves(spec)
            log.append(f"{name}: {spec['action']}")
            if spec["action"] == "apply":
                return {"ok": True, "done": [0], "skipped": [], "failed": None, "generation": 5, "unfinished": None}
            if spec["action"] == "reject":
                return restored(8000)
            return {"ok": True, "done": [], "skipped": [], "failed": None}
        return FakeHost(answer)

    hosts = {name: host(name) for name in ("cpu-1", "cpu-2")}
    monkeypatch.setattr(rolling.remote.Pool, "connect", lambda self, target: hosts[target.name])
    with rolling.remote.Pool(inv.ssh) as pool:
        result = rolling.roll_out(planned, run.Options(quiet=True), pool,
                                  rolling.Roll(planned, {}, timeout=5, pool=pool), 0.0)
    return result, log


def test_a_replica_behind_an_endpoint_is_drained_before_its_restart_and_put_back_once_ready(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result, log = _roll_behind_endpoint(tmp_path, monkeypatch, serves_on(8000))
    assert result.ok, result.errors
    assert log == ["cpu-2: router drain tiny-1/a", "cpu-1: apply", "cpu-1: ready? http://127.0.0.1:8000",
                   "cpu-1: promote", "cpu-2: router ready tiny-1/a"]
    assert {"drain", "restore"} <= set(result.outcomes["cpu-1"].steps)


def test_a_replica_that_fails_behind_an_endpoint_is_rolled_back_before_it_goes_back_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter([{"ok": False, "error": "http://127.0.0.1:8000/health: connection refused"},
                    {"ok": True, "seconds": 1.0}])
    result, log = _roll_behind_endpoint(tmp_path, monkeypatch, lambda spec: next(answers))
    assert result.outcomes["cpu-1"].state == "rolled back", result.outcomes["cpu-1"]
    assert log == ["cpu-2: router drain tiny-1/a", "cpu-1: apply", "cpu-1: ready? http://127.0.0.1:8000",
                   "cpu-1: reject", "cpu-1: ready? http://127.0.0.1:8000", "cpu-2: router ready tiny-1/a"]


def test_a_failed_deploy_of_a_pair_rolls_back_both_nodes_then_restarts_them_together(tmp_path: Path) -> None:
    """vLLM's own multi-node launch: neither node can rejoin the other alone, so after the rollback both
    units restart (the worker first) and only then is the head asked whether the old version serves."""
    path = tmp_path / "inventory.yaml"
    path.write_text("hosts:\n  s1: {address: 10.0.0.5, profile: cpu}\n  s2: {address: 10.0.0.6, profile: cpu}\n"
                    "clusters:\n  pair: {hosts: [s1, s2], head: s1, vars: {model: lab/tiny-llama, fetch_weights: false,"
                    " tensor_parallel_size: 2}}\n")
    inv = inventory.load(path)
    asked_ready: list[str] = []

    def answer(call: str, spec: dict[str, Any]) -> dict[str, Any]:
        if call == "serve_main":  # the new version does not serve; the restored one does, once restarted
            asked_ready.append(spec["base"])
            return ({"ok": False, "error": "vllm.service failed after start"} if len(asked_ready) == 1
                    else {"ok": True, "seconds": 2.0})
        if spec["action"] == "apply":
            return {"ok": True, "done": [0], "skipped": [], "failed": None, "generation": 5, "unfinished": None}
        assert spec["action"] == "reject", spec["action"]
        return restored(8000)

    hosts = {"s1": FakeHost(answer), "s2": FakeHost(answer)}
    worker = plan.Change("restart", "vllm-worker.service", "restarts with s1's vllm.service")
    plans = planned_for(inv, ["s1", "s2"], {}, {"s1": [RESTARTED], "s2": [worker]})
    outcomes = {name: rolling.Outcome(name) for name in ("s1", "s2")}
    planned = run.Planned(["s2", "s1"], plans, {"s1": [], "s2": []}, {}, secrets.Secrets())
    errors = rolling.roll_one(["s2", "s1"], rolling.Roll(planned, outcomes, timeout=5), lambda name: hosts[name],
                              lambda text: lambda done, total: None, {})
    assert set(errors) >= {"s1"} and outcomes["s1"].state == "rolled back" and outcomes["s2"].state == "rolled back"
    assert "the nodes restarted together: the previous version is ready again" in outcomes["s1"].detail
    for name, unit in (("s1", "vllm.service"), ("s2", "vllm-worker.service")):
        actions = [spec["action"] for call, spec in hosts[name].asked if call != "serve_main"]
        assert actions == ["apply", "reject", "apply"], (name, actions)
        last = [spec for call, spec in hosts[name].asked if call != "serve_main"][-1]
        assert [(c["kind"], c["target"]) for c in last["changes"]] == [("restart", unit)], last
    assert len(asked_ready) == 2  # the new version once, the restored pair once (not per node)


def test_one_node_of_a_pair_is_never_started_alone(tmp_path: Path) -> None:
    """`deploy --host s1` while s1's server must start: s2 would have to restart with it and is not in
    the run, so neither is changed and the error names the command that does it; with both, s2 restarts."""
    from provision.run.planning import restart_whole

    path = tmp_path / "inventory.yaml"
    path.write_text("hosts:\n  s1: {address: 10.0.0.5, profile: cpu}\n  s2: {address: 10.0.0.6, profile: cpu}\n"
                    "clusters:\n  pair: {hosts: [s1, s2], head: s1, vars: {model: lab/tiny-llama, tensor_parallel_size: 2}}\n")
    inv = inventory.load(path)
    start = plan.Change("start", "vllm.service", "not running")
    alone = planned_for(inv, ["s1"], {}, {"s1": [start]})
    errors: dict[str, BaseException] = {}
    restart_whole(alone, errors)
    assert alone == {} and str(errors["s1"]) == (
        "s1: the nodes of cluster pair start together, and s2 is not in this run (not a target, or refused by "
        "the gate): nothing changed; run it for the whole cluster: `invoke deploy --cluster pair`")
    quiet = planned_for(inv, ["s1"], {}, {"s1": [plan.Change("file", "/etc/vllm/vllm.env", "changed")]})
    restart_whole(quiet, errors := {})
    assert set(quiet) == {"s1"} and errors == {}  # nothing starts: one node may be changed alone
    both = planned_for(inv, ["s1", "s2"], {}, {"s1": [start]})
    restart_whole(both, errors := {})
    assert errors == {} and [(c.kind, c.target) for c in both["s2"].changes] == [("restart", "vllm-worker.service")]


def with_generations(plans: dict[str, run.HostPlan], name: str, content: str) -> str:
    """The host's generation records as its facts read them (path -> content and sha256); their sha256."""
    hostplan = plans[name]
    path = hostplan.ctx.naming.state_file
    digest = hashlib.sha256(content.encode()).hexdigest()
    recorded = dataclasses.replace(hostplan.ctx.facts, files={path: {"exists": True, "content": content, "sha256": digest}})
    hostplan.context = dataclasses.replace(hostplan.ctx, facts=recorded)
    return digest


PENDING = json.dumps({"current": 7, "generations": [
    {"id": 6, "state": "good", "created": "2026-12-07 10:00:00", "by": "deploy", "changes": ["a"], "deadline": None},
    {"id": 7, "state": "pending", "created": "2026-12-07 10:05:00", "by": "deploy", "changes": ["a", "b"],
     "deadline": 4102444800}]})  # its readiness deadline is far ahead: its deploy was killed a moment ago


def test_a_host_another_run_changed_since_the_facts_is_refused_under_the_roll_lock_with_nothing_done(
        inv: inventory.Inventory, monkeypatch: pytest.MonkeyPatch) -> None:
    plans = planned_for(inv, ["cpu-1"], {}, {"cpu-1": [RESTARTED]})
    with_generations(plans, "cpu-1", PENDING)
    host = FakeHost(rolled_back_on(8000), states={plans["cpu-1"].ctx.naming.state_file: "0" * 64})
    monkeypatch.setattr(rolling.remote.Pool, "connect", lambda self, target: host)
    planned = run.Planned(["cpu-1"], plans, {"cpu-1": []}, {}, secrets.Secrets())
    with rolling.remote.Pool(inv.ssh) as pool:
        result = rolling.roll_out(planned, run.Options(quiet=True), pool, rolling.Roll(planned, {}, timeout=5), 0.0)
    outcome = result.outcomes["cpu-1"]
    assert outcome.state == "failed" and "another run changed its generations" in outcome.detail, outcome
    assert "nothing drained or changed" in outcome.detail and "generations --host cpu-1" in outcome.detail
    assert [call for call, _ in host.asked] == ["hold_main"]  # no apply, no drain, no readiness


def test_under_the_roll_lock_a_served_pending_generation_is_promoted_before_its_deadline(
        inv: inventory.Inventory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A deploy killed during its readiness leaves its generation pending with a deadline minutes ahead;
    the next deploy holds the roll lock, so no run waits for that verdict: it gives it."""
    plans = planned_for(inv, ["cpu-1"], {}, {})
    digest = with_generations(plans, "cpu-1", PENDING)
    assert run.unfinished_generation(plans["cpu-1"].ctx.facts, state_file=plans["cpu-1"].ctx.naming.state_file) is None

    def answer(call: str, spec: dict[str, Any]) -> dict[str, Any]:
        if call == "serve_main":
            return {"ok": True, "seconds": 0.5}
        return {"ok": True, "done": [], "generation": spec.get("generation"), "settled": [5]}
    host = FakeHost(answer, states={plans["cpu-1"].ctx.naming.state_file: digest})
    monkeypatch.setattr(rolling.remote.Pool, "connect", lambda self, target: host)
    planned = run.Planned(["cpu-1"], plans, {"cpu-1": []}, {}, secrets.Secrets())
    with rolling.remote.Pool(inv.ssh) as pool:
        result = rolling.roll_out(planned, run.Options(quiet=True), pool, rolling.Roll(planned, {}, timeout=5), 0.0)
    outcome = result.outcomes["cpu-1"]
    assert outcome.state == "ready", outcome
    assert outcome.detail.startswith("generation 7 (2 change(s), left unfinished by a deploy of 2026-12-07 10:05:00)")
    promoted = [spec for call, spec in host.asked if call == "main" and spec["action"] == "promote"]
    assert [spec["generation"] for spec in promoted] == [7] and promoted[0]["run"] == rolling.ops.RUN_ID


def test_a_deploy_whose_connection_was_lost_while_the_host_applied_counts_its_changes_as_unknown() -> None:
    from provision import report
    result = rolling.Deployed(["cpu-1"], {}, {"cpu-1": rolling.Outcome("cpu-1", "failed", changes_unknown=True,
                                                                     detail="cpu-1: unreachable: during apply")},
                              {}, {}, {"cpu-1": RuntimeError("lost")}, 1.0, secrets.Secrets())
    rows = report.deployed_rows(result)
    assert rows[0]["changes"] is None
    table = report.deployed_table(rows, 1.0)
    assert list(table.columns[2].cells) == ["?"]
