"""The probe: runs ON the host, sent as source on stdin to `python3 -`, so all facts cost one execution.

It must run on any python3 >= 3.6 and import nothing but the standard library; it never changes the
host. The controller appends one call, `main(SPEC_JSON)`, where the spec lists what to collect:

    {"commands": {"NAME": ["argv", ...]}, "files": {"NAME": "/path"}, "paths": ["/opt/vllm", ...],
     "trees": {"NAME": {"pattern": "/sys/bus/pci/devices/*", "read": ["numa_node"], "where": {"vendor": "0x10de"}}},
     "timeout": 20, "identity": {"NAME": ["/glob", ...]}, "keyed_by": {"NAME": ["/proc/sys/kernel/random/boot_id"]},
     "cache_file": "/var/cache/provision/probe.json"}

and it prints one JSON document:

    {"python": "3.11.2", "machine": "x86_64",
     "results": {"NAME": {"exit": 0, "stdout": "...", "stderr": "", "missing": false, "timed_out": false,
                          "truncated": false, "seconds": 0.012, "cached": true}},
     "cache": {"file": "/var/cache/provision/probe.json", "written": false, "error": null}, "seconds": 0.2,
     "paths": {"/opt/vllm": {"checked": "/opt", "free": 123, "total": 456}}}

A command that is not installed answers `missing: true` (a fact, not a crash); one that hangs (nvidia-smi
on a GPU that fell off the bus does) is killed after `timeout` seconds and answers `timed_out: true`;
one that prints more than MAX_OUTPUT is stopped there and answers `truncated: true`.
The commands run at once (nvidia-smi, lscpu and an `import torch` each take their time); each answer
says how long it took (`seconds`).

A command named in "identity" ({"NAME": ["/glob", ...]}) depends only on the files those patterns
match (and on its own program): the probe keeps its answer in the host's cache file
(spec["cache_file"], root's alone) with the identity of those files (size, mtime, ctime, inode) and
answers from there, `cached: true`, until one of them changes. A command named in "keyed_by"
({"NAME": ["/proc/...", ...]}) is kept the same way while those small files read the same: procfs and
sysfs files have no stat worth comparing, their content is the key (the boot id: what the hardware
answers holds for a boot). Writing that file is the only change a probe makes on a host; where it
cannot be written, every command simply runs.

Each answer has an entry of its own, named after its fact and what it asks (the command, the
identity patterns, the keyed_by files; see _slot): a host with two services in two venvs is sent two
probes, each asking a fact named "venv" of its own venv, and each keeps its own entry. At most
MAX_SLOTS entries per fact are kept (see _bounded).
"""
import glob
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Set, Tuple

from provision.host.common import write_atomically
from provision.host.gguf import read_gguf

MAX_OUTPUT = 1 << 20  # 1 MiB per output is plenty for any fact and bounds a runaway command


def _run(argv: List[str], timeout: float) -> Dict[str, Any]:
    """One command, its output read as it comes and at most MAX_OUTPUT of each stream kept: a command
    that prints more (an `nvidia-smi` that printed 768 MiB did) is stopped there and answers
    `truncated: true`, so the probe never holds more than the cap, however much a command prints."""
    import selectors
    import time
    env = dict(os.environ, LC_ALL="C", LANG="C")
    started = time.monotonic()
    result: Dict[str, Any] = {"exit": None, "stdout": "", "stderr": "", "missing": False, "timed_out": False,
                              "truncated": False, "seconds": 0.0}
    try:
        # A session of its own: a command stopped for its time or output is stopped with every process
        # it started (a wrapper script's children would otherwise live on under PID 1).
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, env=env, start_new_session=True)
    except FileNotFoundError:
        result["missing"] = True
        result["exit"] = 127
        return result
    except PermissionError as exc:
        result["exit"] = 126
        result["stderr"] = str(exc)
        return result
    out, err = process.stdout, process.stderr
    assert out is not None and err is not None  # both were asked for as pipes
    out_fd, err_fd = out.fileno(), err.fileno()
    kept = {out_fd: [b""], err_fd: [b""]}
    room = {out_fd: MAX_OUTPUT, err_fd: MAX_OUTPUT}
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(out, selectors.EVENT_READ)
        selector.register(err, selectors.EVENT_READ)
        while selector.get_map() and not (result["timed_out"] or result["truncated"]):
            left = deadline - time.monotonic()
            if left <= 0:
                result["timed_out"] = True
                break
            for key, _ in selector.select(left):
                data = os.read(key.fd, 65536)
                if not data:
                    selector.unregister(key.fileobj)
                    continue
                kept[key.fd].append(data[:room[key.fd]])
                room[key.fd] -= len(data)
                if room[key.fd] < 0:  # more than the cap: the rest is not read, the command stops
                    result["truncated"] = True
                    break
    try:
        if not (result["timed_out"] or result["truncated"]):
            process.wait(max(0.0, deadline - time.monotonic()))  # it closed its output, not yet exited
    except subprocess.TimeoutExpired:
        result["timed_out"] = True
    if result["timed_out"] or result["truncated"]:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            pass  # stuck in the kernel (a GPU off the bus): SIGKILL lands when it returns there
    out.close()
    err.close()
    result["exit"] = 124 if result["timed_out"] else process.returncode
    result["stdout"] = b"".join(kept[out_fd]).decode("utf-8", "replace")
    result["stderr"] = b"".join(kept[err_fd]).decode("utf-8", "replace")
    result["seconds"] = round(time.monotonic() - started, 3)
    return result


