"""A node speaks only for itself (issue 37, item 1) and within caps (item 2), on a real SQLite file
and a real PostgreSQL: an observation for another class is a 422; an OOM kill its node's own
supervisor did not report (no exit event of the same reason and time) raises no floor, and moves
its class no more than any one node's samples may; a new profile or class past a cap is a 429 with
a day's Retry-After; revision 0012 confirms the failures already stored by the same rule."""

from __future__ import annotations

import math
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text

from oomguard.manager.app import create_app
from oomguard.manager.db import current_revision, make_engine, migrate, observations
from oomguard.manager.learning import BOUNDS, OOM_BUMP
from oomguard.manager.settings import Settings
from oomguard.manager.store.claims import CAP_RETRY_AFTER_S
from tests.helpers.manager import (
    AGENT,
    AGENT_H,
    VIEWER,
    VIEWER_H,
    Clock,
    db_url_of,
    exit_event_body,
    ingest,
    local_client,
    make_store,
    migrated_db,
    observation_body,
)

NOW = 1_800_000_000_000
GiB = 1 << 30
ADMIN = "admin-secret-token-1"
BUDGET = 200 * GiB  # an a100 node's run: (200 - 40) GiB of room
ONE_NODE = BOUNDS[0][2]  # one node moves its class's size by at most this factor


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return migrated_db(request.param, tmp_path, "own_class_")


def client(db_url: str, store: Any, **caps: Any) -> Any:
    settings = Settings(db_url=db_url, agent_token=AGENT, viewer_token=VIEWER, admin_token=ADMIN, **caps)
    return local_client(create_app(settings, store))


def post(c: Any, node: str, *, labels: dict[str, str] | None = None, **kw: Any) -> Any:
    body: dict[str, Any] = {"node": node, "id": uuid.uuid4().hex, "observation": observation_body(**kw)}
    if labels is not None:
        body["labels"] = labels
    return c.post("/api/v1/observations", json=body, headers=AGENT_H)


def exit_event(c: Any, node: str, reason: str = "oom-kill", time: str = "2027-01-15T08:00:00Z") -> None:
    body = {"node": node, "id": uuid.uuid4().hex, "event": exit_event_body(reason, time)}
    assert c.post("/api/v1/events", json=body, headers=AGENT_H).status_code == 200


def advice(c: Any, **query: Any) -> dict[str, Any]:
    r = c.get("/api/v1/profiles/cuzk-porep/recommendation", params=query, headers=VIEWER_H)
    assert r.status_code == 200, r.text
    found: dict[str, Any] = r.json()
    return found


