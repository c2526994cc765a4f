"""Model weights ON the host: fetch, verify, keep, under the host lock (common.py). The controller appends
`weights_main(SPEC_JSON)`; relay.py travels ahead of it.

    {"action": "fetch", "root": "/var/lib/vllm/models/ORG/NAME", "repo": "ORG/NAME", "commit": SHA,
     "files": [{"path", "size", "digest": "sha256:HEX" | "git-sha1:HEX"}], "verify_all": false,
     "sources": [{"kind": "peer", "name": HOST, "url": URL}, ...,
                 {"kind": "hub", "endpoint": URL, "token": T|null, "repo": "ORG/NAME", "commit": SHA}],
     "lock": "/run/lock/provision.lock", "wait": 0}

Layout under ROOT: revisions/SHA/ (one per commit, with its manifest .provision-weights.json),
`current` and `previous` (relative symlinks; vLLM reads ROOT/current), .partial/SHA/*.part (what a
broken transfer left, resumed next time; what a relay (relay.serve) serves while it arrives), .quarantine/ (files
whose hash did not match: set aside, never served). A file the new revision shares with the current
one is hard-linked, not fetched.

The sources are tried in order (relay.Route): the nearest relay of the cluster first, the hub last.
The hub transfer is huggingface_hub's own (`http_get`, HF_ENDPOINT-style endpoint, the token in its
headers); it runs under the helper venv's python. Relays answer plain HTTP ranges, standard library
only. Output: JSON lines, {"event": "progress", ...} while bytes move, {"event": "rerouted", ...} when
a source is left, and one {"event": "result", ...} at the end.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Mapping
from typing import Any, BinaryIO, cast

from provision.host.common import StepFailed, emit, lock, make_directories, write_atomically
from provision.host.relay import (
    Progress,
    Route,
    Sink,
    fetch_peer,
    receive,
    tell_done,
)

MANIFEST = ".provision-weights.json"


class WeightsFailed(Exception):
    pass


def file_digest(path: str, kind: str) -> str:
    digest = hashlib.sha256() if kind == "sha256" else hashlib.sha1()
    if kind == "git-sha1":
        digest.update(b"blob %d\0" % os.path.getsize(path))
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return f"{kind}:{digest.hexdigest()}"


def matches(path: str, entry: Mapping[str, Any]) -> bool:
    expected: str = entry["digest"]
    return file_digest(path, expected.split(":", 1)[0]) == expected


def read_manifest(directory: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(directory, MANIFEST)) as handle:
            manifest: dict[str, Any] = json.load(handle)
            return manifest
    except (OSError, ValueError):
        return None


def stat_of(path: str) -> list[int]:
    """What a manifest records of a verified file: [size, mtime_ns, ctime_ns, inode]. ctime is what
    an edit in place followed by `touch -r` cannot put back; it also moves when the file's link count
    does, which is why manifests are stamped after this run's own links and removals (restamp)."""
    info = os.stat(path)
    return [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]


def unchanged_since_verified(path: str, recorded: Mapping[str, Any] | None) -> bool:
    """The file is as it was verified (a manifest from before ctime and inode: its size and mtime)."""
    try:
        now = stat_of(path)
    except OSError:
        return False
    kept = (recorded or {}).get("stat")
    return isinstance(kept, list) and len(kept) >= 2 and now[:len(kept)] == kept


HUB_CHUNK = 1 << 20  # the most a cut hub transfer loses and sends again


