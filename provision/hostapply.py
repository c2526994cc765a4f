"""Applies a plan ON the host: sent as source on stdin to `python3 -`, like the fact probe.

Standard library only, python3 >= 3.6. The controller appends `main(SPEC_JSON)`:

    {"action": "apply" | "rollback", "lock": "/run/lock/provision.lock", "wait": 0,
     "keep": "/var/lib/provision/last-good", "changes": [{"kind", "target", "data"}, ...]}

It holds an exclusive lock for the whole run, so two runs on one host cannot interleave (the second
fails at once naming the holder, or waits up to `wait` seconds). Files are written to a temporary file
in the same directory with owner and mode set, fsynced and renamed over the old one, whose content is
first kept under `keep` as the last-known-good version. It prints one JSON document:
{"ok": bool, "done": [...], "failed": {"index", "kind", "target", "error"} | null, "restored": [...]}.
"""
import errno
import fcntl
import grp
import json
import os
import pwd
import shutil
import subprocess
import sys
import time

UNIT_DIR = "/etc/systemd/system/"


class StepFailed(Exception):
    pass


def _run(argv):
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=dict(os.environ, LC_ALL="C", LANG="C"))
    if done.returncode != 0:
        message = (done.stderr or done.stdout).decode("utf-8", "replace").strip().splitlines()
        raise StepFailed("%s: exit %d: %s" % (" ".join(argv), done.returncode, " | ".join(message[-3:])))
    return done.stdout.decode("utf-8", "replace")


def _ids(owner, group):
    return pwd.getpwnam(owner).pw_uid, grp.getgrnam(group).gr_gid


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path, data, mode, uid, gid):
    directory = os.path.dirname(path)
    temporary = os.path.join(directory, ".%s.provision-tmp" % os.path.basename(path))
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(temporary, path)
    _fsync_dir(directory)


def keep_last_good(path, keep):
    """Copy the current version aside before it is replaced (owner and mode kept)."""
    if not os.path.isfile(path):
        return
    target = os.path.join(keep, path.lstrip("/"))
    os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
    with open(path, "rb") as handle:
        data = handle.read()
    info = os.stat(path)
    write_atomically(target, data, info.st_mode & 0o7777, info.st_uid, info.st_gid)


def _sha256(path):
    import hashlib
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


VERSIONS = """
import importlib, json, sys
found = {}
for name in sys.argv[1:]:
    module = importlib.import_module(name)
    found[name] = getattr(module, "__version__", "unknown")
    if name == "torch":
        found["torch_cuda"] = module.version.cuda
        found["torch_arch_list"] = module.cuda.get_arch_list() if module.version.cuda else []
print(json.dumps(found))
"""


def verify_imports(venv, modules):
    """The new venv must import what it is for (vLLM, torch): a venv that cannot is not kept."""
    if not modules:
        return {}
    done = subprocess.run([os.path.join(venv, "bin", "python"), "-c", VERSIONS] + list(modules),
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=dict(os.environ, LC_ALL="C", LANG="C"))
    if done.returncode != 0:
        lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise StepFailed("the new venv cannot import %s: %s" % (", ".join(modules), " | ".join(lines[-2:])))
    return json.loads(done.stdout.decode("utf-8", "replace").strip().splitlines()[-1])


def build_venv(data):
    """Verify the pushed wheels, then build the venv from them with no index; the old one is kept
    as VENV.last-good and comes back if anything fails."""
    wheelhouse, venv = data["wheelhouse"], data["venv"]
    index_path = os.path.join(wheelhouse, "MANIFEST.json")
    try:
        with open(index_path) as handle:
            verified = json.load(handle)
    except (OSError, ValueError):
        verified = {}
    for name, digest in sorted(data["wheels"].items()):
        path = os.path.join(wheelhouse, name)
        if verified.get(name) == digest and os.path.isfile(path):
            continue
        if not os.path.isfile(path):
            raise StepFailed("wheel %s was not pushed" % name)
        found = _sha256(path)
        if found != digest:
            os.rename(path, path + ".bad")
            raise StepFailed("wheel %s: sha256 %s, expected %s (set aside as .bad)" % (name, found[:12], digest[:12]))
        verified[name] = digest
    write_atomically(index_path, json.dumps(verified, indent=1, sort_keys=True).encode(), 0o644, 0, 0)
    last = venv + ".last-good"
    if os.path.isdir(venv):
        shutil.rmtree(last, ignore_errors=True)
        os.rename(venv, last)
    try:
        _run([sys.executable, "-m", "venv", venv])
        _run([os.path.join(venv, "bin", "pip"), "install", "--no-index", "--find-links", wheelhouse,
              "--no-cache-dir", "--disable-pip-version-check", "--quiet"] + data["requirements"])
        if data.get("remove"):
            _run([os.path.join(venv, "bin", "pip"), "uninstall", "--yes", "--quiet"] + data["remove"])
        versions = verify_imports(venv, data.get("verify", []))
        manifest = {"key": data["key"], "requirements": data["requirements"], "wheels": data["wheels"],
                    "removed": data.get("remove", []), "versions": versions}
        if data.get("fact_probe"):
            # The probe answers the venv fact from here while the venv stays as built (no import).
            manifest["fact_output"] = _run([os.path.join(venv, "bin", "python"), "-c", data["fact_probe"]])
        write_atomically(os.path.join(venv, "provision-manifest.json"),
                         json.dumps(manifest, indent=1).encode(), 0o644, 0, 0)
    except BaseException:
        shutil.rmtree(venv, ignore_errors=True)
        if os.path.isdir(last):
            os.rename(last, venv)
        raise


