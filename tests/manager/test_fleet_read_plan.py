"""The fleet-wide reads' plans on a real PostgreSQL whose statistics lag the tables
(``db.fleet_read``): the trap bench/dashboard.py met at 100,000 nodes (66 s for the first page, a
503 after the 5 s statement timeout) rebuilt small. The events of an OOM storm arrive after the
last ANALYZE (here: none ever ran, and autovacuum is off for the two tables), so the planner
estimates the nodes' recent exits at 1 row and, left alone, joins every node to them in a nested
loop. The store's reads must not: each statement the overview, the node list, the alerts, the
cards and the metrics run is EXPLAINed as the store plans it (the statements caught as they run).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, insert, text

from oomguard.manager.alerts import HOUR_MS
from oomguard.manager.db import events as events_table
from oomguard.manager.db import fleet_read, make_engine, nodes
from oomguard.manager.store import Store
from tests.helpers.manager import migrated_db

NOW = 1_800_000_000_000
NODES = 2_000
STORM = 3  # OOM kills per node in the last hour


@pytest.fixture
def storm_url(tmp_path: Path) -> str:
    url = migrated_db("postgresql", tmp_path, "plan_")
    engine = make_engine(url)
    with engine.begin() as conn:
        for table in ("nodes", "events"):  # the statistics stay as they are: none
            conn.execute(text(f"ALTER TABLE {table} SET (autovacuum_enabled = false)"))
        base = {"first_seen_ms": NOW - HOUR_MS, "last_seen_ms": NOW, "interval_ms": 30_000, "warnings": "[]"}
        conn.execute(
            insert(nodes),
            [{**base, "id": i + 1, "name": f"node-{i:05d}", "effective_bytes": 1 << 30} for i in range(NODES)],
        )
        body = json.dumps({"event": "exit", "reason": "oom-kill"})
        conn.execute(
            insert(events_table),
            [
                {
                    "node_id": i + 1,
                    "ingest_id": f"e-{i}-{k}",
                    "received_ms": NOW - 60_000 * (k + 1),
                    "kind": "exit",
                    "reason": "oom-kill",
                    "body": body,
                }
                for i in range(NODES)
                for k in range(STORM)
            ],
        )
    engine.dispose()
    return url


def caught(store: Store) -> list[tuple[str, Any]]:
    """The statements the store's fleet-wide reads run, with their parameters; each ran with the
    fleet-read settings in effect (asked of its connection as it ran)."""
    seen: list[tuple[str, Any]] = []

    def catch(_conn: Any, cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "JOIN" in statement:
            seen.append((statement, parameters))
            setting = cursor.connection.execute("SHOW enable_nestloop").fetchone()[0]
            assert setting == "off", statement[:120]

    event.listen(store.engine, "before_cursor_execute", catch)
    try:
        listing = {"status": None, "q": None, "limit": 50, "offset": 0, "sort": "risk", "label": None}
        view = store.overview(listing, {"shown": 5, "show_all": "", "start": 0, "page": 500})
        assert view["summary"]["oom_kills_24h"] == NODES * STORM  # every kill counted once
        assert {g["kind"]: g["count"] for g in view["alerts"]["groups"]} == {"oom-kills": NODES}
        assert view["listing"]["total"] == NODES and len(view["listing"]["nodes"]) == 50
        assert {n["oom_kills_24h"] for n in view["listing"]["nodes"]} == {STORM}
        store.list_nodes(sort="-oom_kills_24h", limit=10)
        assert len(store.alerts()) == NODES
        store.alert_groups(5)
        store.summary()
        assert len(store.metric_rows()) == NODES
    finally:
        event.remove(store.engine, "before_cursor_execute", catch)
    return seen


def nested_loops(conn: Any, statements: list[tuple[str, Any]]) -> list[str]:
    """The statements whose plan on *conn* has a nested loop."""
    out = []
    for statement, parameters in statements:
        plan = "\n".join(conn.exec_driver_sql("EXPLAIN " + statement, parameters).scalars())
        if "Nested Loop" in plan:
            out.append(statement[:120])
    return out


def test_fleet_reads_do_not_nest_loops_on_statistics_that_lag(storm_url: str) -> None:
    store = Store(make_engine(storm_url), clock=lambda: NOW)
    try:
        check_plans(store)
    finally:
        store.engine.dispose()


def check_plans(store: Store) -> None:
    statements = caught(store)
    assert len(statements) >= 6, len(statements)
    with store.engine.connect() as conn:  # the planner left alone: the trap is there ...
        assert nested_loops(conn, statements), "the planner chose no nested loop: the trap is not rebuilt"
    with store.engine.connect() as conn:  # ... and the store's reads are planned out of it
        fleet_read(conn)
        assert conn.execute(text("SHOW enable_nestloop")).scalar_one() == "off"
        assert conn.execute(text("SHOW jit")).scalar_one() == "off"
        assert nested_loops(conn, statements) == []
    with store.engine.connect() as conn:  # SET LOCAL: the settings end with the read's transaction
        fleet_read(conn)
        conn.rollback()
        assert conn.execute(text("SHOW enable_nestloop")).scalar_one() == "on"