def _read(path: str) -> Dict[str, Any]:
    result: Dict[str, Any] = {"exit": 0, "stdout": "", "stderr": "", "missing": False, "timed_out": False}
    try:
        with open(path, "rb") as handle:
            result["stdout"] = handle.read(MAX_OUTPUT).decode("utf-8", "replace")
    except FileNotFoundError:
        result["missing"] = True
        result["exit"] = 1
    except OSError as exc:
        result["exit"] = 1
        result["stderr"] = str(exc)
    return result


def _read_tree(tree: Dict[str, Any]) -> Dict[str, Any]:
    """The `read` files of every directory `pattern` matches whose `where` files hold the values
    given, as JSON text: {"0000:c1:00.0": {"numa_node": "1", ...}}. No match is an empty object."""
    found: Dict[str, Dict[str, Optional[str]]] = {}
    for directory in sorted(glob.glob(tree["pattern"])):
        values: Dict[str, Optional[str]] = {}
        for name in list(tree.get("where", {})) + list(tree["read"]):
            try:
                with open(os.path.join(directory, name), "rb") as handle:
                    values[name] = handle.read(65536).decode("utf-8", "replace").strip()
            except OSError:
                values[name] = None
        if all(values.get(name) == value for name, value in tree.get("where", {}).items()):
            found[os.path.basename(directory)] = {name: values[name] for name in tree["read"]}
    return {"exit": 0, "stdout": json.dumps(found, sort_keys=True), "stderr": "", "missing": False,
            "timed_out": False}


def _timed(read: Any, what: Any) -> Dict[str, Any]:
    started = time.monotonic()
    result: Dict[str, Any] = read(what)
    result["seconds"] = round(time.monotonic() - started, 3)
    return result


def _space(path: str) -> Dict[str, Any]:
    """Free space where `path` is or would be created: the nearest existing ancestor's filesystem."""
    checked = os.path.abspath(path)
    while not os.path.exists(checked):
        checked = os.path.dirname(checked)
    stats = os.statvfs(checked)
    return {"checked": checked, "exists": checked == os.path.abspath(path),
            "free": stats.f_bavail * stats.f_frsize, "total": stats.f_blocks * stats.f_frsize}


def _inspect_file(path: str, max_content: int) -> Dict[str, Any]:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return {"exists": False}
    import grp
    import hashlib
    import pwd
    import stat
    state: Dict[str, Any] = {"exists": True, "is_dir": stat.S_ISDIR(info.st_mode),
                             "mode": stat.S_IMODE(info.st_mode), "uid": info.st_uid, "gid": info.st_gid}
    try:
        state["owner"] = pwd.getpwuid(info.st_uid).pw_name
    except KeyError:
        state["owner"] = str(info.st_uid)
    try:
        state["group"] = grp.getgrgid(info.st_gid).gr_name
    except KeyError:
        state["group"] = str(info.st_gid)
    if stat.S_ISREG(info.st_mode):
        # Hashed as it is read: a file grown huge by mistake costs time, never the probe's memory.
        digest, size = hashlib.sha256(), 0
        head: List[bytes] = []
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
                if size <= max_content:
                    head.append(block)
                size += len(block)
        state["sha256"] = digest.hexdigest()
        if size <= max_content:
            state["content"] = b"".join(head).decode("utf-8", "replace")
    return state


