"""Model weights: resolved on the controller, fetched on the hosts, verified on every host.

Plan time: the hub's metadata (huggingface_hub's `model_info` with files metadata, at HF_ENDPOINT or the
inventory's `hf_endpoint`) turns the inventory's revision into a full commit and gives every file's
size and hash, so the plan can name the commit, the gate can check the disk against real sizes, and an
unchanged host is recognised from its manifest (read by the fact probe) without a byte moving.

Apply time (host/weights.py on the host): a cluster fetches from the hub once. With the `transfer`
setting at relay (the default), the first host fetches from the hub while the next receives from it,
and so on down a chain (relay.py), every host verifying every file itself; star: the first host
fetches, then the others copy from it; hub: every host from the hub. Hosts without a cluster address
fetch from the hub each.
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provision import config, programs, relay
from provision.errors import HubUnreachable, RelayError, WeightsError
from provision.facts import HostFacts
from provision.inventory import Settings
from provision.runner import Runner

HUB_VENV = "/var/lib/provision/hub-venv"  # huggingface_hub for the transfers, apart from vLLM's venv
LOCK = "/run/lock/provision.lock"


@dataclass(frozen=True)
class WeightFile:
    path: str
    size: int
    digest: str  # "sha256:HEX" for LFS files (the hub's own), "git-sha1:HEX" (the blob id) for the rest


@dataclass(frozen=True)
class Snapshot:
    repo: str
    revision: str
    commit: str
    files: tuple[WeightFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def weight_bytes(self) -> int:
        return tensor_bytes({f.path: f.size for f in self.files})


def tensor_bytes(sizes: Mapping[str, int]) -> int:
    """{path: size} -> the bytes of the tensors' files (safetensors, or PyTorch .bin/.pt where a repository
    has no safetensors): what the GPUs hold. Tokenizer and config files are left out; all files count
    where none is a tensor file."""
    for suffixes in ((".safetensors",), (".bin", ".pt", ".pth")):
        found = [size for path, size in sizes.items() if path.endswith(suffixes)]
        if found:
            return sum(found)
    return sum(sizes.values())


def managed(settings: Settings) -> bool:
    """The tool fetches the model: a hub repository id, and fetch_weights not turned off."""
    model = str(settings.model or "")
    return bool(model) and not model.startswith("/") and bool(settings.fetch_weights)


def root_of(settings: Settings) -> str:
    return f"{settings.model_dir.rstrip('/')}/{settings.model}"


def serving_path(settings: Settings) -> str:
    """What vLLM is given: the `current` link of the fetched revision."""
    return f"{root_of(settings)}/current"


# ---------------------------------------------------------------------------------------------
# Plan time: the hub's metadata


def snapshot_from_info(repo: str, revision: str, info: Any, patterns: Sequence[str]) -> Snapshot:
    """Pure: a huggingface_hub ModelInfo (with files metadata) -> the files the inventory wants."""
    files = []
    for sibling in info.siblings or ():
        name = sibling.rfilename
        if patterns and not any(fnmatch.fnmatch(name, pattern) for pattern in patterns):
            continue
        if sibling.lfs is not None:
            files.append(WeightFile(name, int(sibling.lfs.size), f"sha256:{sibling.lfs.sha256}"))
        elif sibling.blob_id and sibling.size is not None:
            files.append(WeightFile(name, int(sibling.size), f"git-sha1:{sibling.blob_id}"))
        else:
            raise WeightsError(f"{repo}: the hub gave no size or hash for {name}")
    if not files:
        what = f" matching {', '.join(patterns)}" if patterns else ""
        raise WeightsError(f"{repo}@{revision}: no files{what}")
    return Snapshot(repo, revision, str(info.sha), tuple(sorted(files, key=lambda f: f.path)))


def resolve(repo: str, revision: str, patterns: Sequence[str], endpoint: str, token: str | None,
            token_source: str | None = None) -> Snapshot:
    """The revision's full commit and its files, from the hub; clear errors for what users hit.
    `token_source`: where the token came from ("the environment (HF_TOKEN)", "the secrets file F")."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    api = HfApi(endpoint=endpoint, token=token or False, library_name="provision")
    try:
        info = api.model_info(repo, revision=revision, files_metadata=True, timeout=30)
    except GatedRepoError as exc:
        if token:
            raise WeightsError(f"{repo} is gated and the token from {token_source or 'the secrets'} has no "
                               f"access to it; request access on {endpoint}/{repo}") from exc
        raise WeightsError(f"{repo} is gated: it needs a token; put hf_token in the inventory's secrets "
                           "file (or HF_TOKEN in the environment)") from exc
    except RevisionNotFoundError as exc:
        raise WeightsError(f"{repo} has no revision '{revision}' (a branch, tag or full commit)") from exc
    except RepositoryNotFoundError as exc:
        raise WeightsError(f"no model repository '{repo}' on {endpoint} (a private one needs hf_token)") from exc
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status is not None and status not in _HUB_ANSWERS:
            # 407 and a gateway's 5xx: a proxy or load balancer on the way spoke, not the hub's model API.
            said = getattr(exc.response, "reason_phrase", "") or ""
            raise HubUnreachable(f"no answer from {endpoint} for {repo}: HTTP {status} {said}".rstrip()) from exc
        raise WeightsError(f"{endpoint} refused {repo}@{revision}: {str(exc).splitlines()[0]}") from exc
    except Exception as exc:  # the transport's errors (httpx, requests) differ across versions
        raise HubUnreachable(f"cannot reach {endpoint} for {repo}: {type(exc).__name__}: {exc}") from exc
    return snapshot_from_info(repo, revision, info, patterns)


