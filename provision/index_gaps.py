"""Engine releases PyPI alone cannot install: an exact pin of theirs names a release PyPI never carried
(vLLM 0.34.0 pins flashinfer-python==0.7.3; PyPI has 0.7.2.post1, then 0.7.4). Kept as data in
index_gaps.yaml, each row with its source; pure but for reading that file.

    gaps("vllm", "0.34.0", indexes=())                       # -> (Gap(requires='flashinfer-python==0.7.3', ...),)
    gaps("vllm", "0.34.0", indexes=("https://flashinfer.ai/whl",))   # -> ()  (the index carries it)
    left_out("vllm", indexes=())                              # -> ('0.34.0',)

`indexes` are the host's pip_index_url and pip_extra_index_urls; a gap is closed by its own index among
them (compared without a trailing slash).
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from provision import datafiles

DATA = "index_gaps.yaml"
KEYS = ("engine", "versions", "requires", "pypi", "index", "instead", "source", "verified")


@dataclass(frozen=True)
class Gap:
    engine: str
    versions: SpecifierSet
    requires: str  # 'flashinfer-python==0.7.3'
    pypi: str  # what PyPI carries around it
    index: str  # an index that carries it
    instead: str  # the newest release before it that installs from PyPI alone
    source: str
    verified: str

    def releases(self) -> tuple[str, ...]:
        """The exact releases the row names ('==0.34.0' -> ('0.34.0',)); ranges name none."""
        return tuple(spec.version for spec in self.versions if spec.operator == "==" and "*" not in spec.version)


@functools.cache
def load() -> tuple[Gap, ...]:
    return tuple(Gap(engine=row["engine"], versions=SpecifierSet(row["versions"]), requires=row["requires"],
                     pypi=" ".join(row["pypi"].split()), index=row["index"], instead=row["instead"],
                     source=row["source"], verified=" ".join(row["verified"].split()))
                 for row in datafiles.text_rows(DATA, "gaps", KEYS, "gap"))


def _closed(gap: Gap, indexes: Sequence[str]) -> bool:
    return gap.index.rstrip("/") in {url.rstrip("/") for url in indexes}


def gaps(engine: str, release: str, indexes: Sequence[str]) -> tuple[Gap, ...]:
    """The gaps that keep `release` of the engine from installing with these indexes."""
    try:
        version = Version(release)
    except InvalidVersion:
        return ()
    if version.local is not None:  # a build of its own ("0.34.0+lab.a6d9c49d"), never PyPI's: its pins are its own
        return ()
    return tuple(gap for gap in load() if gap.engine == engine and gap.versions.contains(version, prereleases=True)
                 and not _closed(gap, indexes))


def left_out(engine: str, indexes: Sequence[str]) -> tuple[str, ...]:
    """The releases an engine requirement without an exact pin must leave out to install with these
    indexes ('vllm' -> 'vllm!=0.34.0')."""
    return tuple(sorted({release for gap in load() if gap.engine == engine and not _closed(gap, indexes)
                         for release in gap.releases()}, key=Version))