def _inspect_user(name: str, home_files: List[str]) -> Dict[str, Any]:
    """A user, and the small files named in `home_files` from its home (text, or None where absent)."""
    import pwd
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return {"exists": False}
    files: Dict[str, Optional[str]] = {}
    for relative in home_files:
        files[relative] = _read(os.path.join(entry.pw_dir, relative)).get("stdout") if os.path.isfile(
            os.path.join(entry.pw_dir, relative)) else None
    return {"exists": True, "uid": entry.pw_uid, "home": entry.pw_dir, "shell": entry.pw_shell,
            "home_files": files}


def _inspect_weights(root: str) -> Dict[str, Any]:
    """A model root: the commit `current` points at, its manifest, and each listed file's stat now:
    [size, mtime_ns, ctime_ns, inode]. Any change means the file must be verified again (nothing is
    hashed here); ctime is what an edit in place followed by `touch -r` cannot put back."""
    current = os.path.join(root, "current")
    # What broken transfers left, per commit: a resumed fetch needs that much less room.
    partial: Dict[str, Dict[str, int]] = {}
    for base, _, names in os.walk(os.path.join(root, ".partial")):
        for name in names:
            if name.endswith(".part"):
                path = os.path.join(base, name)
                commit, _, rel = os.path.relpath(path, os.path.join(root, ".partial")).partition(os.sep)
                try:
                    partial.setdefault(commit, {})[rel[:-len(".part")]] = os.path.getsize(path)
                except OSError:
                    pass
    try:
        commit = os.path.basename(os.readlink(current))
    except OSError:
        return {"current": None, "partial": partial}
    try:
        with open(os.path.join(current, ".provision-weights.json")) as handle:
            manifest = json.load(handle)
    except (OSError, ValueError):
        return {"current": commit, "files": {}, "stat": {}, "partial": partial}
    files = manifest.get("files") or {}
    stats: Dict[str, Optional[List[int]]] = {}
    for name in files:
        try:
            info = os.stat(os.path.join(current, name))
            stats[name] = [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]
        except OSError:
            stats[name] = None
    return {"current": commit if manifest.get("commit") == commit else None, "files": files, "stat": stats,
            "partial": partial}


MAX_MODEL_FILES = 10000  # a model directory holds tens of files; more is not a model (the answer says so)


def _gguf_model(sizes: Dict[str, int]) -> Optional[str]:
    """The one GGUF model among a directory's files (a split one by its first part,
    NAME-00001-of-0000N.gguf, which holds the header), None where there are none or several."""
    ggufs = sorted(name for name in sizes if name.endswith(".gguf"))
    models = [name for name in ggufs if "-00001-of-" in name] or ggufs
    return models[0] if len(models) == 1 else None


def _inspect_model(path: str) -> Dict[str, Any]:
    """A model the tool does not fetch (placed by hand). A directory: its config.json's text and every
    file's size, hidden entries (.cache, .git) left out, and where it holds one GGUF model, that file's
    header (`gguf_file`, `gguf`: host/gguf.py). A file (llama.cpp's GGUF): its size and header. Nothing
    else is read; symbolic links are followed (a hub cache's snapshot links its blobs)."""
    if os.path.isfile(path):
        try:
            size = os.stat(path).st_size
        except OSError as exc:
            return {"exists": True, "is_dir": False, "is_file": True, "error": str(exc)}
        return {"exists": True, "is_dir": False, "is_file": True, "size": size, "gguf": read_gguf(path)}
    if not os.path.isdir(path):
        return {"exists": os.path.exists(path), "is_dir": False}
    sizes: Dict[str, int] = {}
    truncated = False
    for base, dirs, names in os.walk(path):
        dirs[:] = sorted(name for name in dirs if not name.startswith("."))
        for name in sorted(names):
            if name.startswith("."):
                continue
            if len(sizes) >= MAX_MODEL_FILES:
                truncated = True
                break
            full = os.path.join(base, name)
            try:
                sizes[os.path.relpath(full, path)] = os.stat(full).st_size
            except OSError:
                pass  # a dangling link is no file of the model
        if truncated:
            break
    answer: Dict[str, Any] = {"exists": True, "is_dir": True, "sizes": sizes, "truncated": truncated,
                              "config": None}
    model = None if truncated else _gguf_model(sizes)
    if model is not None:
        answer["gguf_file"] = model
        answer["gguf"] = read_gguf(os.path.join(path, model))
    try:
        with open(os.path.join(path, "config.json"), "rb") as handle:
            answer["config"] = handle.read(MAX_OUTPUT).decode("utf-8", "replace")
    except OSError as exc:
        answer["config_error"] = "missing" if isinstance(exc, FileNotFoundError) else str(exc)
    return answer


