"""The rows of the contract table (engine_contracts.yaml) that a vLLM release contradicts, read from
its wheel: a maintainer's command for each new release.

    python -m provision.contract_diff vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl
    python -m provision.contract_diff tests/fixtures/wheels/vllm-0.34.0    # an unpacked wheel

For every row of engine vllm it asks two questions: does the release have it (provision/vllm_wheel.py
reads the wheel; nothing is imported), and does the row's `versions` range say it should? A row
where the answers differ is printed with what the table says, what the wheel has and the file inside
the wheel where it was found or looked for. Then the wheel's pins of the packages the table's
dependency rows name, and of the CUDA stack a host must match (torch, torchvision, flashinfer-python).
Exit status: 0 when no row differs, 1 when one does, 2 when the input is not a vLLM release.

How a row is checked, by kind:
  flag        an option string of the serve parser (`--no-X` forms included where argparse adds them)
  env         a key of envs.py's environment_variables
  metric      a name the V1 metrics code registers, as served (counters with _total); NAME{label}
              is a label of an info gauge: a field of the config class whose metrics_info() fills it
  entrypoint  the module's file exists
  file        the row's name appears in the file its `source` link names (…/blob/<tag>/<path>)
  dependency  Requires-Dist (extras left out). Where the wheel requires the package, it has the row
              when its specifier is the row's or admits the row's pinned version; where it requires
              no such package the row is taken as what the tool installs beside vLLM (Ray from
              0.18.0 on), which the wheel does not contradict
A row it cannot check (a `file` row whose source is not a file at a tag) is listed as such.
The engine's `arity` (the options that take other than one value) is compared with the nargs the
release's parser gives each option; a difference counts as a row that differs.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from provision import contracts, vllm_wheel
from provision.errors import ContractError, WheelReadError

ENGINE = "vllm"
# Pins a host must match beside the engine (its CUDA driver, the torch build), shown for every release
# whether or not the table has a row for them yet: a new pin is a row to add.
STACK = ("torch", "torchvision", "flashinfer-python")
# An info gauge's labels are the fields of one config class (V1 loggers.py log_metrics_info).
INFO_LABELS = {"vllm:cache_config_info": ("vllm.config.cache", "CacheConfig")}


@dataclass(frozen=True)
class Verdict:
    row: contracts.Row
    table: bool  # the row's range holds this release
    wheel: bool | None  # the release has it; None where it cannot be checked
    where: str  # the file inside the wheel it was found in, or looked for in
    detail: str = ""

    @property
    def differs(self) -> bool:
        return self.wheel is not None and self.wheel != self.table


@dataclass(frozen=True)
class Reading:
    """Everything read from one release, once."""
    release: vllm_wheel.Release
    serve: vllm_wheel.ServeOptions
    env: dict[str, str]
    metrics: dict[str, str]
    requirements: list[Requirement]


def read(release: vllm_wheel.Release) -> Reading:
    return Reading(release, vllm_wheel.serve_options(release), vllm_wheel.environment_variables(release),
                   vllm_wheel.metric_names(release), release.requirements())


def judge(table: contracts.Contracts, reading: Reading) -> list[Verdict]:
    """One verdict per row of engine vllm, in the table's order."""
    version = reading.release.version
    verdicts = []
    for row in (row for row in table.rows if row.engine == ENGINE):
        holds = row.holds(version)
        wheel, where, detail = _check(row, reading)
        verdicts.append(Verdict(row, holds, wheel, where, detail))
    return verdicts


def _check(row: contracts.Row, reading: Reading) -> tuple[bool | None, str, str]:
    """(has it, where, detail) for one row."""
    release = reading.release
    if row.kind == "flag":
        found = reading.serve.options.get(row.name)
        return found is not None, found or f"{reading.serve.parser_module} (make_arg_parser and what it calls)", ""
    if row.kind == "env":
        return row.name in reading.env, vllm_wheel.ENVS, ""
    if row.kind == "metric":
        name, _, label = row.name.partition("{")
        if label:
            module, klass = INFO_LABELS.get(name, ("", ""))
            fields = vllm_wheel.class_fields(release, module, klass) if module else {}
            path = vllm_wheel.module_path(release, module) if module else None
            return (name in reading.metrics and label.rstrip("}") in fields,
                    path or module or f"no config class known for {name}", f"a field of {klass}" if klass else "")
        return name in reading.metrics, reading.metrics.get(name, vllm_wheel.METRICS_DIR + "/*.py"), ""
    if row.kind in ("entrypoint", "headless"):
        path = vllm_wheel.module_path(release, row.name)
        return path is not None, path or row.name.replace(".", "/") + ".py", ""
    if row.kind == "file":
        inner = _source_path(row.source)
        if inner is None:
            return None, row.source, "its source is not a file at a tag"
        text = release.text(inner)
        return text is not None and row.name in text, inner, "" if text is not None else "no such file"
    if row.kind == "dependency":
        return _dependency(row, reading)
    return None, "", f"kind {row.kind} is not read from a wheel"