# Statuses the hub's model API gives about the request itself (bad request, token, access, repository or
# revision, rate limit): a refusal the inventory or the secrets answer. Any other status (a proxy's 407,
# a gateway's 502/503/504, the hub's own 500) says the hub was not really reached.
_HUB_ANSWERS = frozenset({400, 401, 403, 404, 409, 410, 422, 429})


def unreachable_fix(endpoint: str) -> str:
    """What to look at when the controller got no answer from the hub: nothing about the model."""
    return (f"the hub at {endpoint} gave no answer to this machine (the controller asks it, not the host): "
            "check its network and DNS, a proxy (HTTPS_PROXY / https_proxy in the environment, "
            "NO_PROXY for a local mirror), or set hf_endpoint to a mirror it can reach (HF_ENDPOINT)")


def is_commit(revision: str) -> bool:
    """A full commit id: what it names never changes (a branch or tag can move)."""
    return len(revision) == 40 and all(c in "0123456789abcdef" for c in revision)


def _kept_path(repo: str, commit: str, patterns: Sequence[str], endpoint: str) -> Path:
    key = hashlib.sha256(json.dumps([sorted(patterns), endpoint]).encode()).hexdigest()[:12]
    return config.model_configs() / repo / f"{commit}.files-{key}.json"


def kept_snapshot(repo: str, revision: str, patterns: Sequence[str], endpoint: str) -> Snapshot | None:
    """A pinned commit's files as the hub gave them once (kept by `keep_snapshot`), or None."""
    if not is_commit(revision):
        return None
    try:
        data = json.loads(_kept_path(repo, revision, patterns, endpoint).read_text(encoding="utf-8"))
        return Snapshot(repo, revision, revision, tuple(WeightFile(**f) for f in data["files"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def keep_snapshot(snapshot: Snapshot, patterns: Sequence[str], endpoint: str) -> None:
    """Keep a pinned commit's files: its next plans need not ask the hub while no host must fetch."""
    if not is_commit(snapshot.revision) or snapshot.commit != snapshot.revision:
        return
    path = _kept_path(snapshot.repo, snapshot.commit, patterns, endpoint)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"files": [f.__dict__ for f in snapshot.files]}), encoding="utf-8")
    except OSError:
        pass  # a cache that cannot be written only costs the next plan one request