def inspect(spec: Dict[str, Any]) -> Dict[str, Any]:
    """The state of the files, directories and users a plan manages (small files with their content),
    the names in the directories listed under "dirs", the model roots the tool fetches ("weights")
    and the model directories it does not ("models")."""
    limit = spec.get("max_content", 65536)
    return {"files": {path: _inspect_file(path, limit) for path in spec.get("files", [])},
            "dirs": {path: sorted(os.listdir(path)) if os.path.isdir(path) else None
                     for path in spec.get("dirs", [])},
            "users": {name: _inspect_user(name, spec.get("home_files", [])) for name in spec.get("users", [])},
            "weights": {root: _inspect_weights(root) for root in spec.get("weights", [])},
            "models": {path: _inspect_model(path) for path in spec.get("models", [])}}


def _get(url: str, headers: Dict[str, str], timeout: float) -> Dict[str, Any]:
    """GET over HTTP/1.0 with a plain socket: the answer ends when the server closes (no chunks),
    and importing urllib would cost more than the whole request."""
    import socket
    address, _, path = url.split("://", 1)[1].partition("/")
    host, _, port = address.rpartition(":")
    lines = [f"GET /{path} HTTP/1.0", f"Host: {address}"] + [f"{key}: {value}" for key, value in headers.items()]
    received: List[bytes] = []
    size = 0
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as sock:
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
            while size <= MAX_OUTPUT:
                data = sock.recv(65536)
                if not data:
                    break
                received.append(data)
                size += len(data)
    except (OSError, ValueError) as exc:  # refused, reset, timed out, no such name: "not answering"
        return {"status": None, "error": f"{type(exc).__name__}: {exc}"}
    head, _, body = b"".join(received).partition(b"\r\n\r\n")
    try:
        status = int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return {"status": None, "error": f"not an HTTP answer: {head[:80]!r}"}
    text = body[:MAX_OUTPUT if status == 200 else 2000].decode("utf-8", "replace")
    return {"status": status, "body": text}


def _metrics(base: str, spec: Dict[str, Any]) -> Dict[str, Any]:
    """The engine's metrics page (spec["metrics_path"], with the API key: llama.cpp asks for it), only
    the samples named in spec["keep"] (when given): the page is mostly histograms nobody reads here,
    and it crosses the network twice per host."""
    headers = {"Authorization": "Bearer " + spec["api_key"]} if spec.get("api_key") else {}
    answer = _get(base + spec.get("metrics_path", "/metrics"), headers, spec.get("timeout", 3))
    keep = spec.get("keep")
    if keep and answer.get("status") == 200:
        wanted = set(keep)
        answer["body"] = "\n".join(line for line in answer["body"].splitlines()
                                   if line.split("{", 1)[0].split(" ", 1)[0] in wanted)
    return answer


def serving_first(spec: Dict[str, Any]) -> Dict[str, Any]:
    """The server's own view, first part: /health, /v1/models (with the API key), /metrics."""
    import time
    base, timeout = spec["base"].rstrip("/"), spec.get("timeout", 3)
    headers = {"Authorization": "Bearer " + spec["api_key"]} if spec.get("api_key") else {}
    answer: Dict[str, Any] = {"health": _get(base + "/health", {}, timeout)}
    if answer["health"].get("status") is None:
        return answer
    answer["models"] = _get(base + "/v1/models", headers, timeout)
    answer["started"] = time.time()
    answer["metrics"] = [_metrics(base, spec)]
    return answer


