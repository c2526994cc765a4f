"""The Grafana dashboards the tool ships (provision/dashboards/*.json), and the PromQL their panels run.

One dashboard per engine (their metric names differ: vllm:*, llamacpp:*, sglang:*, trtllm_*) and one for
an endpoint (HAProxy's own exporter: requests, errors, queueing, per replica). Each is a file Grafana
imports as is: a Prometheus datasource variable (DS_PROMETHEUS) and template variables over the labels
the tool's scrape targets carry. Where each comes from, and which release its names are held to, is
provision/dashboards/SOURCES.yaml; tests/test_dashboards.py holds every name a query reads to the
contract table (engine_contracts.yaml) or to a recorded metrics page.

    dashboards.names()                        # ('endpoint', 'llamacpp', 'sglang', 'trtllm', 'vllm')
    dashboards.queries("vllm")                # [PanelQuery(title, ref_id, expr), ...]
    dashboards.metric_names('rate(vllm:prompt_tokens_total{model=~"$model"}[5m])')
                                              # {'vllm:prompt_tokens_total'}
    dashboards.expand('x{model=~"$model"}[$__rate_interval]')
                                              # 'x{model=~".*"}[1m]': Prometheus' HTTP API runs it as is

`names`, `load`, `sources`, `engine_of` and `queries` read the package's files; the rest is pure.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

from provision import datafiles
from provision.errors import ContractError

FOLDER = "dashboards"
SOURCES = "SOURCES.yaml"
# Grafana's built-in interval variables; every other $name is a template variable.
INTERVALS = ("__rate_interval", "__interval", "__interval_ms", "__range", "__range_s", "__range_ms")
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")

# A Grafana variable reference: $name, ${name}, ${name:format}, [[name]], [[name:format]]. A name starts
# with a letter or _, so a regex group reference in a label_replace replacement ("$1") is none.
VARIABLE = re.compile(r"\$\{(?P<braced>[A-Za-z_]\w*)(?::[^}]*)?\}|\[\[(?P<bracketed>[A-Za-z_]\w*)(?::[^\]]*)?\]\]"
                      r"|\$(?P<bare>[A-Za-z_]\w*)")
# A label matcher whose value is a quoted string (PromQL takes "..." and '...').
MATCHER = re.compile(r"""(?P<label>[A-Za-z_]\w*)\s*(?P<op>=~|!~|!=|=)\s*(?P<value>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')""")
# PromQL, token by token. A number takes a duration's unit letters with it (5m, 1h30m, 1e-9), so that
# neither is read as a name; a Grafana variable is one token wherever it stands.
TOKEN = re.compile(r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<variable>\$\{[^}]*\}|\[\[[^\]]*\]\]|\$\w+)
  | (?P<number>0[xX][0-9a-fA-F]+|(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?(?:(?:ms|[smhdwy])(?:\d+(?:ms|[smhdwy]))*)?)
  | (?P<name>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<punct>=~|!~|!=|==|<=|>=|[-+*/%^=<>(){}\[\],@:])
""", re.VERBOSE)
# Words that are PromQL's own where they stand alone (not followed by "("): set operators, modifiers,
# the special numbers. A label list follows the grouping words.
KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2"})
GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000,
            "y": 31_536_000_000}
LABEL_VALUES = re.compile(r"^\s*label_values\((?P<selector>.*),\s*(?P<label>[A-Za-z_]\w*)\s*\)\s*$", re.DOTALL)


@dataclass(frozen=True)
class PanelQuery:
    """One query a dashboard runs: a panel target's, or a template variable's selector (its title then
    `$name`, its ref_id "variable")."""

    title: str
    ref_id: str
    expr: str


@dataclass(frozen=True)
class Source:
    """Where a dashboard comes from and what its metric names are held to (SOURCES.yaml)."""

    name: str
    engine: str | None  # the contract table's engine; None: not an engine's (the endpoint's HAProxy)
    release: str | None  # the release its names are held to; None: the engine's target release
    source: str
    note: str


def names() -> tuple[str, ...]:
    """The dashboards shipped, by file name without .json."""
    folder = resources.files("provision").joinpath(FOLDER)
    return tuple(sorted(entry.name.removesuffix(".json") for entry in folder.iterdir()
                        if entry.name.endswith(".json")))


def load(name: str) -> dict[str, Any]:
    """The dashboard `name` as Grafana imports it; ContractError where it is not one."""
    if name not in names():
        raise ContractError(f"no dashboard {name!r}: shipped are {', '.join(names())}")
    text = resources.files("provision").joinpath(FOLDER, f"{name}.json").read_text(encoding="utf-8")
    return parse(text, f"provision/{FOLDER}/{name}.json")


def parse(text: str, source: str) -> dict[str, Any]:
    """A dashboard's JSON; ContractError (naming `source`) where it is not an object with panels."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ContractError(f"{source}: not JSON: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("panels"), list):
        raise ContractError(f"{source}: not a Grafana dashboard (an object with a list of panels)")
    return data


def sources() -> dict[str, Source]:
    """SOURCES.yaml: each dashboard's engine, the release it is held to and where it comes from."""
    text = resources.files("provision").joinpath(FOLDER, SOURCES).read_text(encoding="utf-8")
    return parse_sources(datafiles.load(text), f"provision/{FOLDER}/{SOURCES}")


def parse_sources(data: Any, source: str) -> dict[str, Source]:
    entries = data.get("dashboards") if isinstance(data, dict) else None
    if not isinstance(entries, dict):
        raise ContractError(f"{source}: expected a mapping `dashboards` of name: entry")
    found = {}
    for name, entry in entries.items():
        if not isinstance(entry, dict) or not all(isinstance(entry.get(key), str) for key in ("source", "note")):
            raise ContractError(f"{source}: {name}: needs source and note as text")
        # a release is text ("1.3.0rc10"): YAML would read 1.30 as a number
        if not all(isinstance(entry.get(key), (str, type(None))) for key in ("engine", "release")):
            raise ContractError(f"{source}: {name}: engine and release are text where given")
        found[name] = Source(name, entry.get("engine"), entry.get("release"), entry["source"], entry["note"])
    return found


def engine_of(name: str) -> str | None:
    """The engine dashboard `name` is for (the contract table's name); None for the endpoint's."""
    found = sources().get(name)
    if found is None:
        raise ContractError(f"no dashboard {name!r} in provision/{FOLDER}/{SOURCES}")
    return found.engine


def queries(name: str) -> list[PanelQuery]:
    """Every query dashboard `name` runs (panel_queries of the shipped file)."""
    return panel_queries(load(name))


def panel_queries(dashboard: Mapping[str, Any]) -> list[PanelQuery]:
    """The template variables' selectors, then each panel's targets in order (a row's panels too)."""
    found = [query for variable in dashboard.get("templating", {}).get("list", [])
             if (query := _variable_query(variable)) is not None]
    for panel in _panels(dashboard.get("panels", [])):
        found.extend(PanelQuery(str(panel.get("title", "")), str(target.get("refId", "")), target["expr"])
                     for target in panel.get("targets", []) if isinstance(target.get("expr"), str))
    return found


def _panels(panels: list[Any]) -> Iterator[Mapping[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # a collapsed row holds its panels


def _variable_query(variable: Mapping[str, Any]) -> PanelQuery | None:
    """A query variable's label_values(SELECTOR, LABEL) as its SELECTOR; None for any other variable."""
    if variable.get("type") != "query":
        return None
    query = variable.get("query")
    text = query.get("query", "") if isinstance(query, dict) else str(query or "")
    matched = LABEL_VALUES.match(text)
    if matched is None:
        raise ContractError(f"variable {variable.get('name')}: not label_values(SELECTOR, LABEL): {text!r}")
    return PanelQuery(f"${variable.get('name')}", "variable", matched["selector"])


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads, as the series are named (`x_bucket` stays so; see
    `family`). Not names: functions and aggregations (a name before "(", or before the by/without of
    `sum by (le) (...)`), label names (inside {...}
    and the lists after by/without/on/ignoring/group_left/group_right), keywords, numbers, durations
    and strings; `{__name__="x"}` reads x."""
    tokens = [(kind, text) for kind, text in _tokens(expr) if kind != "space"]
    found: set[str] = set()
    depth = {"{": 0, "[": 0}
    index = 0
    while index < len(tokens):
        kind, text = tokens[index]
        following = tokens[index + 1][1] if index + 1 < len(tokens) else ""
        if text in ("{", "["):
            depth[text] += 1
        elif text in ("}", "]"):
            depth["{" if text == "}" else "["] -= 1
        elif depth["{"] and text == "__name__" and following == "=" and index + 2 < len(tokens):
            found.add(_unquote(tokens[index + 2][1]))
        elif kind == "name" and not depth["{"] and not depth["["]:
            if text in GROUPING and following == "(":
                index = _closing(tokens, index + 1)
            elif following not in ("(", "by", "without") and text.lower() not in KEYWORDS:
                found.add(text)
        index += 1
    return found


def _tokens(expr: str) -> Iterator[tuple[str, str]]:
    position = 0
    while position < len(expr):
        matched = TOKEN.match(expr, position)
        if matched is None or matched.lastgroup is None:
            raise ValueError(f"not PromQL at {position}: {expr[position:position + 20]!r}")
        yield matched.lastgroup, matched.group()
        position = matched.end()


def _closing(tokens: list[tuple[str, str]], opening: int) -> int:
    """The index of the ")" that closes the "(" at `opening`."""
    depth = 0
    for index in range(opening, len(tokens)):
        depth += {"(": 1, ")": -1}.get(tokens[index][1], 0)
        if depth == 0:
            return index
    raise ValueError("a \"(\" is never closed")


def _unquote(text: str) -> str:
    return text[1:-1] if text[:1] in "\"'`" else text


def family(name: str) -> str:
    """The metric family a series belongs to: a histogram's x_bucket, x_sum and x_count are x's; any
    other name is its own. (A counter spelt x_count would be misread; the caller asks the family only
    where the series name itself is not known.)"""
    for suffix in HISTOGRAM_SERIES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def expand(expr: str, rate_interval: str = "1m", range_: str = "1h") -> str:
    """`expr` as Prometheus' HTTP API runs it: Grafana's interval variables given values (`$__interval`
    is `rate_interval` too) and every template variable matching anything: a matcher on one
    (label=~"$var", label="$var") becomes label=~".*" (!= and !~ become !~). ValueError where a
    variable stands outside a label matcher: no value can stand in for it."""
    values = _interval_values(rate_interval, range_)
    expanded = VARIABLE.sub(lambda m: values.get(_variable_name(m), m.group()), expr)
    expanded = MATCHER.sub(_match_all, expanded)
    left = VARIABLE.search(expanded)
    if left is not None:
        raise ValueError(f"variable {left.group()} outside a label matcher: {expr!r}")
    return expanded


def variables(expr: str) -> set[str]:
    """The names of the Grafana variables `expr` refers to, built-in ones (__rate_interval) included."""
    return {_variable_name(found) for found in VARIABLE.finditer(expr)}


def _variable_name(matched: re.Match[str]) -> str:
    return matched["braced"] or matched["bracketed"] or matched["bare"]


def _interval_values(rate_interval: str, range_: str) -> dict[str, str]:
    rate_ms, range_ms = duration_ms(rate_interval), duration_ms(range_)
    return {"__rate_interval": rate_interval, "__interval": rate_interval, "__interval_ms": str(rate_ms),
            "__range": range_, "__range_s": str(range_ms // 1000), "__range_ms": str(range_ms)}


def _match_all(matched: re.Match[str]) -> str:
    value = matched["value"]
    if not VARIABLE.search(value):
        return matched.group()
    op = {"=": "=~", "!=": "!~"}.get(matched["op"], matched["op"])
    return f'{matched["label"]}{op}{value[0]}{VARIABLE.sub(".*", value[1:-1])}{value[0]}'


def duration_ms(text: str) -> int:
    """A Prometheus duration (5m, 1h30m, 250ms) in milliseconds; ValueError where it is not one."""
    parts = re.findall(r"(\d+)(ms|[smhdwy])", text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        raise ValueError(f"not a duration: {text!r}")
    return sum(int(number) * UNITS_MS[unit] for number, unit in parts)
