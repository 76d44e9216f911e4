"""The report as the manager takes it: schema.json applied by the manager's one validator
(``manager/reportschema.py``, standard library), checked against the reference implementation
(``jsonschema``) on real and broken reports; the manager's own needs (``manager/contract.py``),
and the fields it keeps in columns.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oomguard.manager import contract, reportschema
from oomguard.policy.plan import Shape, make_plan
from tests.helpers.fuzz import examples
from tests.helpers.manager import fixture_report, json_paths

SCHEMA = reportschema.schema()
STRICT = jsonschema.Draft202012Validator(SCHEMA)
BASE = fixture_report()


def _relaxed(node: Any) -> Any:
    """schema.json as ``reportschema``'s relaxed mode reads it: nothing required, unknown fields allowed."""
    if isinstance(node, dict):
        return {
            k: _relaxed(v)
            for k, v in node.items()
            if k != "required" and not (k == "additionalProperties" and v is False)
        }
    if isinstance(node, list):
        return [_relaxed(v) for v in node]
    return node


RELAXED = jsonschema.Draft202012Validator(_relaxed(SCHEMA))


PATHS = json_paths(BASE)
VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63) + 1, max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(["cgroup-v2", "docker", "memlock-too-low", "", "auto"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8,
)


@st.composite
def broken_reports(draw: st.DrawFn) -> dict[str, Any]:
    """The fixture's real report with a few values replaced, a few keys dropped or added."""
    report = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from(PATHS))
        node: Any = report
        for step in path[:-1]:
            if not isinstance(node, dict | list) or (isinstance(node, dict) and step not in node):
                break
            if isinstance(node, list) and not (isinstance(step, int) and step < len(node)):
                break
            node = node[step]
        else:
            last = path[-1]
            if isinstance(node, dict) and draw(st.booleans()) and last in node:
                del node[last]
            elif isinstance(node, dict):
                node[draw(st.sampled_from([last, "unknown_field"]))] = draw(VALUES)
            elif isinstance(node, list) and isinstance(last, int) and last < len(node):
                node[last] = draw(VALUES)
    return report


def test_schema_json_uses_only_keywords_the_validator_implements() -> None:
    unknown = reportschema.keywords_used() - reportschema.KEYWORDS - reportschema.ANNOTATIONS
    assert unknown == set(), "reportschema.py does not implement these keywords schema.json now uses"


def test_a_real_report_fits_strictly_and_as_the_manager_takes_it() -> None:
    assert STRICT.is_valid(BASE)
    assert reportschema.problem(BASE, relaxed=False) is None
    assert contract.problem(BASE) is None


@given(report=broken_reports())
@settings(max_examples=examples(300), deadline=None, suppress_health_check=list(HealthCheck))
def test_the_validator_agrees_with_jsonschema_strict_and_relaxed(report: dict[str, Any]) -> None:
    assert (reportschema.problem(report, relaxed=False) is None) == STRICT.is_valid(report)
    assert (reportschema.problem(report) is None) == RELAXED.is_valid(report)
    kept = reportschema.conform_report(report)  # what the templates see always fits
    assert RELAXED.is_valid(kept)


def _without(report: dict[str, Any], *path: str) -> dict[str, Any]:
    out = copy.deepcopy(report)
    node = out
    for step in path[:-1]:
        node = node[step]
    node.pop(path[-1], None)
    return out


def test_older_and_newer_agents_reports_are_taken() -> None:
    planned = copy.deepcopy(BASE)
    planned["plan"] = make_plan(planned, Shape(8 << 30, pinned_per_job=1 << 30))  # type: ignore[arg-type]
    assert STRICT.is_valid(planned) and "pin_method" in planned["plan"]["shape"]
    older = _without(_without(planned, "plan", "shape", "pin_method"), "memlock", "probe")
    assert contract.problem(older) is None  # fields added later: missing in an older agent's report
    newer = copy.deepcopy(BASE)
    newer["memory"]["a_later_field_bytes"] = 5
    newer["a_later_section"] = {"x": [1]}
    assert contract.problem(newer) is None  # fields the schema does not know yet: kept as sent
    assert contract.problem({"schema_version": 1, "memory": {}}) is None


@pytest.mark.parametrize(
    ("report", "why"),
    [
        ({"memory": {}}, "report: schema_version is missing"),
        ({"schema_version": 1}, "report: memory is missing"),
        ({"schema_version": 0, "memory": {}}, "report.schema_version: minimum 1"),
        ({"schema_version": 1, "memory": {"effective_bytes": -1}}, "report.memory.effective_bytes: minimum 0"),
        ({"schema_version": 1, "memory": {"effective_bytes": 1e300}}, "report.memory.effective_bytes: maximum"),
        ({"schema_version": 1, "memory": {}, "plan": {"concurrency": 10**7}}, "report.plan.concurrency: maximum"),
        ({"schema_version": 1, "memory": {}, "warnings": [{"code": 'a"b'}]}, "report.warnings[0].code: does not"),
        ({"schema_version": 1, "memory": {}, "warnings": [{"message": "m"}]}, "report.warnings[0]: code is missing"),
        ({"schema_version": 1, "memory": {}, "gpus": [{"name": "x"}]}, "report.gpus[0]: index is missing"),
        ({"schema_version": 1, "memory": {}, "container": {"runtime": "rkt"}}, "report.container.runtime: not one"),
        ({"schema_version": 1, "memory": {}, "root": 5}, "report.root: expected string"),
        # A newer agent's report: only the fields kept in columns are held to schema.json.
        ({"schema_version": 2, "memory": {"usage_bytes": "5"}}, "report.memory.usage_bytes: expected integer"),
        ({"schema_version": 2, "memory": {}, "gpus": {}}, "report.gpus: expected array"),
    ],
)
def test_a_report_the_manager_refuses_says_where_and_why(report: dict[str, Any], why: str) -> None:
    problem = contract.problem(report)
    assert problem is not None and why in problem, problem


def test_a_newer_agents_other_fields_are_its_own() -> None:
    assert contract.problem({"schema_version": 2, "memory": {"cgroup": "v3"}, "root": 5, "cpu": []}) is None


def test_the_columns_of_a_report() -> None:
    report = copy.deepcopy(BASE)
    report["memory"]["usage_bytes"] = 5.0  # JSON's 5.0 is an integer: the column gets 5
    report["gpus"] = [{"index": 0, "name": "H100", "memory_total_bytes": 80 << 30, "uuid": "GPU-1"}]
    columns = contract.columns(report)
    assert set(columns) == {*contract.COLUMNS, *contract.LISTS}
    assert columns["effective_bytes"] == BASE["memory"]["effective_bytes"]
    assert columns["usage_bytes"] == 5 and isinstance(columns["usage_bytes"], int)
    assert columns["concurrency"] is None  # no plan
    assert columns["gpus"] == [{"index": 0, "name": "H100", "memory_total_bytes": 80 << 30, "memory_free_bytes": None}]
    assert columns["warnings"] == [w["code"] for w in BASE["warnings"]]
    for name, (section, field, _) in contract.COLUMNS.items():  # every column names a field of the schema
        assert field in SCHEMA["properties"][section]["properties"], name