def serving_second(spec: Dict[str, Any], answer: Dict[str, Any]) -> Dict[str, Any]:
    """/metrics again `window` seconds after the first, so the controller can turn counters into rates;
    `sampled_at`: when each was read, on the host's clock (the stuck rule compares samples of several
    executions)."""
    import time
    started = answer.pop("started", None)
    if started is None:
        return answer
    pause = spec.get("window", 1.0) - (time.time() - started)
    if pause > 0:
        time.sleep(pause)
    answer["metrics"].append(_metrics(spec["base"].rstrip("/"), spec))
    answer["window"] = time.time() - started
    answer["sampled_at"] = [started, started + answer["window"]]
    return answer


def _identity(patterns: List[str]) -> List[List[Any]]:
    """[path, size, mtime_ns, ctime_ns, inode] of every path the patterns match (stat follows links),
    [pattern] where one matches nothing: a file that appears changes the identity as one that goes."""
    found: List[List[Any]] = []
    for pattern in patterns:
        paths = sorted(glob.glob(pattern))
        if not paths:
            found.append([pattern])
        for path in paths:
            try:
                info = os.stat(path)
            except OSError:
                found.append([path])
                continue
            found.append([path, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino])
    return found


def _contents(paths: List[str]) -> List[List[Any]]:
    """[path, its first 4 KiB as text] of each small file (None where it cannot be read)."""
    found: List[List[Any]] = []
    for path in paths:
        try:
            with open(path, "rb") as handle:
                found.append([path, handle.read(4096).decode("utf-8", "replace")])
        except OSError:
            found.append([path, None])
    return found


def _program(argv: List[str]) -> str:
    """The file a command runs: its argv[0] as PATH resolves it (an upgraded tool is a changed one).
    Looked up here rather than with shutil.which: importing shutil costs more than the lookup."""
    if "/" in argv[0]:
        return argv[0]
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", argv[0])
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return argv[0]


def _load_cache(path: str) -> Dict[str, Any]:
    try:
        with open(path) as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save_cache(path: str, entries: Dict[str, Any]) -> Optional[str]:
    """Write the cache atomically, readable by its owner alone; why not, or None."""
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        write_atomically(path, json.dumps(entries).encode(), 0o600, os.getuid(), os.getgid())
    except OSError as exc:
        return str(exc)
    return None


KEPT = ("exit", "stdout", "stderr", "missing")  # what a cached answer holds of the command's result
# Entries kept per fact, those this run asked for first, then the most recently stored: a host's
# services each ask the venv fact of their own venv (and the unit scores of their own units), a
# handful per host. A count, not an age: an entry a venv still in use has not rewritten for months
# is as good as a new one (an age would cost it an `import torch` again), and the file stays bounded
# however many venvs come and go.
MAX_SLOTS = 8


def _slot(name: str, argv: List[str], identity: List[str], keyed_by: List[str]) -> str:
    """The cache entry a command's answer is kept in: its fact's name and a digest of what it asks
    (its argv, its identity patterns, the files it is keyed by), "venv 3f0c9a1e52b7d4a6". The name
    alone is not enough: one probe per venv asks a fact named "venv" of each, and with one entry per
    name each probe replaced the other's answer on every run. The digest only picks the entry; the
    key stored in it still decides whether the answer holds."""
    asked = json.dumps([argv, identity, keyed_by]).encode()
    return name + " " + hashlib.sha256(asked).hexdigest()[:16]


def _bounded(cache: Dict[str, Any], asked: Set[str]) -> Dict[str, Any]:
    """The entries worth writing back: per fact, those asked for in this run and then the most
    recently stored others, MAX_SLOTS in all. An entry of the old form (named after its fact alone,
    no "fact" in it) is never read again: it goes."""
    by_fact: Dict[str, List[Tuple[bool, float, str]]] = {}
    for slot, entry in cache.items():
        if not (isinstance(entry, dict) and isinstance(entry.get("fact"), str)):
            continue
        stored = entry.get("stored")
        by_fact.setdefault(entry["fact"], []).append(
            (slot in asked, stored if isinstance(stored, (int, float)) else 0.0, slot))
    kept: Set[str] = set()
    for slots in by_fact.values():
        kept.update(slot for _, _, slot in sorted(slots, reverse=True)[:MAX_SLOTS])
    return {slot: entry for slot, entry in cache.items() if slot in kept}


def _key(argv: List[str], identity: List[str], keyed_by: List[str]) -> Dict[str, Any]:
    """What a kept answer must match: the command, its files' identity (its program's included) and
    the content of the small files it is keyed by."""
    key: Dict[str, Any] = {"argv": argv, "identity": _identity(identity + [_program(argv)])}
    if keyed_by:
        key["contents"] = _contents(keyed_by)
    return key


