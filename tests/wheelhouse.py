"""Wheels of installed distributions, so that a test can `pip install --no-index --find-links` a
package and let pip resolve its declared dependencies with no index and no network.

An installed distribution keeps what its wheel held: the files its RECORD lists and, in its
.dist-info, the WHEEL file with the wheel's tags. `repack` zips those back into a wheel (a fresh
RECORD with each file's hash; the installer's own INSTALLER, REQUESTED and direct_url.json left
out; scripts and data outside site-packages left out, since pip writes console scripts again from
entry_points.txt). `wheelhouse` does that for a set of requirements and everything they need, as
this interpreter has them installed.
"""
from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

_INSTALLER_FILES = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}


def _tag(wheel_text: str) -> str:
    """The wheel's compressed tag set from its WHEEL file's Tag lines (py3-none-any, or e.g.
    cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64), as its file name had it."""
    tags = [line.split(":", 1)[1].strip() for line in wheel_text.splitlines() if line.startswith("Tag:")]
    if not tags:
        raise ValueError("WHEEL names no Tag")
    parts = [list(dict.fromkeys(tag.split("-")[index] for tag in tags)) for index in range(3)]
    return "-".join(".".join(values) for values in parts)


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def repack(dist: metadata.Distribution, target: Path) -> Path:
    """One installed distribution as a wheel in `target`."""
    wheel_text = dist.read_text("WHEEL")
    if wheel_text is None:
        raise ValueError(f"{dist.metadata['Name']} was not installed from a wheel (no WHEEL file)")
    name = canonicalize_name(dist.metadata["Name"]).replace("-", "_")
    path = target / f"{name}-{dist.version}-{_tag(wheel_text)}.whl"
    record: list[str] = []
    dist_info = ""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        for entry in dist.files or ():
            relative = entry.as_posix()
            parts = relative.split("/")
            if relative.startswith("..") or "__pycache__" in parts or relative.endswith(".pyc"):
                continue
            if parts[0].endswith(".dist-info"):
                dist_info = parts[0]
                if len(parts) == 2 and parts[1] in _INSTALLER_FILES:
                    continue
            data = Path(str(dist.locate_file(entry))).read_bytes()
            archive.writestr(relative, data)
            record.append(f"{relative},{_digest(data)},{len(data)}")
        if not dist_info:
            raise ValueError(f"{dist.metadata['Name']}: its RECORD lists no .dist-info")
        record.append(f"{dist_info}/RECORD,,")
        archive.writestr(f"{dist_info}/RECORD", "\n".join(record) + "\n")
    return path


def wheelhouse(requirements: Iterable[str], target: Path) -> list[Path]:
    """Wheels of `requirements` and of everything they require (no extras), as installed here."""
    target.mkdir(parents=True, exist_ok=True)
    todo = [Requirement(text) for text in requirements]
    seen: dict[str, metadata.Distribution] = {}
    while todo:
        requirement = todo.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        key = canonicalize_name(requirement.name)
        if key in seen:
            continue
        dist = metadata.distribution(requirement.name)
        if not requirement.specifier.contains(dist.version, prereleases=True):
            raise ValueError(f"installed {requirement.name} {dist.version} does not meet {requirement}")
        seen[key] = dist
        todo.extend(Requirement(text) for text in dist.requires or ())
    return [repack(dist, target) for _, dist in sorted(seen.items())]
