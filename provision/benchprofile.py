"""Published benchmark profiles, run with the tool they name: Spark Arena's `benchmarking/*.yaml`
(spark-arena/recipe-registry), read as they are.

    framework: llama-benchy          # the benchmark tool; the only one this tool runs
    metadata: {description: ...}
    args: {pp: [2048], tg: [128], depth: [0, 4096], concurrency: [1, 2], prefix_caching: true, runs: 3}
    schedule: [{depth: 4096, concurrency: 2}, ...]   # optional: the runs, in this order

Each run is one llama-benchy invocation at one depth and one concurrency (the schedule's entries, else
every depth with every concurrency, depth first), as sparkrun runs a profile; its other args become
llama-benchy's flags (`prefix_caching` is its `--enable-prefix-caching`). `runs` is llama-benchy's
`--runs`, as sparkrun passes it: within each invocation, every test is measured that many times after
one warm-up pass, and its result holds each measurement and their mean (`Run.repetitions`; a profile
without it gets llama-benchy's default, 3). It does not repeat the schedule. A server whose context
cannot hold a run (depth + pp + tg tokens) has the profile cut to it: runs at a depth it cannot hold
are dropped, and at depth 0 pp and tg shrink to fit; `Cut` says what, and the report prints it.

The shipped profiles (provision/benchprofiles) are the publisher's files byte for byte; where each was
read, and the sha256 of its bytes, is recorded beside them in sources.json (`Published`), never inside
the file: a shipped file whose bytes differ from the record is refused.

Pure: reading the profile files and sources.json is the only I/O. provision/benchrun.py runs the runs.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from provision import benchprofiles, datafiles
from provision.errors import BenchProfileError, clip

FRAMEWORK = "llama-benchy"
MAX_PROFILE_BYTES = 64 * 1024
_KEYS = {"framework", "metadata", "args", "schedule"}
LIST_ARGS = ("pp", "tg", "depth", "concurrency")
ALIASES = {"prefix_caching": "enable_prefix_caching"}  # sparkrun's shorthand, llama-benchy's name
# What this tool gives every run itself: where the server is, which model, the tokenizer it fetched,
# the key (never in argv), the result's file and format. A profile that sets one is refused.
OWNED = ("base_url", "api_key", "model", "served_model_name", "format", "save_result", "emit_progress")
DEFAULT_RUNS = 3  # llama-benchy's own default (--runs)
_SOURCE_KEYS = {"repository", "path", "commit", "sha256"}
# Tokens of a run's context left for the chat template and the special tokens around the prompt.
TEMPLATE_ROOM = 32


@dataclass(frozen=True)
class Run:
    """One llama-benchy invocation: its label and its args (lists for pp, tg, depth, concurrency)."""

    label: str
    args: Mapping[str, Any]

    @property
    def depth(self) -> int:
        return int(self.args["depth"][0])

    @property
    def concurrency(self) -> int:
        return int(self.args["concurrency"][0])

    @property
    def repetitions(self) -> int:
        """How many times llama-benchy measures this run's test (its `--runs`), after one warm-up."""
        return int(self.args.get("runs", DEFAULT_RUNS))

    def tokens(self) -> int:
        """The context one request of this run fills: its depth, its longest prompt and output."""
        return self.depth + int(max(self.args.get("pp") or [0])) + int(max(self.args.get("tg") or [0]))


@dataclass(frozen=True)
class Published:
    """Where a shipped profile was read: the publisher's repository, the file's path there, the full
    commit it was read at, and the sha256 of its bytes (one entry of provision/benchprofiles/sources.json)."""

    repository: str
    path: str
    commit: str
    sha256: str

    def words(self) -> str:
        return benchprofiles.where(self.as_json())

    def as_json(self) -> dict[str, str]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Profile:
    """A profile as read: its args (llama-benchy's names), its schedule's (depth, concurrency) pairs
    (None: every depth with every concurrency), the args the command line changed (`--arg`), and
    where a shipped one was published (None: a file of the user's)."""

    name: str
    description: str
    args: Mapping[str, Any]
    schedule: tuple[tuple[int, int], ...] | None
    source: str
    changed: Mapping[str, Any] = field(default_factory=dict)
    published: Published | None = None

    @property
    def repetitions(self) -> int:
        """llama-benchy's `--runs` for every run: its measurements of each test (the profile's `runs`)."""
        return int(self.args.get("runs", DEFAULT_RUNS))

    @property
    def about(self) -> str:
        """The publisher's description, and where a shipped profile was read."""
        where = f"published as {self.published.words()}" if self.published else f"read from {self.source}"
        return f"{self.description or self.name} ({where})"

    @property
    def runs(self) -> tuple[Run, ...]:
        pairs = self.schedule if self.schedule is not None else tuple(
            itertools.product(self.args["depth"], self.args["concurrency"]))
        return tuple(Run(f"d={depth} c={concurrency}", {**self.args, "depth": [depth], "concurrency": [concurrency]})
                     for depth, concurrency in pairs)


