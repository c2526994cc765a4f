"""Published benchmark profiles shipped with the tool, each byte for byte as its source publishes it;
sources.json beside them records where each was read (repository, path, full commit) and the sha256 of
its bytes. `invoke bench --profile NAME` finds them by file name and names that commit.

The ground floor: standard library only, so the tasks' help can name each profile's commit without
loading the profile reader (provision.benchprofile judges the records and the files against them)."""
from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

SOURCES = "sources.json"


def sources() -> Any:
    """sources.json as written: {FILE: {repository, path, commit, sha256}}."""
    return json.loads((resources.files(__name__) / SOURCES).read_text(encoding="utf-8"))


def where(record: Mapping[str, str]) -> str:
    """Where a shipped profile was read, in words: 'OWNER/REPO PATH at commit SHA'."""
    return f"{record['repository']} {record['path']} at commit {record['commit']}"


def listed() -> str:
    """Each shipped profile by name with where it was read (the bench task's help for --profile)."""
    try:
        return "; ".join(f"{file.removesuffix('.yaml')} (read from {where(record)})"
                         for file, record in sorted(sources().items()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        # The help still answers; `bench --profile NAME` refuses the same file with the reason.
        return f"their sources cannot be read ({type(exc).__name__}: {exc})"
