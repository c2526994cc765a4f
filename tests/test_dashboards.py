"""The shipped Grafana dashboards (provision/dashboards/*.json): each imports as Grafana expects, and every
metric name a query reads is one the engine serves, by the contract table at the release the dashboard is
held to (provision/dashboards/SOURCES.yaml) and by the metrics pages recorded from real servers; the
endpoint's, by the page HAProxy 2.6's exporter served (tests/fixtures/haproxy/haproxy-2.6.12-promex.txt).
Then the PromQL reader and the variable expansion on expressions chosen to trip them."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from provision import contracts, dashboards
from provision.endpoints import EndpointPlan, Replica
from provision.errors import ContractError

FIXTURES = Path(__file__).parent / "fixtures"
HAPROXY_PAGE = FIXTURES / "haproxy" / "haproxy-2.6.12-promex.txt"
# The recorded Prometheus pages of each engine (trtllm has none: no GPU ran it here).
PAGES = {"vllm": "vllm-*.json", "llamacpp": "llamacpp-*.json", "sglang": "sglang-*.json"}
ENGINE_VARIABLES = ("cluster", "host", "service", "model")  # the scrape targets' labels
ENDPOINT_VARIABLES = ("host", "endpoint", "replica")
NAMES = dashboards.names()
ENGINE_DASHBOARDS = [name for name in NAMES if dashboards.engine_of(name)]


def page_series(text: str) -> set[str]:
    """The series names a Prometheus text page serves (comment lines skipped)."""
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def recorded_series(engine: str) -> set[str]:
    found: set[str] = set()
    for path in sorted((FIXTURES / "metrics").glob(PAGES[engine])):
        recorded = json.loads(path.read_text())
        for key in ("page", "first", "second"):
            found |= page_series(recorded.get(key, ""))
    return found


def read_names(name: str) -> dict[str, str]:
    """{metric name: the panel that reads it} over every query of dashboard `name`."""
    return {metric: query.title for query in dashboards.queries(name) for metric in dashboards.metric_names(query.expr)}


def release_of(name: str) -> str:
    source = dashboards.sources()[name]
    engine = dashboards.engine_of(name)
    assert engine is not None
    return source.release or contracts.load().target(engine)


def test_the_shipped_dashboards_are_the_five_and_each_has_its_source() -> None:
    assert NAMES == ("endpoint", "llamacpp", "sglang", "trtllm", "vllm")
    assert set(dashboards.sources()) == set(NAMES)
    assert {name: dashboards.engine_of(name) for name in NAMES} == {
        "endpoint": None, "llamacpp": "llamacpp", "sglang": "sglang", "trtllm": "trtllm", "vllm": "vllm"}


@pytest.mark.parametrize("name", NAMES)
def test_each_dashboard_is_one_grafana_imports(name: str) -> None:
    board = dashboards.load(name)
    variables = {variable["name"]: variable for variable in board["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource" and variables["DS_PROMETHEUS"]["query"] == "prometheus"
    assert board["uid"] == f"provision-{name}" and board["title"] and board["description"]
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids)) and ids
    for panel in board["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, panel["title"]
        assert [target["expr"] for target in panel["targets"] if target.get("expr", "").strip()], panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
    expected = ENGINE_VARIABLES if dashboards.engine_of(name) else ENDPOINT_VARIABLES
    assert [variable for variable in variables if variable != "DS_PROMETHEUS"] == list(expected)


@pytest.mark.parametrize("name", NAMES)
def test_every_variable_a_query_uses_is_one_the_dashboard_defines(name: str) -> None:
    """A misspelt $modle would match nothing in Grafana, and expand() would hide it (any variable there
    matches anything)."""
    defined = {variable["name"] for variable in dashboards.load(name)["templating"]["list"]}
    for query in dashboards.queries(name):
        assert dashboards.variables(query.expr) - defined - set(dashboards.INTERVALS) == set(), query


@pytest.mark.parametrize("name", ENGINE_DASHBOARDS)
def test_every_name_an_engine_dashboard_reads_is_a_contract_row_at_its_release(name: str) -> None:
    engine = dashboards.engine_of(name)
    assert engine is not None
    held = set(contracts.load().names(engine, "metric", release_of(name)))
    unknown = {metric: title for metric, title in read_names(name).items()
               if metric not in held and dashboards.family(metric) not in held}
    assert not unknown, f"{name} reads names the contract table lacks at {release_of(name)}: {unknown}"


@pytest.mark.parametrize("name", [name for name in ENGINE_DASHBOARDS if name in PAGES])
def test_every_name_an_engine_dashboard_reads_is_on_a_page_recorded_from_its_engine(name: str) -> None:
    served = recorded_series(name)
    assert served
    unknown = {metric: title for metric, title in read_names(name).items() if metric not in served}
    assert not unknown, f"{name} reads names no recorded page serves: {unknown}"


def test_a_dashboard_held_to_another_release_than_the_target_needs_it() -> None:
    """trtllm's is held to 1.3.0rc10: the target (1.2) serves none of the trtllm_* names it reads."""
    table = contracts.load()
    for name in ENGINE_DASHBOARDS:
        engine = dashboards.engine_of(name)
        assert engine is not None
        if dashboards.sources()[name].release is None:
            continue
        at_target = set(table.names(engine, "metric", table.target(engine)))
        assert not set(read_names(name)) & at_target, name


