"""A hub-compatible HTTP server for the lab: repositories made on the spot, served like huggingface.co.

It speaks the part of the hub's protocol that huggingface_hub uses to read models: repository metadata
with file sizes and hashes (`/api/models/REPO[/revision/REV]`), file resolution by branch, tag or commit
(`HEAD`/`GET /REPO/resolve/REV/PATH`, with X-Repo-Commit, X-Linked-Etag/-Size for LFS files, ranges),
and the hub's error codes (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo). Standard library
only. PyPI's `olah` mirrors an upstream hub; the lab has no upstream and needs faults on demand.

It also serves a package index (PEP 503 "simple" pages, `/simple/VARIANT/PROJECT/`) the way PyTorch
serves its per-CUDA indexes (`…/whl/cu130`): wheels whose versions carry the variant as a local part
(`torch-2.9.0+cu130-py3-none-any.whl`), each link with its `#sha256=`.

For tests it counts what it served (`GET /_lab/stats`) and injects faults (`POST /_lab/faults`):
cut a file's transfer after N bytes for the next K requests, or slow it down (for one client address
or all).

Layout under ROOT:  repos/ORG/NAME/repo.json  {"gated": bool, "refs": {"main": SHA}, "commits": [..]}
                    repos/ORG/NAME/commits/SHA/<files>
                    tokens.json  ["hf_..."]  (who may read gated repositories)
                    simple/VARIANT/<wheels>  (the package index)
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlparse

from provision.errors import HubError

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".onnx", ".msgpack", ".h5")
LFS_MIN_SIZE = 10 * 2**20  # the hub's default: anything bigger goes to LFS as well


def is_lfs(path: str, size: int) -> bool:
    return path.endswith(LFS_SUFFIXES) or size >= LFS_MIN_SIZE


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def describe_file(path: Path, name: str) -> dict[str, Any]:
    """A sibling as the hub lists it with files metadata: size, git blob id, LFS sha256."""
    size = path.stat().st_size
    entry: dict[str, Any] = {"rfilename": name, "size": size}
    if is_lfs(name, size):
        sha = _sha256(path)
        pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {size}\n".encode()
        entry.update(blobId=git_blob_id(pointer), lfs={"size": size, "sha256": sha, "pointerSize": len(pointer)})
    else:
        entry["blobId"] = git_blob_id(path.read_bytes())
    return entry


# ---------------------------------------------------------------------------------------------
# Publishing (the lab and the tests make repositories with these)


def publish(root: Path, repo_id: str, files: Path, *, ref: str = "main", gated: bool = False,
            tags: tuple[str, ...] = ()) -> str:
    """Commit the directory `files` to `repo_id` on branch `ref` (and tags); returns the commit sha."""
    repo = root / "repos" / repo_id
    meta_path = repo / "repo.json"
    meta: dict[str, Any] = (json.loads(meta_path.read_text()) if meta_path.exists()
                            else {"gated": gated, "refs": {}, "commits": []})
    meta["gated"] = gated
    listing = sorted(str(p.relative_to(files)) for p in files.rglob("*") if p.is_file())
    tree = [describe_file(files / name, name) for name in listing]
    parent = meta["refs"].get(ref, "")
    commit = hashlib.sha1(json.dumps({"parent": parent, "tree": tree}, sort_keys=True).encode()).hexdigest()
    target = repo / "commits" / commit
    if not target.exists():
        building = target.with_name(commit + ".tmp")
        shutil.rmtree(building, ignore_errors=True)
        shutil.copytree(files, building)
        (building.parent / f"{commit}.json").write_text(json.dumps(tree))
        building.rename(target)
        meta["commits"].append(commit)
    meta["refs"][ref] = commit
    for tag in tags:
        meta["refs"][tag] = commit
    repo.mkdir(parents=True, exist_ok=True)
    meta_path.write_text(json.dumps(meta, indent=1))
    return commit


def publish_wheel(root: Path, variant: str, wheel: Path) -> None:
    """Put a wheel in the index under VARIANT (e.g. cu130): /simple/VARIANT/PROJECT/ lists it."""
    directory = root / "simple" / variant
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy2(wheel, directory / wheel.name)


def _project(wheel_name: str) -> str:
    """PEP 503 normalized project name of a wheel file: 'Torch_Thing-1.0-py3-none-any.whl' -> 'torch-thing'."""
    return re.sub(r"[-_.]+", "-", wheel_name.split("-")[0]).lower()


def allow_token(root: Path, token: str) -> None:
    path = root / "tokens.json"
    tokens = json.loads(path.read_text()) if path.exists() else []
    if token not in tokens:
        tokens.append(token)
    path.write_text(json.dumps(tokens))
    path.chmod(0o600)


# ---------------------------------------------------------------------------------------------
# Serving


class Hub:
    """Repositories, counters and faults; shared by the handler threads."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.lock = threading.Lock()
        self.stats: dict[str, Any] = {"bytes": 0, "files": {}, "requests": [], "clients": {}, "client_files": {}}
        self.faults: list[dict[str, Any]] = []

    def repo(self, repo_id: str, token: str | None) -> dict[str, Any]:
        meta_path = self.root / "repos" / repo_id / "repo.json"
        if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo_id) or not meta_path.exists():
            raise HubError(401 if token is None else 404, "RepoNotFound",
                           f"Repository Not Found for url: {repo_id}")
        meta: dict[str, Any] = json.loads(meta_path.read_text())
        if meta.get("gated"):
            tokens_path = self.root / "tokens.json"
            allowed = json.loads(tokens_path.read_text()) if tokens_path.exists() else []
            if token is None:
                raise HubError(401, "GatedRepo", f"Access to model {repo_id} is restricted. "
                                                 "You must have access to it and be authenticated to access it.")
            if token not in allowed:
                raise HubError(403, "GatedRepo", f"Access to model {repo_id} is restricted and you are not "
                                                 "in the authorized list.")
        return meta

    def commit_of(self, repo_id: str, meta: dict[str, Any], revision: str) -> str:
        if revision in meta["refs"]:
            return str(meta["refs"][revision])
        if revision in meta["commits"]:
            return revision
        raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")

    def tree(self, repo_id: str, commit: str) -> list[dict[str, Any]]:
        data: list[dict[str, Any]] = json.loads(
            (self.root / "repos" / repo_id / "commits" / f"{commit}.json").read_text())
        return data

    def count(self, key: str, sent: int, client: str) -> None:
        with self.lock:
            self.stats["bytes"] += sent
            self.stats["files"][key] = self.stats["files"].get(key, 0) + sent
            clients = self.stats.setdefault("clients", {})
            clients[client] = clients.get(client, 0) + sent
            # Per client and file: the controller's plan-time reads (config.json) apart from the hosts'.
            mine = self.stats.setdefault("client_files", {}).setdefault(client, {})
            mine[key] = mine.get(key, 0) + sent

    def fault_for(self, key: str, client: str) -> dict[str, Any] | None:
        with self.lock:
            for fault in self.faults:
                if (fault["match"] in key and fault.get("times", 1) > 0
                        and fault.get("client") in (None, client)):
                    fault["times"] = fault.get("times", 1) - 1
                    return dict(fault)
        return None


