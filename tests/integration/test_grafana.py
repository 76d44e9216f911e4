"""deploy/grafana/oomguard-fleet.json: a dashboard Grafana can import (structure, layout, data source
references), whose every query asks a real manager's /metrics for metrics and labels that exist,
and which a real Prometheus (Debian's) answers with data.

The check parses each PromQL expression with promql-parser (PyPI; Python bindings of GreptimeTeam's
PromQL parser in Rust, https://github.com/messense/py-promql-parser) and infers the labels each
sub-expression carries, with Prometheus' rules
(https://prometheus.io/docs/prometheus/latest/querying/operators/): an aggregation keeps its ``by``
labels (or drops its ``without`` ones), a one-to-one binary operation without ``on``/``ignoring``
needs the same labels on both sides, ``on (l)`` keeps only ``l``, ``group_left (l)`` copies ``l``
from the "one" side. Where promql-parser is not installed, a tokenizer falls back to the names
alone (metric names outside braces and strings, label names in braces and in
by/without/on/ignoring/group_x lists), each label looked up on the metrics of its expression.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from tests.conftest import REPO
from tests.helpers.wait import wait_until

DASHBOARD = REPO / "deploy" / "grafana" / "oomguard-fleet.json"
README = REPO / "deploy" / "grafana" / "README.md"
GRID_COLUMNS = 24  # Grafana's layout grid is 24 columns wide
PROMETHEUS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
# Grafana's own variables: https://grafana.com/docs/grafana/latest/dashboards/variables/add-template-variables/#global-variables
GLOBAL_DURATIONS = ("__rate_interval", "__interval", "__range")
GLOBALS = {*GLOBAL_DURATIONS, "__range_s", "__range_ms", "__interval_ms", "__dashboard", "__from", "__to"}
VARIABLE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))|\[\[(\w+)(?::\w+)?\]\]")
LEGEND_LABEL = re.compile(r"\{\{\s*([a-zA-Z_]\w*)\s*\}\}")
LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(.+?)\s*,\s*)?([a-zA-Z_]\w*)\s*\)\s*$")

try:
    import promql_parser
except ImportError:  # pragma: no cover - the dev extra installs it
    promql_parser = None  # type: ignore[assignment]


def load() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())  # type: ignore[no-any-return]


def all_panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    for p in dash["panels"]:
        yield p
        yield from p.get("panels", [])


def variables(dash: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dash["templating"]["list"]}


def queries(dash: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(where, PromQL, legend) for every panel target and every Prometheus annotation."""
    for p in all_panels(dash):
        for t in p.get("targets", []):
            yield f"panel {p['id']} {p['title']!r} {t['refId']}", t["expr"], t.get("legendFormat", "")
    for a in dash["annotations"]["list"]:
        if "expr" in a:
            yield f"annotation {a['name']!r}", a["expr"], a.get("textFormat", "")


def variable_query(v: dict[str, Any]) -> str:
    q = v["query"]
    return q["query"] if isinstance(q, dict) else q  # type: ignore[no-any-return]


def grafana_to_promql(expr: str) -> str:
    """What Grafana sends Prometheus, near enough to parse: durations for its interval variables,
    a value for the dashboard's own (they only stand inside label matchers' strings here)."""

    def value(m: re.Match[str]) -> str:
        name = m[1] or m[2] or m[3]
        return "5m" if name in GLOBAL_DURATIONS else "x"

    return VARIABLE.sub(value, expr)


# --- the file --------------------------------------------------------------------------------------


def test_dashboard_is_a_grafana_dashboard() -> None:
    dash = load()
    assert isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 39  # Grafana 10.4 and later
    assert dash["uid"] == "oomguard-fleet" and dash["title"] and dash["id"] is None
    assert dash["time"]["from"].startswith("now-") and dash["time"]["to"] == "now"
    panels = list(all_panels(dash))
    ids = [p["id"] for p in panels]
    assert all(isinstance(i, int) for i in ids) and len(ids) == len(set(ids)), "panel ids must be unique"
    required = {r["id"] for r in dash["__requires"] if r["type"] == "panel"}
    boxes = []
    for p in panels:
        g = p["gridPos"]
        assert {"x", "y", "w", "h"} <= g.keys() and all(isinstance(g[k], int) and g[k] >= 0 for k in "xywh"), p
        assert g["w"] > 0 and g["h"] > 0 and g["x"] + g["w"] <= GRID_COLUMNS, f"panel {p['id']} leaves the grid"
        boxes.append((p["id"], g["x"], g["y"], g["x"] + g["w"], g["y"] + g["h"]))
        assert p["title"], p["id"]
        if p["type"] == "row":
            continue
        assert p["type"] in required, f"panel type {p['type']} missing from __requires"
        assert p.get("description"), f"panel {p['id']} {p['title']!r}: say what it shows"
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), f"panel {p['id']}: targets need unique refIds"
        for t in p["targets"]:
            assert isinstance(t["expr"], str) and t["expr"].strip(), (p["id"], t)
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            overlap = a[1] < b[3] and b[1] < a[3] and a[2] < b[4] and b[2] < a[4]
            assert not overlap, f"panels {a[0]} and {b[0]} overlap"