@dataclass(frozen=True)
class Cut:
    """What was changed for a server whose context cannot hold the profile's runs."""

    context: int
    dropped: tuple[str, ...] = ()
    shrunk: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # arg -> (the profile's, run here)

    @property
    def cut(self) -> bool:
        return bool(self.dropped or self.shrunk)

    def words(self) -> str:
        if not self.cut:
            return f"as published (the server's context, {self.context} tokens, holds every run)"
        parts = [f"{name} {was} -> {now}" for name, (was, now) in self.shrunk.items()]
        if self.dropped:
            depths = sorted({int(label.split()[0].removeprefix("d=")) for label in self.dropped})
            parts.append(f"{len(self.dropped)} run(s) dropped (at depth {', '.join(map(str, depths))})")
        return (f"cut to the server's context ({self.context} tokens, {TEMPLATE_ROOM} kept for the chat "
                f"template): {'; '.join(parts)}")


def named(name_or_path: str) -> Profile:
    """A profile file by its path, else a shipped one by name (provision/benchprofiles: spark-arena-v2)."""
    path = Path(name_or_path)
    if path.is_file():
        return load(path)
    known = shipped()
    if name_or_path in known:
        with resources.as_file(resources.files("provision.benchprofiles") / f"{name_or_path}.yaml") as found:
            return load(found, known[name_or_path])
    raise BenchProfileError(f"no profile file {name_or_path!r}, and no shipped profile of that name (shipped: "
                            f"{', '.join(known)})", file="command line", key="--profile")


def shipped() -> dict[str, Published]:
    """The shipped profiles by name, each with where it was published (sources.json). A profile file
    there without a record, or a record without its file, is refused: what ships says where it is from."""
    folder = resources.files("provision.benchprofiles")
    where = f"provision/benchprofiles/{benchprofiles.SOURCES}"
    try:
        records = benchprofiles.sources()
    except (OSError, ValueError) as exc:
        raise BenchProfileError(f"cannot read the shipped profiles' sources: {clip(str(exc))}", file=where) from exc
    files = {entry.name for entry in folder.iterdir() if entry.name.endswith(".yaml")}
    if not isinstance(records, dict) or set(records) != files:
        raise BenchProfileError(f"records {sorted(records) if isinstance(records, dict) else records!r}, the "
                                f"shipped files are {sorted(files)}: each needs exactly one", file=where)
    return {file[:-len(".yaml")]: _published(record, where, file) for file, record in sorted(records.items())}


def _published(record: Any, where: str, file: str) -> Published:
    if not (isinstance(record, dict) and set(record) == _SOURCE_KEYS
            and all(isinstance(value, str) for value in record.values())
            and re.fullmatch(r"[0-9a-f]{40}", record["commit"]) and re.fullmatch(r"[0-9a-f]{64}", record["sha256"])):
        raise BenchProfileError(f"{file} must be {{repository, path, commit: a full sha (40 hex), sha256: 64 hex}}, "
                                f"got {clip(repr(record))}", file=where, key=file)
    return Published(**record)


