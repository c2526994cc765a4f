"""How a distribution that is not Ubuntu gets the NVIDIA driver with its open kernel modules: NVIDIA's own
repository, as NVIDIA's driver installation guide gives it per release (Debian 12 and 13), the fix of the
gate's driver rules where the distribution's own packages lag. Kept as data in driver_installs.yaml, each
row with its source; pure but for reading that file.

    steps_for("debian", "12")  # -> ('enable ... repository for debian12 ... then apt install nvidia-open', 'https://...debian.html')
    steps_for("debian", "11")  # -> None: the guide gives no steps for it
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from provision import datafiles

DATA = "driver_installs.yaml"
KEYS = ("distribution", "releases", "steps", "source", "verified")
GUIDE = "https://docs.nvidia.com/datacenter/tesla/driver-installation-guide/"


@dataclass(frozen=True)
class Install:
    distribution: str  # os-release ID: 'debian'
    releases: tuple[str, ...]  # VERSION_IDs: ('12', '13')
    steps: str  # with {repo}: the release as NVIDIA's repository names its folder
    source: str
    verified: str


@functools.cache
def load() -> tuple[Install, ...]:
    return tuple(Install(distribution=row["distribution"], releases=tuple(row["releases"].split()),
                         steps=" ".join(row["steps"].split()), source=row["source"],
                         verified=" ".join(row["verified"].split()))
                 for row in datafiles.text_rows(DATA, "installs", KEYS, "install"))


def steps_for(distribution: str, release: str) -> tuple[str, str] | None:
    """(steps, source) for os-release ID `distribution` at VERSION_ID `release`; None where no row has it."""
    for install in load():
        if install.distribution == distribution and release in install.releases:
            return install.steps.format(repo=f"{distribution}{release.replace('.', '')}"), install.source
    return None