def fetch_hub(source: Mapping[str, Any], entry: Mapping[str, Any], sink: Sink, resume: int) -> None:
    """The file from the hub with huggingface_hub's own transfer (its retries, its headers)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    from huggingface_hub import constants, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]  # an implicit re-export

    # http_get writes what arrives in chunks of this size, and a cut loses the chunk still in memory:
    # the resume (its own retry, or the next source's) starts from the bytes that reached the part
    # file, a 10 MB boundary by default.
    constants.DOWNLOAD_CHUNK_SIZE = min(constants.DOWNLOAD_CHUNK_SIZE, HUB_CHUNK)
    url = hf_hub_url(source["repo"], entry["path"], revision=source["commit"], endpoint=source["endpoint"])
    headers = build_hf_headers(token=source.get("token") or False, library_name="provision")
    # http_get only writes to its file: the Sink stands in for one.
    http_get(url, cast(BinaryIO, sink), resume_size=resume, headers=headers, expected_size=entry["size"])


FETCHERS: Mapping[str, Any] = {"hub": fetch_hub, "peer": fetch_peer}  # relay.Fetcher each


QUARANTINE_KEEP = 1  # bad copies kept per file for a look: the newest; older ones only fill the disk
QUARANTINE_BYTES = 1 << 30  # all of .quarantine/ beyond this loses its oldest copies (never the newest)


def quarantine(root: str, path: str, commit: str, name: str, keep_in_place: bool = False) -> str:
    """Set a bad file aside where nothing serves it; returns where it went. With keep_in_place the file
    stays where it is (a hard link goes aside): it is replaced only once a verified copy exists, so a
    served revision is never missing a file, even when the fetch of its replacement fails."""
    target = os.path.join(root, ".quarantine", commit, f"{name}.{time.time_ns()}")
    make_directories(os.path.dirname(target))
    if keep_in_place:
        os.link(path, target)
    else:
        os.rename(path, target)
    prefix = os.path.basename(name) + "."
    folder = os.path.dirname(target)
    older = sorted((entry for entry in os.listdir(folder)
                    if entry.startswith(prefix) and entry[len(prefix):].isdigit()),
                   key=lambda entry: int(entry[len(prefix):]))[:-QUARANTINE_KEEP]
    for entry in older:
        os.remove(os.path.join(folder, entry))
    bound_quarantine(os.path.join(root, ".quarantine"), target)
    return target


def bound_quarantine(folder: str, newest: str) -> None:
    """Drop the oldest copies set aside (any file, any commit) while all of them pass QUARANTINE_BYTES;
    `newest`, the one just set aside, stays whatever its size. Folders left empty go too."""
    copies = []
    for directory, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(directory, name)
            stamp = name.rsplit(".", 1)[-1]
            copies.append((int(stamp) if stamp.isdigit() else 0, os.path.getsize(path), path))
    total = sum(size for _, size, _ in copies)
    for _, size, path in sorted(copies):
        if total <= QUARANTINE_BYTES:
            break
        if path != newest:
            os.remove(path)
            total -= size
    for directory, _, _ in sorted(os.walk(folder), key=lambda found: -len(found[0])):
        if directory != folder and not os.listdir(directory):
            os.rmdir(directory)


def place_all(spec: dict[str, Any], todo: list[dict[str, Any]], revision: str, partial: str, progress: Progress,
              report: dict[str, Any], route: Route) -> dict[str, list[int]]:
    """Bring the revision's missing files in place: each received, then hashed on disk in a thread of
    its own while the next one arrives (the hash stays off the transfer's path; hashlib releases the
    GIL), then given its name, or set aside and fetched once more from the next source. Returns each
    placed file's identity (stat_of) right after its rename, for confirm() to hold the manifest to."""
    from concurrent.futures import ThreadPoolExecutor

    placed: dict[str, list[int]] = {}

    def paths(entry: dict[str, Any]) -> tuple[str, str]:
        return os.path.join(revision, entry["path"]), os.path.join(partial, entry["path"] + ".part")

    def take(entry: dict[str, Any]) -> None:
        try:
            receive(entry, paths(entry)[1], route, progress, FETCHERS)
        except OSError as exc:
            raise WeightsFailed(str(exc)) from None

    def digest_of(entry: dict[str, Any]) -> tuple[str, list[int]]:
        """The part's digest and its identity (stat_of) while it was hashed; ("", ...) for a part of the
        wrong size or one that changed while it was read."""
        part = paths(entry)[1]
        before = stat_of(part)
        if before[0] != entry["size"]:
            return "", before
        digest = file_digest(part, entry["digest"].split(":", 1)[0])
        return (digest if stat_of(part) == before else ""), before

    def settle(entry: dict[str, Any], hashed: tuple[str, list[int]]) -> bool:
        final, part = paths(entry)
        digest, identity = hashed
        if digest and stat_of(part) != identity:
            # Written to since it was hashed (the hash ran while later files arrived): what was
            # verified is not what would take the name. Hash what is there now.
            digest, identity = digest_of(entry)
        if digest == entry["digest"]:
            os.chmod(part, 0o644)
            make_directories(os.path.dirname(final))
            os.rename(part, final)  # over a bad copy, if one is still in place: one atomic step
            placed[entry["path"]] = stat_of(final)
            return True
        report["quarantined"].append(quarantine(spec["root"], part, spec["commit"], entry["path"]))
        return False

    with ThreadPoolExecutor(max_workers=1) as hashing:
        digests = []
        for entry in todo:
            take(entry)
            digests.append((entry, hashing.submit(digest_of, entry)))
        for entry, digest in digests:
            if settle(entry, digest.result()):
                continue
            route.leave(f"{entry['path']}: its hash is not {entry['digest'][:19]}...")
            take(entry)
            if not settle(entry, digest_of(entry)):
                raise WeightsFailed(f"{entry['path']}: hash mismatch twice (expected {entry['digest']}); the "
                                    f"fetched copies are set aside in {spec['root']}/.quarantine")
    return placed