def quantization_of(config: Any) -> str:
    """Pure: a model's config.json -> its quantization_config.quant_method, 'none' without one:
    {"quantization_config": {"quant_method": "awq", "bits": 4, ...}} -> 'awq'."""
    if not isinstance(config, dict):
        raise WeightsError("config.json is not a JSON object")
    quant = config.get("quantization_config")
    if quant is None:
        return "none"
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    if not isinstance(method, str) or not method:
        raise WeightsError("config.json: quantization_config has no quant_method")
    return method.lower()


def model_config(repo: str, commit: str, endpoint: str, token: str | None) -> dict[str, Any]:
    """The model's config.json at its resolved commit (its quantization for the known issues, its
    layers and heads for the KV cache estimate): only that file is fetched, into a directory thrown
    away after (the controller's hub cache stays untouched), through the same endpoint and token as
    `resolve`, and kept per commit, which never changes."""
    cached = config.model_configs() / repo / f"{commit}.json"
    try:  # a commit is immutable: an unchanged host's plan asks the hub for no file at all
        kept = json.loads(cached.read_text(encoding="utf-8"))
        if isinstance(kept, dict):
            return kept
    except (OSError, ValueError):
        pass
    from huggingface_hub import HfApi
    from huggingface_hub.errors import EntryNotFoundError

    api = HfApi(endpoint=endpoint, token=token or False, library_name="provision")
    with tempfile.TemporaryDirectory(prefix="provision-config-") as scratch:
        try:
            path = api.hf_hub_download(repo, "config.json", revision=commit, cache_dir=scratch)
        except EntryNotFoundError as exc:
            raise WeightsError(f"{repo}@{commit[:12]} has no config.json") from exc
        except Exception as exc:  # the transport's errors (httpx) differ across versions
            raise WeightsError(f"cannot read config.json of {repo} from {endpoint}: "
                               f"{type(exc).__name__}: {exc}") from exc
        try:
            text = Path(str(path)).read_text(encoding="utf-8")
            found = json.loads(text)
        except (OSError, ValueError) as exc:
            raise WeightsError(f"{repo}: config.json is not JSON: {exc}") from exc
    if not isinstance(found, dict):
        raise WeightsError(f"{repo}: config.json is not a JSON object")
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(text, encoding="utf-8")
    except OSError:
        pass  # a cache that cannot be written only costs the next plan one small request
    return found


@dataclass(frozen=True)
class HostWeights:
    """What the probe saw of one model root: the current commit and its verified manifest."""

    current: str | None
    files: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # manifest entries
    stat: Mapping[str, Any] = field(default_factory=dict)  # [size, mtime_ns, ctime_ns, inode] now, None if gone
    partial: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # {commit: {path: bytes kept}}


def host_weights(facts: HostFacts, root: str) -> HostWeights:
    state = facts.weights.get(root) or {}
    return HostWeights(state.get("current"), state.get("files") or {}, state.get("stat") or {},
                       state.get("partial") or {})


def unchanged(now: Any, recorded: Any) -> bool:
    """A file's stat now against the one recorded when it was verified. An edit in place that keeps
    the size and puts the old mtime back (`touch -r`) still moves ctime, which nothing but the kernel
    sets; a file replaced by another gets another inode. Manifests written before ctime and inode were
    recorded hold [size, mtime_ns]: those two are compared until the next fetch or --verify rewrites
    them (so upgrading the tool does not re-hash every model and restart every server)."""
    if not isinstance(now, list) or not isinstance(recorded, list) or len(recorded) < 2:
        return False
    return now[:len(recorded)] == recorded


