"""Retention off the ingest path, receive-time rules and bounded history: the store against a real
SQLite file and a real PostgreSQL server, with the manager's clock under the test's control."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, select, text

from oomguard.manager.bodies import EventEnvelope
from oomguard.manager.db import current_revision, events, make_engine, migrate, nodes, reports
from oomguard.manager.retention import HOUR_MS, LOCK_KEY
from oomguard.manager.store import Store
from oomguard.manager.times import iso_ms
from tests.helpers.manager import Clock, fixture_report, ingest, make_store, migrated_db, pg_or_skip
from tests.helpers.pg import PostgresServer

MIN_MS = 60_000
DAY_MS = 24 * HOUR_MS


@pytest.fixture(scope="module")
def pg() -> PostgresServer:
    return pg_or_skip()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return migrated_db(request.param, tmp_path, "r_")


def event(store: Store, node: str, ingest_id: str, **fields: Any) -> bool:
    env = EventEnvelope.model_validate({"node": node, "id": ingest_id, "event": {"event": "exit", **fields}})
    return asyncio.run(store.ingest_event_async(env, json.dumps(env.event.model_dump())))


def stored_ids(store: Store) -> set[str]:
    with store.engine.connect() as conn:
        return set(conn.execute(select(reports.c.ingest_id)).scalars())


def test_retention_thins_and_expires_by_receive_time_and_counts_oom_kills(db_url: str) -> None:
    now = 1_800_000_000_000 // HOUR_MS * HOUR_MS + 40 * MIN_MS  # 40 minutes into a clock hour
    clock = Clock(0)
    store = make_store(db_url, clock)
    # Received over three clock hours two to four hours back (four each), and three in the last half hour.
    # The agent's own times say otherwise (a day later): retention goes by receive time only.
    old = [now // HOUR_MS * HOUR_MS - h * HOUR_MS + m * MIN_MS for h in (2, 3, 4) for m in (5, 20, 35, 50)]
    recent = [now - m * MIN_MS for m in (25, 15, 5)]
    for i, t in enumerate(sorted(old) + recent):
        clock.t = t
        assert ingest(store, "n", agent_ms=t + DAY_MS, ingest_id=f"r{i:02d}")
    clock.t = now - 20 * DAY_MS
    assert event(store, "n", "oom-old", reason="oom-kill") and event(store, "n", "exit-old", reason="exit")
    assert event(store, "n", "stop-old", reason="pressure-stop")
    clock.t = now
    result = store.thin()
    assert result == {
        "expired_reports": 0,
        "thinned_reports": 9,
        "expired_events": 0,
        "expired_observations": 0,
        "archived_nodes": 0,
        "batches": 1,
        "skipped": 0,
    }
    kept = sorted(stored_ids(store))  # the first of each old hour, then every recent one
    assert kept == ["r00", "r04", "r08", "r12", "r13", "r14"]
    history = store.node_detail("n")["history"]  # type: ignore[index]
    assert [h["time"] for h in history] == [iso_ms(t) for t in [*sorted(old)[::4], *recent]]
    short = make_store(db_url, clock, retention_s=10 * 86400)  # a shorter retention: old events go, OOM kills too
    assert short.thin()["expired_events"] == 3  # issue 37: none is kept for ever
    assert short.node_detail("n")["events"] == []  # type: ignore[index]
    (row,) = [r for r in short.metric_rows() if r["name"] == "n"]  # the counters stay: they never go down
    assert (row["oom_kills_total"], row["pressure_stops_total"]) == (1, 1)
    clock.t = now + 3 * HOUR_MS + 31 * DAY_MS  # and everything past the retention goes
    assert make_store(db_url, clock).thin()["expired_reports"] == 6


@pytest.mark.slow
def test_passes_over_hours_keep_exactly_the_first_report_of_each_node_and_hour(db_url: str) -> None:
    """Passes every 10 minutes for five hours, in batches of 2 nodes and 3 rows, against the rule computed here."""
    start = 1_800_000_000_000 // HOUR_MS * HOUR_MS + 7 * MIN_MS
    clock = Clock(start)
    store = make_store(db_url, clock)
    store.retention.nodes_per_batch, store.retention.rows_per_batch, store.retention.pause_s = 2, 3, 0.0
    sent: list[tuple[str, int, str]] = []  # node, received, id
    batches = 0
    for step in range(60):  # a report from each node every 5 minutes; a pass every 10
        clock.t = start + step * 5 * MIN_MS
        for node in ("a", "b", "c", "d", "e"):
            sent.append((node, clock.t, f"{node}-{step:02d}"))
            assert ingest(store, node, ingest_id=sent[-1][2], agent_ms=clock.t - 1500)
        if step % 2:
            batches += store.thin()["batches"]
    first_of_hour: dict[tuple[str, int], str] = {}
    for node, t, rid in sent:
        first_of_hour.setdefault((node, t // HOUR_MS), rid)
    cut = clock.t - HOUR_MS
    expected = {rid for node, t, rid in sent if t >= cut or first_of_hour[(node, t // HOUR_MS)] == rid}
    assert stored_ids(store) == expected
    assert batches > 30 * 3  # five nodes in three batches, and more when a statement hit its 3 rows


def test_a_restarted_manager_goes_on_from_where_the_last_pass_ended(db_url: str) -> None:
    """The one-hour line of the last pass is kept in the database: the next pass, of a new process or
    another replica, looks only above it (it does not scan the whole history again)."""
    now = 1_800_000_000_000 // HOUR_MS * HOUR_MS + 30 * MIN_MS
    clock = Clock(now - 5 * HOUR_MS)
    first = make_store(db_url, clock)
    for k in range(4):
        ingest(first, "n", ingest_id=f"a{k}")
    clock.t = now
    assert first.thin()["thinned_reports"] == 3
    below = now - 5 * HOUR_MS + 1  # a row under the line, in an hour that was thinned
    with first.engine.begin() as conn:
        node_id = conn.execute(select(nodes.c.id)).scalar_one()
        conn.execute(insert(reports).values(node_id=node_id, ingest_id="planted", received_ms=below))
    clock.t = now + 10 * MIN_MS
    restarted = make_store(db_url, clock)
    assert restarted.thin()["thinned_reports"] == 0 and "planted" in stored_ids(restarted)
    with restarted.engine.begin() as conn:  # without the line, a pass looks at everything again
        conn.execute(text("DELETE FROM retention_state"))
    assert restarted.thin()["thinned_reports"] == 1 and "planted" not in stored_ids(restarted)


def test_ingest_goes_on_between_the_batches_of_a_pass(db_url: str) -> None:
    """The pass runs on its own connection: a report sent during it is stored before the pass ends."""
    now = 1_800_000_000_000
    clock = Clock(now - 3 * HOUR_MS)
    store = make_store(db_url, clock)
    for i in range(30):
        for k in range(4):
            ingest(store, f"n{i:02d}", ingest_id=f"n{i:02d}-{k}")
    clock.t = now
    store.retention.nodes_per_batch = 4
    during: list[tuple[bool, float]] = []

    def between_batches(_pause: float) -> None:  # the pass's pause: a report arrives meanwhile
        t0 = time.monotonic()
        during.append((ingest(store, "live"), time.monotonic() - t0))

    store.retention.sleep = between_batches
    result = store.thin()
    assert result["batches"] == 8 and result["thinned_reports"] == 30 * 3
    assert len(during) == 8 and all(ok for ok, _ in during)
    assert max(seconds for _, seconds in during) < 2.0
    assert store.node_detail("live")["history_count"] == 8  # type: ignore[index]


def test_the_agents_clock_is_kept_but_never_trusted(db_url: str) -> None:
    t = 1_800_000_000_000
    clock = Clock(t)
    store = make_store(db_url, clock)
    ingest(store, "slow", agent_ms=t - 10 * MIN_MS, interval_s=30)  # an agent 10 minutes behind
    node = store.list_nodes()["nodes"][0]
    assert node["status"] == "online" and node["last_seen"] == iso_ms(t) and node["clock_skew_s"] == -600.0
    assert store.alerts() == []  # not offline right after reporting
    page = store.node_history("slow")
    assert page is not None and [(h["time"], h["agent_time"]) for h in page["history"]] == [
        (iso_ms(t), iso_ms(t - 10 * MIN_MS))
    ]
    # Ordering is by receive time: the later arrival is the latest, whatever the agent's clocks say.
    clock.t = t + 1000
    ingest(store, "n", agent_ms=t + HOUR_MS, report=fixture_report(budget="100GiB"))
    clock.t = t + 2000
    ingest(store, "n", agent_ms=t, report=fixture_report(budget="200GiB"))
    detail = store.node_detail("n")
    assert detail is not None and detail["budget_bytes"] == 200 << 30 and detail["clock_skew_s"] == -2.0
    assert detail["last_seen"] == iso_ms(t + 2000)
    clock.t = t + 2000 + 3 * 30_000 + 1  # three missed intervals after the last receipt
    assert {a["kind"] for a in store.alerts() if a["node"] == "slow"} == {"offline"}
    ingest(store, "unknown")  # no agent time: no skew
    assert store.node_detail("unknown")["clock_skew_s"] is None  # type: ignore[index]


def test_events_are_stamped_on_receipt_and_keep_their_own_time(db_url: str) -> None:
    t = 1_800_000_000_000
    store = make_store(db_url, Clock(t))
    assert event(store, "w", "e1", reason="oom-kill", time="2001-01-01T00:00:00.000Z")
    assert not event(store, "w", "e1", reason="oom-kill")  # the same id: stored once
    detail = store.node_detail("w")
    assert detail is not None and detail["oom_kills_24h"] == 1
    assert [(e["received"], e["time"]) for e in detail["events"]] == [(iso_ms(t), "2001-01-01T00:00:00.000Z")]


def _bulk_history(store: Store, node: str, rows: list[tuple[int, int, int]]) -> None:
    """Stored reports of *node* straight into the tables: (received ms, effective, usage)."""
    with store.engine.begin() as conn:
        conn.execute(insert(nodes).values(name=node, first_seen_ms=rows[0][0], last_seen_ms=rows[-1][0]))
        node_id = conn.execute(select(nodes.c.id).where(nodes.c.name == node)).scalar_one()
        conn.execute(
            insert(reports),
            [
                {
                    "node_id": node_id,
                    "ingest_id": f"{node}-{i}",
                    "received_ms": t,
                    "agent_ms": t - 7,
                    "effective_bytes": eff,
                    "budget_bytes": eff // 2 + i % 5,
                    "usage_bytes": use,
                    "working_set_bytes": use // 2,
                }
                for i, (t, eff, use) in enumerate(rows)
            ],
        )


def test_history_is_downsampled_for_charts_and_paged_for_the_rest(db_url: str) -> None:
    t0 = 1_800_000_000_000
    rows = [(t0 + i * 1000 + (i % 3), 1000 + (i * 7919) % 101, (i * 104729) % 1009) for i in range(3001)]
    store = make_store(db_url, Clock(t0 + HOUR_MS))
    _bulk_history(store, "busy", rows)
    detail = store.node_detail("busy")
    assert detail is not None and detail["history_count"] == 3001
    series = detail["history"]
    span = rows[-1][0] - rows[0][0] + 1  # the rule, computed here: 500 equal buckets, the worst of each
    buckets: dict[int, list[tuple[int, int, int, int]]] = {}
    for i, (t, eff, use) in enumerate(rows):
        buckets.setdefault((t - rows[0][0]) * 500 // span, []).append((t, eff, eff // 2 + i % 5, use))
    expected = [
        {
            "time": iso_ms(max(r[0] for r in b)),
            "effective_bytes": min(r[1] for r in b),
            "budget_bytes": max(r[2] for r in b),
            "usage_bytes": max(r[3] for r in b),
            "working_set_bytes": max(r[3] // 2 for r in b),
        }
        for _, b in sorted(buckets.items())
    ]
    assert len(series) == 500 and series == expected
    assert len(store.node_detail("busy", history_points=10)["history"]) == 10  # type: ignore[index]
    recent = store.node_detail("busy", history_since_ms=rows[-100][0])  # a chart's range: the last 100 reports
    assert recent is not None and recent["history_count"] == 100
    assert [h["time"] for h in recent["history"]] == [iso_ms(t) for t, _, _ in rows[-100:]]
    seen: list[str] = []
    cursor = None
    while True:
        page = store.node_history("busy", limit=700, before=cursor)
        assert page is not None and len(page["history"]) <= 700
        seen += [h["time"] for h in page["history"]]
        cursor = page["next"]
        if cursor is None:
            break
    assert seen == [iso_ms(t) for t, _, _ in reversed(rows)] and len(seen) == 3001
    assert store.node_history("nobody") is None
    for bad in ("x", "1-2-3", "-1-2", "1" * 17 + "-1"):
        with pytest.raises(ValueError, match="not a history cursor"):
            store.node_history("busy", before=bad)


def test_a_small_history_comes_whole(db_url: str) -> None:
    store = make_store(db_url, Clock(1_800_000_000_000))
    for k in range(3):
        ingest(store, "quiet", ingest_id=f"q{k}")
    detail = store.node_detail("quiet")
    assert detail is not None and detail["history_count"] == 3 and len(detail["history"]) == 3
    assert set(detail["history"][0]) == {"time", "effective_bytes", "budget_bytes", "usage_bytes", "working_set_bytes"}


def test_upgrade_to_receive_time_keeps_the_data(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    migrate(url, "0003")
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO nodes (name, first_seen_ms, last_seen_ms) VALUES ('old', 1, 2)"))
        conn.execute(text("INSERT INTO reports (node_id, ingest_id, received_ms) SELECT id, 'r-1', 2 FROM nodes"))
    migrate(url, "0004")
    assert current_revision(engine) == "0004"
    migrate(url)  # and on to the head
    store = Store(engine)
    detail = store.node_detail("old")
    assert detail is not None and detail["clock_skew_s"] is None and detail["history_count"] == 1
    assert store.node_history("old")["history"][0]["agent_time"] is None  # type: ignore[index]
    assert not ingest(store, "old", ingest_id="r-1")  # ids stored before the upgrade still deduplicate


def test_one_retention_pass_at_a_time_on_postgresql(pg: PostgresServer) -> None:
    """Another replica's pass holds the advisory lock: this one skips, deletes nothing, and runs once it is free."""
    url = pg.create_db("lock_" + uuid.uuid4().hex[:8])
    migrate(url)
    now = 1_800_000_000_000
    clock = Clock(now - 5 * HOUR_MS)
    store = make_store(url, clock)
    for k in range(3):
        ingest(store, "n", ingest_id=f"k{k}")
    clock.t = now
    other = make_engine(url)
    with other.connect() as holder:
        holder.execute(text("SELECT pg_advisory_lock(:k)"), {"k": LOCK_KEY})
        holder.commit()
        assert store.thin() == {
            "expired_reports": 0,
            "thinned_reports": 0,
            "expired_events": 0,
            "expired_observations": 0,
            "archived_nodes": 0,
            "batches": 0,
            "skipped": 1,
        }
        holder.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": LOCK_KEY})
        holder.commit()
    assert store.thin()["thinned_reports"] == 2
    results: list[dict[str, int]] = []
    passes = [threading.Thread(target=lambda: results.append(store.thin())) for _ in range(2)]
    for p in passes:
        p.start()
    for p in passes:
        p.join()
    assert sorted(r["skipped"] for r in results) == [0, 0]  # one process: its passes queue, never skip
    with store.engine.connect() as conn:  # and the lock is not left behind
        locks = conn.execute(text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")).scalar_one()
    assert locks == 0
    other.dispose()


def test_events_expire_in_batches_too(db_url: str) -> None:
    now = 1_800_000_000_000
    clock = Clock(now - 40 * DAY_MS)
    store = make_store(db_url, clock)
    store.retention.rows_per_batch, store.retention.pause_s = 4, 0.0
    for k in range(10):
        event(store, "w", f"x{k}", reason="exit")
    event(store, "w", "oom", reason="oom-kill")
    clock.t = now
    result = store.thin()
    assert result["expired_events"] == 11 and result["batches"] == 3  # 4 + 4 + 3: the OOM kill too
    with store.engine.connect() as conn:
        assert list(conn.execute(select(events.c.ingest_id)).scalars()) == []
        assert list(conn.execute(select(nodes.c.oom_kills_total)).scalars()) == [1]  # counted on the node


def test_the_api_answers_a_busy_node_in_bounded_pieces(tmp_path: Path) -> None:
    """``/api/v1/nodes/{name}`` carries at most ``?points=`` (500) history entries, and
    ``/api/v1/nodes/{name}/history`` pages through every stored report."""
    from oomguard.manager.app import create_app
    from oomguard.manager.settings import Settings
    from tests.helpers.manager import local_client

    url = f"sqlite:///{tmp_path / 'busy.db'}"
    migrate(url)
    t0 = 1_800_000_000_000
    store = make_store(url, Clock(t0 + HOUR_MS))
    _bulk_history(store, "busy", [(t0 + i * 60, 1000, i) for i in range(1200)])
    with local_client(create_app(Settings(db_url=url), store)) as c:
        detail = c.get("/api/v1/nodes/busy").json()
        assert len(detail["history"]) == 500 and detail["history_count"] == 1200
        assert len(c.get("/api/v1/nodes/busy?points=50").json()["history"]) == 50
        times, path = [], "/api/v1/nodes/busy/history?limit=500"
        while True:
            page = c.get(path).json()
            times += [h["time"] for h in page["history"]]
            if page["next"] is None:
                break
            path = f"/api/v1/nodes/busy/history?limit=500&before={page['next']}"
        assert times == [iso_ms(t0 + i * 60) for i in reversed(range(1200))]
        for bad in ("history?before=x", "history?limit=0", "history?limit=5001", "?points=1", "?points=2001"):
            assert c.get(f"/api/v1/nodes/busy/{bad}".replace("/?", "?")).status_code == 422, bad
        assert c.get("/api/v1/nodes/nobody/history").status_code == 404
