"""Weights planning, pure: the hub's answer -> the files wanted; the host's manifest -> what to fetch;
a cluster -> who fetches from the hub and who copies. And the model's quantization from its config.json,
read through the lab's hub on loopback."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from provision import errors, facts, inventory, remote, weights
from provision.inventory import Settings
from provision.lab import hub, tinymodel
from provision.weights import HostWeights, Job, Snapshot, WeightFile

BIG = WeightFile("model.safetensors", 5_000_000, "sha256:" + "a" * 64)
CONFIG = WeightFile("config.json", 600, "git-sha1:" + "b" * 40)
SNAP = Snapshot("org/m", "main", "c" * 40, (CONFIG, BIG))


def sibling(name: str, size: int, sha: str | None = None, blob: str | None = "f" * 40) -> SimpleNamespace:
    lfs = SimpleNamespace(size=size, sha256=sha, pointer_size=134) if sha else None
    return SimpleNamespace(rfilename=name, size=size, blob_id=blob, lfs=lfs)


def test_snapshot_from_the_hubs_answer_keeps_patterns_and_hash_kinds() -> None:
    info = SimpleNamespace(sha="d" * 40, siblings=[sibling("config.json", 600), sibling("README.md", 90),
                                                   sibling("model.safetensors", 5_000_000, "e" * 64)])
    snap = weights.snapshot_from_info("org/m", "main", info, ["*.json", "*.safetensors"])
    assert [f.path for f in snap.files] == ["config.json", "model.safetensors"]
    assert snap.files[1].digest == "sha256:" + "e" * 64 and snap.files[0].digest == "git-sha1:" + "f" * 40
    assert snap.commit == "d" * 40 and snap.total_bytes == 5_000_600
    with pytest.raises(errors.WeightsError, match="no files matching"):
        weights.snapshot_from_info("org/m", "main", info, ["*.gguf"])


def manifest(files: tuple[WeightFile, ...], stat_of: dict[str, list[int]]) -> dict[str, dict]:
    return {f.path: {"size": f.size, "digest": f.digest, "stat": stat_of[f.path]} for f in files}


def test_compare_names_why_and_how_many_bytes() -> None:
    stats = {"config.json": [600, 1], "model.safetensors": [5_000_000, 2]}
    assert weights.compare(SNAP, HostWeights(None)) == ("missing", 5_000_600)
    resumed = HostWeights(None, partial={SNAP.commit: {"model.safetensors": 3_000_000}, "0" * 40: {"x": 9}})
    assert weights.compare(SNAP, resumed) == ("missing", 2_000_600)  # only what the break left to fetch
    same = HostWeights(SNAP.commit, manifest(SNAP.files, stats), stats)
    assert weights.compare(SNAP, same) == (None, 0)
    touched = HostWeights(SNAP.commit, manifest(SNAP.files, stats), {**stats, "model.safetensors": [5_000_000, 9]})
    reason, size = weights.compare(SNAP, touched)
    assert reason is not None and "changed since verified" in reason and size == 5_000_000
    older = HostWeights("9" * 40, manifest(SNAP.files, stats), stats)
    new_config = Snapshot("org/m", "main", "e" * 40, (WeightFile("config.json", 610, "git-sha1:" + "0" * 40), BIG))
    reason, size = weights.compare(new_config, older)
    assert reason == f"revision {'9' * 12} -> {'e' * 12}" and size == 610  # the big file is linked, not fetched


def test_a_manifest_from_before_ctime_and_inode_compares_size_and_time() -> None:
    old = HostWeights(SNAP.commit, manifest(SNAP.files, {"config.json": [600, 1], "model.safetensors": [5_000_000, 2]}),
                      {"config.json": [600, 1, 7, 40], "model.safetensors": [5_000_000, 2, 8, 41]})
    assert weights.compare(SNAP, old) == (None, 0)  # no re-hash and restart on upgrading the tool
    new = HostWeights(SNAP.commit, manifest(SNAP.files, {"config.json": [600, 1, 7, 40],
                                                         "model.safetensors": [5_000_000, 2, 8, 41]}),
                      {"config.json": [600, 1, 7, 40], "model.safetensors": [5_000_000, 2, 9, 41]})
    reason, size = weights.compare(SNAP, new)
    assert reason is not None and "model.safetensors" in reason and size == 5_000_000
    assert not weights.unchanged(None, [600, 1]) and not weights.unchanged([600, 1, 7, 40], None)


def test_an_edit_in_place_that_keeps_size_and_time_is_verified_again_on_the_next_run(tmp_path: Path) -> None:
    """A real file: verified by the host program, edited in place, its mtime put back (`touch -r`):
    size and mtime match the manifest, but ctime does not, and the next plan says re-verify."""
    data = os.urandom(1 << 16)
    commit = "f" * 40
    root = tmp_path / "models" / "org" / "m"
    (root / "revisions" / commit).mkdir(parents=True)
    target = root / "revisions" / commit / "model.safetensors"
    target.write_bytes(data)
    entry = WeightFile("model.safetensors", len(data), "sha256:" + hashlib.sha256(data).hexdigest())
    snap = Snapshot("org/m", "main", commit, (entry,))
    runner = remote.connect(inventory.local_host(), inventory.SshSettings())
    spec = {"action": "fetch", "root": str(root), "repo": snap.repo, "revision": "main", "commit": commit,
            "files": [entry.__dict__], "verify_all": False, "lock": str(tmp_path / "lock"), "wait": 0,
            # Nothing is fetched: the file is there and hashes right (the peer is never asked).
            "sources": [{"kind": "peer", "name": "none", "url": "http://127.0.0.1:9/none"}]}
    result = weights._run(runner, "python3", spec, lambda done, total: None)
    assert result["fetched"] == 0 and result["verified"] == 1 and result["kept"] == 1

    def planned() -> tuple[str | None, int]:
        seen = facts.gather(runner, facts=(), inspect={"weights": [str(root)]})
        return weights.compare(snap, weights.host_weights(seen, str(root)))

    assert planned() == (None, 0)
    before = target.stat()
    with target.open("r+b") as handle:  # one byte flipped, in place: same size, same inode
        handle.seek(4096)
        byte = handle.read(1)
        handle.seek(4096)
        handle.write(bytes([byte[0] ^ 0xFF]))
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = target.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    reason, size = planned()
    assert reason == "1 file(s) changed since verified (model.safetensors): re-verify" and size == len(data)


def test_revision_changes_and_a_rollback_leave_no_file_looking_changed(tmp_path: Path) -> None:
    """ctime also moves when a file's link count does: a new revision hard-links the files it shares
    and drops the oldest revision. Manifests are stamped after those, so nothing shows up as changed."""
    data = os.urandom(1 << 16)
    entry = WeightFile("model.safetensors", len(data), "sha256:" + hashlib.sha256(data).hexdigest())
    root = tmp_path / "org" / "m"
    runner = remote.connect(inventory.local_host(), inventory.SshSettings())
    snaps = [Snapshot("org/m", "main", commit * 40, (entry,)) for commit in "abc"]
    (root / "revisions" / snaps[0].commit).mkdir(parents=True)
    (root / "revisions" / snaps[0].commit / entry.path).write_bytes(data)

    def fetch(snap: Snapshot) -> dict:
        spec = {"action": "fetch", "root": str(root), "repo": snap.repo, "revision": "main", "commit": snap.commit,
                "files": [entry.__dict__], "verify_all": False, "lock": str(tmp_path / "lock"), "wait": 0,
                "sources": [{"kind": "peer", "name": "none", "url": "http://127.0.0.1:9/none"}]}
        return weights._run(runner, "python3", spec, lambda done, total: None)

    def planned(snap: Snapshot) -> tuple[str | None, int]:
        seen = facts.gather(runner, facts=(), inspect={"weights": [str(root)]})
        return weights.compare(snap, weights.host_weights(seen, str(root)))

    fetch(snaps[0])
    assert fetch(snaps[1])["linked"] == 1 and planned(snaps[1]) == (None, 0)
    third = fetch(snaps[2])  # links again, and removes the first revision (keeps current and previous)
    assert third["linked"] == 1 and snaps[0].commit in third["freed"] and planned(snaps[2]) == (None, 0)
    for name, commit in (("current", snaps[1].commit), ("previous", snaps[2].commit)):  # a rollback
        os.remove(root / name)
        os.symlink(f"revisions/{commit}", root / name)
    assert planned(snaps[1]) == (None, 0)


def test_a_cluster_shares_one_copy_per_revision_and_hosts_without_an_address_fetch_alone() -> None:
    data = {"commit": SNAP.commit, "root": "/m/org/m"}
    jobs = [Job("a", "c1", data, "10.0.0.1"), Job("b", "c1", data, "10.0.0.2"), Job("c", "c1", data, None),
            Job("d", "c2", data, "10.0.1.1"), Job("e", "c1", {**data, "root": "/other/org/m"}, "10.0.0.3")]
    groups = [[job.host for job in group] for group in weights.transfer_groups(jobs)]
    assert groups == [["a", "b"], ["d"], ["e"], ["c"]]


def test_managed_only_for_hub_ids_and_served_from_current() -> None:
    settings = Settings.of({"model": "org/m", "fetch_weights": True, "model_dir": "/var/lib/vllm/models/"})
    assert weights.managed(settings) and weights.serving_path(settings) == "/var/lib/vllm/models/org/m/current"
    assert not weights.managed(dataclasses.replace(settings, model="/srv/m"))
    assert not weights.managed(dataclasses.replace(settings, fetch_weights=False))


# ---------------------------------------------------------------------------------------------
# The model's quantization (for the known issues) from its config.json, through a hub on loopback


def test_quantization_of_a_config() -> None:
    assert weights.quantization_of({"quantization_config": {"quant_method": "MXFP4"}}) == "mxfp4"
    assert weights.quantization_of({"model_type": "llama"}) == "none"
    with pytest.raises(errors.WeightsError, match="no quant_method"):
        weights.quantization_of({"quantization_config": {"bits": 4}})


def test_model_config_reads_config_json_from_the_hub(tmp_path: Path) -> None:
    awq, plain, bare = tmp_path / "awq", tmp_path / "plain", tmp_path / "bare"
    for folder in (awq, plain, bare):
        folder.mkdir()
    (awq / "config.json").write_text(json.dumps({**tinymodel.CONFIG, "quantization_config": tinymodel.AWQ_CONFIG}))
    (plain / "config.json").write_text(json.dumps(tinymodel.CONFIG))
    (bare / "README.md").write_text("no config here\n")
    root = tmp_path / "hub"
    commits = {name: hub.publish(root, f"lab/{name}", folder) for name, folder in
               (("tiny-llama-awq", awq), ("tiny-llama", plain), ("bare", bare))}
    server = hub.serve(root, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        awq_config = weights.model_config("lab/tiny-llama-awq", commits["tiny-llama-awq"], endpoint, None)
        assert weights.quantization_of(awq_config) == "awq"
        plain_config = weights.model_config("lab/tiny-llama", commits["tiny-llama"], endpoint, None)
        assert weights.quantization_of(plain_config) == "none"
        assert plain_config["num_key_value_heads"] == tinymodel.CONFIG["num_key_value_heads"]
        with pytest.raises(errors.WeightsError, match="has no config.json"):
            weights.model_config("lab/bare", commits["bare"], endpoint, None)
    finally:
        server.shutdown()
        server.server_close()


def test_a_pinned_commits_files_are_kept_and_a_branch_is_never(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROVISION_MODEL_CONFIGS", str(tmp_path))
    commit = "0123456789abcdef0123456789abcdef01234567"
    pinned = Snapshot("org/m", commit, commit, (WeightFile("model.safetensors", 5, "sha256:" + "a" * 64),))
    assert weights.kept_snapshot("org/m", commit, (), "https://hub") is None
    weights.keep_snapshot(pinned, (), "https://hub")
    assert weights.kept_snapshot("org/m", commit, (), "https://hub") == pinned
    # Another file selection or another hub is another answer; a branch is never kept.
    assert weights.kept_snapshot("org/m", commit, ("*.json",), "https://hub") is None
    assert weights.kept_snapshot("org/m", commit, (), "https://mirror") is None
    weights.keep_snapshot(dataclasses.replace(pinned, revision="main"), (), "https://hub")
    assert weights.kept_snapshot("org/m", "main", (), "https://hub") is None
    assert not weights.is_commit("main") and not weights.is_commit(commit.upper()) and weights.is_commit(commit)


# ---------------------------------------------------------------------------------------------
# The host program's fetch, in process, on real files


def fetch_spec(root: Path, commit: str, files: dict[str, bytes]) -> dict:
    return {"action": "fetch", "root": str(root), "repo": "org/m", "revision": "main", "commit": commit,
            "files": [{"path": name, "size": len(data), "digest": "sha256:" + hashlib.sha256(data).hexdigest()}
                      for name, data in files.items()],
            "verify_all": False, "sources": [{"kind": "peer", "name": "up", "url": "http://127.0.0.1:9/x"}]}


def test_a_part_written_to_after_its_hash_is_not_recorded_as_verified(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Parts are hashed while the next ones arrive and renamed after: 4 KiB overwritten in a hashed
    part before its rename must not end as the file the manifest vouches for."""
    from provision.host import weights as host_weights

    files = {"a.safetensors": os.urandom(1 << 16), "b.safetensors": os.urandom(1 << 16)}
    root, commit = tmp_path / "org" / "m", "a" * 40
    part_of_a = root / ".partial" / commit / "a.safetensors.part"
    asked: list[str] = []

    def peer(source: dict, entry: dict, sink: host_weights.Sink, resume: int) -> None:
        asked.append(entry["path"])
        if asked == ["a.safetensors", "b.safetensors"]:
            time.sleep(0.3)  # a's hash, in its own thread, is done by now
            with part_of_a.open("r+b") as handle:
                handle.seek(8192)
                handle.write(os.urandom(4096))
        sink.write(files[entry["path"]][resume:])

    monkeypatch.setitem(host_weights.FETCHERS, "peer", peer)
    report = host_weights.fetch(fetch_spec(root, commit, files))
    manifest = host_weights.read_manifest(str(root / "revisions" / commit))
    assert manifest is not None
    for name, recorded in manifest["files"].items():
        path = root / "revisions" / commit / name
        assert host_weights.file_digest(str(path), "sha256") == recorded["digest"], name
        assert host_weights.unchanged_since_verified(str(path), recorded), name
    assert (root / "current" / "a.safetensors").read_bytes() == files["a.safetensors"]
    assert len(report["quarantined"]) == 1 and asked.count("a.safetensors") == 2