def compare(snapshot: Snapshot, seen: HostWeights) -> tuple[str | None, int]:
    """(why the host needs a fetch or None, bytes it must fetch). Pure."""
    by_digest = {entry.get("digest"): name for name, entry in seen.files.items()
                 if unchanged(seen.stat.get(name), entry.get("stat"))}
    kept = seen.partial.get(snapshot.commit, {})  # a broken transfer resumes from what it left
    to_fetch = sum(max(0, f.size - kept.get(f.path, 0)) for f in snapshot.files if f.digest not in by_digest)
    if seen.current is None:
        return "missing", to_fetch
    if seen.current != snapshot.commit:
        return f"revision {seen.current[:12]} -> {snapshot.commit[:12]}", to_fetch
    wanted = {f.path: f.digest for f in snapshot.files}
    have = {name: entry.get("digest") for name, entry in seen.files.items()}
    if any(have.get(path) != digest for path, digest in wanted.items()):
        return "files differ from the manifest", to_fetch
    changed = sorted(name for name in wanted if not unchanged(seen.stat.get(name), seen.files[name].get("stat")))
    if changed:
        return f"{len(changed)} file(s) changed since verified ({', '.join(changed[:3])}): re-verify", \
            sum(f.size for f in snapshot.files if f.path in changed)
    return None, 0


def change_data(settings: Settings, snapshot: Snapshot) -> dict[str, Any]:
    return {"root": root_of(settings), "repo": snapshot.repo, "revision": snapshot.revision,
            "commit": snapshot.commit, "endpoint": settings.hf_endpoint,
            "files": [f.__dict__ for f in snapshot.files]}


# ---------------------------------------------------------------------------------------------
# Weights placed by hand (fetch_weights false, or a model given as a path): what the probe saw


@dataclass(frozen=True)
class PlacedModel:
    """A model the tool does not fetch, as the probe saw it (host/probe.py `_inspect_model`): a
    directory's files and sizes and its config.json read (None, with `config_error` saying why, where
    there is none or it is not a JSON object); or one file (llama.cpp's GGUF, `is_file`). Where the
    directory holds one GGUF model, or the file is one, `gguf` is its header's scalar metadata
    (host/gguf.py; None, with `gguf_error` saying why, where it could not be read)."""

    directory: str  # the model's path: a directory, or for `is_file` the file
    present: bool  # the directory (or the file) exists
    sizes: Mapping[str, int] = field(default_factory=dict)
    config: Mapping[str, Any] | None = None
    config_error: str | None = None
    truncated: bool = False  # more files than the probe lists: not a model directory
    is_file: bool = False
    gguf_file: str | None = None  # the GGUF file whose header was read (its full path)
    gguf: Mapping[str, Any] | None = None
    gguf_error: str | None = None

    @property
    def weight_bytes(self) -> int | None:
        """The tensor files' bytes (tensor_bytes; a GGUF model's files, every part of a split one), None
        where the directory holds no file at all."""
        if not self.sizes or self.truncated:
            return None
        if self.gguf_file is not None and not self.is_file:
            return sum(size for path, size in self.sizes.items() if path.endswith(".gguf")) or None
        return tensor_bytes(self.sizes)


def _gguf_seen(seen: Mapping[str, Any], path: str) -> tuple[Mapping[str, Any] | None, str | None]:
    """The probe's reading of a GGUF header -> (scalar metadata, None) or (None, why not). A header
    read only in part keeps what it found where that names the architecture (the walk stops after
    the metadata llama.cpp writes first), else says where it stopped."""
    header = seen.get("gguf")
    if not isinstance(header, Mapping):
        return None, f"the GGUF header of {path} was not read"
    metadata = header.get("metadata")
    error = header.get("error")
    if not isinstance(metadata, Mapping) or (error and "general.architecture" not in metadata):
        return None, f"the GGUF header of {path} on the host cannot be read: {error or 'no metadata'}"
    return metadata, None


