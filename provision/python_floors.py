"""The Pythons an engine's release and its stack install on, where narrower than the rest: vLLM 0.32+,
SGLang 0.5.22+, torch 2.15 and Triton 3.9 require Python >= 3.11 (their Requires-Python), and SGLang
0.5.23 ships wheels for CPython 3.11 to 3.13 only. Kept as data in python_floors.yaml, each row with its
source; pure but for reading that file.

    refusals({"vllm": "0.34.0"}, "3.10.12")   # -> (Floor(package='vllm', python=<SpecifierSet('<3.15,>=3.11')>, ...),)
    refusals({"sglang": "0.5.23"}, "3.14.0")  # -> (Floor(... says='wheels for CPython 3.11 to 3.13 only ...'),)
    refusals({"vllm": "0.31.0"}, "3.10.12")   # -> ()
"""
from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from provision import datafiles

DATA = "python_floors.yaml"
KEYS = ("package", "versions", "python", "says", "source", "verified")


@dataclass(frozen=True)
class Floor:
    package: str  # canonical: 'vllm'
    versions: SpecifierSet
    python: SpecifierSet  # the Pythons those releases install on
    says: str  # 'Requires-Python: <3.15,>=3.11'
    source: str
    verified: str


@functools.cache
def load() -> tuple[Floor, ...]:
    return tuple(Floor(package=canonicalize_name(row["package"]), versions=SpecifierSet(row["versions"]),
                       python=SpecifierSet(row["python"]), says=row["says"], source=row["source"],
                       verified=" ".join(row["verified"].split()))
                 for row in datafiles.text_rows(DATA, "floors", KEYS, "floor"))


def refusals(releases: Mapping[str, str], python: str) -> tuple[tuple[str, str, Floor], ...]:
    """(package, release, row) for each release of `releases` ({distribution: version}, any spelling)
    that a row says does not install on `python` ('3.10.12'); () where every one does or none is known."""
    try:
        interpreter = Version(python)
    except InvalidVersion:
        return ()
    found = []
    for name, release in releases.items():
        try:
            version = Version(release)
        except InvalidVersion:
            continue
        for floor in load():
            if (floor.package == canonicalize_name(name) and floor.versions.contains(version, prereleases=True)
                    and not floor.python.contains(interpreter, prereleases=True)):
                found.append((floor.package, release, floor))
    return tuple(found)