def test_a_file_written_to_after_it_was_placed_fails_the_run_before_current_moves(tmp_path: Path) -> None:
    """The window after the rename: the manifest is written once every file is in place; one changed
    meanwhile is hashed again, and a bad one is never recorded (nor served: `current` does not move)."""
    from provision.host import weights as host_weights

    data = os.urandom(1 << 16)
    root, commit = tmp_path / "org" / "m", "b" * 40
    spec = fetch_spec(root, commit, {"model.safetensors": data})
    (root / "revisions" / commit).mkdir(parents=True)
    path = root / "revisions" / commit / "model.safetensors"
    path.write_bytes(data)
    verified = {"model.safetensors": host_weights.stat_of(str(path))}
    host_weights.confirm(str(root / "revisions" / commit), spec["files"], verified)  # untouched: fine
    os.utime(path, ns=(1, 1))  # touched, same bytes: hashed again, fine
    host_weights.confirm(str(root / "revisions" / commit), spec["files"], verified)
    with path.open("r+b") as handle:
        handle.write(b"\0" * 4096)
    with pytest.raises(host_weights.WeightsFailed, match="changed on disk after it was verified"):
        host_weights.confirm(str(root / "revisions" / commit), spec["files"], verified)


def test_quarantine_keeps_the_newest_bad_copy_per_file_and_is_bounded_by_size(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from provision.host import weights as host_weights

    monkeypatch.setattr(host_weights, "QUARANTINE_BYTES", 150_000, raising=False)
    root = tmp_path / "org" / "m"
    root.mkdir(parents=True)

    def set_aside(name: str, commit: str, size: int = 1 << 16) -> str:
        bad = root / "bad"
        bad.write_bytes(os.urandom(size))
        return host_weights.quarantine(str(root), str(bad), commit, name)

    def kept() -> list[str]:
        return sorted(str(path.relative_to(root / ".quarantine")).rsplit(".", 1)[0]
                      for path in (root / ".quarantine").rglob("*") if path.is_file())

    set_aside("a.safetensors", "1" * 40)
    newest_a = set_aside("a.safetensors", "1" * 40)
    assert kept() == ["1" * 40 + "/a.safetensors"] and os.path.exists(newest_a)  # one copy per file
    set_aside("sub/b.safetensors", "2" * 40)
    assert len(kept()) == 2  # 128 KiB: within the bound
    set_aside("c.safetensors", "3" * 40)  # 192 KiB: the oldest copy (a's) goes, with its empty folder
    assert kept() == ["2" * 40 + "/sub/b.safetensors", "3" * 40 + "/c.safetensors"]
    assert not (root / ".quarantine" / ("1" * 40)).exists()
    huge = set_aside("d.safetensors", "3" * 40, size=200_000)  # alone past the bound: it stays, alone
    assert kept() == ["3" * 40 + "/d.safetensors"] and os.path.exists(huge)


def test_a_hub_transfer_cut_mid_chunk_resumes_from_the_bytes_received(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub's own transfer against the lab's hub on loopback, cut once after 15.5 MiB of
    24: the resume starts where the bytes stopped (within a MiB), not at the last 10 MB chunk."""
    from huggingface_hub import constants

    from provision.host import relay as host_relay
    from provision.host import weights as host_weights

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", constants.DOWNLOAD_CHUNK_SIZE)  # put back after
    for name in ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_HUB_DISABLE_TELEMETRY"):
        monkeypatch.setenv(name, "1")
    data = os.urandom(24 << 20)
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "model.safetensors").write_bytes(data)
    commit = hub.publish(tmp_path / "hub", "lab/cut", tmp_path / "files")
    server = hub.serve(tmp_path / "hub", "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    served = server.RequestHandlerClass.hub  # type: ignore[attr-defined]
    served.faults.append({"match": "lab/cut/model.safetensors", "cut_after": (31 << 20) // 2, "times": 1})
    entry = {"path": "model.safetensors", "size": len(data), "digest": "sha256:" + hashlib.sha256(data).hexdigest()}
    source = {"kind": "hub", "endpoint": f"http://127.0.0.1:{server.server_address[1]}", "token": None,
              "repo": "lab/cut", "commit": commit}
    part = tmp_path / "model.safetensors.part"
    try:
        with part.open("ab") as handle:
            route = host_relay.Route([source])
            host_weights.fetch_hub(source, entry, host_relay.Sink(handle, host_relay.Progress(len(data)), route), 0)
    finally:
        server.shutdown()
        server.server_close()
    assert part.read_bytes() == data
    resent = served.stats["files"]["lab/cut/model.safetensors"] - len(data)
    assert 0 <= resent <= 1 << 20, f"{resent} bytes sent twice"


def test_a_host_that_alone_must_fetch_takes_the_files_from_the_peers_holding_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One host of a cluster lost a file; its peers hold the revision verified (their plans need no
    fetch): they serve it, and the hub comes last. A peer in another cluster, one holding another
    commit, one without a cluster address, and any peer of a `transfer: hub` cluster serve nothing."""
    from provision import plan, run

    data = {"commit": SNAP.commit, "root": "/m/org/m", "endpoint": "http://hub", "repo": "org/m"}
    needs = run.HostPlan([plan.Change("weights", data["root"], "missing", data)], cluster_address="10.0.0.3",
                         group="c1")
    plans = {"cpu-1": needs,
             "h200": run.HostPlan([], cluster_address="10.0.0.1", group="c1", holds=data),
             "ws-5090": run.HostPlan([], cluster_address="10.0.0.2", group="c1", holds=data),
             "other": run.HostPlan([], cluster_address="10.0.1.1", group="c2", holds=data),
             "older": run.HostPlan([], cluster_address="10.0.0.4", group="c1", holds={**data, "commit": "9" * 40}),
             "bare": run.HostPlan([], group="c1", holds=data)}
    jobs, holders = run.weight_jobs(plans, ["cpu-1"])
    assert [job.host for job in jobs] == ["cpu-1"]
    asked: dict[str, list[str]] = {}
    served: dict[str, int] = {}

    class Serving:
        def __init__(self, host: str, peers: int) -> None:
            self.host = host
            served[host] = peers

        def start(self) -> str:
            return f"http://{self.host}/secret"

    def fetch_one(runner: str, job_data: dict, sources: list[dict], *args: object) -> weights.FetchResult:
        asked[runner] = [source.get("name", source["kind"]) for source in sources]
        return weights.FetchResult(1, sources[0]["kind"])

    monkeypatch.setattr(weights, "fetch", fetch_one)
    monkeypatch.setattr(weights, "relay_server", lambda runner, job_data, address, peers: Serving(runner, peers))
    done, failed = weights.fetch_all(jobs, lambda host: host, None, False, 0, lambda text: lambda d, t: None,
                                     holders)
    assert failed == {} and list(done) == ["cpu-1"]
    assert asked == {"cpu-1": ["ws-5090", "h200", "hub"]} and served == {"ws-5090": 1, "h200": 1}
    hub_only = [dataclasses.replace(job, transfer="hub") for job in jobs]
    asked.clear()
    weights.fetch_all(hub_only, lambda host: host, None, False, 0, lambda text: lambda d, t: None, holders)
    assert asked == {"cpu-1": ["hub"]}


def test_the_peers_holding_a_revision_serve_in_the_runs_host_order_not_the_order_plans_arrived() -> None:
    """Plans arrive as their facts did (in parallel): the holders, and so the relay chain's first
    sources, follow the run's host order, so a rerun takes the same peer first every time."""
    from provision import plan, run

    data = {"commit": SNAP.commit, "root": "/m/org/m", "endpoint": "http://hub", "repo": "org/m"}
    needs = run.HostPlan([plan.Change("weights", data["root"], "missing", data)], cluster_address="10.0.0.3",
                         group="c1")
    holding = {"ws-5090": run.HostPlan([], cluster_address="10.0.0.1", group="c1", holds=data),
               "h200": run.HostPlan([], cluster_address="10.0.0.2", group="c1", holds=data)}
    order = ["ws-5090", "h200", "cpu-1"]
    for arrived in (["h200", "ws-5090"], ["ws-5090", "h200"]):
        plans = {"cpu-1": needs, **{name: holding[name] for name in arrived}}
        _, holders = run.weight_jobs(plans, ["cpu-1"], order)
        assert [job.host for job in holders] == ["ws-5090", "h200"]
    from provision import relay
    assert relay.routes_with_holders(["cpu-1"], relay.RELAY, ["ws-5090", "h200"])["cpu-1"][0] == "h200"