def confirm(revision: str, files: list[dict[str, Any]], verified: Mapping[str, list[int]]) -> None:
    """Every file is still the one verified (same stat_of as then) before the manifest vouches for it;
    one written to since is hashed again, and a bad one fails the run before `current` moves (the next
    run finds it unrecorded, sets it aside and fetches it)."""
    for entry in files:
        path = os.path.join(revision, entry["path"])
        if stat_of(path) == verified.get(entry["path"]):
            continue
        before = stat_of(path)
        if not (matches(path, entry) and stat_of(path) == before):
            raise WeightsFailed(f"{entry['path']}: changed on disk after it was verified (its hash is no "
                                f"longer {entry['digest'][:19]}...); not recorded as verified")


def fetch(spec: dict[str, Any]) -> dict[str, Any]:
    root, commit = spec["root"], spec["commit"]
    revision = os.path.join(root, "revisions", commit)
    partial = os.path.join(root, ".partial", commit)
    current = os.path.join(root, "current")
    for directory in (revision, partial):
        make_directories(directory)
    os.chmod(root, 0o755)
    report: dict[str, Any] = {"fetched": 0, "linked": 0, "kept": 0, "verified": 0, "quarantined": [],
                              "freed": [], "served_replaced": []}
    # The revision a server reads (`current`): a file replaced there is not what it loaded at its start.
    served = os.path.realpath(current) == os.path.realpath(revision)
    own = read_manifest(revision) or {}
    live_dir = os.path.realpath(current)
    live = read_manifest(current) if live_dir != os.path.realpath(revision) else None
    shared: dict[str, str] = {}
    live_unchanged: list[str] = []
    if live:
        for name, recorded in live.get("files", {}).items():
            if unchanged_since_verified(os.path.join(current, name), recorded):
                shared[recorded["digest"]] = os.path.join(current, name)
                live_unchanged.append(name)
    todo: list[dict[str, Any]] = []
    verified: dict[str, list[int]] = {}  # each file's stat_of when it was found or made verified
    for entry in spec["files"]:
        final = os.path.join(revision, entry["path"])
        recorded = own.get("files", {}).get(entry["path"])
        if (recorded and recorded.get("digest") == entry["digest"] and not spec.get("verify_all")
                and unchanged_since_verified(final, recorded)):
            report["kept"] += 1
            verified[entry["path"]] = stat_of(final)
            continue
        if os.path.exists(final):
            report["verified"] += 1
            identity = stat_of(final)
            if identity[0] == entry["size"] and matches(final, entry):
                report["kept"] += 1
                verified[entry["path"]] = identity
                continue
            # A copy goes aside now; the bad file itself stays until its verified replacement takes its
            # place (the revision may be the one served: it must never lack a file).
            report["quarantined"].append(quarantine(root, final, commit, entry["path"],
                                                    keep_in_place=True))
            if served:
                report["served_replaced"].append(entry["path"])
        if entry["digest"] in shared:
            make_directories(os.path.dirname(final))
            linked = final + ".provision-link"
            if os.path.lexists(linked):
                os.remove(linked)
            os.link(shared[entry["digest"]], linked)
            os.rename(linked, final)
            verified[entry["path"]] = stat_of(final)
            report["linked"] += 1
            continue
        todo.append(entry)
    need = sum(e["size"] for e in todo) - sum(
        os.path.getsize(os.path.join(partial, e["path"] + ".part")) for e in todo
        if os.path.exists(os.path.join(partial, e["path"] + ".part")))
    make_room(root, need, commit, report)
    progress = Progress(sum(e["size"] for e in todo))
    route = Route(spec["sources"])
    verified.update(place_all(spec, todo, revision, partial, progress, report, route))
    report["fetched"] = progress.fetched
    report["from"] = route.received
    report["rerouted"] = route.left
    confirm(revision, spec["files"], verified)
    write_manifest(spec, revision)
    switch(root, commit, report)
    # Linking into the new revision and removing old ones changed link counts, so ctimes: stamp the
    # revisions kept again, the new one whole, the one it replaced only where it was unchanged above.
    restamp(revision, [entry["path"] for entry in spec["files"]])
    if live and os.path.isdir(live_dir):
        restamp(live_dir, live_unchanged)
    shutil.rmtree(os.path.join(root, ".partial"), ignore_errors=True)
    return report