def test_data_source_references_resolve() -> None:
    """Every query names the one Prometheus input (``${DS_PROMETHEUS}``): the import dialog replaces it
    with the data source picked there, and a dashboard provisioned from a file (where no import
    dialog runs) finds it as the data-source variable of the same name."""
    dash = load()
    (inp,) = dash["__inputs"]
    assert (inp["type"], inp["pluginId"], inp["name"]) == ("datasource", "prometheus", "DS_PROMETHEUS")
    assert {"type": "datasource", "id": "prometheus"}.items() <= next(
        r for r in dash["__requires"] if r["type"] == "datasource"
    ).items()
    ds_var = variables(dash)["DS_PROMETHEUS"]
    assert (ds_var["type"], ds_var["query"]) == ("datasource", "prometheus")
    refs = [("templating node", variables(dash)["node"]["datasource"])]
    for p in all_panels(dash):
        if p["type"] != "row":
            refs += [(f"panel {p['id']}", p["datasource"])]
            refs += [(f"panel {p['id']} {t['refId']}", t.get("datasource", p["datasource"])) for t in p["targets"]]
    refs += [(f"annotation {a['name']}", a["datasource"]) for a in dash["annotations"]["list"] if "expr" in a]
    for where, ref in refs:
        assert ref == PROMETHEUS, f"{where}: data source {ref} is not the declared input"
    for a in dash["annotations"]["list"]:
        assert a.get("builtIn") == 1 or a["datasource"] == PROMETHEUS, a


def test_variables_are_declared() -> None:
    dash = load()
    declared = set(variables(dash))
    node = variables(dash)["node"]
    assert node["type"] == "query" and node["multi"] and node["includeAll"] and node["allValue"] == ".*"
    m = LABEL_VALUES.match(variable_query(node))
    assert m and m[2] == "node", variable_query(node)
    texts = [expr for _, expr, _ in queries(dash)] + [p["title"] for p in all_panels(dash)]
    used = {m[1] or m[2] or m[3] for text in texts for m in VARIABLE.finditer(text)}
    assert "node" in used
    assert used <= declared | GLOBALS, f"undeclared variables: {used - declared - GLOBALS}"
    for where, expr, _ in queries(dash):
        assert 'node=~"$node"' in expr or "oomguard_manager_" in expr, f"{where}: not filtered by $node"


# --- the metrics: every name and label the dashboard asks for is on a real manager's /metrics -------


