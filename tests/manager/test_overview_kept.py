"""The dashboard overview's answer kept a few seconds where it is slow (``store/overview.py``):
the rules on a moved clock, then the real page and API on a real SQLite file."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from oomguard.manager.app import create_app
from oomguard.manager.settings import Settings
from oomguard.manager.store import fleet_size
from oomguard.manager.store.overview import FRESH_S, KEEP_FROM, REFRESH_THREAD, STALE_S, Overview
from tests.helpers.manager import AGENT, VIEWER, VIEWER_H, Clock, ingest, local_client, make_store, migrated_db

NOW = 1_800_000_000_000


class Ticks:
    """A monotonic clock the test moves; each compute below advances it by its *took*."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def slow(ticks: Ticks, took: float, answers: list[Any]) -> Any:
    """A compute that takes *took* seconds on *ticks* and answers the next of *answers*."""

    def compute() -> Any:
        ticks.t += took
        return answers.pop(0)

    return compute


def join_refreshes() -> None:
    for t in threading.enumerate():
        if t.name == REFRESH_THREAD:
            t.join(10)


def LARGE(value: Any) -> int:
    return KEEP_FROM


def test_a_quick_answer_or_a_small_fleet_s_is_never_kept() -> None:
    ticks = Ticks()
    kept = Overview(lambda: NOW, LARGE, monotonic=ticks)
    assert kept.read("k", slow(ticks, 0.05, [1])) == (1, None)
    assert kept.read("k", slow(ticks, 0.05, [2])) == (2, None)  # asked again: computed again
    small = Overview(lambda: NOW, lambda value: KEEP_FROM - 1, monotonic=ticks)
    assert small.read("k", slow(ticks, 5.0, [1])) == (1, None)
    assert small.read("k", slow(ticks, 5.0, [2])) == (2, None)  # however slow


def test_a_slow_answer_is_served_fresh_then_refreshed_in_the_background_then_recomputed() -> None:
    ticks = Ticks()
    kept = Overview(lambda: NOW, LARGE, monotonic=ticks)
    answers = [1, 2, 3]
    compute = slow(ticks, 0.5, answers)
    assert kept.read("k", compute) == (1, None)  # computed: the database as it is
    ticks.t += FRESH_S - 1
    value, said = kept.read("k", compute)
    assert value == 1 and said == {"computed_ms": NOW, "age_s": round(FRESH_S - 0.5, 1), "took_s": 0.5}
    assert answers == [2, 3]  # nothing computed while fresh

    ticks.t += 2  # past FRESH_S: the old answer now, the next one computed in the background
    value, said = kept.read("k", compute)
    assert value == 1 and said is not None
    join_refreshes()
    assert answers == [3]
    value, said = kept.read("k", compute)
    assert value == 2 and said is not None and said["age_s"] < 1  # the background's answer

    ticks.t += STALE_S + 1  # too old to serve: the request computes it itself
    assert kept.read("k", compute) == (3, None)


def test_questions_are_kept_apart_bounded_and_cleared() -> None:
    ticks = Ticks()
    kept = Overview(lambda: NOW, LARGE, monotonic=ticks, kept=2)
    for key in ("a", "b", "c"):
        kept.read(key, slow(ticks, 0.2, [key]))
    assert kept.read("b", slow(ticks, 0.2, ["new b"]))[0] == "b"  # kept
    assert kept.read("a", slow(ticks, 0.2, ["new a"]))[0] == "new a"  # the oldest went first
    kept.clear()
    assert kept.read("b", slow(ticks, 0.2, ["after clear"])) == ("after clear", None)


def test_a_failed_background_refresh_is_logged_and_the_request_past_stale_sees_the_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ticks = Ticks()
    kept = Overview(lambda: NOW, LARGE, monotonic=ticks)
    kept.read("k", slow(ticks, 0.5, [1]))
    ticks.t += FRESH_S + 1

    def broken() -> Any:
        raise ConnectionError("database gone")

    with caplog.at_level(logging.WARNING, logger="oomguard.manager"):
        assert kept.read("k", broken)[0] == 1
        join_refreshes()
    assert "background refresh failed: ConnectionError" in caplog.text
    ticks.t += STALE_S
    with pytest.raises(ConnectionError):
        kept.read("k", broken)


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return migrated_db("sqlite", tmp_path, "ov_")


def test_a_small_fleet_s_page_is_the_database_as_it_is(db_url: str) -> None:
    clock = Clock(NOW)
    store = make_store(db_url, clock)
    settings = Settings(db_url=db_url, agent_token=AGENT, viewer_token=VIEWER)
    with local_client(create_app(settings, store)) as c:
        ingest(store, "alpha")
        assert "alpha" in c.get("/", headers=VIEWER_H).text
        ingest(store, "bravo")
        page = c.get("/", headers=VIEWER_H).text
        assert "/nodes/bravo" in page and "Figures as of" not in page


def test_a_slow_overview_says_its_age_the_api_does_not_wait_and_forgetting_drops_it(db_url: str) -> None:
    clock, ticks = Clock(NOW), Ticks()
    store = make_store(db_url, clock)
    store.overview_kept = Overview(clock, fleet_size, keep_from=1, slow_s=0.0, monotonic=ticks)  # as if large and slow
    settings = Settings(db_url=db_url, agent_token=AGENT, viewer_token=VIEWER, admin_token="admin-secret-token-1")
    with local_client(create_app(settings, store)) as c:
        ingest(store, "alpha")
        c.get("/", headers=VIEWER_H)
        ingest(store, "bravo")
        ticks.t += 2
        page = c.get("/", headers=VIEWER_H).text
        assert "/nodes/alpha" in page and "/nodes/bravo" not in page  # kept: 2 s old, and it says so
        assert "Figures as of" in page and "1 online" in page
        api = c.get("/api/v1/nodes", headers=VIEWER_H).json()
        assert {n["name"] for n in api["nodes"]} == {"alpha", "bravo"}  # the API: the database now

        gone = c.delete("/api/v1/nodes/alpha", headers={"Authorization": "Bearer admin-secret-token-1"})
        assert gone.status_code in (200, 204), gone.text
        page = c.get("/", headers=VIEWER_H).text  # forgotten here: the kept answer is dropped
        assert "/nodes/bravo" in page and "/nodes/alpha" not in page