def step(change, keep):
    kind, target, data = change["kind"], change["target"], change.get("data", {})
    if kind == "user":
        _run(["useradd", "--system", "--user-group", "--home-dir", data["home"], "--no-create-home",
              "--shell", "/usr/sbin/nologin", target])
    elif kind == "directory":
        os.makedirs(target, mode=data["mode"], exist_ok=True)
        uid, gid = _ids(data["owner"], data["group"])
        os.chown(target, uid, gid)
        os.chmod(target, data["mode"])
    elif kind == "file":
        uid, gid = _ids(data["owner"], data["group"])
        os.makedirs(os.path.dirname(target), exist_ok=True)
        keep_last_good(target, keep)
        write_atomically(target, data["content"].encode("utf-8"), data["mode"], uid, gid)
    elif kind == "venv":
        build_venv(data)
    elif kind == "daemon-reload":
        _run(["systemctl", "daemon-reload"])
    elif kind == "enable":
        _run(["systemctl", "enable", target])
    elif kind == "start":
        subprocess.run(["systemctl", "reset-failed", target], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)  # a unit stopped by its start limit must start again
        _run(["systemctl", "start", target])
    elif kind == "restart":
        subprocess.run(["systemctl", "reset-failed", target], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)  # a crash loop's start limit must not refuse it
        _run(["systemctl", "restart", target])
    elif kind == "stop":
        _run(["systemctl", "disable", "--now", target])
    else:
        raise StepFailed("unknown change kind %r" % kind)


def swap_venv(venv):
    """The venv kept as VENV.last-good and the current one change places."""
    last = venv + ".last-good"
    if not os.path.isdir(last):
        return False
    aside = venv + ".rollback-tmp"
    shutil.rmtree(aside, ignore_errors=True)
    if os.path.isdir(venv):
        os.rename(venv, aside)
    os.rename(last, venv)
    if os.path.isdir(aside):
        os.rename(aside, last)
    return True


def swap_model(root):
    """The model's `current` and `previous` revision links change places."""
    current, previous = os.path.join(root, "current"), os.path.join(root, "previous")
    if not (os.path.islink(current) and os.path.islink(previous)):
        return False
    now, before = os.readlink(current), os.readlink(previous)
    for name, target in (("current", before), ("previous", now)):
        temporary = os.path.join(root, ".%s.tmp" % name)
        if os.path.lexists(temporary):
            os.remove(temporary)
        os.symlink(target, temporary)
        os.rename(temporary, os.path.join(root, name))
    return True


def rollback(keep, venvs=(), models=(), only=None):
    """Swap every kept file (or only those named) with the current one, the kept venv and model
    revision too; reload systemd and restart the running units."""
    restored = [venv for venv in venvs if swap_venv(venv)] + [root for root in models if swap_model(root)]
    for root, _, names in os.walk(keep):
        for name in names:
            kept = os.path.join(root, name)
            path = "/" + os.path.relpath(kept, keep)
            if only is not None and path not in only:
                continue
            with open(kept, "rb") as handle:
                data = handle.read()
            info = os.stat(kept)
            current = None
            if os.path.isfile(path):
                with open(path, "rb") as handle:
                    current = handle.read()
                current_info = os.stat(path)
            write_atomically(path, data, info.st_mode & 0o7777, info.st_uid, info.st_gid)
            if current is not None:
                write_atomically(kept, current, current_info.st_mode & 0o7777, current_info.st_uid,
                                 current_info.st_gid)
            restored.append(path)
    if any(path.startswith(UNIT_DIR) for path in restored):
        _run(["systemctl", "daemon-reload"])
    units = sorted(os.path.basename(path) for path in restored if path.startswith(UNIT_DIR))
    if any(not path.startswith(UNIT_DIR) for path in restored):  # environment, venv, model: every unit
        units = sorted(set(units) | {name for name in os.listdir(UNIT_DIR) if name.startswith("vllm")})
    for unit in units:
        active = subprocess.run(["systemctl", "is-active", "--quiet", unit]).returncode == 0
        if active:
            _run(["systemctl", "restart", unit])
    return sorted(restored)


def lock(path, wait):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.time() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            if time.time() >= deadline:
                holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another run"
                raise StepFailed("another provision holds %s (%s)" % (path, holder))
            time.sleep(0.2)
    os.ftruncate(fd, 0)
    os.pwrite(fd, ("pid %d since %s" % (os.getpid(), time.strftime("%Y-%m-%d %H:%M:%S"))).encode(), 0)
    return fd


def main(spec):
    result = {"ok": True, "done": [], "failed": None, "restored": []}
    try:
        lock(spec["lock"], spec.get("wait", 0))
    except StepFailed as exc:
        result.update(ok=False, failed={"index": -1, "kind": "lock", "target": spec["lock"], "error": str(exc)})
        sys.stdout.write(json.dumps(result) + "\n")
        return
    try:
        if spec["action"] == "rollback":
            result["restored"] = rollback(spec["keep"], spec.get("venvs", ()), spec.get("models", ()),
                                          spec.get("only"))
        for index, change in enumerate(spec.get("changes", [])):
            step(change, spec["keep"])
            result["done"].append(index)
    except (StepFailed, OSError, KeyError) as exc:
        index = len(result["done"])
        change = (spec.get("changes") or [{}])[index] if index < len(spec.get("changes", [])) else {}
        result.update(ok=False, failed={"index": index, "kind": change.get("kind", spec["action"]),
                                        "target": change.get("target", ""), "error": str(exc)})
    sys.stdout.write(json.dumps(result) + "\n")