def jobs(answer: dict[str, Any]) -> int:
    return int((BUDGET - answer["baseline_bytes"]) // answer["per_job_bytes"])


def a100_fleet(store: Any, c: Any) -> None:
    """Four nodes of class a100 (their reports' label), three runs each of 10 GiB a job; and h1,
    of class h100, with a report of its own: the hostile node of these tests."""
    for node in ("a1", "a2", "a3", "a4"):
        ingest(store, node, labels={"node_class": "a100"})
        for _ in range(3):
            assert post(c, node, peak_per_job_bytes=10 * GiB).status_code == 200
    ingest(store, "h1", labels={"node_class": "h100"})


def test_a_node_cannot_post_for_another_class(db_url: str) -> None:
    """Issue 37's attack: h1 (h100) posts an OOM kill "for" a100, in the body's node_class or its
    envelope's labels, with its exit event: 422 naming the field, and a100's plan is untouched."""
    store = make_store(db_url, Clock(NOW))
    with client(db_url, store) as c:
        a100_fleet(store, c)
        before = [advice(c, node=n, node_class="a100", budget_bytes=BUDGET) for n in ("a1", "a9")]
        exit_event(c, "h1")
        for _ in range(5):
            r = post(c, "h1", node_class="a100", outcome="oom-kill", peak_per_job_bytes=60 * GiB)
            assert r.status_code == 422
            assert r.json()["detail"].startswith("observation.node_class: this node's class is h100 (its node_class")
            r = post(c, "h1", labels={"node_class": "a100"}, outcome="oom-kill", peak_per_job_bytes=60 * GiB)
            assert r.status_code == 422 and r.json()["detail"].startswith("labels.node_class: this node's class is")
        after = [advice(c, node=n, node_class="a100", budget_bytes=BUDGET) for n in ("a1", "a9")]
        assert after == before and [jobs(a) for a in after] == [jobs(b) for b in before]
        assert after[1]["node_class"] == "a100" and after[1]["floor_bytes"] == 0
        assert post(c, "h1", outcome="oom-kill", peak_per_job_bytes=60 * GiB).status_code == 200  # its own class
        assert advice(c, node="h9", node_class="h100")["floor_bytes"] == math.ceil(60 * GiB * OOM_BUMP)
        assert advice(c, node="a9", node_class="a100", budget_bytes=BUDGET) == before[1]


def test_an_unconfirmed_kill_is_a_sample_not_a_floor(db_url: str) -> None:
    """A node of a100 itself (h2, labelled so) posts five OOM kills of 60 GiB a job that no exit
    event of its supervisor shows: no floor; a1 (its own samples) keeps its jobs exactly; a new
    node of the class is moved by at most one node's bound."""
    store = make_store(db_url, Clock(NOW))
    with client(db_url, store) as c:
        a100_fleet(store, c)
        ingest(store, "h2", labels={"node_class": "a100"})
        mine, new = (
            advice(c, node="a1", budget_bytes=BUDGET),
            advice(c, node="a9", node_class="a100", budget_bytes=BUDGET),
        )
        for i in range(5):
            r = post(c, "h2", outcome="oom-kill", peak_per_job_bytes=60 * GiB, time=f"2027-01-15T08:0{i}:00Z")
            assert r.status_code == 200, r.text
        exit_event(c, "h2", "oom-kill", "2027-01-15T09:00:00Z")  # another run's time: confirms none of them
        exit_event(c, "h2", "pressure-stop", "2027-01-15T08:00:00Z")  # another reason: likewise
        moved = advice(c, node="a9", node_class="a100", budget_bytes=BUDGET)
        assert moved["floor_bytes"] == 0
        assert moved["per_job_bytes"] <= math.ceil(new["per_job_bytes"] * ONE_NODE)
        assert jobs(moved) >= math.floor(jobs(new) / ONE_NODE), (jobs(new), jobs(moved))
        assert any("not confirmed by an exit event" in line for line in moved["explanation"])
        kept = advice(c, node="a1", budget_bytes=BUDGET)
        assert (kept["per_job_bytes"], kept["floor_bytes"], jobs(kept)) == (mine["per_job_bytes"], 0, jobs(mine))


def test_the_exit_event_confirms_a_kill_whichever_arrives_first(db_url: str) -> None:
    """``run`` sends the exit event and the observation with one time: either may arrive first
    (a spool, two replicas); the floor counts once both are in."""
    store = make_store(db_url, Clock(NOW))
    with client(db_url, store) as c:
        a100_fleet(store, c)
        late = "2027-01-15T10:00:00Z"
        assert post(c, "a2", outcome="oom-kill", peak_per_job_bytes=12 * GiB, time=late).status_code == 200
        assert advice(c, node="a9", node_class="a100")["floor_bytes"] == 0
        exit_event(c, "a2", "oom-kill", late)  # the event after its observation
        assert advice(c, node="a9", node_class="a100")["floor_bytes"] == math.ceil(14 * GiB * OOM_BUMP)
        early = "2027-01-15T11:00:00Z"
        exit_event(c, "a3", "pressure-stop", early)  # the event first
        r = post(c, "a3", outcome="pressure-stop", declared_per_job_bytes=16 * GiB, peak_per_job_bytes=5, time=early)
        assert r.status_code == 200
        assert advice(c, node="a9", node_class="a100")["floor_bytes"] == math.ceil(16 * GiB * OOM_BUMP)
        exit_event(c, "a4", "oom-kill", "2027-01-15T12:00:00Z")
        r = post(c, "a1", outcome="oom-kill", declared_per_job_bytes=20 * GiB, time="2027-01-15T12:00:00Z")
        assert r.status_code == 200
        assert advice(c, node="a9", node_class="a100")["floor_bytes"] == math.ceil(
            16 * GiB * OOM_BUMP
        )  # another node's event: none


def test_the_caps_on_profiles_and_classes(db_url: str) -> None:
    """Past a cap a new profile or class is a 429 naming the flag, with a day's Retry-After; what
    is already counted still passes; forgetting a node frees its names."""
    store = make_store(db_url, Clock(NOW))
    caps: dict[str, Any] = {"max_profiles": 3, "max_classes": 3, "max_profiles_per_node": 2, "max_classes_per_node": 1}
    with client(db_url, store, **caps) as c:
        assert post(c, "n1", profile="p1", node_class="c1").status_code == 200
        assert post(c, "n1", profile="p2").status_code == 200
        r = post(c, "n1", profile="p3")
        assert r.status_code == 429 and r.headers["Retry-After"] == str(CAP_RETRY_AFTER_S)
        assert r.json()["detail"] == (
            "observation: 2 profiles of this node in the last 14 days, the cap (--max-profiles-per-node 2); "
            "a new one is refused until older ones leave the window"
        )
        assert post(c, "n1", profile="p1").status_code == 200  # a profile it has: counted already
        assert post(c, "n2", profile="p3", node_class="c2").status_code == 200
        r = post(c, "n3", profile="p4", node_class="c3")
        assert r.status_code == 429 and "the cap (--max-profiles 3)" in r.json()["detail"]
        assert post(c, "n3", profile="p1", node_class="c3").status_code == 200
        r = post(c, "n4", profile="p1", node_class="c4")
        assert r.status_code == 429 and "the cap (--max-classes 3)" in r.json()["detail"]
        ingest(store, "n5", labels={"node_class": "c1"})
        assert post(c, "n5", profile="p1").status_code == 200
        ingest(store, "n5", labels={"node_class": "c2"})  # relabelled: its own class is now c2
        r = post(c, "n5", profile="p1")
        assert r.status_code == 429 and "the cap (--max-classes-per-node 1)" in r.json()["detail"]
        delete = c.delete("/api/v1/nodes/n2", headers={"Authorization": f"Bearer {ADMIN}"})
        assert delete.status_code == 204, delete.text
        assert post(c, "n4", profile="p4", node_class="c4").status_code == 200  # p3 and c2 went with n2
        metrics = c.get("/metrics", headers=VIEWER_H).text
        assert "oomguard_manager_cap_refusals_total 4.0" in metrics


def test_revision_0012_confirms_the_failures_already_stored(tmp_path: Path, db_url: str) -> None:
    """At 0011: two OOM kills of node a, one with its exit event, and an ok run; after 0012 the
    shown kill and the ok run are confirmed, the other not; the downgrade drops the column."""
    url = db_url_of("sqlite" if db_url.startswith("sqlite") else "postgresql", tmp_path, "own_0011_", "old.db")
    migrate(url, "0011")
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO nodes (name, first_seen_ms, last_seen_ms) VALUES ('a', 1, 1)"))
        rows = [("o-1", "oom-kill", "T1"), ("o-2", "oom-kill", "T2"), ("o-3", "ok", "T3")]
        for ingest_id, outcome, when in rows:
            conn.execute(
                text(
                    "INSERT INTO observations (node_id, ingest_id, received_ms, observed, profile, node_class, "
                    "declared_per_job_bytes, peak_per_job_bytes, declared_baseline_bytes, concurrency, outcome, "
                    "excluded) SELECT id, :i, 1, :w, 'p', 'c', 1, 1, 1, 1, :o, false FROM nodes"
                ),
                {"i": ingest_id, "o": outcome, "w": when},
            )
        conn.execute(
            text(
                "INSERT INTO events (node_id, ingest_id, received_ms, time, kind, reason, body) "
                "SELECT id, 'e-1', 1, 'T1', 'exit', 'oom-kill', '{}' FROM nodes"
            )
        )
    migrate(url)
    with engine.connect() as conn:
        found = conn.execute(select(observations.c.ingest_id, observations.c.confirmed).order_by("ingest_id")).all()
    assert found == [("o-1", True), ("o-2", False), ("o-3", True)]
    from alembic import command

    from oomguard.manager.db import alembic_config

    command.downgrade(alembic_config(url), "0011")
    assert current_revision(engine) == "0011"
    with engine.connect() as conn:
        assert "confirmed" not in list(conn.execute(text("SELECT * FROM observations")).keys())
    engine.dispose()