def placed_model(facts: HostFacts, directory: str) -> PlacedModel | None:
    """Pure: the probe's view of a model placed by hand; None where it was not inspected."""
    seen = facts.models.get(directory)
    if not isinstance(seen, Mapping):
        return None
    if seen.get("is_file"):
        if not isinstance(seen.get("size"), int):
            return PlacedModel(directory, False, is_file=True,
                               config_error=f"{directory} on the host cannot be read: {seen.get('error')}")
        metadata, why = _gguf_seen(seen, directory)
        name = directory.rstrip("/").rsplit("/", 1)[-1]
        return PlacedModel(directory, True, {name: int(seen["size"])}, is_file=True, gguf_file=directory,
                           gguf=metadata, gguf_error=why,
                           config_error=why and f"{directory} is a file, not a model directory, and {why}")
    if not seen.get("is_dir"):
        why = "is not a directory" if seen.get("exists") else "does not exist"
        return PlacedModel(directory, False, config_error=f"{directory} {why} on the host")
    sizes = {str(path): int(size) for path, size in (seen.get("sizes") or {}).items()}
    config, error = None, None
    text = seen.get("config")
    if text is None:
        said = seen.get("config_error") or "missing"
        error = f"no config.json in {directory} on the host" if said == "missing" else \
            f"{directory}/config.json on the host cannot be read: {said}"
    else:
        try:
            found = json.loads(text)
        except ValueError as exc:
            found, error = None, f"{directory}/config.json on the host is not JSON: {exc}"
        if isinstance(found, dict):
            config = found
        elif error is None:
            error = f"{directory}/config.json on the host is not a JSON object"
    gguf_file, metadata, why = None, None, None
    if isinstance(seen.get("gguf_file"), str):
        gguf_file = f"{directory.rstrip('/')}/{seen['gguf_file']}"
        metadata, why = _gguf_seen(seen, gguf_file)
    return PlacedModel(directory, True, sizes, config, error, bool(seen.get("truncated")),
                       gguf_file=gguf_file, gguf=metadata, gguf_error=why)


def not_fetched(settings: Settings, placed: PlacedModel | None) -> str | None:
    """Pure: what a weights run says of a model the tool does not fetch (None where it fetches it):
    'not fetched: fetch_weights is false; 5 file(s) placed by hand in /models/org/name'."""
    if managed(settings) or not settings.model:
        return None
    why = "the model is a path on the host" if str(settings.model).startswith("/") else "fetch_weights is false"
    if placed is None:
        return f"not fetched: {why}"
    if not placed.present or not placed.sizes:
        return f"not fetched: {why}; none present in {placed.directory}"
    if placed.is_file:
        return f"not fetched: {why}; {placed.directory} placed by hand"
    return f"not fetched: {why}; {len(placed.sizes)} file(s) placed by hand in {placed.directory}"


# ---------------------------------------------------------------------------------------------
# Apply time


def program(spec: Mapping[str, Any]) -> str:
    return programs.ship(("relay", "weights"), "weights_main", spec)


@dataclass
class FetchResult:
    fetched: int = 0  # bytes that crossed the network to this host
    source: str = ""  # "hub" or "peer HOST": where the host was to get the bytes from first
    detail: dict[str, Any] = field(default_factory=dict)  # the program's report: "from" bytes per source, ...


def _run(runner: Runner, python: str, spec: Mapping[str, Any], on_progress: Callable[[int, int], None]) -> dict[str, Any]:
    try:
        return relay.run(runner, program(spec), python, f"the weights {spec['action']}", on_progress)
    except RelayError as exc:
        raise WeightsError(str(exc)) from exc


def hub_source(data: Mapping[str, Any], token: str | None) -> dict[str, Any]:
    return {"kind": "hub", "endpoint": data["endpoint"], "token": token, "repo": data["repo"],
            "commit": data["commit"]}


def fetch(runner: Runner, data: Mapping[str, Any], sources: Sequence[Mapping[str, Any]], verify_all: bool,
          wait: float, on_progress: Callable[[int, int], None]) -> FetchResult:
    """One host's fetch from its sources in order (its relays, the hub last), every file verified there."""
    spec = {"action": "fetch", "root": data["root"], "repo": data["repo"], "revision": data["revision"],
            "commit": data["commit"], "files": data["files"], "verify_all": verify_all, "lock": LOCK,
            "wait": wait, "sources": list(sources)}
    first = sources[0]
    result = _run(runner, f"{HUB_VENV}/bin/python", spec, on_progress)
    return FetchResult(int(result.get("fetched", 0)), "hub" if first["kind"] == "hub" else f"peer {first['name']}",
                       result)


