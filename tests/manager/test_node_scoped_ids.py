"""Ingest ids are the node's own (issue 37, item 6; revision 0011): node B's report, event or
observation whose id is node A's is stored, not dropped as a duplicate; a retry of one node's id
is still stored once. The store and the API on a real SQLite file and a real PostgreSQL server,
and the migration from 0010 with rows in place (the OOM-kill counters counted from them)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from fastapi.testclient import TestClient
from sqlalchemy import select, text

from oomguard.manager.app import create_app
from oomguard.manager.bodies import EventEnvelope, ObservationEnvelope
from oomguard.manager.db import alembic_config, current_revision, events, make_engine, migrate, observations, reports
from oomguard.manager.settings import Settings
from tests.helpers.manager import (
    AGENT_H,
    VIEWER,
    Clock,
    db_url_of,
    envelope,
    fixture_report,
    ingest,
    make_store,
    migrated_db,
    observation_body,
)

T0 = 1_800_000_000_000


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return migrated_db(request.param, tmp_path, "ids_")


def test_the_same_id_from_two_nodes_is_two_rows_and_a_retry_is_one(db_url: str) -> None:
    store = make_store(db_url, Clock(T0))

    def event(node: str, ingest_id: str) -> bool:
        env = EventEnvelope.model_validate({"node": node, "id": ingest_id, "event": {"event": "start"}})
        return asyncio.run(store.ingest_event_async(env, json.dumps(env.event.model_dump())))

    def observation(node: str, ingest_id: str) -> bool:
        body = {"node": node, "id": ingest_id, "observation": observation_body()}
        stored = asyncio.run(store.ingest_observation_async(ObservationEnvelope.model_validate(body)))
        assert isinstance(stored, bool), stored
        return stored

    def report(node: str, ingest_id: str) -> bool:
        return ingest(store, node, ingest_id=ingest_id)

    for write in (report, event):
        assert write("node-a", "same-id") and write("node-b", "same-id")  # B's id equal to A's: stored
        assert not write("node-a", "same-id") and not write("node-b", "same-id")  # each one's retry: once
    assert observation("node-a", "same-id") and observation("node-b", "same-id")
    assert not observation("node-b", "same-id")
    with store.engine.connect() as conn:
        for table in (reports, events, observations):
            assert conn.execute(select(table.c.ingest_id)).scalars().all() == ["same-id", "same-id"]
    for node in ("node-a", "node-b"):  # and each node's latest report is its own
        detail = store.node_detail(node)
        assert detail is not None and [e["event"] for e in detail["events"]] == ["start"]
        assert detail["effective_bytes"] == fixture_report()["memory"]["effective_bytes"]


def test_one_batch_holding_two_nodes_with_one_id_stores_both(db_url: str) -> None:
    """Reports share a commit (the group committer's bulk write): the batch tells them apart by node."""
    store = make_store(db_url, Clock(T0))
    from oomguard.manager.bodies import ReportEnvelope

    async def both() -> list[bool]:
        report = fixture_report()
        envs = [ReportEnvelope.model_validate({**envelope(n, report), "id": "r-1"}) for n in ("x", "y", "x")]
        return list(await asyncio.gather(*(store.ingest_report_async(e, json.dumps(e.report)) for e in envs)))

    assert sorted(asyncio.run(both())) == [False, True, True]
    with store.engine.connect() as conn:
        assert conn.execute(select(reports.c.ingest_id)).scalars().all() == ["r-1", "r-1"]


def test_the_api_answers_stored_true_for_another_nodes_id(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'api.db'}"
    migrate(url)
    app = create_app(Settings(db_url=url, agent_token="agent-secret-token", viewer_token=VIEWER))
    with TestClient(app, base_url="http://localhost") as c:
        for node, stored in (("a", True), ("b", True), ("b", False)):
            body = {**envelope(node, fixture_report()), "id": "0001"}
            r = c.post("/api/v1/reports", json=body, headers=AGENT_H)
            assert r.status_code == 200 and r.json() == {"stored": stored, "id": "0001"}
            e = c.post(
                "/api/v1/events", json={"node": node, "id": "0001", "event": {"event": "start"}}, headers=AGENT_H
            )
            assert e.status_code == 200 and e.json()["stored"] is stored


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_revision_0011_keeps_the_rows_counts_the_kills_and_downgrades(kind: str, tmp_path: Path) -> None:
    url = db_url_of(kind, tmp_path, "m11_")
    migrate(url, "0010")
    engine = make_engine(url)
    rows: list[dict[str, Any]] = [
        {"n": 1, "id": "e-1", "reason": "oom-kill"},
        {"n": 1, "id": "e-2", "reason": "oom-kill"},
        {"n": 1, "id": "e-3", "reason": "exit"},
        {"n": 2, "id": "e-4", "reason": "pressure-stop"},
    ]
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO nodes (id, name, first_seen_ms, last_seen_ms) VALUES (1, 'a', 1, 1), (2, 'b', 1, 1)")
        )
        conn.execute(text("INSERT INTO reports (node_id, ingest_id, received_ms) VALUES (1, 'r-1', 1)"))
        for row in rows:
            conn.execute(
                text(
                    "INSERT INTO events (node_id, ingest_id, received_ms, kind, reason, body) "
                    "VALUES (:n, :id, 1, 'exit', :reason, '{}')"
                ),
                row,
            )
    migrate(url, "0011")
    assert current_revision(engine) == "0011"
    with engine.begin() as conn:
        counts = conn.execute(text("SELECT name, oom_kills_total, pressure_stops_total FROM nodes ORDER BY name"))
        assert counts.all() == [("a", 2, 0), ("b", 0, 1)]
        assert conn.execute(text("SELECT COUNT(*) FROM events")).scalar() == 4
        conn.execute(text("INSERT INTO reports (node_id, ingest_id, received_ms) VALUES (2, 'r-1', 2)"))  # b: A's id
    with pytest.raises(RuntimeError, match="1 ingest id of reports is held by more than one node"):
        command.downgrade(alembic_config(url), "0010")  # refused while two nodes hold one id, nothing changed
    assert current_revision(engine) == "0011"
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM reports WHERE node_id = 2"))
    command.downgrade(alembic_config(url), "0010")
    assert current_revision(engine) == "0010"
    with engine.connect() as conn:
        assert conn.execute(text("SELECT ingest_id FROM reports")).scalars().all() == ["r-1"]
    migrate(url, "0011")
    assert current_revision(engine) == "0011"
    engine.dispose()