def post(url: str, path: str, body: dict[str, Any]) -> None:
    from tests.helpers.manager import AGENT_H

    req = urllib.request.Request(
        url + path, json.dumps(body).encode(), {**AGENT_H, "Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200


def exit_event(url: str, reason: str, signal: int) -> None:
    event = {"event": "exit", "reason": reason, "signal": signal, "pid": 7}
    post(url, "/api/v1/events", {"node": "node-a", "id": uuid.uuid4().hex, "event": event})


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real manager (``oomguard manager``, SQLite) given a report with usage and working set, an OOM
    kill and a pressure stop."""
    pytest.importorskip("fastapi")
    from tests.helpers.manager import ManagerProcess, envelope, fixture_report

    server = ManagerProcess(f"sqlite:///{tmp_path_factory.mktemp('grafana') / 'fleet.db'}").start()
    try:
        report = fixture_report("docker_v2_private_ns_limit_512m")
        assert report["memory"]["usage_bytes"] and report["memory"]["working_set_bytes"]
        post(server.url, "/api/v1/reports", envelope("node-a", report))
        exit_event(server.url, "oom-kill", 9)
        exit_event(server.url, "pressure-stop", 15)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def scrape(fleet: Any) -> dict[str, frozenset[str]]:
    """{series name: its label names} from the manager's /metrics, read by prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    from tests.helpers.manager import VIEWER_H

    req = urllib.request.Request(fleet.url + "/metrics", headers=VIEWER_H)
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
    series: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            series.setdefault(sample.name, set()).update(sample.labels)
    assert 'oomguard_oom_kills_total{node="node-a"} 1.0' in text
    assert 'oomguard_pressure_stops_total{node="node-a"} 1.0' in text
    return {name: frozenset(labels) for name, labels in series.items()}


Labels = frozenset[str]


class _Check:
    """Walks one expression's syntax tree, returns the labels each node carries and collects problems."""

    def __init__(self, scraped: dict[str, Labels], where: str) -> None:
        self.scraped = scraped
        self.where = where
        self.problems: list[str] = []
        self.unknown = False  # a metric is missing: its labels are unknown, so are those built on them

    def fail(self, what: str) -> None:
        self.problems.append(f"{self.where}: {what}")

    def need(self, labels: list[str] | Labels, have: Labels | None, why: str) -> None:
        missing = sorted(set(labels) - (have or frozenset()))
        if missing and not self.unknown:
            self.fail(f"{why}: label(s) {missing} not on {sorted(have or ())}")

    def labels(self, node: Any) -> Labels | None:
        """The label names of the series *node* yields; None for a scalar or a string."""
        p = promql_parser
        if isinstance(node, p.VectorSelector):
            return self.selector(node)
        if isinstance(node, p.MatrixSelector):
            return self.selector(node.vector_selector)
        if isinstance(node, (p.ParenExpr, p.UnaryExpr, p.SubqueryExpr)):
            return self.labels(node.expr)
        if isinstance(node, (p.NumberLiteral, p.StringLiteral)):
            return None
        if isinstance(node, p.Call):
            return self.call(node)
        if isinstance(node, p.AggregateExpr):
            return self.aggregate(node)
        if isinstance(node, p.BinaryExpr):
            return self.binary(node)
        self.fail(f"unhandled PromQL node {type(node).__name__}")
        return frozenset()

    def selector(self, vs: Any) -> Labels:
        if vs.name is None:
            self.fail("a selector without a metric name")
            return frozenset()
        have = self.scraped.get(vs.name)
        if have is None:
            self.fail(f"metric {vs.name} is not on /metrics")
            self.unknown = True
            return frozenset()
        matchers = list(vs.matchers.matchers) + [m for group in vs.matchers.or_matchers for m in group]
        self.need([m.name for m in matchers if m.name != "__name__"], have, f"{vs.name}{{...}}")
        return have

    def call(self, call: Any) -> Labels | None:
        args = [self.labels(a) for a in call.args]
        name = call.func.name
        if str(call.func.return_type) == "ValueType.Scalar":
            return None
        if name in ("label_replace", "label_join"):
            # label_replace(v, dst, replacement, src, regex); label_join(v, dst, separator, src...)
            dst, _, *rest = (a.val for a in call.args[1:])
            sources = rest[:1] if name == "label_replace" else rest
            self.need([s for s in sources if s], args[0], name)
            return (args[0] or frozenset()) | {dst}
        if name == "histogram_quantile":
            self.need(["le"], args[1], name)
            return (args[1] or frozenset()) - {"le"}
        vectors = [a for a in args if a is not None]
        return vectors[0] if vectors else frozenset()  # vector(), absent(): no labels worth relying on

    def aggregate(self, agg: Any) -> Labels:
        inner = self.labels(agg.expr) or frozenset()
        if agg.param is not None:
            self.labels(agg.param)
        op = str(agg.op)
        mod = agg.modifier
        if op in ("topk", "bottomk", "limitk", "limit_ratio"):
            if mod is not None:
                self.need(mod.labels, inner, f"{op} {mod.type}")
            return inner
        if mod is None:
            out: Labels = frozenset()
        elif str(mod.type) == "AggModifierType.By":
            self.need(mod.labels, inner, f"{op} by")
            out = frozenset(mod.labels)
        else:
            self.need(mod.labels, inner, f"{op} without")
            out = inner - set(mod.labels)
        if op == "count_values" and isinstance(agg.param, promql_parser.StringLiteral):
            out |= {agg.param.val}
        return out

    def binary(self, b: Any) -> Labels | None:
        lhs, rhs = self.labels(b.lhs), self.labels(b.rhs)
        if lhs is None or rhs is None or self.unknown:
            return rhs if lhs is None else lhs  # scalar with vector: the vector's labels
        mod, op = b.modifier, str(b.op)
        matching = mod.matching if mod is not None else None
        card = str(mod.card) if mod is not None else "VectorMatchCardinality.OneToOne"
        on = matching is not None and str(matching.type) == "LabelModifierType.Include"
        listed = frozenset(matching.labels) if matching is not None else frozenset()
        if on:
            self.need(listed, lhs, f"{op} on (lhs)")
            self.need(listed, rhs, f"{op} on (rhs)")
        elif matching is not None:
            self.need(listed, lhs | rhs, f"{op} ignoring")
        if op in ("and", "or", "unless"):
            if not on and lhs - listed != rhs - listed:
                self.fail(f"{op}: sides carry different labels {sorted(lhs)} and {sorted(rhs)}: nothing matches")
            return lhs | rhs if op == "or" else lhs
        if card == "VectorMatchCardinality.OneToOne":
            if not on and lhs - listed != rhs - listed:
                self.fail(f"{op}: sides carry different labels {sorted(lhs)} and {sorted(rhs)}: nothing matches")
            return listed if on else lhs - listed
        if card == "VectorMatchCardinality.ManyToOne":  # group_left: copies labels from the rhs
            self.need(mod.group_labels, rhs, f"{op} group_left")
            return lhs | set(mod.group_labels)
        self.need(mod.group_labels, lhs, f"{op} group_right")
        return rhs | set(mod.group_labels)


PROMQL_WORDS = {
    *("and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right"),
    *("atan2", "inf", "nan", "start", "end"),
}
LIST_LABELS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
BRACES = re.compile(r"\{([^{}]*)\}")
STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
IDENT = re.compile(r"(?<![\w:.])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()")


def names_by_tokens(expr: str) -> tuple[set[str], set[str]]:
    """Without a parser: (metric names, label names) of one expression."""
    labels: set[str] = set()

    def take(pattern: str) -> Callable[[re.Match[str]], str]:
        def blank(m: re.Match[str]) -> str:
            labels.update(re.findall(pattern, m[1]))
            return " "

        return blank

    text = BRACES.sub(take(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)"), STRING.sub('""', expr))
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries: [5m], [1h:1m]
    text = LIST_LABELS.sub(take(r"[a-zA-Z_]\w*"), text)
    names = {n for n in IDENT.findall(text) if n not in PROMQL_WORDS and not re.fullmatch(r"\d\w*", n)}
    return names, labels - {"__name__"}


def problems(dash: dict[str, Any], scraped: dict[str, Labels], parser: Any = promql_parser) -> list[str]:
    """What in *dash* asks for a metric or a label the scrape does not have (*parser* None: by tokens)."""
    found: list[str] = []
    for v in variables(dash).values():
        if v["type"] != "query":
            continue
        m = LABEL_VALUES.match(variable_query(v))
        if not m:
            found.append(f"variable {v['name']}: not a label_values() query")
            continue
        selector, label = m[1], m[2]
        names = names_by_tokens(selector)[0] if selector else set(scraped)
        if not names <= scraped.keys():
            found.append(f"variable {v['name']}: metric(s) {sorted(names - scraped.keys())} not on /metrics")
        elif not any(label in scraped[n] for n in names):
            found.append(f"variable {v['name']}: label {label} not on {sorted(names)}")
    for where, expr, legend in queries(dash):
        promql = grafana_to_promql(expr)
        if parser is not None:
            try:
                tree = parser.parse(promql)
            except ValueError as e:
                found.append(f"{where}: does not parse: {e}")
                continue
            check = _Check(scraped, where)
            check.need(LEGEND_LABEL.findall(legend), check.labels(tree), "legend")
            found += check.problems
            continue
        names, labels = names_by_tokens(promql)
        unknown = names - scraped.keys()
        found += [f"{where}: metric {n} is not on /metrics" for n in sorted(unknown)]
        if not unknown:  # else the labels are unknown too: the missing metric is the one problem
            have = set().union(*(scraped[n] for n in names))
            labels |= set(LEGEND_LABEL.findall(legend))
            found += [f"{where}: label {la} on none of {sorted(names)}" for la in sorted(labels - have)]
    return found


@pytest.mark.slow
def test_every_query_asks_for_metrics_and_labels_that_exist(scrape: dict[str, Labels]) -> None:
    for name in ("oomguard_memory_working_set_bytes", "oomguard_memory_usage_bytes", "oomguard_node_up"):
        assert "node" in scrape.get(name, ()), f"{name}{{node}} is not on /metrics"
    assert problems(load(), scrape) == []


def test_every_metric_on_metrics_has_a_panel(scrape: dict[str, Labels]) -> None:
    """The other way round: each node series the manager serves is shown somewhere."""
    text = DASHBOARD.read_text()
    node_series = {n for n, labels in scrape.items() if "node" in labels}
    assert node_series and {n for n in node_series if n not in text} == set()


PLANTED = [
    ("oomguard_memory_working_set_bytes", "oomguard_memory_workingset_bytes", "workingset"),
    ("oomguard_oom_kills_total", "oomguard_oom_kills", "oomguard_oom_kills "),
    ("max by (node)", "max by (nodes)", "nodes"),
    ('node=~"$node"', 'host=~"$node"', "host"),
    ("{{node}}", "{{instance}}", "instance"),
]
WAYS = [pytest.param(promql_parser, id="parser"), pytest.param(None, id="tokens")]


@pytest.mark.parametrize("parser", WAYS)
@pytest.mark.parametrize(("old", "new", "wrong"), PLANTED, ids=[p[1] for p in PLANTED])
def test_the_check_finds_a_planted_mistake(
    scrape: dict[str, Labels], old: str, new: str, wrong: str, parser: Any
) -> None:
    """A copy of the dashboard with one mistake in one query: the check names the mistake and the query."""
    dash = load()
    bad = copy.deepcopy(dash)
    panel, target = next(
        (p, t)
        for p in all_panels(bad)
        for t in p.get("targets", [])
        if old in t["expr"] or old in t.get("legendFormat", "")
    )
    key = "expr" if old in target["expr"] else "legendFormat"
    target[key] = target[key].replace(old, new, 1)
    found = problems(bad, scrape, parser)
    assert found, f"{new!r} in panel {panel['id']} went unnoticed"
    assert all(f.startswith(f"panel {panel['id']} ") and wrong in f for f in found), found
    assert problems(dash, scrape, parser) == []


@pytest.mark.parametrize(
    ("expr", "said"),
    [
        ("max by (node) (oomguard_budget_bytes) > oomguard_manager_database_up", "nothing matches"),
        ("oomguard_budget_bytes / on (kind) oomguard_memory_effective_bytes", "label(s) ['kind'] not on"),
        ("sum(oomguard_node_up) by (node", "does not parse"),
    ],
)
def test_the_check_finds_a_planted_mismatch(scrape: dict[str, Labels], expr: str, said: str) -> None:
    if promql_parser is None:
        pytest.skip("needs promql-parser: label inference walks the syntax tree")
    bad = load()
    next(p for p in all_panels(bad) if p["type"] != "row")["targets"][0]["expr"] = expr
    found = problems(bad, scrape)
    assert found and all(said in f for f in found), found


def test_variable_query_is_checked(scrape: dict[str, Labels]) -> None:
    bad = load()
    variables(bad)["node"]["query"]["query"] = "label_values(oomguard_node_upp, node)"
    assert problems(bad, scrape) == ["variable node: metric(s) ['oomguard_node_upp'] not on /metrics"]
    variables(bad)["node"]["query"]["query"] = "label_values(oomguard_node_up, host)"
    assert problems(bad, scrape) == ["variable node: label host not on ['oomguard_node_up']"]


def test_parser_and_tokens_agree_on_names() -> None:
    """The fallback finds the same metric names as the parser, on every query of the dashboard."""
    if promql_parser is None:
        pytest.skip("needs promql-parser")
    for where, expr, _ in queries(load()):
        tree = promql_parser.parse(grafana_to_promql(expr))
        parsed: set[str] = set()

        def visit(node: Any, into: set[str] = parsed) -> None:
            if isinstance(node, promql_parser.VectorSelector) and node.name:
                into.add(node.name)

        promql_parser.walk(tree, pre_visit=visit)
        assert names_by_tokens(grafana_to_promql(expr))[0] == parsed, where


def test_tokens_skip_words_functions_strings_and_label_lists() -> None:
    expr = (
        'sum without (instance) (rate(a_total{node=~"b_c", x!="d e"}[5m] offset 1h)) '
        "/ on (node) group_left (kind) max by (node, kind) (f_bytes) > bool 0 and time() - g_seconds"
    )
    assert names_by_tokens(expr) == ({"a_total", "f_bytes", "g_seconds"}, {"instance", "node", "x", "kind"})


def test_readme_names_real_metrics_and_every_panel(scrape: dict[str, Labels]) -> None:
    text = README.read_text()
    used = set(re.findall(r"\boomguard_[a-z_]+[a-z]", text))
    assert used and used <= scrape.keys(), sorted(used - scrape.keys())
    for p in all_panels(load()):
        if p["type"] != "row":
            assert p["title"] in text, f"deploy/grafana/README.md does not explain {p['title']!r}"
    assert "deploy/prometheus/scrape.yml" in text


# --- a real Prometheus scrapes the manager and answers every query -----------------------------------

PROMETHEUS_BIN = shutil.which("prometheus")


def prom_get(base: str, path: str, **params: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{base}{path}?{urllib.parse.urlencode(params)}", timeout=10) as r:
        body: dict[str, Any] = json.load(r)
    assert body["status"] == "success", body
    return body


@pytest.fixture(scope="module")
def prometheus(fleet: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Debian's Prometheus, scraping the manager every second with deploy/prometheus/scrape.yml's job
    (its target and scheme changed for this test); an OOM kill lands between scrapes, so that
    increase() has something to count."""
    if PROMETHEUS_BIN is None:
        pytest.skip("needs Debian's prometheus (scripts/system-deps.sh installs it)")
    from tests.helpers.manager import VIEWER, free_port

    tmp = tmp_path_factory.mktemp("prometheus")
    (tmp / "token").write_text(VIEWER)
    (job,) = yaml.safe_load((REPO / "deploy" / "prometheus" / "scrape.yml").read_text())["scrape_configs"]
    job.update(scheme="http", scrape_interval="1s", static_configs=[{"targets": [fleet.url.split("//")[1]]}])
    job["authorization"]["credentials_file"] = str(tmp / "token")
    (tmp / "prometheus.yml").write_text(yaml.safe_dump({"scrape_configs": [job]}))
    port = free_port()
    with (tmp / "log").open("wb") as log:
        proc = subprocess.Popen(
            [
                PROMETHEUS_BIN,
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=log,
        )
    base = f"http://127.0.0.1:{port}"
    try:

        def scrapes() -> int:
            try:
                got = prom_get(base, "/api/v1/query", query="count_over_time(oomguard_node_up[1m])")
            except OSError:
                return 0
            return int(float(got["data"]["result"][0]["value"][1])) if got["data"]["result"] else 0

        def scraped_or_gone(n: int) -> bool:
            return scrapes() >= n or proc.poll() is not None

        for wanted in (2, 5):  # an OOM kill after the 2nd scrape: increase() over the range sees it
            wait_until(functools.partial(scraped_or_gone, wanted), interval=0.2, what=f"{wanted} scrapes")
            assert proc.poll() is None, (tmp / "log").read_text()[-3000:]
            if wanted == 2:
                exit_event(fleet.url, "oom-kill", 9)
        yield base
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.slow
def test_a_real_prometheus_answers_every_query(prometheus: str) -> None:
    """Every query as Grafana would send it ($node: All), evaluated by Prometheus itself over what it
    scraped from the manager: each one parses and returns at least one series."""
    dash = load()
    for where, expr, _ in queries(dash):
        promql = VARIABLE.sub(
            lambda m: {"__range": "5m", "__rate_interval": "1m", "__interval": "15s"}.get(m[1] or m[2], ".*"), expr
        )
        got = prom_get(prometheus, "/api/v1/query", query=promql)
        assert got["data"]["result"], f"{where}: no data for {promql}"
        assert not got.get("warnings"), (where, got["warnings"])
    m = LABEL_VALUES.match(variable_query(variables(dash)["node"]))
    assert m
    values = prom_get(prometheus, f"/api/v1/label/{m[2]}/values", **{"match[]": m[1]})["data"]
    assert values == ["node-a"]