def relay_server(runner: Runner, data: Mapping[str, Any], address: str, peers: int) -> relay.Server:
    """A host serving the revision to its cluster: the files it holds, and those still arriving."""
    root, commit = data["root"], data["commit"]
    return relay.Server(runner, address, f"{root}/revisions/{commit}", f"{root}/.partial/{commit}", ".part",
                        {f["path"]: f["size"] for f in data["files"]}, peers)


# ---------------------------------------------------------------------------------------------
# A cluster's fetch: the hub once, then host to host


@dataclass(frozen=True)
class Job:
    host: str
    group: str  # hosts of one group share one fetch from the hub (a cluster, or the host alone)
    data: Mapping[str, Any]  # change_data
    address: str | None  # the host's address on its cluster network, where its peers reach it
    transfer: str = relay.RELAY  # the group's `transfer` setting: relay, star or hub


def transfer_groups(jobs: Sequence[Job]) -> list[list[Job]]:
    """Pure: the hosts that share one copy from the hub: per (group, commit, model root), in order.
    Hosts without a cluster address cannot serve or be served: each is a group of its own."""
    groups: dict[tuple[str, str, str], list[Job]] = {}
    alone: list[list[Job]] = []
    for job in jobs:
        if job.address is None:
            alone.append([job])
        else:
            groups.setdefault((job.group, job.data["commit"], job.data["root"]), []).append(job)
    return list(groups.values()) + alone


def holders_of(members: Sequence[Job], holders: Sequence[Job]) -> list[Job]:
    """Pure: the hosts that hold the group's revision verified (a Job each, for a host with nothing
    to fetch) and can serve it: same group, commit and model root, a cluster address, and a transfer
    that passes copies around."""
    first = members[0]
    if first.address is None or first.transfer == relay.HUB:
        return []
    key = (first.group, first.data["commit"], first.data["root"])
    return [held for held in holders if held.address is not None and held.host not in {m.host for m in members}
            and (held.group, held.data["commit"], held.data["root"]) == key]


def fetch_all(jobs: Sequence[Job], connect: Callable[[str], Any], token: str | None, verify_all: bool,
              wait: float, progress: Callable[[str], Callable[[int, int], None]],
              holders: Sequence[Job] = ()) -> tuple[dict[str, FetchResult], dict[str, BaseException]]:
    """Every job's fetch, all groups at once. relay: every host of a group at once, each from the host
    before it while that one still receives; star: the first host from the hub, then the others from
    it; hub: every host from the hub. Peers of the group that hold the revision already (`holders`)
    are the first sources, before the hub. A host's relay that fails is replaced by the next source."""
    from provision.fanout import for_each_host

    results: dict[str, FetchResult] = {}
    errors: dict[str, BaseException] = {}

    def run_group(members: list[Job]) -> None:
        serving = holders_of(members, holders)
        by_host = {job.host: job for job in [*serving, *members]}

        def one(host: str, relays: list[dict[str, Any]]) -> FetchResult:
            job = by_host[host]
            sources = [*relays, hub_source(job.data, token)]
            shown = "from the hub" if sources[0]["kind"] == "hub" else f"from {sources[0]['name']}"
            return fetch(connect(host), job.data, sources, verify_all, wait, progress(f"{host}: {shown}"))

        def server(host: str, peers: int) -> relay.Server:
            return relay_server(connect(host), by_host[host].data, str(by_host[host].address), peers)

        strategy = members[0].transfer if len(members) > 1 or serving else relay.HUB
        done, failed = relay.carry([job.host for job in members], strategy, server, one,
                                   [job.host for job in serving])
        results.update(done)
        errors.update(failed)

    for_each_host(transfer_groups(jobs), lambda members: members[0].host, run_group)
    return results, errors


def hub_requirement() -> str:
    """The hosts fetch with the huggingface_hub release the controller resolved metadata with."""
    import huggingface_hub

    return f"huggingface_hub=={huggingface_hub.__version__}"
