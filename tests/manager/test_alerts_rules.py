"""deploy/prometheus/oomguard-rules.yml: every expression parses as PromQL (promql-parser), names
only metrics a real manager serves, and the working-set and refused rules ask what the manager's
own alerts ask (the manager's line, the refused count)."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO
from tests.helpers.manager import AGENT, AGENT_H, VIEWER, VIEWER_H, envelope, fixture_report, local_client, migrated_db

RULES = REPO / "deploy" / "prometheus" / "oomguard-rules.yml"


def rules() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    return found


def served(tmp_path: Path) -> set[str]:
    """The metric names on a real manager's /metrics after a report at its working-set line and
    a refused gate."""
    from oomguard.manager.app import create_app
    from oomguard.manager.settings import Settings

    url = migrated_db("sqlite", tmp_path, "rules_")
    with local_client(create_app(Settings(db_url=url, agent_token=AGENT, viewer_token=VIEWER))) as c:
        high = fixture_report()
        high["memory"]["working_set_bytes"] = high["memory"]["effective_bytes"]
        assert c.post("/api/v1/reports", json=envelope("n", high), headers=AGENT_H).is_success
        gate = {"event": "gate", "step": "check", "passed": False, "exit_code": 3, "message": "x"}
        body = {"node": "g", "id": uuid.uuid4().hex, "event": gate}
        assert c.post("/api/v1/events", json=body, headers=AGENT_H).is_success
        text = c.get("/metrics", headers=VIEWER_H).text
    return set(re.findall(r"^(oomguard_\w+?)(?:\{| )", text, re.M))


def test_every_rule_parses_and_names_served_metrics(tmp_path: Path) -> None:
    promql_parser = pytest.importorskip("promql_parser")
    names = served(tmp_path)
    for rule in rules():
        tree = promql_parser.parse(rule["expr"])
        used: set[str] = set()

        def visit(node: Any, used: set[str] = used) -> bool:
            if isinstance(node, promql_parser.VectorSelector) and node.name:
                used.add(node.name)
            return True

        promql_parser.walk(tree, pre_visit=visit)
        assert {n for n in used if n.startswith("oomguard_")} <= names, (rule["alert"], used - names)


def test_the_working_set_rule_uses_the_managers_line_and_the_budget() -> None:
    rule = next(r for r in rules() if r["alert"] == "OomguardWorkingSetHigh")
    assert "oomguard_memory_working_set_high_since_timestamp_seconds" in rule["expr"]  # the manager's own alert
    assert rule["labels"]["severity"] == "critical"
    refused = next(r for r in rules() if r["alert"] == "OomguardNodeRefused")
    assert 'oomguard_nodes{state="refused"}' in refused["expr"]
