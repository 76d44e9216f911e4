"""CuZK's own view beside the kernel's, in the manager (issue 34, item 4): the report's ``consumers``
(``agent --cuzk-status``) kept in ``nodes.consumers`` and ``nodes.consumer_budget_bytes`` (revision
0009), the ``consumer-budget-above-limit`` alert, ``oomguard_consumer_*_bytes`` on /metrics and the
node page's lines; on a real SQLite file and a real PostgreSQL, with the consumer polled from a real
server on 127.0.0.1 answering as CuZK's does (tests/helpers/cuzk.py)."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, text

from oomguard.agent.consumers import check_status_url, poll_cuzk
from oomguard.manager.alerts import KINDS, node_alerts
from oomguard.manager.app import create_app
from oomguard.manager.db import current_revision, make_engine, migrate, nodes
from oomguard.manager.settings import Settings
from tests.conftest import run_oomguard
from tests.helpers.cuzk import FakeCuzk, fake_cuzk, status_fixture
from tests.helpers.manager import (
    AGENT,
    AGENT_H,
    VIEWER,
    VIEWER_H,
    Clock,
    ManagerProcess,
    db_url_of,
    envelope,
    fixture_report,
    local_client,
    make_store,
)

GiB = 1 << 30
KIND = "consumer-budget-above-limit"
LIMIT = 342 * GiB  # the default fixture: a 342 GiB v2 container on a 503 GiB host


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return db_url_of(request.param, tmp_path, "cz_")


@pytest.fixture
def client(db_url: str) -> Iterator[TestClient]:
    migrate(db_url)
    settings = Settings(db_url=db_url, agent_token=AGENT, viewer_token=VIEWER)
    with local_client(create_app(settings)) as c:
        yield c


def served(total: int | None = None, used: int | None = None) -> bytes:
    """CuZK's answer (the fixture) with its budget (and use) changed, as another host's would be."""
    s = status_fixture()
    if total is not None:
        s["memory"]["total_bytes"] = total
        s["memory"]["used_bytes"] = used if used is not None else min(s["memory"]["used_bytes"], total)
        s["memory"]["available_bytes"] = total - s["memory"]["used_bytes"]
    return json.dumps(s).encode()


def report_with(cuzk: FakeCuzk, **fixture: Any) -> dict[str, Any]:
    """The agent's report: the probe's (a fixture tree's) and CuZK's view, polled for real."""
    report = fixture_report(**fixture)
    report["consumers"] = [poll_cuzk(check_status_url(cuzk.url))]
    return report


def send(c: TestClient, node: str, report: dict[str, Any]) -> None:
    r = c.post("/api/v1/reports", json=envelope(node, report, interval_s=30), headers=AGENT_H)
    assert r.status_code == 200 and r.json()["stored"], r.text


def kinds_of(c: TestClient, node: str) -> list[str]:
    return [a["kind"] for a in c.get(f"/api/v1/nodes/{node}", headers=VIEWER_H).json()["open_alerts"]]


def consumer_lines(c: TestClient) -> list[str]:
    body = c.get("/metrics", headers=VIEWER_H).text
    return sorted(line for line in body.splitlines() if line.startswith("oomguard_consumer_"))


def test_the_alert_fires_on_the_outage_and_clears_when_the_budget_fits(client: TestClient) -> None:
    """The outage: CuZK on a 503 GiB host inside a 342 GiB container budgets 498 GiB ("auto")."""
    with fake_cuzk() as cuzk:
        send(client, "prover-1", report_with(cuzk))
    (alert,) = [a for a in client.get("/api/v1/alerts", headers=VIEWER_H).json()["alerts"] if a["kind"] == KIND]
    assert alert == {
        "node": "prover-1",
        "kind": KIND,
        "severity": "critical",
        "message": "a consumer's own budget (cuzk: 498 GiB) is above the effective limit 342 GiB: it plans on "
        "memory the kernel will not give it and is OOM-killed before its budget runs out",
        "since": None,
    }
    assert KIND in kinds_of(client, "prover-1")
    assert consumer_lines(client) == [
        'oomguard_consumer_budget_bytes{consumer="cuzk",node="prover-1"} 5.34723428352e+11',
        'oomguard_consumer_used_bytes{consumer="cuzk",node="prover-1"} 1.97939314688e+11',
    ]
    # CuZK restarted with an explicit total_budget that fits: the next report clears the alert
    with fake_cuzk(served(total=300 * GiB, used=120 * GiB)) as cuzk:
        send(client, "prover-1", report_with(cuzk))
    assert KIND not in kinds_of(client, "prover-1")
    assert consumer_lines(client) == [
        'oomguard_consumer_budget_bytes{consumer="cuzk",node="prover-1"} 3.221225472e+11',
        'oomguard_consumer_used_bytes{consumer="cuzk",node="prover-1"} 1.2884901888e+11',
    ]


@pytest.mark.parametrize(("total", "fires"), [(LIMIT - 1, False), (LIMIT, False), (LIMIT + 1, True)])
def test_the_alert_is_strictly_above_the_limit_of_the_same_report(client: TestClient, total: int, fires: bool) -> None:
    with fake_cuzk(served(total=total)) as cuzk:
        send(client, "p", report_with(cuzk))
    assert (KIND in kinds_of(client, "p")) is fires
    groups = client.get("/api/v1/alerts", headers=VIEWER_H).json()["alerts"]
    assert any(a["kind"] == KIND for a in groups) is fires


def test_unknown_values_export_nothing_and_raise_no_alert(client: TestClient) -> None:
    with fake_cuzk(mode="garbage") as cuzk:
        send(client, "garbled", report_with(cuzk))
    with fake_cuzk() as cuzk:
        dead = report_with(cuzk)  # polled while up ...
    dead["consumers"] = [poll_cuzk(check_status_url(cuzk.url))]  # ... and again once it is gone
    assert dead["consumers"][0]["error"] == "unreachable: connection refused"
    send(client, "down", dead)
    send(client, "older-agent", fixture_report())  # no consumers at all
    assert consumer_lines(client) == []  # never 0 or +Inf for unknown
    for node in ("garbled", "down", "older-agent"):
        assert KIND not in kinds_of(client, node)
        assert client.get(f"/nodes/{node}", headers=VIEWER_H).status_code == 200
    page = client.get("/nodes/down", headers=VIEWER_H).text
    assert "unknown: unreachable: connection refused" in page
    assert "cuzk</b>&#39;s own view" in page or "cuzk</b>'s own view" in page
    assert "own view" not in client.get("/nodes/older-agent", headers=VIEWER_H).text


def test_the_node_page_shows_budget_used_and_available_beside_the_limit(client: TestClient) -> None:
    with fake_cuzk() as cuzk:
        send(client, "prover-1", report_with(cuzk))
        url = check_status_url(cuzk.url)
    page = client.get("/nodes/prover-1", headers=VIEWER_H).text
    line = re.sub(r"<[^>]+>", "", re.search(r'<p class="consumer">(.*?)</p>', page, re.S)[1])  # type: ignore[index]
    assert " ".join(line.split()) == (
        f"cuzk's own view ({url}): budget 498 GiB above the 342 GiB limit · used 184.35 GiB · available 313.65 GiB"
    )
    assert '<b class="bad">498 GiB</b>' in page


def test_the_used_bytes_are_a_reading_only_while_the_report_is_current(db_url: str) -> None:
    migrate(db_url)
    clock = Clock(1_800_000_000_000)
    store = make_store(db_url, clock, default_interval_s=30)
    app = create_app(Settings(db_url=db_url, agent_token=AGENT, viewer_token=VIEWER), store)
    with local_client(app) as c, fake_cuzk() as cuzk:
        send(c, "p", report_with(cuzk))
        assert len(consumer_lines(c)) == 2
        clock.t += 3 * 30_000 + 1  # three intervals without a report: offline
        assert [line.split("{")[0] for line in consumer_lines(c)] == ["oomguard_consumer_budget_bytes"]


def test_the_message_on_one_node_row() -> None:
    row = {
        "name": "n",
        "status": "online",
        "effective_bytes": LIMIT,
        "host_total_bytes": 503 * GiB,
        "budget_bytes": 332 * GiB,
        "warnings": "[]",
        "last_seen_ms": 0,
    }
    assert node_alerts(row, 0) == []  # an older manager's row, an older agent's report: no consumer
    listed = [
        {"name": "cuzk", "budget_bytes": 498 * GiB},
        {"name": "other", "budget_bytes": 100 * GiB},
        {"name": "third", "budget_bytes": None},
    ]
    over = {**row, "consumer_budget_bytes": 498 * GiB, "consumers": json.dumps(listed)}
    (alert,) = node_alerts(over, 0)
    assert alert["kind"] == KIND and alert["severity"] == KINDS[KIND] == "critical"
    assert alert["message"].startswith("a consumer's own budget (cuzk: 498 GiB) is above the effective limit 342 GiB")
    unnamed = node_alerts({**over, "consumers": "not json"}, 0)[0]["message"]  # the column's text, whatever it is
    assert unnamed.startswith("a consumer's own budget (498 GiB) is above")
    assert node_alerts({**over, "effective_bytes": None}, 0) == []  # the limit unknown: no alert
    assert node_alerts({**over, "consumer_budget_bytes": LIMIT}, 0) == []  # at the limit: not above
    assert node_alerts({**over, "status": "archived"}, 0) == []


def test_the_columns_keep_the_largest_known_budget(db_url: str) -> None:
    migrate(db_url)
    with local_client(create_app(Settings(db_url=db_url, agent_token=AGENT, viewer_token=VIEWER))) as c:
        report = fixture_report()
        report["consumers"] = [
            {"name": "cuzk", "url": "http://a/status", "budget_bytes": 100, "used_bytes": 1, "available_bytes": 99}
            | {"error": None},
            {"name": "cuzk2", "url": "http://b/status", "budget_bytes": None, "used_bytes": None}
            | {"available_bytes": None, "error": "memory: missing"},
            {"name": "cuzk3", "url": "http://c/status", "budget_bytes": 300, "used_bytes": 2, "available_bytes": 298}
            | {"error": None},
        ]
        send(c, "n", report)
        bad = fixture_report()
        bad["consumers"] = [{"name": "cuzk", "url": "u", "budget_bytes": 2**63}]
        r = c.post("/api/v1/reports", json=envelope("m", bad), headers=AGENT_H)
        assert r.status_code == 422 and "consumers" in r.json()["detail"]
    engine = make_engine(db_url)
    with engine.connect() as conn:
        kept, largest = conn.execute(select(nodes.c.consumers, nodes.c.consumer_budget_bytes)).one()
    engine.dispose()
    assert largest == 300
    assert json.loads(kept) == [
        {"name": "cuzk", "budget_bytes": 100, "used_bytes": 1, "available_bytes": 99},
        {"name": "cuzk2", "budget_bytes": None, "used_bytes": None, "available_bytes": None},
        {"name": "cuzk3", "budget_bytes": 300, "used_bytes": 2, "available_bytes": 298},
    ]


def test_revision_0009_upgrades_a_fleet_and_downgrades(db_url: str) -> None:
    """The columns arrive NULL on the nodes of an 0008 database (no alert, no series), fill from the
    next report, and go again on a downgrade."""
    migrate(db_url, "0008")
    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO nodes (name, first_seen_ms, last_seen_ms, effective_bytes, budget_bytes, warnings) "
                "VALUES ('old-node', 1, :t, :limit, 90, '[]')"
            ),
            {"t": int(time.time() * 1000), "limit": LIMIT},
        )
    migrate(db_url)
    assert current_revision(engine) == head_revision(db_url)  # 0009, and any revision after it
    with engine.connect() as conn:
        assert conn.execute(select(nodes.c.consumers, nodes.c.consumer_budget_bytes)).one() == (None, None)
    with local_client(create_app(Settings(db_url=db_url, agent_token=AGENT, viewer_token=VIEWER))) as c:
        assert consumer_lines(c) == [] and KIND not in kinds_of(c, "old-node")
        with fake_cuzk() as cuzk:
            send(c, "old-node", report_with(cuzk))
        assert KIND in kinds_of(c, "old-node")
    migrate_down(db_url, "0008")
    assert current_revision(engine) == "0008"
    with engine.connect() as conn:
        assert conn.execute(text("SELECT effective_bytes FROM nodes WHERE name = 'old-node'")).scalar() == LIMIT
    engine.dispose()


def head_revision(url: str) -> str | None:
    from alembic.script import ScriptDirectory

    from oomguard.manager.db import alembic_config

    return ScriptDirectory.from_config(alembic_config(url)).get_current_head()


def migrate_down(url: str, revision: str) -> None:
    from alembic import command

    from oomguard.manager.db import alembic_config

    command.downgrade(alembic_config(url), revision)


# --- the whole way: oomguard agent --cuzk-status into oomguard manager, both real processes -------


def _get(server: ManagerProcess, path: str) -> Any:
    with urllib.request.urlopen(urllib.request.Request(server.url + path, headers=VIEWER_H), timeout=10) as r:
        data = r.read().decode()
    return data if path == "/metrics" else json.loads(data)


@pytest.mark.slow
def test_the_agent_reports_cuzks_view_to_a_real_manager(db_url: str, tmp_path: Path) -> None:
    """The agent probes this machine (its effective limit, whatever it is), polls the CuZK stand-in
    and sends both; the manager alerts while the consumer's budget is above that limit, within the
    report that said so, and not once it is at the limit."""
    migrate(db_url)
    server = ManagerProcess(db_url).start()
    try:

        def agent(cuzk: FakeCuzk) -> dict[str, Any]:
            proc = run_oomguard(
                "agent",
                *("--once", "--no-gpu", "--node", "e2e", "--manager", server.url, "--token", AGENT),
                *("--spool", str(tmp_path / "spool"), "--cuzk-status", cuzk.url),
            )
            assert proc.returncode == 0, proc.stderr
            node: dict[str, Any] = _get(server, "/api/v1/nodes/e2e")
            return node

        with fake_cuzk() as cuzk:
            node = agent(cuzk)
        limit = node["effective_bytes"]
        assert node["latest"]["consumers"][0]["budget_bytes"] == 498 * GiB
        assert (KIND in [a["kind"] for a in node["open_alerts"]]) is (limit is not None and 498 * GiB > limit)
        assert 'oomguard_consumer_budget_bytes{consumer="cuzk",node="e2e"} 5.34723428352e+11' in _get(
            server, "/metrics"
        )
        if limit is None:
            return  # no limit known on this machine: nothing to compare with
        with fake_cuzk(served(total=limit + 1)) as cuzk:
            assert KIND in [a["kind"] for a in agent(cuzk)["open_alerts"]]
        with fake_cuzk(served(total=limit)) as cuzk:
            assert KIND not in [a["kind"] for a in agent(cuzk)["open_alerts"]]
    finally:
        server.stop()