def test_every_name_the_endpoint_dashboard_reads_is_on_haproxys_recorded_page() -> None:
    served = page_series(HAPROXY_PAGE.read_text())
    assert "haproxy_server_http_responses_total" in served
    read = read_names("endpoint")
    assert read and all(metric.startswith("haproxy_") for metric in read)
    assert {metric: title for metric, title in read.items() if metric not in served} == {}


def test_the_haproxy_page_carries_the_labels_and_codes_the_endpoint_dashboard_matches() -> None:
    page = HAPROXY_PAGE.read_text()
    assert 'haproxy_server_status{proxy="chat-1",server="tiny-a",state="UP"} 1' in page
    assert 'haproxy_frontend_http_responses_total{proxy="chat",code="5xx"}' in page
    matched = {found for query in dashboards.queries("endpoint")
               for found in re.findall(r'(?:code|state)="([^"]+)"', query.expr)}
    assert matched == {"5xx", "UP"}


def test_the_endpoint_dashboard_finds_the_backends_the_router_names() -> None:
    """The router's backend for each model of endpoint E is E-N (provision/endpoints.py); the dashboard's
    backend and server queries match proxy=~"$endpoint-[0-9]+"."""
    replicas = tuple(Replica(cluster, "h1", "10.0.0.1", port, model) for cluster, port, model in
                     (("a", 8001, "m1"), ("b", 8002, "m2"), ("c", 8003, "m1")))
    plan = EndpointPlan(name="chat", host="h1", bind_host="127.0.0.1", port=9000, drain_timeout=30.0, replicas=replicas)
    patterns = {match for query in dashboards.queries("endpoint")
                for match in re.findall(r'proxy=~"([^"]+)"', query.expr) if match != "$endpoint"}
    assert patterns == {"$endpoint-[0-9]+"}
    backend = re.compile(patterns.pop().replace("$endpoint", re.escape(plan.name)))
    assert [b.name for b in plan.backends if backend.fullmatch(b.name)] == ["chat-1", "chat-2"]
    assert not backend.fullmatch(plan.name)


@pytest.mark.parametrize("name", NAMES)
def test_expand_leaves_every_query_runnable_as_is(name: str) -> None:
    for query in dashboards.queries(name):
        expanded = dashboards.expand(query.expr)
        assert "$" not in expanded and "[[" not in expanded, (query.title, expanded)
        assert dashboards.metric_names(expanded) == dashboards.metric_names(query.expr)


def test_queries_take_the_variables_selectors_and_the_panels_inside_rows() -> None:
    board = {"templating": {"list": [
        {"name": "DS_PROMETHEUS", "type": "datasource", "query": "prometheus"},
        {"name": "host", "type": "query", "query": {"query": 'label_values(up{job="a"}, host)'}},
        {"name": "step", "type": "interval", "query": "1m,5m"}]},
        "panels": [{"title": "top", "targets": [{"refId": "A", "expr": "a"}, {"refId": "B"}]},
                   {"title": "row", "type": "row", "panels": [{"title": "inner", "targets": [{"refId": "A", "expr": "b"}]}]}]}
    assert dashboards.panel_queries(board) == [dashboards.PanelQuery("$host", "variable", 'up{job="a"}'),
                                               dashboards.PanelQuery("top", "A", "a"),
                                               dashboards.PanelQuery("inner", "A", "b")]
    with pytest.raises(ContractError, match="not label_values"):
        dashboards.panel_queries({"templating": {"list": [{"name": "x", "type": "query", "query": "query_result(up)"}]},
                                  "panels": []})


