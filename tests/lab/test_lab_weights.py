"""Model weights on lab hosts: real huggingface_hub on the hosts, the lab hub serving repositories made
here, every figure read from the hub's own counters and from the hosts' files."""
from __future__ import annotations

import hashlib
import json
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from provision import inventory, lab
from provision.lab import hub, tinymodel
from tests.lab.conftest import GROUP_HOSTS, on_host, run_invoke

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("restores_lab_cpu")]


def hub_call(the_lab: lab.Lab, path: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{the_lab.hub_url}{path}", data=data, method="POST" if data else "GET")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture
def hub_counters(the_lab: lab.Lab, lab_inventory: inventory.Inventory) -> Iterator[lab.Lab]:
    """Counters at zero, no faults, and no model directory left by an earlier run on the hosts."""
    for name in ("ws-5090", "h200", "cpu-1"):
        on_host(lab_inventory, name, ["sh", "-c", "rm -rf /srv/w-*"])
    hub_call(the_lab, "/_lab/reset", {})
    yield the_lab
    hub_call(the_lab, "/_lab/reset", {})


def served(the_lab: lab.Lab, repo: str, name: str | None = None) -> int:
    """Bytes of the repository the hub sent to the lab's hosts (the controller reads config.json at plan
    time for the gate: that is not a weights transfer)."""
    by_client = hub_call(the_lab, "/_lab/stats")["client_files"]
    return sum(count for client, files in by_client.items() if client != the_lab.gateway()
               for key, count in files.items()
               if key.startswith(repo + "/") and (name is None or key == f"{repo}/{name}"))


def host_bytes(the_lab: lab.Lab) -> int:
    """Everything the hub sent to this test group's hosts (the other group's fetch their own models
    meanwhile: tests/lab/conftest.py)."""
    clients = hub_call(the_lab, "/_lab/stats")["clients"]
    ours = {record["address"] for name, record in the_lab.state()["hosts"].items() if name in GROUP_HOSTS["lab"]}
    return sum(count for client, count in clients.items() if client in ours)


def publish(the_lab: lab.Lab, repo: str, change: dict[str, str] | None = None, maker: str = "make",
            big: int = 0) -> str:
    """A repository on the lab hub, made now; `change` rewrites small files for a new commit; `big`
    adds a second weights file of that many bytes."""
    with tempfile.TemporaryDirectory() as scratch:
        files = getattr(tinymodel, maker)(Path(scratch) / "files")
        for name, text in (change or {}).items():
            (files / name).write_text(text)
        if big:
            import numpy as np
            from safetensors.numpy import save_file

            tensor = np.random.default_rng(7).integers(0, 255, big, dtype=np.uint8)
            save_file({"extra": tensor}, str(files / "extra.safetensors"))
        return hub.publish(the_lab.hub_root, repo, files)


def weights(*args: str) -> tuple[int, dict[str, Any], str]:
    done = run_invoke("weights", "--json", *args)
    try:
        document = json.loads(done.stdout)
    except json.JSONDecodeError:
        document = {}
    return done.returncode, document, done.stdout + done.stderr


def host_sha256(inv: inventory.Inventory, host: str, path: str) -> str:
    return on_host(inv, host, ["sha256sum", path]).split()[0]


def local_sha256(the_lab: lab.Lab, repo: str, commit: str, name: str) -> str:
    data = (the_lab.hub_root / "repos" / repo / "commits" / commit / name).read_bytes()
    return hashlib.sha256(data).hexdigest()


def test_fresh_fetch_then_unchanged_rerun_fetches_nothing(
        hub_counters: lab.Lab, lab_inventory: inventory.Inventory) -> None:
    the_lab = hub_counters
    commit = publish(the_lab, "test/fresh")
    args = ("--host", "cpu-1", "--set", "model=test/fresh", "--set", "model_dir=/srv/w-fresh")
    code, report, text = weights(*args)
    assert code == 0, text
    host = report["hosts"]["cpu-1"]
    assert host["weights"]["commit"] == commit  # the plan names the full commit, not "main"
    total = host["weights"]["bytes"]
    assert host["fetched"]["bytes"] == total == served(the_lab, "test/fresh") == report["bytes_from_hub"]
    root = "/srv/w-fresh/test/fresh"
    assert on_host(lab_inventory, "cpu-1", ["readlink", f"{root}/current"]).strip() == f"revisions/{commit}"
    assert host_sha256(lab_inventory, "cpu-1", f"{root}/current/model.safetensors") == local_sha256(
        the_lab, "test/fresh", commit, "model.safetensors")
    hub_call(the_lab, "/_lab/reset", {})
    code, report, text = weights(*args)
    assert code == 0, text
    assert report["hosts"]["cpu-1"]["changes"] == [] and report["bytes_from_hub"] == 0
    assert served(the_lab, "test/fresh") == 0  # not a byte of any file, not even a HEAD for one
    # (this repository's: the other test group's hosts fetch their own models meanwhile)
    assert not [r for r in hub_call(the_lab, "/_lab/stats")["requests"]
                if "/resolve/" in r["path"] and "test/fresh" in r["path"]]


def test_revision_change_fetches_only_what_changed_and_keeps_the_previous(
        hub_counters: lab.Lab, lab_inventory: inventory.Inventory) -> None:
    the_lab = hub_counters
    first = publish(the_lab, "test/revs")
    args = ("--host", "cpu-1", "--set", "model=test/revs", "--set", "model_dir=/srv/w-revs")
    assert weights(*args)[0] == 0
    config = json.loads((the_lab.hub_root / "repos/test/revs/commits" / first / "config.json").read_text())
    second = publish(the_lab, "test/revs", {"config.json": json.dumps({**config, "rope_theta": 20000.0})})
    assert second != first
    hub_call(the_lab, "/_lab/reset", {})
    planned = run_invoke("plan", "--host", "cpu-1", "--set", "model=test/revs", "--set", "model_dir=/srv/w-revs")
    assert f"revision {first[:12]} -> {second[:12]}" in planned.stdout
    code, report, text = weights(*args)
    assert code == 0, text
    assert report["hosts"]["cpu-1"]["weights"]["commit"] == second
    # Only config.json crossed the network; the unchanged weights were hard-linked from the old revision.
    assert served(the_lab, "test/revs") == served(the_lab, "test/revs", "config.json") > 0
    assert report["hosts"]["cpu-1"]["fetched"]["linked"] >= 1
    root = "/srv/w-revs/test/revs"
    links = on_host(lab_inventory, "cpu-1", ["readlink", f"{root}/current", f"{root}/previous"]).split()
    assert links == [f"revisions/{second}", f"revisions/{first}"]  # the last-known-good revision is kept
    rolled = run_invoke("rollback", *args)
    assert rolled.returncode == 0 and root in rolled.stdout, rolled.stdout + rolled.stderr
    links = on_host(lab_inventory, "cpu-1", ["readlink", f"{root}/current", f"{root}/previous"]).split()
    assert links == [f"revisions/{first}", f"revisions/{second}"]  # back to the last-known-good revision
    hub_call(the_lab, "/_lab/reset", {})
    pinned = weights(*args, "--set", f"model_revision={second}")  # a full commit works as a revision
    assert pinned[0] == 0 and pinned[1]["hosts"]["cpu-1"]["weights"]["commit"] == second
    assert pinned[1]["bytes_from_hub"] == 0  # both revisions were still on the host


def test_a_corrupted_file_is_set_aside_and_fetched_again(
        hub_counters: lab.Lab, lab_inventory: inventory.Inventory) -> None:
    the_lab = hub_counters
    commit = publish(the_lab, "test/corrupt")
    args = ("--host", "cpu-1", "--set", "model=test/corrupt", "--set", "model_dir=/srv/w-corrupt")
    assert weights(*args)[0] == 0
    target = "/srv/w-corrupt/test/corrupt/current/model.safetensors"
    flip = ("import os,sys; p=sys.argv[1]; st=os.stat(p); f=open(p,'r+b'); f.seek(4096); b=f.read(1); "
            "f.seek(4096); f.write(bytes([b[0]^255])); f.close(); "
            "os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns)) if len(sys.argv)>2 else None")
    # An edit in place that keeps size and time (`touch -r`): its ctime moved, which the plain run sees.
    on_host(lab_inventory, "cpu-1", ["python3", "-c", flip, target, "keep-time"])
    planned = run_invoke("plan", "--host", "cpu-1", "--set", "model=test/corrupt",
                         "--set", "model_dir=/srv/w-corrupt")
    assert "1 file(s) changed since verified (model.safetensors): re-verify" in planned.stdout, planned.stdout
    hub_call(the_lab, "/_lab/reset", {})
    code, report, text = weights(*args)
    assert code == 0, text
    fetched = report["hosts"]["cpu-1"]["fetched"]
    assert len(fetched["quarantined"]) == 1 and "/.quarantine/" in fetched["quarantined"][0]
    # It was replaced in the revision `current` points at: a server there read the earlier copy.
    assert fetched["served_replaced"] == ["model.safetensors"], fetched
    expected = local_sha256(the_lab, "test/corrupt", commit, "model.safetensors")
    assert host_sha256(lab_inventory, "cpu-1", target) == expected
    assert served(the_lab, "test/corrupt") == served(the_lab, "test/corrupt", "model.safetensors")
    # --verify hashes every file even where nothing moved (rot below the filesystem keeps ctime too).
    code, report, text = weights(*args, "--verify")
    assert code == 0 and report["hosts"]["cpu-1"]["fetched"]["quarantined"] == [], text
    assert report["bytes_from_hub"] == 0
    # A write that changes the file's time is seen by the plain run, from the probe's stat alone.
    on_host(lab_inventory, "cpu-1", ["python3", "-c", flip, target])
    planned = run_invoke("plan", "--host", "cpu-1", "--set", "model=test/corrupt",
                         "--set", "model_dir=/srv/w-corrupt")
    assert "changed since verified" in planned.stdout
    code, report, text = weights(*args)
    assert code == 0 and len(report["hosts"]["cpu-1"]["fetched"]["quarantined"]) == 1, text
    assert host_sha256(lab_inventory, "cpu-1", target) == expected
    # A bad copy stays set aside, never in the served revision; older ones are pruned (the newest is kept).
    aside = on_host(lab_inventory, "cpu-1", ["find", "/srv/w-corrupt/test/corrupt/.quarantine", "-type", "f"])
    assert len(aside.split()) == 1
    # The served revision is complete at every instant: a replacement whose fetch fails leaves the file
    # where it was (the bad copy stays in place until a verified one replaces it in one rename).
    on_host(lab_inventory, "cpu-1", ["python3", "-c", flip, target])
    hub_call(the_lab, "/_lab/faults", {"match": "test/corrupt/model.safetensors", "cut_after": 0, "times": 50})
    code, report, text = weights(*args, "--verify")
    assert code == 1, text
    assert on_host(lab_inventory, "cpu-1", ["python3", "-c", "import os, sys; print(os.path.isfile(sys.argv[1]))",
                                            target]).strip() == "True"
    hub_call(the_lab, "/_lab/reset", {})
    code, report, text = weights(*args)
    assert code == 0 and host_sha256(lab_inventory, "cpu-1", target) == expected, text
    aside = on_host(lab_inventory, "cpu-1", ["find", "/srv/w-corrupt/test/corrupt/.quarantine", "-type", "f"])
    assert len(aside.split()) == 1
    # What a run says: the file set aside is named where it went, and a verify's plan cannot know what
    # fails its hash (at most the whole revision).
    on_host(lab_inventory, "cpu-1", ["python3", "-c", flip, target, "keep-time"])
    done = run_invoke("weights", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 bad file(s) set aside and fetched again: /srv/w-corrupt/test/corrupt/.quarantine/" in done.stdout, \
        done.stdout
    assert ("replaced in the revision the server serves: model.safetensors (a running server read the earlier "
            "copy at its start") in done.stdout, done.stdout
    done = run_invoke("weights", *args, "--verify")
    assert done.returncode == 0 and "MiB to fetch: the files that fail their hash" in done.stdout, done.stdout


def test_an_interrupted_fetch_resumes_where_it_stopped(
        hub_counters: lab.Lab, lab_inventory: inventory.Inventory) -> None:
    the_lab = hub_counters
    commit = publish(the_lab, "test/resume", big=24 * 2**20)
    size = (the_lab.hub_root / "repos/test/resume/commits" / commit / "extra.safetensors").stat().st_size
    # The transfer breaks off after 12 MB, then every retry gets nothing: huggingface_hub gives up.
    # (It hands data on in 10 MiB chunks: what a break loses is at most one chunk.)
    hub_call(the_lab, "/_lab/faults", {"match": "test/resume/extra.safetensors", "cut_after": 12_000_000, "times": 1})
    hub_call(the_lab, "/_lab/faults", {"match": "test/resume/extra.safetensors", "cut_after": 0, "times": 50})
    args = ("--host", "cpu-1", "--set", "model=test/resume", "--set", "model_dir=/srv/w-resume")
    code, _, text = weights(*args)
    assert code == 1
    assert "cpu-1" in text and "extra.safetensors: transfer broke off after" in text and "resume" in text
    part = on_host(lab_inventory, "cpu-1", ["sh", "-c", ("stat -c %s /srv/w-resume/test/resume/.partial/*/"
                                                          "extra.safetensors.part")]).strip()
    assert int(part) >= 10 * 2**20
    assert on_host(lab_inventory, "cpu-1", ["sh", "-c", "test -e /srv/w-resume/test/resume/current; echo $?"]
                   ).strip() == "1"  # nothing half-fetched is ever served
    hub_call(the_lab, "/_lab/reset", {})
    code, _report, text = weights(*args)
    assert code == 0, text
    assert served(the_lab, "test/resume", "extra.safetensors") == size - int(part)
    ranges = [r["range"] for r in hub_call(the_lab, "/_lab/stats")["requests"]
              if r["path"].endswith("extra.safetensors") and r["range"]]
    assert f"bytes={part}-" in ranges
    assert host_sha256(lab_inventory, "cpu-1", "/srv/w-resume/test/resume/current/extra.safetensors") == \
        local_sha256(the_lab, "test/resume", commit, "extra.safetensors")


def test_too_little_disk_is_refused_before_a_byte_moves(hub_counters: lab.Lab) -> None:
    # cpu-1's /srv/small is a 2 MiB filesystem; the tiny model is about 5 MB.
    code, _report, text = weights("--host", "cpu-1", "--set", "model=lab/tiny-llama",
                                 "--set", "model_dir=/srv/small/models")
    assert code == 1
    assert "disk.space" in text and "/srv/small/models" in text
    assert host_bytes(hub_counters) == 0


def _inventory_variant(the_lab: lab.Lab, directory: Path, *, secrets: bool, extra: dict[str, Any]) -> Path:
    document = yaml.safe_load(the_lab.inventory.read_text())
    if not secrets:
        document.pop("secrets", None)
    if extra:  # a host serves one cluster: the new ones replace the lab's
        document["clusters"] = extra
        document.pop("endpoints", None)  # of the clusters replaced
    path = directory / "inventory.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_hub_refusals_are_clear_and_change_nothing(hub_counters: lab.Lab, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    bare = _inventory_variant(hub_counters, tmp_path, secrets=False, extra={})
    cases = [(("--inventory", str(bare), "--set", "model=lab/gated-llama"), "is gated: it needs a token"),
             (("--set", "model=lab/no-such-model"), "no model repository 'lab/no-such-model'"),
             (("--set", "model=lab/tiny-llama", "--set", "model_revision=v9"), "has no revision 'v9'")]
    for extra_args, message in cases:
        code, _, text = weights("--host", "cpu-1", "--set", "model_dir=/srv/w-refused", *extra_args)
        assert code == 1 and "model.hub" in text and message in text, text
    files = hub_call(hub_counters, "/_lab/stats")["files"]  # by repository (the other group's meanwhile too)
    asked = ("lab/gated-llama", "lab/no-such-model", "lab/tiny-llama")
    assert sum(sent for key, sent in files.items() if key.startswith(asked)) == 0  # not even config.json
    code, report, text = weights("--host", "cpu-1", "--set", "model=lab/gated-llama",
                                 "--set", "model_dir=/srv/w-gated")  # the lab inventory's secrets file
    assert code == 0 and report["bytes_from_hub"] > 0, text


def test_a_cluster_of_three_fetches_from_the_hub_once(
        hub_counters: lab.Lab, lab_inventory: inventory.Inventory, tmp_path: Path) -> None:
    the_lab = hub_counters
    commit = publish(the_lab, "test/trio-awq", maker="make_awq")
    trio = {"trio": {"hosts": ["ws-5090", "h200", "cpu-1"], "vars": {
        "model": "test/trio-awq", "model_dir": "/srv/w-trio", "cluster_network": str(the_lab.network)}}}
    path = _inventory_variant(the_lab, tmp_path, secrets=True, extra=trio)
    code, report, text = weights("--inventory", str(path), "--cluster", "trio")
    assert code == 0, text
    total = report["hosts"]["cpu-1"]["weights"]["bytes"]
    assert report["bytes_from_hub"] == total == served(the_lab, "test/trio-awq")  # the hub, once
    # A chain: each host from the one before it, while that one still receives.
    sources = [report["hosts"][name]["fetched"]["from"] for name in ("ws-5090", "h200", "cpu-1")]
    assert sources == ["hub", "peer ws-5090", "peer h200"]
    assert [report["hosts"][name]["fetched"]["by_source"] for name in ("ws-5090", "h200", "cpu-1")] == [
        {"hub": total}, {"ws-5090": total}, {"h200": total}]
    expected = local_sha256(the_lab, "test/trio-awq", commit, "model.safetensors")
    for name in ("ws-5090", "h200", "cpu-1"):
        assert report["hosts"][name]["fetched"]["bytes"] == total
        assert host_sha256(lab_inventory, name, "/srv/w-trio/test/trio-awq/current/model.safetensors") == expected
        config = json.loads(on_host(lab_inventory, name, ["cat", "/srv/w-trio/test/trio-awq/current/config.json"]))
        assert config["quantization_config"]["quant_method"] == "awq"
    # One host lost its copy: the rerun fetches it from the peers that hold it verified, not the hub.
    on_host(lab_inventory, "cpu-1", ["rm", "-rf", "/srv/w-trio"])
    hub_call(the_lab, "/_lab/reset", {})
    code, report, text = weights("--inventory", str(path), "--cluster", "trio")
    assert code == 0, text
    assert list(report["hosts"]["cpu-1"]["fetched"]["by_source"]) == ["h200"], report["hosts"]["cpu-1"]
    assert report["bytes_from_hub"] == 0 == served(the_lab, "test/trio-awq")
    assert host_sha256(lab_inventory, "cpu-1", "/srv/w-trio/test/trio-awq/current/model.safetensors") == expected


def test_a_pinned_commit_is_planned_without_the_hub_until_a_host_must_fetch(
        hub_counters: lab.Lab, lab_inventory: inventory.Inventory) -> None:
    """model_revision a full commit: what the hub said of it is kept on the controller, so a plan of a
    host that has it asks the hub nothing. A host that must fetch makes the plan ask the hub again (the
    gate's model.hub speaks for the hub as it is now)."""
    the_lab = hub_counters
    commit = hub_call(the_lab, "/api/models/lab/tiny-llama")["sha"]

    def plan(*extra: str) -> list[str]:
        hub_call(the_lab, "/_lab/reset", {})
        done = run_invoke("plan", "--host", "cpu-1", "--json", "--set", f"model_revision={commit}", *extra)
        assert done.returncode == 0, done.stdout + done.stderr
        return [r["path"] for r in hub_call(the_lab, "/_lab/stats")["requests"]
                if r["path"].startswith("/api/") and "lab/tiny-llama" in r["path"]]  # not the other group's

    plan()  # the first plan of this pin may ask (and keeps the answer)
    assert plan() == []  # cpu-1 has the commit: the hub is not asked
    assert plan("--set", "model_dir=/srv/w-pinned") != []  # an empty model directory: it is asked