def load(path: Path, published: Published | None = None) -> Profile:
    """A profile file; BenchProfileError (exit 2) names the file and what is wrong. With `published`
    (a shipped one), its bytes must be the ones recorded (their sha256)."""
    data = datafiles.read_bounded(path, MAX_PROFILE_BYTES, BenchProfileError, "a benchmark profile")
    digest = hashlib.sha256(data).hexdigest()
    if published is not None and digest != published.sha256:
        raise BenchProfileError(f"not the file published as {published.words()}: its sha256 is {digest}, "
                                f"{benchprofiles.SOURCES} records {published.sha256}", file=str(path))
    try:
        body = datafiles.load(data.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise BenchProfileError(f"not YAML text: {clip(str(exc))}", file=str(path)) from exc
    return dataclasses.replace(from_mapping(body, str(path), path.stem), published=published)


def from_mapping(body: Any, source: str, name: str) -> Profile:
    if not isinstance(body, dict):
        raise BenchProfileError("a benchmark profile is a mapping with framework and args", file=source)
    unknown = sorted(set(map(str, body)) - _KEYS)
    if unknown:
        raise BenchProfileError(f"unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(_KEYS))})", file=source)
    if body.get("framework") != FRAMEWORK:
        raise BenchProfileError(f"framework {clip(repr(body.get('framework')))}: this tool runs {FRAMEWORK} profiles "
                                "only", file=source, key="framework")
    metadata = body.get("metadata") or {}
    description = str(metadata.get("description", "")) if isinstance(metadata, dict) else ""
    profile = Profile(name=name, description=description, args=_args(body.get("args") or {}, source),
                      schedule=_schedule(body.get("schedule"), source), source=source)
    if not profile.runs:
        raise BenchProfileError("no run: give args depth and concurrency, or a schedule", file=source)
    return profile


def with_args(profile: Profile, changed: Mapping[str, Any]) -> Profile:
    """The profile with some of its args changed (`bench --arg KEY=VALUE`: skip_coherence for a model
    that cannot answer, say), held to the same rules as the file's; the report names each."""
    if not changed:
        return profile
    args = _args({**profile.args, **changed}, "command line")
    return dataclasses.replace(profile, args=args,
                               changed={ALIASES.get(key, key): value for key, value in changed.items()})


def parse_args(pairs: Sequence[str]) -> dict[str, Any]:
    """`--arg KEY=VALUE` pairs, each VALUE read as YAML (true, 4 and [1, 2] keep their types)."""
    found: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise BenchProfileError(f"--arg expects KEY=VALUE, got {clip(repr(pair))}", file="command line")
        try:
            found[key.strip()] = yaml.safe_load(text) if text else ""
        except yaml.YAMLError as exc:
            raise BenchProfileError(f"cannot read the value of {clip(repr(pair))}", file="command line") from exc
    return found


def _args(raw: Any, source: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise BenchProfileError("'args' must be a mapping of llama-benchy's arguments", file=source, key="args")
    args: dict[str, Any] = {}
    for key, value in raw.items():
        name = ALIASES.get(str(key), str(key))
        if name in OWNED:
            raise BenchProfileError(f"args.{key}: this tool sets it for every run", file=source, key=f"args.{key}")
        if name in LIST_ARGS:
            values = value if isinstance(value, list) else [value]
            if not values or not all(isinstance(item, int) and not isinstance(item, bool) and item >= 0
                                     for item in values):
                raise BenchProfileError(f"args.{key} must be a list of whole numbers, got {clip(repr(value))}",
                                        file=source, key=f"args.{key}")
            value = values
        elif name == "runs" and not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            raise BenchProfileError(f"args.{key} (llama-benchy's measurements of each test) must be a whole "
                                    f"number of at least 1, got {clip(repr(value))}", file=source, key=f"args.{key}")
        args[name] = value
    args.setdefault("depth", [0])
    args.setdefault("concurrency", [1])
    return args


def _schedule(schedule: Any, source: str) -> tuple[tuple[int, int], ...] | None:
    if schedule is None:
        return None
    if not isinstance(schedule, list):
        raise BenchProfileError("'schedule' must be a list of {depth, concurrency}", file=source, key="schedule")
    pairs = []
    for number, entry in enumerate(schedule, 1):
        if not (isinstance(entry, dict) and set(entry) == {"depth", "concurrency"}
                and all(isinstance(entry[key], int) and not isinstance(entry[key], bool) for key in entry)):
            raise BenchProfileError(f"schedule entry {number} must be {{depth: N, concurrency: N}}, got "
                                    f"{clip(repr(entry))}", file=source, key="schedule")
        pairs.append((entry["depth"], entry["concurrency"]))
    return tuple(pairs)


def cut(runs: Sequence[Run], context: int | None) -> tuple[tuple[Run, ...], Cut | None]:
    """The runs a server of `context` tokens can hold: a run at a depth it cannot hold is dropped; at
    depth 0, tg shrinks to an eighth of the room and pp to the rest. None: no context known, no cut."""
    if context is None:
        return tuple(runs), None
    room = context - TEMPLATE_ROOM
    kept: list[Run] = []
    dropped: list[str] = []
    shrunk: dict[str, tuple[int, int]] = {}
    for run in runs:
        if run.tokens() <= room:
            kept.append(run)
            continue
        pp, tg = int(max(run.args.get("pp") or [0])), int(max(run.args.get("tg") or [0]))
        if run.depth > 0 or room < 16:
            dropped.append(run.label)
            continue
        new_tg = max(1, min(tg, room // 8))
        new_pp = min(pp, room - new_tg)
        for name, was, now in (("pp", pp, new_pp), ("tg", tg, new_tg)):
            if was != now:
                shrunk[name] = (was, now)
        kept.append(Run(run.label, {**run.args, "pp": [new_pp], "tg": [new_tg]}))
    return tuple(kept), Cut(context, tuple(dropped), shrunk)


@dataclass(frozen=True)
class Target:
    """Where and what a run measures: the server's OpenAI base URL (.../v1), the model's hub name, the
    name the server answers to, a local tokenizer file (None: llama-benchy finds it by the model's name)
    and the text its prompts are cut from (None: llama-benchy's own book)."""

    base_url: str
    model: str
    served_model_name: str
    tokenizer: str | None = None
    book_url: str | None = None


def argv(run: Run, target: Target, result_file: str) -> list[str]:
    """llama-benchy's arguments for one run (its own parser judges them: tests/test_benchprofile.py).
    The API key is not among them: benchrun hands it over outside argv."""
    line = ["--base-url", target.base_url, "--model", target.model, "--served-model-name", target.served_model_name,
            "--format", "json", "--save-result", result_file]
    if target.tokenizer:
        line += ["--tokenizer", target.tokenizer]
    if target.book_url:
        line += ["--book-url", target.book_url]
    for key, value in run.args.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            line += [flag] if value else []
        elif isinstance(value, list):
            line += [flag, *map(str, value)]
        else:
            line += [flag, str(value)]
    return line