@pytest.mark.parametrize(("expr", "names"), [
    (('histogram_quantile(0.99, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket'
      '{model_name="$model_name", le!="+Inf"}[$__rate_interval])))'), {"vllm:e2e_request_latency_seconds_bucket"}),
    ("sum without (instance, job) (rate(a_total[5m] offset 1h)) / on (host) group_left (model) b_info",
     {"a_total", "b_info"}),
    ("sum(rate(x_sum[5m])) by (le) / sum(rate(x_count[5m])) by (le)", {"x_sum", "x_count"}),
    ("x > bool 0.5 and y unless z or NaN < Inf", {"x", "y", "z"}),
    ('{__name__="up", job="node"} == 1', {"up"}),
    ("1e-9 + 0x1F * 2.5 - .5", set()),
    ("max_over_time(rate(c_total[5m])[1h30m:1m])", {"c_total"}),
    ('label_replace(m, "dst", "$1", "src", "(.*)")', {"m"}),
    ('count by (host) (y{by="on", sum="rate"})', {"y"}),
    ("x @ start() + y atan2 z", {"x", "y", "z"}),
    ('rate(q{a=~"[[var]]"}[${__rate_interval}])', {"q"}),
    ("# a comment\nfoo", {"foo"}),
])
def test_metric_names(expr: str, names: set[str]) -> None:
    assert dashboards.metric_names(expr) == names


def test_metric_names_refuses_what_is_not_promql() -> None:
    with pytest.raises(ValueError, match="not PromQL"):
        dashboards.metric_names("x; y")
    with pytest.raises(ValueError, match="never closed"):
        dashboards.metric_names("sum by (le x")


def test_family_strips_only_a_histograms_series_suffix() -> None:
    assert [dashboards.family(name) for name in ("x_bucket", "x_sum", "x_count", "x_total", "x")] == [
        "x", "x", "x", "x_total", "x"]


@pytest.mark.parametrize(("expr", "expanded"), [
    ('rate(x{model=~"$model"}[$__rate_interval])', 'rate(x{model=~".*"}[2m])'),
    ('x{a="$a", b!="${b}", c="[[c:regex]]", d="fixed", e!~"$e"}', 'x{a=~".*", b!~".*", c=~".*", d="fixed", e!~".*"}'),
    ('x{proxy=~"$endpoint-[0-9]+"}', 'x{proxy=~".*-[0-9]+"}'),
    ("increase(x[$__range]) / $__range_s + $__interval_ms", "increase(x[6h]) / 21600 + 120000"),
    ('label_replace(m{h=~"${host:pipe}"}, "dst", "$1", "src", "(.*)")', 'label_replace(m{h=~".*"}, "dst", "$1", "src", "(.*)")'),
    ("x{model='$model'}", "x{model=~'.*'}"),
])
def test_expand(expr: str, expanded: str) -> None:
    assert dashboards.expand(expr, rate_interval="2m", range_="6h") == expanded


def test_expand_refuses_a_variable_outside_a_matcher() -> None:
    with pytest.raises(ValueError, match=r"variable \$n outside a label matcher"):
        dashboards.expand("topk($n, x)")
    with pytest.raises(ValueError, match="not a duration"):
        dashboards.expand("x", rate_interval="1 minute")


def test_sources_and_dashboards_refuse_what_is_not_theirs() -> None:
    with pytest.raises(ContractError, match="engine and release are text"):
        dashboards.parse_sources({"dashboards": {"x": {"engine": "trtllm", "release": 1.3, "source": "s", "note": "n"}}},
                                 "test")
    with pytest.raises(ContractError, match="needs source and note"):
        dashboards.parse_sources({"dashboards": {"x": {"engine": "vllm"}}}, "test")
    with pytest.raises(ContractError, match="not JSON"):
        dashboards.parse("{", "test")
    with pytest.raises(ContractError, match="not a Grafana dashboard"):
        dashboards.parse('{"title": "x"}', "test")
    with pytest.raises(ContractError, match="no dashboard 'grafana'"):
        dashboards.load("grafana")


def test_vllms_dashboard_names_the_commit_it_started_from() -> None:
    commit = "4b5c627c23e6690b8987100d1cbf78e34ac14bf9"
    assert commit in dashboards.load("vllm")["description"]
    assert commit in dashboards.sources()["vllm"].source