class Handler(BaseHTTPRequestHandler):
    hub: Hub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # the lab's log, not stderr noise
        pass

    # -- plumbing --------------------------------------------------------------------------------

    def _token(self) -> str | None:
        header = self.headers.get("Authorization", "")
        return header[7:].strip() or None if header.startswith("Bearer ") else None

    def _json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _error(self, error: HubError) -> None:
        self._json(error.status, {"error": error.message},
                   {"X-Error-Code": error.code, "X-Error-Message": error.message})

    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        path = unquote(urlparse(self.path).path)
        with self.hub.lock:
            self.hub.stats["requests"].append({"method": self.command, "path": path,
                                               "range": self.headers.get("Range")})
        try:
            if path.startswith("/_lab/"):
                return self._control(path)
            if path.startswith("/apt/"):
                return self._apt(path.removeprefix("/apt/"))
            match = re.fullmatch(r"/simple/([\w.-]+)/(?:([\w.-]+)/(?:([^/]+\.whl))?)?", path)
            if match:
                return self._index(match.group(1), match.group(2), match.group(3))
            match = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/(.+))?", path)
            if match:
                return self._info(match.group(1), match.group(2) or "main")
            match = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
            if match:
                return self._resolve(match.group(1), match.group(2), match.group(3))
            raise HubError(404, "EntryNotFound", f"no route for {path}")
        except HubError as error:
            self._error(error)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _apt(self, name: str) -> None:
        """A file of the lab's apt repository (provision/lab/aptrepo.py), served as a plain web server would."""
        base = (self.hub.root / "apt").resolve()
        path = (base / name).resolve()
        if base not in path.parents or not path.is_file():
            raise HubError(404, "EntryNotFound", f"no apt file {name}")
        self._send(path.read_bytes(), "application/octet-stream")

    def _send(self, data: bytes, content_type: str) -> bool:
        """A whole file or page with 200; False where the request was a HEAD (nothing was sent)."""
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command == "HEAD":
            return False
        self.wfile.write(data)
        return True

    # -- the hub's API ---------------------------------------------------------------------------

    def _info(self, repo_id: str, revision: str) -> None:
        meta = self.hub.repo(repo_id, self._token())
        commit = self.hub.commit_of(repo_id, meta, revision)
        siblings = self.hub.tree(repo_id, commit)
        self._json(200, {"id": repo_id, "modelId": repo_id, "sha": commit, "private": False,
                         "gated": "manual" if meta.get("gated") else False, "disabled": False,
                         "siblings": siblings, "tags": [], "downloads": 0, "likes": 0})

    def _resolve(self, repo_id: str, revision: str, name: str) -> None:
        meta = self.hub.repo(repo_id, self._token())
        commit = self.hub.commit_of(repo_id, meta, revision)
        entry = next((e for e in self.hub.tree(repo_id, commit) if e["rfilename"] == name), None)
        if entry is None:
            raise HubError(404, "EntryNotFound", f"{name} does not exist at revision {revision}")
        path = self.hub.root / "repos" / repo_id / "commits" / commit / name
        size = int(entry["size"])
        start, end = 0, size - 1
        ranged = self.headers.get("Range")
        if ranged:
            match = re.fullmatch(r"bytes=(\d+)-(\d*)", ranged.strip())
            if not match or int(match.group(1)) >= max(size, 1):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start = int(match.group(1))
            end = min(int(match.group(2)), size - 1) if match.group(2) else size - 1
        self.send_response(206 if ranged else 200)
        self.send_header("X-Repo-Commit", commit)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        if "lfs" in entry:
            self.send_header("X-Linked-Etag", f'"{entry["lfs"]["sha256"]}"')
            self.send_header("X-Linked-Size", str(size))
            self.send_header("ETag", f'"{entry["lfs"]["sha256"]}"')
        else:
            self.send_header("ETag", f'"{entry["blobId"]}"')
        if ranged:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        if self.command == "HEAD":
            return
        key = f"{repo_id}/{name}"
        client = self.client_address[0]
        fault = self.hub.fault_for(key, client)
        remaining, sent = end - start + 1, 0
        with path.open("rb") as handle:
            handle.seek(start)
            while remaining > 0:
                block = handle.read(min(64 * 1024, remaining))
                if not block:
                    break
                if fault and fault.get("cut_after") is not None and sent + len(block) > fault["cut_after"]:
                    block = block[:max(0, fault["cut_after"] - sent)]
                    self.wfile.write(block)
                    self.hub.count(key, len(block), client)
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_WR)  # the transfer ends early, cleanly
                    return
                self.wfile.write(block)
                self.hub.count(key, len(block), client)
                sent += len(block)
                remaining -= len(block)
                if fault and fault.get("delay"):
                    time.sleep(float(fault["delay"]))

    # -- the package index (PEP 503) -------------------------------------------------------------

    def _index(self, variant: str, project: str | None, wheel: str | None) -> None:
        directory = self.hub.root / "simple" / variant
        wheels = sorted(p.name for p in directory.glob("*.whl")) if directory.is_dir() else []
        if project is None:
            names = sorted({_project(name) for name in wheels})
            return self._html("".join(f'<a href="{name}/">{name}</a><br>\n' for name in names))
        mine = [name for name in wheels if _project(name) == re.sub(r"[-_.]+", "-", project).lower()]
        if wheel is None:
            if not mine:
                raise HubError(404, "EntryNotFound", f"no project {project} in {variant}")
            links = "".join(f'<a href="{quote(name)}#sha256={_sha256(directory / name)}">{name}</a><br>\n'
                            for name in mine)
            return self._html(links)
        if wheel not in mine:
            raise HubError(404, "EntryNotFound", f"no file {wheel} in {variant}")
        data = (directory / wheel).read_bytes()
        if self._send(data, "application/octet-stream"):
            self.hub.count(f"simple/{variant}/{wheel}", len(data), self.client_address[0])

    def _html(self, body: str) -> None:
        self._send(f"<!DOCTYPE html>\n<html><body>\n{body}</body></html>\n".encode(), "text/html")

    # -- the lab's controls ----------------------------------------------------------------------

    def _control(self, path: str) -> None:
        if path == "/_lab/stats":
            with self.hub.lock:
                return self._json(200, self.hub.stats)
        if path == "/_lab/reset" and self.command == "POST":
            with self.hub.lock:
                self.hub.stats = {"bytes": 0, "files": {}, "requests": [], "clients": {}, "client_files": {}}
                self.hub.faults = []
            return self._json(200, {"ok": True})
        if path == "/_lab/faults" and self.command == "POST":
            length = int(self.headers.get("Content-Length", "0"))
            fault = json.loads(self.rfile.read(length) or b"{}")
            with self.hub.lock:
                self.hub.faults.append(fault)
            return self._json(200, {"ok": True})
        raise HubError(404, "EntryNotFound", f"no control {path}")


def serve(root: Path, address: str, port: int) -> ThreadingHTTPServer:
    handler = type("BoundHandler", (Handler,), {"hub": Hub(root)})
    ThreadingHTTPServer.daemon_threads = True
    return ThreadingHTTPServer((address, port), handler)


def main() -> None:
    parser = argparse.ArgumentParser(description="the lab's hub-compatible model server")
    parser.add_argument("--root", required=True, type=Path)
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8930)
    args = parser.parse_args()
    server = serve(args.root, args.address, args.port)
    (args.root / "hub.pid").write_text(str(os.getpid()))
    server.serve_forever()


if __name__ == "__main__":
    main()
