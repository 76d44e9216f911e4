"""What one node may add (issue 37, item 3): its events and observations a minute are capped
(``--max-events-per-node``, ``--max-observations-per-node``: 429 with ``Retry-After`` and one line,
counted in /metrics, the first of an episode logged), and retention takes every event at
``--retention``, OOM kills too, while the node's counters keep them. The app in process on a real
SQLite file (and the retention on PostgreSQL too); the settings through the real command line."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from oomguard.manager.app import create_app
from oomguard.manager.bodies import EventEnvelope
from oomguard.manager.db import events, migrate, nodes
from oomguard.manager.retention import HOUR_MS
from oomguard.manager.settings import EVENTS_PER_NODE, OBSERVATIONS_PER_NODE, Settings, settings_from
from oomguard.manager.web.credentials import node_token
from oomguard.manager.web.quotas import NodeQuota
from tests.helpers.manager import (
    Clock,
    envelope,
    fixture_report,
    make_store,
    migrated_db,
    observation_body,
    refused_at_start,
)

SECRET = "fleet-secret-0123456789abcdef"
VIEWER = "viewer-secret-token"
EVENTS, OBSERVATIONS, REPORTS = "/api/v1/events", "/api/v1/observations", "/api/v1/reports"
DAY_MS = 24 * HOUR_MS


def token(node: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {node_token(SECRET, node)}"}


def client(tmp_path: Path, **settings: Any) -> TestClient:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    migrate(url)
    app = create_app(Settings(db_url=url, fleet_secrets=(SECRET,), viewer_token=VIEWER, **settings))
    return TestClient(app, base_url="http://localhost")


def post_event(c: TestClient, node: str, event: dict[str, Any]) -> Any:
    return c.post(EVENTS, json={"node": node, "id": uuid.uuid4().hex, "event": event}, headers=token(node))


def stored_events(c: TestClient, node: str) -> int:
    return int(c.get(f"/api/v1/nodes/{node}/events", headers={"Authorization": f"Bearer {VIEWER}"}).json()["total"])


def refusals(c: TestClient, kind: str) -> float:
    text = c.get("/metrics", headers={"Authorization": f"Bearer {VIEWER}"}).text
    line = next(
        li for li in text.splitlines() if li.startswith(f'oomguard_manager_quota_refusals_total{{kind="{kind}"}}')
    )
    return float(line.split()[-1])


def test_a_node_past_its_events_a_minute_gets_429_with_retry_after(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="oomguard.manager.quotas"), client(tmp_path, max_events_per_node=3) as c:
        assert refusals(c, "events") == refusals(c, "observations") == 0  # both kinds there from the start
        assert post_event(c, "noisy", {"event": "start"}).status_code == 200
        assert post_event(c, "noisy", {"event": "heartbeat", "interval_s": 60}).status_code == 200  # counts too
        assert post_event(c, "noisy", {"event": "exit", "reason": "oom-kill"}).status_code == 200
        for _ in range(5):
            r = post_event(c, "noisy", {"event": "exit", "reason": "oom-kill"})
            assert r.status_code == 429, r.text
            assert 1 <= int(r.headers["retry-after"]) <= 20  # one more every 60 / 3 s
            detail = r.json()["detail"]
            assert detail == (
                "this node may send at most 3 events a minute (--max-events-per-node); try again after Retry-After"
            )
        assert stored_events(c, "noisy") == 2  # the refused ones were never written (a heartbeat is no row)
        assert post_event(c, "quiet", {"event": "start"}).status_code == 200  # another node has its own
        r = c.post(
            OBSERVATIONS,
            json={"node": "noisy", "id": "o-1", "observation": observation_body()},
            headers=token("noisy"),
        )
        assert r.status_code == 200  # observations are counted apart
        assert refusals(c, "events") == 5 and refusals(c, "observations") == 0
        wrong = c.post(EVENTS, json={"node": "noisy", "id": "x", "event": {"event": "start"}}, headers=token("quiet"))
        assert wrong.status_code == 403  # another node's token: refused before it costs anything
    said = [r.getMessage() for r in caplog.records if r.name == "oomguard.manager.quotas"]
    assert said == [
        "oomguard manager: node noisy is over its quota of 3 events a minute (--max-events-per-node); answering 429"
    ]  # once for the episode, not once a refusal


def test_a_node_past_its_observations_a_minute_gets_429(tmp_path: Path) -> None:
    with client(tmp_path, max_observations_per_node=2) as c:
        assert c.post(REPORTS, json=envelope("lab", fixture_report()), headers=token("lab")).status_code == 200
        statuses = []
        for i in range(4):
            body = {"node": "lab", "id": f"o-{i}", "observation": observation_body()}
            statuses.append(c.post(OBSERVATIONS, json=body, headers=token("lab")))
        assert [r.status_code for r in statuses] == [200, 200, 429, 429]
        assert "--max-observations-per-node" in statuses[2].json()["detail"]
        assert int(statuses[2].headers["retry-after"]) in range(1, 31)
        bad = {"node": "lab", "id": "o-9", "observation": observation_body(concurrency=10**6)}
        assert c.post(OBSERVATIONS, json=bad, headers=token("lab")).status_code == 422  # checked first: no cost
        assert refusals(c, "observations") == 2


def test_the_bucket_refills_at_its_rate_and_forgets_the_oldest_nodes() -> None:
    quota = NodeQuota("events", 6, "--max-events-per-node")  # one more every 10 s
    assert [quota.take("n", now=100.0) for _ in range(7)] == [0, 0, 0, 0, 0, 0, 10]
    assert quota.take("n", now=104.0) == 6  # the wait left
    assert quota.take("n", now=110.0) == 0 and quota.take("n", now=110.0) == 10
    assert quota.take("n", now=200.0) == 0  # refilled, never above the minute's count
    assert [quota.take("n", now=200.0) for _ in range(6)] == [0, 0, 0, 0, 0, 10]
    assert quota.refused == 4


def test_the_defaults_take_a_crash_looping_node_without_a_refusal() -> None:
    """16 supervisors on one node, their workers crashing at once and restarting with the default
    backoff (1 s, doubling, at most 300 s) for two hours: three events a restart, a heartbeat a
    minute each, an observation a worker run. None of it is refused at the default quotas."""
    events_quota = NodeQuota("events", EVENTS_PER_NODE, "--max-events-per-node")
    observations_quota = NodeQuota("observations", OBSERVATIONS_PER_NODE, "--max-observations-per-node")
    restarts, t, delay = [], 0.0, 1.0
    while t < 2 * 3600:
        t += delay
        restarts.append(t)
        delay = min(delay * 2, 300.0)
    items = [(at, "event") for at in restarts for _ in range(3)] + [(at, "observation") for at in restarts]
    items += [(m * 60.0, "event") for m in range(120)]  # heartbeats
    waits = []
    for at, kind in sorted(items * 16):
        quota = events_quota if kind == "event" else observations_quota
        waits.append(quota.take("node", now=1000.0 + at))
    assert not any(waits), waits.count(0)


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {"OOMGUARD_MAX_EVENTS_PER_NODE": "0"}, "--max-events-per-node: must be 1 to 1000000, got 0"),
        ([], {"OOMGUARD_MAX_OBSERVATIONS_PER_NODE": "many"}, "OOMGUARD_MAX_OBSERVATIONS_PER_NODE: expected a whole"),
    ],
)
def test_bad_quotas_are_one_line_exit_2(
    tmp_path: Path,
    argv: list[str],
    env: dict[str, str],
    message: str,
    clean_env: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    refused_at_start(tmp_path, argv, env, message, monkeypatch, capsys)


def test_the_quotas_come_from_their_flags_else_their_variables(
    clean_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert (Settings().max_events_per_node, Settings().max_observations_per_node) == (300, 120)
    monkeypatch.setenv("OOMGUARD_MAX_EVENTS_PER_NODE", "50")
    monkeypatch.setenv("OOMGUARD_MAX_OBSERVATIONS_PER_NODE", "7")
    settings = settings_from(argparse.Namespace())
    assert (settings.max_events_per_node, settings.max_observations_per_node) == (50, 7)
    flags = argparse.Namespace(max_events_per_node="900", max_observations_per_node="9")  # a flag beats its variable
    settings = settings_from(flags)
    assert (settings.max_events_per_node, settings.max_observations_per_node) == (900, 9)


# -- retention: every event expires, the counters stay -------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return migrated_db(request.param, tmp_path, "q_")


def test_fake_oom_kills_expire_at_the_retention_and_the_counter_never_goes_down(db_url: str) -> None:
    """Issue 37: a node's OOM-kill events were kept for ever, so fake ones grew the database without
    end. They expire now like every event; ``oomguard_oom_kills_total`` reads the node's counter."""
    now = 1_800_000_000_000
    clock = Clock(now - 40 * DAY_MS)
    store = make_store(db_url, clock, retention_s=30 * 86400, forget_after_s=None)

    def event(ingest_id: str, **fields: Any) -> bool:
        env = EventEnvelope.model_validate({"node": "n", "id": ingest_id, "event": {"event": "exit", **fields}})
        return asyncio.run(store.ingest_event_async(env, json.dumps(env.event.model_dump())))

    for i in range(5):
        assert event(f"fake-{i}", reason="oom-kill")
    assert event("stop", reason="pressure-stop") and event("plain", reason="exit")
    assert not event("fake-0", reason="oom-kill")  # a retry of a stored id: counted once
    clock.t = now - 2 * DAY_MS
    assert event("recent", reason="oom-kill")
    clock.t = now
    assert store.thin()["expired_events"] == 7
    with store.engine.connect() as conn:
        assert list(conn.execute(select(events.c.ingest_id)).scalars()) == ["recent"]
        assert conn.execute(select(func.count()).select_from(nodes)).scalar() == 1
    (row,) = store.metric_rows()
    assert (row["oom_kills_total"], row["pressure_stops_total"]) == (6, 1)


def test_quota_refusals_are_logged_once_an_episode() -> None:
    quota = NodeQuota("observations", 1, "--max-observations-per-node")
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("oomguard.manager.quotas")
    logger.addHandler(handler)
    try:
        assert quota.take("a", now=0.0) == 0
        assert quota.take("a", now=1.0) == 59 and quota.take("a", now=2.0) == 58  # one line for both
        assert quota.take("a", now=70.0) == 0  # the episode ended: allowed again
        assert quota.take("a", now=71.0) == 59  # a new episode, a new line
    finally:
        logger.removeHandler(handler)
    assert len(records) == 2 and all("node a is over its quota of 1 observations a minute" in r for r in records)
