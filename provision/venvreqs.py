"""An installed engine's own requirements, judged against the venv it sits in. Pure.

pip holds a wheel to its METADATA's Requires-Dist lines only when it resolves them: `pip install
--no-deps`, a torch upgraded on its own or a venv put together by hand can hold vLLM 0.33.0 (which
declares torch==2.14.0) beside torch 2.13.0; that installs, and fails at import. The venv fact reads
each engine distribution's Requires-Dist lines, the installed versions of what they name and the venv
python's marker environment (parsers.VenvInfo); `unmet` judges them the way `pip check` does, with
packaging's own Requirement, SpecifierSet and Marker:

  * a requirement whose marker is false in the venv's environment, `extra` "" (no extra asked for),
    is not the venv's (`llguidance ...; platform_machine == "x86_64" or ...` on an s390x host);
  * the installed version must be inside the specifier, prereleases allowed (an installed 1.3.0rc5 is
    judged as itself); a local version (2.14.0+cu130) satisfies ==2.14.0, as PEP 440 says;
  * a requirement's own extras (`fastapi[standard]`) are not followed: what an extra brings is in the
    required distribution's METADATA, which the probe does not read.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from packaging.markers import UndefinedEnvironmentName, default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version


@dataclass(frozen=True)
class Unmet:
    """One requirement the venv does not meet: Unmet('torch==2.14.0', 'torch', '2.13.0')."""

    requirement: str  # as the engine declares it, its marker left out
    name: str  # the distribution it names, as written there
    installed: str | None  # the version there; None: not installed
    why: str = ""  # where it could not be judged: why (an unreadable line or version)

    @property
    def shown(self) -> str:
        """'torch==2.14.0 (2.13.0 installed)', 'flashinfer-python==0.7.2.post1 (not installed)'."""
        if self.why:
            return f"{self.requirement} ({self.why})"
        return f"{self.requirement} ({self.installed} installed)" if self.installed else \
            f"{self.requirement} (not installed)"


def canonical(name: str) -> str:
    """A distribution name as the venv fact keys it: 'flashinfer-python' -> 'flashinfer_python'."""
    return re.sub(r"[-_.]+", "_", name).lower()


def unmet(requires: Sequence[str], installed: Mapping[str, str], markers: Mapping[str, str]) -> tuple[Unmet, ...]:
    """The requirements among `requires` (Requires-Dist lines) that the venv's `installed` versions
    (by canonical name) do not meet, judged in the marker environment `markers` (the venv python's)."""
    # packaging fills a key the environment lacks from the controller's own python: never the host's.
    lacking = sorted(set(default_environment()) - set(markers))
    environment = {**markers, "extra": ""}
    found: list[Unmet] = []
    for line in requires:
        try:
            requirement = Requirement(line)
        except InvalidRequirement as exc:
            found.append(Unmet(line, line.split(";")[0].strip(), None, f"not a PEP 508 requirement: {exc}"))
            continue
        wanted = requirement.name + (f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else "") \
            + str(requirement.specifier)
        if requirement.marker is not None:
            needs = [key for key in lacking if key in str(requirement.marker)]
            if needs:
                found.append(Unmet(wanted, requirement.name, installed.get(canonical(requirement.name)),
                                   f"its marker needs {', '.join(needs)}, which the venv's record lacks"))
                continue
            try:
                if not requirement.marker.evaluate(environment):
                    continue
            except UndefinedEnvironmentName as exc:
                found.append(Unmet(wanted, requirement.name, None, f"its marker cannot be evaluated: {exc}"))
                continue
        version = installed.get(canonical(requirement.name))
        if version is None:
            found.append(Unmet(wanted, requirement.name, None))
            continue
        try:
            inside = requirement.specifier.contains(Version(version), prereleases=True)
        except InvalidVersion:
            found.append(Unmet(wanted, requirement.name, version, f"{version!r} installed is not a PEP 440 version"))
            continue
        if not inside:
            found.append(Unmet(wanted, requirement.name, version))
    return tuple(found)
