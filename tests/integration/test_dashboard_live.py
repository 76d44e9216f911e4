"""The live question in Chromium (issue 21), on SQLite and PostgreSQL, at 1,280 px and 390 px:

- a live node at 99.2 % of its limit ranks first, above offline nodes with many OOM kills, which
  are grouped after the live ones and say since when; its working-set alert is in the alert
  groups and its Issues;
- a node the entrypoint's gate refused shows as refused, with the reason, and is counted;
- labels in the table, filterable; the memlock column highlighted only where it can bind;
- the node page: the supervisor's state, an offline node's numbers marked as not current, the
  timeline a page at a time; the working-set label never over its bar.

Every number checked is computed here from what the fixture posted or wrote."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.helpers.dashboard import api, fits, logged_in, needs_browser, rows, shot
from tests.helpers.fleet import PHONE, WIDE
from tests.helpers.manager import ManagerProcess, db_url_of, fixture_report, write_latest

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytestmark = needs_browser

MiB = 1 << 20
LIMIT = 512 * MiB
CASE = "docker_v2_private_ns_limit_512m"
DYING = int(0.992 * LIMIT)
LIVE = {"dying": DYING, "warm": 300 * MiB, "calm": 100 * MiB}  # working sets of the live nodes
DEAD = {"dead-a": 9, "dead-b": 12, "dead-c": 30}  # offline nodes: OOM kills in the last day
GATE = "plan: 0 jobs of 24 GiB fit the 15.6 GiB budget (16 GiB limit, cgroup-v2)"
VIEWS = {"wide": WIDE, "phone": PHONE}


def posted(ws: int, *, cap: bool | None = None, memlock: int | None = None) -> dict[str, Any]:
    rep = fixture_report(CASE, budget="500MiB")
    rep["memory"].update(working_set_bytes=ws, usage_bytes=ws + 30 * MiB)
    if memlock is not None:
        rep["memlock"].update(soft_bytes=memlock, cap_ipc_lock=cap)
    return rep


def event(s: ManagerProcess, node: str, **fields: Any) -> None:
    api(s, "/api/v1/events", {"node": node, "id": uuid.uuid4().hex, "event": fields})


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def live(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagerProcess]:
    from sqlalchemy import insert, select

    from oomguard.manager.db import events, make_engine, migrate, nodes

    url = db_url_of(request.param, Path(tmp_path_factory.mktemp("live")), "dl_")
    migrate(url)
    now = int(time.time() * 1000)
    engine = make_engine(url)
    with engine.begin() as conn:  # yesterday's trouble, straight into the database: silent an hour
        base = {"first_seen_ms": now - 86_400_000, "last_seen_ms": now - 3_600_000, "interval_ms": 30_000}
        dead = [
            {**base, "name": n, "warnings": "[]", "effective_bytes": LIMIT, "budget_bytes": 500 * MiB} for n in DEAD
        ]
        conn.execute(insert(nodes), [{**d, "working_set_bytes": 480 * MiB, "usage_bytes": 500 * MiB} for d in dead])
        ids = dict(conn.execute(select(nodes.c.name, nodes.c.id)).all())
        write_latest(conn, ids.values(), now - 3_600_000, json.dumps(posted(480 * MiB)))
        conn.execute(
            insert(events),
            [
                {
                    "node_id": ids[n],
                    "ingest_id": f"{n}-{k}",
                    "received_ms": now - 3_700_000 - k * 1000,
                    "kind": "exit",
                    "reason": "oom-kill",
                    "body": json.dumps({"event": "exit", "reason": "oom-kill", "signal": 9}),
                }
                for n, kills in DEAD.items()
                for k in range(kills)
            ],
        )
    engine.dispose()
    s = ManagerProcess(url).start()
    for name, ws in LIVE.items():
        api(s, "/api/v1/reports", {"node": name, "id": uuid.uuid4().hex, "report": posted(ws)})
    api(
        s,
        "/api/v1/reports",
        {"node": "locked", "id": uuid.uuid4().hex, "report": posted(50 * MiB, cap=True, memlock=8 * MiB)},
    )
    labels = {"provider": "vast", "instance": "C.42"}
    api(
        s,
        "/api/v1/reports",
        {
            "node": "bound",
            "id": uuid.uuid4().hex,
            "report": posted(50 * MiB, cap=False, memlock=8 * MiB),
            "labels": labels,
        },
    )
    api(s, "/api/v1/reports", {"node": "gated", "id": uuid.uuid4().hex, "report": posted(20 * MiB)})
    event(s, "gated", event="gate", step="plan", passed=False, exit_code=3, message=GATE)
    plan = posted(200 * MiB)
    plan["plan"] = {"concurrency": 3}
    api(s, "/api/v1/reports", {"node": "busy", "id": uuid.uuid4().hex, "report": plan})
    event(s, "busy", event="start", concurrency=3)
    for k in range(14):  # 28 events, and 4 more: 32 in all, two pages of the timeline
        event(s, "busy", event="exit", reason="exit", exit_code=k + 1)
        event(s, "busy", event="restart", reason="exit", delay_s=1.0, message=f"restart {k}")
    event(s, "busy", event="exit", reason="oom-kill", signal=9)
    event(s, "busy", event="restart", reason="oom-kill", delay_s=1.0, message="after an OOM kill: concurrency 3 -> 2")
    event(s, "busy", event="start", concurrency=2)
    yield s
    s.stop()


def expected_order() -> list[str]:
    """Live nodes by working set over limit (then alerts, then name); the offline ones after them."""
    ws = {**LIVE, "locked": 50 * MiB, "bound": 50 * MiB, "gated": 20 * MiB, "busy": 200 * MiB}
    live = sorted(ws, key=lambda n: (-ws[n], n))
    return [*live, *sorted(DEAD, key=lambda n: (-DEAD[n], n))]  # the dead alike but for OOM kills


def row(page: Page, node: str) -> Any:
    return page.locator("table.nodes tbody tr", has=page.locator("a.node", has_text=re.compile(f"^{node}$")))


def cell(page: Page, node: str, label: str) -> str:
    return str(row(page, node).locator(f"td[data-label='{label}']").inner_text().strip())


@pytest.mark.parametrize("view", ["wide", "phone"])
def test_the_live_99_percent_node_first_and_the_dead_after(browser: Browser, live: ManagerProcess, view: str) -> None:
    page, watch = logged_in(browser, live, **VIEWS[view])
    assert rows(page) == expected_order()
    assert rows(page)[0] == "dying" and cell(page, "dying", "Working set / limit") == "99.2%"
    group = page.locator("table.nodes tr.group")  # the offline nodes grouped after the live ones
    assert group.count() == 1 and "Not live" in group.inner_text()
    order = page.locator("table.nodes tbody tr").evaluate_all(
        "rs => rs.map(r => r.classList.contains('group') ? '|' : r.querySelector('a.node').textContent)"
    )
    assert order.index("|") == len(order) - len(DEAD) - 1
    for name in DEAD:
        status = cell(page, name, "Status")
        assert status.startswith("offline") and re.search(r"since \d+ (m|h) ago", status), status
        assert cell(page, name, "Working set / limit") == "not current"
    assert cell(page, "dead-c", "OOM 24h") == "30"
    assert cell(page, "dying", "Issues").startswith("1 alert")
    group_box = page.locator("details", has=page.locator("summary b", has_text="working-set-high"))
    assert "dying" in group_box.inner_text() and "99.2% of the 512 MiB limit (line 90%)" in group_box.inner_text()
    cards = {c.split("\n")[-1].strip(): c.split("\n")[0] for c in page.locator(".cards .card").all_inner_texts()}
    assert cards["refused"] == "1"
    online = len(LIVE) + 3  # locked, bound, busy (gated is refused)
    assert cards["effective memory (online)"] == f"{online * 512 // 1024} GiB"
    # The working-set label ends before its bar, and the bar before its number (390 px: stacked).
    ws = row(page, "dying").locator("td[data-label='Working set / limit']")
    boxes = ws.evaluate(
        """td => {
            const b = getComputedStyle(td, '::before'), ctx = document.createElement('canvas').getContext('2d');
            ctx.font = b.font;
            const m = td.querySelector('meter').getBoundingClientRect();
            const p = td.querySelector('.pct').getBoundingClientRect();
            const left = td.getBoundingClientRect().left + parseFloat(b.left || '0');
            return {label_end: left + ctx.measureText(td.dataset.label).width, meter: [m.left, m.right], pct: p.left};
        }"""
    )
    if view == "phone":
        assert boxes["label_end"] <= boxes["meter"][0], boxes
    assert boxes["meter"][1] <= boxes["pct"], boxes
    fits(page, VIEWS[view]["viewport"]["width"])
    shot(page, f"live-risk-{view}")
    assert not watch.errors, watch.errors


@pytest.mark.parametrize("view", ["wide", "phone"])
def test_refused_labels_and_memlock(browser: Browser, live: ManagerProcess, view: str) -> None:
    page, watch = logged_in(browser, live, **VIEWS[view])
    assert cell(page, "gated", "Status").split() == ["refused", "at", "plan"]
    assert "refused" in page.locator("#alerts").inner_text() and GATE in page.locator("#alerts").inner_text()
    assert row(page, "locked").locator("td[data-label=Memlock]").get_attribute("class") == ""  # CAP_IPC_LOCK
    assert row(page, "bound").locator("td[data-label=Memlock]").get_attribute("class") == "warn"
    assert cell(page, "bound", "Node").split() == ["bound", "instance=C.42", "provider=vast"]
    page.click("a.label >> text=provider=vast")
    page.wait_for_url(re.compile(r"label=provider%3Dvast"))
    assert rows(page) == ["bound"] and page.input_value("input[name=label]") == "provider=vast"
    page.fill("input[name=label]", "provider=aws")
    page.click("button >> text=Filter")
    assert rows(page) == ["No node matches."]
    page.fill("input[name=label]", "not a label")
    page.click("button >> text=Filter")
    assert "KEY=VALUE" in page.locator(".banner.bad").inner_text() and len(rows(page)) == len(expected_order())
    page.goto(live.url + "/nodes/gated")
    assert GATE in page.locator(".banner.refused").inner_text()
    assert page.locator("h1 .badge").inner_text() == "refused"
    fits_page(page, VIEWS[view]["viewport"]["width"])
    shot(page, f"live-refused-{view}")
    assert not watch.errors, watch.errors


def fits_page(page: Page, width: int) -> None:
    assert page.evaluate("document.documentElement.scrollWidth") <= width


@pytest.mark.parametrize("view", ["wide", "phone"])
def test_node_pages_supervisor_stale_numbers_and_timeline(browser: Browser, live: ManagerProcess, view: str) -> None:
    page, watch = logged_in(browser, live, **VIEWS[view])
    page.goto(live.url + "/nodes/busy")
    supervisor = " ".join(page.locator("section.supervisor").inner_text().split())
    assert "running 2 of the planned 3 jobs" in supervisor
    assert "stepped down: after an OOM kill: concurrency 3 -> 2" in supervisor
    assert "Last exit OOM kill" in supervisor and "(signal 9)" in supervisor
    timeline = page.locator("ol.timeline li")
    assert timeline.count() == 25
    assert page.locator("nav.timeline-pages").first.inner_text().split()[:3] == ["1-25", "of", "32"]
    page.locator("nav.timeline-pages a[rel=next]").first.click()
    page.wait_for_url("**/nodes/busy?events=25#timeline")
    assert page.locator("ol.timeline li").count() == 7
    oldest = " ".join(page.locator("ol.timeline li").last.inner_text().split())
    assert oldest.endswith("start , concurrency 3") or oldest.endswith("start, concurrency 3"), (
        oldest
    )  # the first start
    page.goto(live.url + "/nodes/dead-c")
    usage = " ".join(page.locator("section.usage").inner_text().split())
    assert "Working set 480 MiB of the 512 MiB limit: 93.8%" in usage  # the last known, not "unknown"
    assert usage.count("not current: last reported 1 h ago") == 2  # the working set and the usage
    gauge = page.locator("section.usage .gauge")
    meter, pct = gauge.locator("meter").bounding_box(), gauge.locator(".pct").bounding_box()
    assert meter is not None and pct is not None and meter["x"] + meter["width"] <= pct["x"]
    fits_page(page, VIEWS[view]["viewport"]["width"])
    shot(page, f"live-offline-node-{view}")
    assert not watch.errors, watch.errors
