"""The node chart's data on SQLite and PostgreSQL (issue 38, item 4): each report at the time it was
measured (the agent's time, never later than its arrival), the default range fitted to the node's
reports and events, an explicit range kept, and a run-only node's events read for its chart.
``views.node_with_chart`` is what the node page reads; the store's own ``history`` (the API's) keeps
the receive time."""

from __future__ import annotations

import asyncio
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from oomguard.manager.bodies import EventEnvelope
from oomguard.manager.store import Store, history
from oomguard.manager.times import iso_ms
from oomguard.manager.web.chart import LEFT, RANGES, RIGHT, W, memory_chart
from oomguard.manager.web.views import node_with_chart
from tests.helpers.manager import Clock, fixture_report, ingest, make_store, migrated_db

T = 1_800_000_000_000  # the manager's clock, epoch ms
MIN_MS = 60_000
GiB = 1 << 30


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return migrated_db(request.param, tmp_path, "ch_")


def event(store: Store, node: str, ingest_id: str, **fields: Any) -> None:
    env = EventEnvelope.model_validate({"node": node, "id": ingest_id, "event": fields})
    assert asyncio.run(store.ingest_event_async(env, json.dumps(env.event.model_dump(exclude_none=True))))


def spooled(store: Store, clock: Clock) -> list[int]:
    """12 reports of "late" made 5 minutes apart over the last hour, kept in its agent's spool and
    all delivered now; then one from an agent whose clock is an hour ahead. The measured times."""
    made = [T - (55 - 5 * k) * MIN_MS for k in range(12)]
    for k, agent_ms in enumerate(made):
        report = fixture_report()
        report["memory"]["working_set_bytes"] = (k + 1) * GiB
        assert ingest(store, "late", agent_ms=agent_ms, ingest_id=f"s{k}", report=report)
    clock.t = T + 1000
    assert ingest(store, "late", agent_ms=T + 3_600_000, ingest_id="ahead")  # measured when it arrived
    return [*made, T + 1000]


def test_spooled_reports_are_drawn_when_they_were_measured(db_url: str) -> None:
    clock = Clock(T)
    store = make_store(db_url, clock)
    made = spooled(store, clock)
    now = clock.t / 1000
    detail = node_with_chart(store, "late", None, now, 0)
    assert detail is not None and detail["range"] == "1h"  # 55 minutes of data: an hour, not 30 days
    assert [h["time"] for h in detail["history"]] == [iso_ms(t) for t in made] and detail["history_count"] == 13
    assert [h["working_set_bytes"] for h in detail["history"][:12]] == [(k + 1) * GiB for k in range(12)]
    # The API's series keeps the receive time: the twelve arrived together.
    api = store.node_detail("late")
    assert api is not None and {h["time"] for h in api["history"][:12]} == {iso_ms(T)}
    # On the chart, each point where its report was measured: spread over the hour, not stacked at its end.
    svg = memory_chart(detail["history"], detail["events"], RANGES[detail["range"]], now)
    chart = ET.fromstring(svg[svg.index("<svg") : svg.index("</svg>") + 6])
    dots = [float(c.get("cx") or 0) for c in chart.iter("circle") if c.get("class") == "s-ws"]
    plot = W - LEFT - RIGHT
    assert dots == [pytest.approx(LEFT + (t / 1000 - (now - 3600)) / 3600 * plot, abs=0.06) for t in made]
    assert dots[0] < LEFT + 0.1 * plot and dots[-1] > W - RIGHT - 0.01 * plot
    explicit = node_with_chart(store, "late", "30d", now, 0)  # a chosen range wins
    assert explicit is not None and explicit["range"] == "30d" and len(explicit["history"]) == 13
    short = node_with_chart(store, "late", "15m", now, 0)  # measured in the last 15 minutes: 4 of them
    assert short is not None and [h["time"] for h in short["history"]] == [iso_ms(t) for t in made[-4:]]


def test_many_spooled_reports_are_bucketed_by_the_time_they_were_measured(db_url: str) -> None:
    """Past *points* reports, equal buckets of the measured time, the worst of each (the store's rule)."""
    clock = Clock(T)
    store = make_store(db_url, clock)
    made = [T - 3_600_000 + k * 90_000 for k in range(40)]  # an hour of reports, all delivered now
    for k, agent_ms in enumerate(made):
        report = fixture_report()
        report["memory"]["working_set_bytes"] = (k * 7919 % 40 + 1) * GiB
        ingest(store, "burst", agent_ms=agent_ms, ingest_id=f"b{k}", report=report)
    with store.engine.connect() as conn:
        node_id = history.node_id_of(conn, "burst")
        assert node_id is not None and history.node_id_of(conn, "nobody") is None
        series, count = history.measured_series(conn, node_id, 8, T - 2 * 3_600_000)
        assert history.first_measured_ms(conn, node_id, T - 2 * 3_600_000) == made[0]
        assert history.first_measured_ms(conn, node_id, T + 1) is None
    span = made[-1] - made[0] + 1
    buckets: dict[int, list[int]] = {}
    for k, t in enumerate(made):
        buckets.setdefault((t - made[0]) * 8 // span, []).append(k)
    assert count == 40 and [h["time"] for h in series] == [iso_ms(made[max(b)]) for _, b in sorted(buckets.items())]
    assert [h["working_set_bytes"] for h in series] == [
        max((k * 7919 % 40 + 1) * GiB for k in b) for _, b in sorted(buckets.items())
    ]


def test_a_run_only_nodes_range_fits_its_events(db_url: str) -> None:
    """No report: the range holds its events (3 h old: 6 h), and the chart marks them."""
    clock = Clock(T)
    store = make_store(db_url, clock)
    sizes = {"budget_bytes": 24 * GiB, "effective_bytes": 32 * GiB, "limited_by": "cgroup-v2"}
    event(store, "runner", "e1", event="start", concurrency=2, time=iso_ms(T - 3 * 3_600_000), **sizes)
    event(store, "runner", "e2", event="exit", reason="oom-kill", signal=9, time=iso_ms(T - 2 * 3_600_000))
    event(store, "runner", "e3", event="restart", reason="oom-kill", delay_s=1.0)
    detail = node_with_chart(store, "runner", None, T / 1000, 0)
    assert detail is not None and detail["range"] == "6h" and detail["history"] == []
    assert detail["budget_bytes"] == 24 * GiB and detail["last_report"] is None  # what the page shows as known
    svg = memory_chart(detail["history"], detail["events"], RANGES[detail["range"]], T / 1000)
    assert svg.count('<g class="oom">') == 1 and svg.count('<g class="restart">') == 1
    assert 'class="s-budget step"' in svg and "No reports" not in svg
    assert node_with_chart(store, "nobody", None, T / 1000, 0) is None