def _run_all(commands: Dict[str, List[str]], identities: Dict[str, List[str]], cache_file: Optional[str],
             timeout: float, keyed_by: Optional[Dict[str, List[str]]] = None
             ) -> Tuple[Dict[str, Dict[str, Any]], Dict[str, Any]]:
    """Every command's answer (those whose key still holds from the cache) and what became of the
    cache: {"file", "written", "error"}."""
    keyed_by = keyed_by or {}
    if not any(name in identities or name in keyed_by for name in commands):
        cache_file = None  # nothing asked could be answered from it: not even read
    cache = _load_cache(cache_file) if cache_file else {}
    results: Dict[str, Dict[str, Any]] = {}
    keys: Dict[str, Dict[str, Any]] = {}
    slots: Dict[str, str] = {}
    threads: List[threading.Thread] = []
    for name, argv in commands.items():
        if cache_file and (name in identities or name in keyed_by):
            keys[name] = _key(argv, identities.get(name, []), keyed_by.get(name, []))
            slots[name] = _slot(name, argv, identities.get(name, []), keyed_by.get(name, []))
            held = cache.get(slots[name])
            if isinstance(held, dict) and held.get("key") == keys[name]:
                results[name] = dict(held["result"], timed_out=False, truncated=False, seconds=0.0,
                                     cached=True)
                continue

        def work(name: str = name, argv: List[str] = argv) -> None:
            results[name] = _run(argv, timeout)

        thread = threading.Thread(target=work)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    stored = time.time()
    kept = {slots[name]: {"fact": name, "stored": stored, "key": key,
                          "result": {field: results[name][field] for field in KEPT}}
            for name, key in keys.items()
            if not (results[name].get("cached") or results[name]["timed_out"] or results[name]["truncated"])}
    state: Dict[str, Any] = {"file": cache_file, "written": False, "error": None}
    if kept and cache_file:
        cache.update(kept)
        state["error"] = _save_cache(cache_file, _bounded(cache, set(slots.values())))
        state["written"] = state["error"] is None
    return results, state


def _reach(endpoint: str, timeout: float) -> Optional[str]:
    """None where a TCP connection to HOST:PORT opens within `timeout`, else why not."""
    import socket
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return None
    except (OSError, ValueError) as exc:  # no such name, refused, unreachable, timed out
        return f"{type(exc).__name__}: {exc}"


def collect(spec: Dict[str, Any]) -> Dict[str, Any]:
    began = time.monotonic()
    timeout = spec.get("timeout", 20)
    # The host's own clock as nvidia-smi writes its `timestamp` column (local time): a reading whose
    # timestamp is far older than this was not measured by this probe (facts.recorded_at).
    clock = time.strftime("%Y/%m/%d %H:%M:%S")
    # The server's two /metrics samples are a window apart: everything else is done meanwhile.
    served = serving_first(spec["serving"]) if spec.get("serving") else None
    results, cache = _run_all(spec.get("commands", {}), spec.get("identity", {}), spec.get("cache_file"), timeout,
                              spec.get("keyed_by", {}))
    for name, path in spec.get("files", {}).items():
        results[name] = _timed(_read, path)
    for name, tree in spec.get("trees", {}).items():
        results[name] = _timed(_read_tree, tree)
    answer: Dict[str, Any] = {
        "python": ".".join(str(part) for part in sys.version_info[:3]),
        # The machine this interpreter runs on, from the kernel itself (not an `uname` found on PATH):
        # the venvs made from it run wheels of this architecture.
        "machine": os.uname().machine,  # what platform.machine() answers, without importing platform
        "clock": clock,
        "results": results,
        "cache": cache,
        "paths": {path: _space(path) for path in spec.get("paths", [])},
        "inspect": inspect(spec.get("inspect", {})),
        "serving": None,
    }
    if served is not None:
        answer["serving"] = serving_second(spec["serving"], served)
    if spec.get("reach"):
        answer["reach"] = {endpoint: _reach(endpoint, spec.get("reach_timeout", 3)) for endpoint in spec["reach"]}
    answer["seconds"] = round(time.monotonic() - began, 3)
    return answer


def main(spec: Dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(collect(spec)))
    sys.stdout.write("\n")
