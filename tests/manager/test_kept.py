"""The fleet's lessons kept between reads (issue 37, item 2: ``store/kept.py``), on a real SQLite
file and a real PostgreSQL: /metrics computes a profile's recommendations again only when its
observations changed (a new one, an exclusion, a confirming exit event) or after ``REFRESH_MS``,
and a computation that outlives the request's time is the recommender's (``recommendations_up
0``), never the database's (``database_up`` stays 1, no database error counted)."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from oomguard.manager.app import create_app
from oomguard.manager.settings import Settings
from oomguard.manager.store.kept import REFRESH_MS, Kept
from tests.helpers.manager import (
    AGENT,
    AGENT_H,
    VIEWER,
    VIEWER_H,
    Clock,
    exit_event_body,
    local_client,
    make_store,
    migrated_db,
    observation_body,
)

NOW = 1_800_000_000_000
ADMIN = "admin-secret-token-1"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return migrated_db(request.param, tmp_path, "kept_")


def post(c: Any, node: str, profile: str, ingest_id: str | None = None, **kw: Any) -> str:
    ingest_id = ingest_id or uuid.uuid4().hex
    body = {"node": node, "id": ingest_id, "observation": observation_body(profile=profile, node_class="c1", **kw)}
    assert c.post("/api/v1/observations", json=body, headers=AGENT_H).status_code == 200
    return ingest_id


def samples(c: Any) -> dict[str, float]:
    text = c.get("/metrics", headers=VIEWER_H).text
    return {
        s.name + "".join(f"|{v}" for k, v in sorted(s.labels.items()) if k == "profile"): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_compute_a_profile_again_only_when_it_changed(db_url: str) -> None:
    clock = Clock(NOW)
    store = make_store(db_url, clock)
    settings = Settings(db_url=db_url, agent_token=AGENT, viewer_token=VIEWER, admin_token=ADMIN)
    with local_client(create_app(settings, store)) as c:
        for node in ("a1", "a2", "a3"):
            post(c, node, "p1")
            post(c, node, "p2")
        first = samples(c)
        assert first["oomguard_profile_samples|p1"] == 3 and store.lessons.computed == 2
        lessons = {k: v for k, v in first.items() if k.startswith("oomguard_profile_")}
        again = {k: v for k, v in samples(c).items() if k.startswith("oomguard_profile_")}
        assert again == lessons and store.lessons.computed == 2  # nothing changed: kept
        kill = post(c, "a1", "p1", outcome="oom-kill", time="2027-01-15T09:00:00Z")
        assert samples(c)["oomguard_profile_samples|p1"] == 4 and store.lessons.computed == 3  # p1 only
        assert samples(c)["oomguard_profile_floor_per_job_bytes|p1"] == 0  # not confirmed yet
        event = {"node": "a1", "id": uuid.uuid4().hex, "event": exit_event_body("oom-kill", "2027-01-15T09:00:00Z")}
        assert c.post("/api/v1/events", json=event, headers=AGENT_H).status_code == 200
        assert samples(c)["oomguard_profile_floor_per_job_bytes|p1"] > 0  # the event confirmed it: computed anew
        flip = c.post(f"/api/v1/observations/a1/{kill}/exclude", headers={"Authorization": f"Bearer {ADMIN}"})
        assert flip.status_code == 200, flip.text
        assert samples(c)["oomguard_profile_floor_per_job_bytes|p1"] == 0
        computed = store.lessons.computed
        clock.t += REFRESH_MS
        samples(c)
        assert store.lessons.computed == computed + 2  # both profiles, after REFRESH_MS


def test_a_slow_recommender_is_not_a_database_outage(db_url: str) -> None:
    store = make_store(db_url, Clock(NOW))
    settings = Settings(db_url=db_url, agent_token=AGENT, viewer_token=VIEWER, admin_token=ADMIN, request_timeout_s=0.5)
    release = threading.Event()
    computing = store.class_recommendations

    def slow() -> list[dict[str, Any]]:
        release.wait(30)  # the recommender busy past the request's time, until the test releases it
        return computing()

    store.class_recommendations = slow  # type: ignore[method-assign]
    with local_client(create_app(settings, store)) as c:
        post(c, "a1", "p1")
        found = samples(c)
        release.set()
        assert found["oomguard_manager_database_up"] == 1
        assert found["oomguard_manager_recommendations_up"] == 0
        assert "oomguard_nodes" in found  # the node series are there: the database was read
        assert all(v == 0 for k, v in found.items() if k.startswith("oomguard_manager_db_errors_total"))
        assert "oomguard_profile_samples|p1" not in found
    store.class_recommendations = computing  # type: ignore[method-assign]


def test_kept_answers_by_signature_and_age() -> None:
    kept, calls = Kept(refresh_ms=1000), []

    def compute() -> int:
        calls.append(1)
        return len(calls)

    assert kept.get("k", (1, 1, 1, 1), 0, compute) == 1
    assert kept.get("k", (1, 1, 1, 1), 999, compute) == 1
    assert kept.get("k", (2, 1, 1, 1), 999, compute) == 2  # the profile's observations changed
    assert kept.get("k", (2, 1, 1, 1), 1999, compute) == 3  # refreshed after refresh_ms
    assert kept.get("k", (2, 1, 1, 1), 500, compute) == 4  # a clock gone back: computed anew


def test_the_memo_changes_no_answer() -> None:
    """``learning.recommend(memo=...)``, shared by a page's classes, answers exactly as without it:
    every class, with and without a node and a budget, confirmed and unconfirmed failures, measured
    baselines or not, and classes of 1 to 800 samples."""
    import random

    from oomguard.manager import learning

    now, rng = 10**13, random.Random(3)
    for classes in (1, 7, 800):
        samples = [
            learning.Sample(
                node=f"n{i % 300}",
                node_class=f"c{i % classes}",
                received_ms=now - i * 600_000,
                declared_per_job=100 << 20,
                peak_per_job=int(rng.gauss(80, 10)) << 20,
                declared_baseline=1 << 30,
                peak_baseline=None if i % 3 else 900 << 20,
                concurrency=rng.choice([1, 4, 8, 16]),
                outcome=rng.choice(["ok"] * 15 + ["oom-kill"]),
                confirmed=rng.random() < 0.5,
            )
            for i in range(800)
        ]
        for budget in (None, 8 << 30, 64 << 30):
            memo: dict[str, Any] = {}
            for k in range(min(classes, 12)):
                for node in (None, f"n{k}"):
                    plain = learning.recommend(now, node, f"c{k}", samples, budget=budget)
                    assert learning.recommend(now, node, f"c{k}", samples, budget=budget, memo=memo) == plain
            # The fleet scope's figures are computed (and kept) where a class has too few samples.
            assert "live" in memo and ("job" in memo) is (classes == 800)