def make_room(root: str, need: int, commit: str, report: dict[str, Any]) -> None:
    """Free space for the fetch: the kept previous revision goes first, if it must."""
    free = _free(root)
    if free >= need:
        return
    previous = os.path.join(root, "previous")
    if os.path.islink(previous):
        kept = os.path.realpath(previous)
        if os.path.basename(kept) != commit and kept != os.path.realpath(os.path.join(root, "current")):
            shutil.rmtree(kept, ignore_errors=True)
            os.remove(previous)
            report["freed"].append(os.path.basename(kept))
            free = _free(root)
    if free < need:
        raise WeightsFailed(f"too little disk at {root}: {need // 2**20 + 1} MiB to fetch, "
                            f"{free // 2**20} MiB free")


def _free(path: str) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def restamp(directory: str, names: list[str]) -> None:
    """Record the stat now of `names` in a revision's manifest: files this run found unchanged since
    verified, whose ctime only its own links and removals have moved since. One whose size, mtime or
    inode moved too was written to meanwhile: it leaves the manifest (the next run verifies it)."""
    manifest = read_manifest(directory)
    if not manifest or not names:
        return
    files = manifest.get("files", {})
    for name in names:
        if name not in files:
            continue
        now = stat_of(os.path.join(directory, name))
        if _same_but_ctime(now, files[name].get("stat") or []):
            files[name]["stat"] = now
        else:
            del files[name]
    write_manifest(None, directory, manifest)


def _same_but_ctime(now: list[int], kept: list[int]) -> bool:
    """Size, mtime and inode as recorded (ctime may have moved with the link count)."""
    if len(kept) >= 4:
        return [now[0], now[1], now[3]] == [kept[0], kept[1], kept[3]]
    return len(kept) >= 2 and now[:2] == kept[:2]


def write_manifest(spec: dict[str, Any] | None, revision: str,
                   manifest: dict[str, Any] | None = None) -> None:
    """The revision's manifest: every file of `spec` stamped now, or `manifest` as given."""
    if manifest is None:
        assert spec is not None, "a manifest, or the spec to make it from"
        files = {}
        for entry in spec["files"]:
            files[entry["path"]] = {"size": entry["size"], "digest": entry["digest"],
                                    "stat": stat_of(os.path.join(revision, entry["path"]))}
        manifest = {"repo": spec["repo"], "revision": spec.get("revision"), "commit": spec["commit"],
                    "files": files, "verified": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    write_atomically(os.path.join(revision, MANIFEST), json.dumps(manifest, indent=1).encode(), 0o644,
                     0, 0)
    for directory, _, _ in os.walk(revision):
        os.chmod(directory, 0o755)


def _relink(root: str, name: str, commit: str) -> None:
    temporary = os.path.join(root, f".{name}.tmp")
    if os.path.lexists(temporary):
        os.remove(temporary)
    os.symlink(os.path.join("revisions", commit), temporary)
    os.rename(temporary, os.path.join(root, name))


def switch(root: str, commit: str, report: dict[str, Any]) -> None:
    """Point `current` at the commit; the one it pointed at becomes `previous`; older ones go."""
    current = os.path.join(root, "current")
    before = os.path.basename(os.readlink(current)) if os.path.islink(current) else None
    if before != commit:
        if before and os.path.isdir(os.path.join(root, "revisions", before)):
            _relink(root, "previous", before)
        _relink(root, "current", commit)
    keep = {commit}
    if os.path.islink(os.path.join(root, "previous")):
        keep.add(os.path.basename(os.readlink(os.path.join(root, "previous"))))
    for name in os.listdir(os.path.join(root, "revisions")):
        if name not in keep:
            shutil.rmtree(os.path.join(root, "revisions", name), ignore_errors=True)
            report["freed"].append(name)


def weights_main(spec: dict[str, Any]) -> None:
    result: dict[str, Any] = {"ok": True, "error": None}
    try:
        fd = lock(spec["lock"], spec.get("wait", 0))
        try:
            result.update(fetch(spec))
        finally:
            os.close(fd)
    except (WeightsFailed, StepFailed, OSError) as exc:
        result.update(ok=False, error=str(exc))
    finally:
        tell_done(spec["sources"])
    emit("result", **result)
