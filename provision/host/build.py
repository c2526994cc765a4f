"""Builds a wheel from source ON a build host. Sent on stdin to `python3 -`; standard library only.
The controller appends `build_main(SPEC_JSON)`:

    {"tarball": "/var/cache/provision/build/KEY.tar.gz", "workdir": "/var/cache/provision/build/KEY",
     "wheelhouse": "/var/cache/provision/wheels", "requires": ["setuptools>=61", ...],
     "env": {"TORCH_CUDA_ARCH_LIST": "12.0", "MAX_JOBS": "8"}}

The build tools come from the pushed wheelhouse into a build venv (no index: air-gapped hosts build
too); the build runs without isolation so it sees them. Output: JSON lines, {"event": "log", "line"}
while the compiler works and one {"event": "result", "ok", "wheel", "sha256", "size", "error"}.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Mapping
from typing import Any

from provision.host.common import emit, sha256_of

# Lines that say why a build failed, wherever they fall in its output: pip closes a failed build with
# "This error originates from a subprocess, and is likely not a problem with pip" and three more lines
# that say nothing (on the H200 host the cause, a cmake that could not execute, was 60 lines above).
TELLING = re.compile(r"CMake Error|\berror\b:|\bfatal\b|Error: |Error\b.*\[Errno|No such file|"
                     r"not found|Permission denied|nvcc fatal|FAILED:|Killed|No space left")
QUIET = ("error: subprocess-exited-with-error", "ERROR: Failed building wheel", "ERROR: Failed to build")


def telling(lines: list[str], keep: int = 3) -> list[str]:
    """Pure: a failed step's output lines -> the first `keep` that say why (pip's own closing words left
    out), else its last lines."""
    found = [line.strip() for line in lines if TELLING.search(line) and not any(q in line for q in QUIET)]
    return [line[:300] for line in found[:keep] or [line.strip() for line in lines[-4:]]]


def _run(step: str, argv: list[str], env: Mapping[str, str] | None = None) -> None:
    """Run a step, streaming its output as log events; the lines that say why it failed are kept."""
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, env=env)
    lines: list[str] = []
    assert process.stdout is not None  # asked for as a pipe
    for raw in process.stdout:
        line = raw.decode("utf-8", "replace").rstrip()
        lines.append(line)
        del lines[:-400]
        emit("log", line=line)
    if process.wait() != 0:
        raise RuntimeError(f"{step} failed (exit {process.returncode}): {' | '.join(telling(lines))}")


def build(spec: dict[str, Any]) -> dict[str, Any]:
    workdir = spec["workdir"]
    shutil.rmtree(workdir, ignore_errors=True)
    source, out = os.path.join(workdir, "src"), os.path.join(workdir, "out")
    os.makedirs(source)
    os.makedirs(out)
    with tarfile.open(spec["tarball"]) as archive:
        for member in archive.getmembers():  # refuse paths that would leave the source directory
            if (member.name.startswith("/") or ".." in member.name.split("/") or member.issym()
                    or member.islnk()):
                raise RuntimeError(f"unsafe path in the source archive: {member.name}")
        archive.extractall(source)
    venv = os.path.join(workdir, "venv")
    _run("creating the build venv", [sys.executable, "-m", "venv", venv])
    pip = [os.path.join(venv, "bin", "python"), "-m", "pip"]
    quiet = ["--no-index", "--find-links", spec["wheelhouse"], "--disable-pip-version-check"]
    _run("installing the build requirements", pip + ["install"] + quiet + list(spec["requires"]))
    env = dict(os.environ, **spec.get("env", {}))
    env["PATH"] = os.path.join(venv, "bin") + os.pathsep + env.get("PATH", "")
    _run("building the wheel",
         pip + ["wheel"] + quiet + ["--no-build-isolation", "--no-deps", "--wheel-dir", out, source], env=env)
    wheels = [name for name in os.listdir(out) if name.endswith(".whl")]
    if len(wheels) != 1:
        raise RuntimeError(f"the build made {len(wheels)} wheels in {out}, expected one")
    path = os.path.join(out, wheels[0])
    return {"wheel": path, "sha256": sha256_of(path), "size": os.path.getsize(path)}


def build_main(spec: dict[str, Any]) -> None:
    result: dict[str, Any] = {"ok": True, "error": None}
    try:
        result.update(build(spec))
    except (RuntimeError, OSError, tarfile.TarError) as exc:
        result.update(ok=False, error=str(exc))
    emit("result", **result)