def _dependency(row: contracts.Row, reading: Reading) -> tuple[bool | None, str, str]:
    wanted = Requirement(row.name)
    where = reading.release.metadata_path
    required = [item for item in reading.requirements if canonicalize_name(item.name) == canonicalize_name(wanted.name)]
    if not required:
        return row.holds(reading.release.version), where, f"requires no {wanted.name}: the tool's to install"
    pins = [spec.version for spec in wanted.specifier if spec.operator == "=="]
    has = any(item.specifier == wanted.specifier and item.extras == wanted.extras
              or (pins and item.specifier.contains(Version(pins[0]), prereleases=True)) for item in required)
    return has, where, "requires " + ", ".join(sorted(str(item) for item in required))


def _source_path(source: str) -> str | None:
    """https://github.com/vllm-project/vllm/blob/v0.17.0/vllm/ray/ray_env.py -> vllm/ray/ray_env.py."""
    parts = urlparse(source).path.split("/")
    if len(parts) > 5 and parts[3] == "blob":
        return "/".join(parts[5:])
    return None


def arity_differences(table: contracts.Contracts, reading: Reading) -> list[str]:
    """A line per option whose nargs the table's arity and the release's parser give differently."""
    held, read_ = table.arity(ENGINE), reading.serve.arity
    return [f"  {option}: table {held.get(option, 'one value')}, wheel {read_.get(option, 'one value')}"
            for option in sorted(set(held) | set(read_)) if held.get(option) != read_.get(option)]


def pins(table: contracts.Contracts, reading: Reading) -> list[str]:
    """A line per package the dependency rows name (and per STACK package): the wheel's requirement
    and the row that holds for this release, if any."""
    rows = [row for row in table.rows if row.engine == ENGINE and row.kind == "dependency"]
    names = {canonicalize_name(Requirement(row.name).name) for row in rows} | {canonicalize_name(n) for n in STACK}
    lines = []
    for name in sorted(names):
        required = sorted(str(item) for item in reading.requirements if canonicalize_name(item.name) == name)
        held = [row.name for row in rows if canonicalize_name(Requirement(row.name).name) == name
                and row.holds(reading.release.version)]
        wheel = ", ".join(required) or f"{name}: not required"
        lines.append(f"  {wheel:<40} table: {', '.join(held) or 'no row holds for this release'}")
    return lines


def report(table: contracts.Contracts, reading: Reading, verdicts: Sequence[Verdict]) -> str:
    release = reading.release
    differing = [verdict for verdict in verdicts if verdict.differs]
    unchecked = [verdict for verdict in verdicts if verdict.wheel is None]
    lines = [
        f"{release.name} {release.version}: the rows of engine {ENGINE} in {contracts.DATA} against the release",
        (f"read: {len(reading.serve.options)} serve options ({reading.serve.parser_module} make_arg_parser "
         f"and what it calls), {len(reading.env)} environment variables ({vllm_wheel.ENVS}), "
         f"{len(reading.metrics)} metric names ({vllm_wheel.METRICS_DIR}), "
         f"{len(reading.requirements)} requirements ({release.metadata_path})"),
        *(f"not followed (options it may add are not counted): {call}" for call in reading.serve.not_followed),
        f"rows: {len(verdicts)} checked, {len(differing)} differ, {len(unchecked)} not checkable",
        "",
    ]
    for verdict in differing:
        row = verdict.row
        says = "has it" if verdict.table else "lacks it"
        has = "has it" if verdict.wheel else "lacks it"
        lines += [f"{row.kind} {row.name}",
                  f"  table: {release.version} {says} (versions {row.versions or 'any'}; {row.source})",
                  f"  wheel: {has} ({verdict.where}){': ' + verdict.detail if verdict.detail else ''}", ""]
    for verdict in unchecked:
        lines += [f"not checkable: {verdict.row.kind} {verdict.row.name}: {verdict.detail}"]
    arity = arity_differences(table, reading)
    if arity:
        lines += [f"arity (engines.{ENGINE}.arity) differs from the release's parser:", *arity, ""]
    lines += ["pins (Requires-Dist) of the packages the dependency rows name, and of the CUDA stack:",
              *pins(table, reading)]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m provision.contract_diff", description=__doc__.splitlines()[0])
    parser.add_argument("release", type=Path, help="a vLLM wheel, or the directory of an unpacked one")
    args = parser.parse_args(argv)
    try:
        reading = read(vllm_wheel.open_release(args.release))
        table = contracts.load()
        verdicts = judge(table, reading)
    except (WheelReadError, ContractError, InvalidRequirement, OSError) as exc:
        print(f"contract_diff: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(report(table, reading, verdicts))
    return 1 if any(verdict.differs for verdict in verdicts) or arity_differences(table, reading) else 0


if __name__ == "__main__":
    sys.exit(main())
