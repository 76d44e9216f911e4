"""The operator's view in Chromium (issue 14): the table fits at 1,280 px and stacks at 390 px, the
alerts come first and grouped, risky nodes stand out, the refresh keeps what the operator typed and
says when it is stale, every value is in words or units, the chart is readable, errors are pages.

20 nodes through the API (8 GPUs each), and 10,000 written straight into the database."""

# ruff: noqa: F811  (the browser fixture is imported from test_dashboard and named by each test)
from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from oomguard.manager.web.chart import segments, y_step
from oomguard.manager.web.formatting import gpus, timed
from tests.manager_helpers import ManagerProcess, fixture_report, write_latest
from tests.test_dashboard import Browser, Page, api, browser, logged_in, pytestmark, rows, shot  # noqa: F401

GiB = 1 << 30
WIDE = {"viewport": {"width": 1280, "height": 900}}
PHONE = {"viewport": {"width": 390, "height": 844}}


def eight_gpus() -> list[dict[str, Any]]:
    return [
        {"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 80 * GiB, "memory_free_bytes": 79 * GiB}
        for i in range(8)
    ]


MiB = 1 << 20
LIMIT = 512 * MiB  # the fixture's cgroup limit, every node's effective limit
NO_WORKING_SET = 11  # node-11 reports no working set: "unknown", never 0%


def working_set(i: int) -> int | None:
    """node-i's working set: 40 MiB + 23 MiB a node; node-02 above its limit (600 MiB)."""
    return None if i == NO_WORKING_SET else 600 * MiB if i == 2 else (40 + 23 * i) * MiB


def pct_text(i: int) -> str:
    ws = working_set(i)
    return "unknown" if ws is None else f"{ws * 100 / LIMIT:.1f}%"


def seed_twenty(s: ManagerProcess) -> None:
    """20 nodes of 8 GPUs: node-00 fits 0 jobs, node-01's budget is above its limit, node-02 uses
    more than its limit, node-03..09 sized from the host (one alert kind with 7 nodes), OOM kills
    (node-05: 2, each also followed by a restart event that repeats the reason), pressure stops
    (node-05: 1, node-12: 2); every node's usage and working set as ``working_set`` says."""
    for i in range(20):
        report = fixture_report("docker_v2_private_ns_limit_512m", **({"budget": "500GiB"} if 1 <= i <= 9 else {}))
        report["gpus"] = eight_gpus()
        report["plan"] = {"concurrency": 0 if i == 0 else 4}
        ws = working_set(i)
        report["memory"].update(working_set_bytes=ws, usage_bytes=None if ws is None else ws + 30 * MiB)
        if i == 5:  # RLIMIT_MEMLOCK unlimited
            report["memlock"].update(soft_bytes=None, hard_bytes=None)
        if i == 2:
            report["warnings"].append({"code": "usage-above-limit", "message": "usage is above the limit"})
        api(s, "/api/v1/reports", {"node": f"node-{i:02d}", "id": uuid.uuid4().hex, "report": report})
    for _ in range(2):
        for event in (
            {"event": "exit", "reason": "oom-kill", "signal": 9},
            {"event": "restart", "reason": "oom-kill", "delay_s": 1.0},  # the same kill: not counted again
        ):
            api(s, "/api/v1/events", {"node": "node-05", "id": uuid.uuid4().hex, "event": event})
    for node, n in (("node-05", 1), ("node-12", 2)):
        for _ in range(n):
            event = {
                "event": "exit",
                "reason": "pressure-stop",
                "exit_code": 0,
                "working_set_peak_bytes": 461 * MiB,
                "guard_margin_bytes": 64 * MiB,
            }
            api(s, "/api/v1/events", {"node": node, "id": uuid.uuid4().hex, "event": event})


RUN_ONLY = "runner-01"  # known only from run --manager events: no agent


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagerProcess]:
    """The 20 nodes, and one more known only from a supervisor's events (run-only)."""
    s = ManagerProcess(f"sqlite:///{tmp_path_factory.mktemp('fleet') / 'fleet.db'}").start()
    seed_twenty(s)
    api(s, "/api/v1/events", {"node": RUN_ONLY, "id": uuid.uuid4().hex, "event": {"event": "start", "concurrency": 2}})
    yield s
    s.stop()


BIG = 10_000
BIG_RUN_ONLY = 3  # runner-0..2: no agent, a supervisor's recent event


def big_working_set(i: int) -> int | None:
    """Distinct ratios (7919 is prime to 10,000: a permutation of 0..9999 hundredths of a
    percent); every 13th node reports none."""
    return None if i % 13 == 0 else LIMIT_BIG * (i * 7919 % 10_000) // 10_000


def big_exits(i: int) -> tuple[int, int]:
    """(OOM kills, pressure stops) of node i in the last day."""
    return (3 if i == 4321 else 1 if i % 1000 == 7 else 0, 2 if i % 500 == 250 else 0)


LIMIT_BIG = 342 * GiB


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagerProcess]:
    """10,000 nodes written straight into the database (the API would take minutes)."""
    from sqlalchemy import insert, select

    from oomguard.manager.db import events, make_engine, migrate, nodes

    url = f"sqlite:///{tmp_path_factory.mktemp('big') / 'fleet.db'}"
    migrate(url)
    now = int(time.time() * 1000)
    gpu_json = json.dumps(eight_gpus())
    latest = json.dumps(fixture_report())
    row = {"effective_bytes": LIMIT_BIG, "host_total_bytes": 503 * GiB, "limited_by": "cgroup-v2", "runtime": "docker"}

    def node_row(i: int) -> dict[str, Any]:
        ws = big_working_set(i)
        return {
            **row,
            "name": f"node-{i:05d}",
            "first_seen_ms": now,
            "last_seen_ms": now - (0 if i % 100 else 3_600_000),
            "budget_bytes": (332 if i % 50 else 500) * GiB,
            "memlock_soft_bytes": 8 << 20,
            "warnings": "[]",
            "gpus": gpu_json,
            "concurrency": 0 if i % 97 == 0 else 18,
            "working_set_bytes": ws,
            "usage_bytes": None if ws is None else ws + GiB,
        }

    with make_engine(url).begin() as conn:
        conn.execute(insert(nodes), [node_row(i) for i in range(BIG)])
        runners = [{"name": f"runner-{i}", "first_seen_ms": now, "last_seen_ms": now} for i in range(BIG_RUN_ONLY)]
        conn.execute(insert(nodes), runners)
        ids = dict(conn.execute(select(nodes.c.name, nodes.c.id)).all())
        write_latest(conn, (ids[f"node-{i:05d}"] for i in range(BIG)), now, latest)
        conn.execute(
            insert(events),
            [
                {
                    "node_id": ids[f"node-{i:05d}"],
                    "ingest_id": f"e-{i}-{reason}-{k}",
                    "received_ms": now - (k + 1) * 600_000,
                    "kind": "exit",
                    "reason": reason,
                    "body": json.dumps({"event": "exit", "reason": reason}),
                }
                for i in range(BIG)
                for reason, n in zip(("oom-kill", "pressure-stop"), big_exits(i), strict=True)
                for k in range(n)
            ],
        )
    s = ManagerProcess(url).start()
    yield s
    s.stop()


def fits(page: Page, width: int) -> None:
    """Nothing wider than the window: neither the page nor the table inside its box."""
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    box = page.evaluate(
        "[document.querySelector('.scroll').scrollWidth, document.querySelector('.scroll').clientWidth]"
    )
    assert box[0] <= box[1], box


@pytest.mark.parametrize("which", ["fleet", "big"])
def test_table_fits_1280_and_summarises_gpus(browser: Browser, request: pytest.FixtureRequest, which: str) -> None:
    server: ManagerProcess = request.getfixturevalue(which)
    page, watch = logged_in(browser, server, **WIDE)
    fits(page, 1280)
    assert page.locator("td[data-label=GPUs]").first.inner_text() == "8× H100 80GB HBM3 80 GiB"
    assert len(rows(page)) == (21 if which == "fleet" else 50)
    for label in ("Working set / limit", "Jobs", "Issues", "OOM 24h", "Last seen"):  # the columns that used to fall off
        box = page.locator(f"td[data-label='{label}']").first.bounding_box()
        assert box is not None and box["x"] + box["width"] <= 1280, label
    shot(page, f"wide-{which}")
    assert not watch.errors, watch.errors


@pytest.mark.parametrize("which", ["fleet", "big"])
def test_phone_shows_every_column_as_stacked_rows(browser: Browser, request: pytest.FixtureRequest, which: str) -> None:
    server: ManagerProcess = request.getfixturevalue(which)
    page, watch = logged_in(browser, server, **PHONE)
    fits(page, 390)
    first = page.locator("table.nodes tbody tr").first
    for cell in first.locator("td").all():
        box = cell.bounding_box()
        assert cell.is_visible() and box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390
    labels = first.locator("td").evaluate_all("cs => cs.map(c => getComputedStyle(c, '::before').content)")
    assert labels[-1] == '"Last seen"' and len(labels) == 12 and '"Working set / limit"' in labels
    label_boxes = first.locator("td").evaluate_all(
        """cs => cs.map(c => {
            const b = getComputedStyle(c, '::before'), ctx = document.createElement('canvas').getContext('2d');
            ctx.font = b.font;
            return [b.whiteSpace, ctx.measureText(c.dataset.label).width, parseFloat(b.width)];
        })"""
    )
    for white_space, text_px, box_px in label_boxes:  # a wrapped or wider label runs into the next row
        assert white_space == "nowrap" and text_px <= box_px, label_boxes
    shot(page, f"phone-{which}")
    assert not watch.errors, watch.errors


def test_alerts_first_grouped_with_show_all(browser: Browser, fleet: ManagerProcess) -> None:
    page, watch = logged_in(browser, fleet, **WIDE)
    alerts_y = page.locator("#alerts").bounding_box()["y"]  # type: ignore[index]
    assert alerts_y < page.locator("table.nodes").bounding_box()["y"]  # type: ignore[index]
    group = page.locator("details", has=page.locator("summary b", has_text="budget-from-host"))
    assert "9 nodes" in group.locator("summary").inner_text()
    assert group.locator(".alert").count() == 5
    group.locator("a.more").click()
    assert "alerts=budget-from-host" in page.url
    group = page.locator("details", has=page.locator("summary b", has_text="budget-from-host"))
    assert group.locator(".alert").count() == 9 and group.locator("a.more").count() == 0
    assert "oom-kills" in page.locator("#alerts").inner_text()
    assert not watch.errors, watch.errors


def test_cards_link_to_their_filter(browser: Browser, fleet: ManagerProcess) -> None:
    page, _ = logged_in(browser, fleet, **WIDE)
    page.click(".card >> text=OOM kills in 24 h")
    page.wait_for_url("**/?sort=-oom_kills_24h")
    page.wait_for_selector("table.nodes")
    assert rows(page)[0] == "node-05"
    page.click(".card >> text=online")
    page.wait_for_url("**/?status=online")
    page.wait_for_selector("table.nodes")
    assert len(rows(page)) == 20


def test_risky_nodes_are_highlighted(browser: Browser, fleet: ManagerProcess) -> None:
    page, _ = logged_in(browser, fleet, **WIDE)
    risky = page.locator("tr.risk td:first-child").all_inner_texts()
    assert {"node-00", "node-01", "node-02"} <= set(risky) and "node-10" not in risky
    row0 = page.locator("tr", has=page.locator("a.node", has_text="node-00"))
    assert row0.locator("td[data-label=Jobs]").inner_text() == "0: fits none"
    row2 = page.locator("tr", has=page.locator("a.node", has_text="node-02"))
    assert "usage above limit" in row2.locator("td[data-label=Issues]").inner_text()
    shot(page, "risk")


def test_refresh_keeps_filter_focus_scroll_and_says_when_stale(browser: Browser, tmp_path: Any) -> None:
    s = ManagerProcess(f"sqlite:///{tmp_path / 'live.db'}").start()
    try:
        seed_twenty(s)
        page, watch = logged_in(browser, s, viewport={"width": 1280, "height": 400})
        page.goto(s.url + "/?refresh=1")
        page.fill("input[name=q]", "typed, not sent")
        page.select_option("select[name=status]", "offline")
        page.evaluate("window.scrollTo(0, 300)")
        page.focus("input[name=q]")
        api(s, "/api/v1/reports", {"node": "late-node", "id": uuid.uuid4().hex, "report": fixture_report()})
        page.wait_for_selector("text=21 nodes", timeout=10_000)  # swapped in
        assert page.input_value("input[name=q]") == "typed, not sent"
        assert page.input_value("select[name=status]") == "offline"
        assert page.evaluate("document.activeElement.name") == "q"
        assert page.evaluate("window.scrollY") == 300
        assert re.fullmatch(r"[0-9] s ago", page.inner_text("#updated"))
        page.context.clear_cookies()  # the session ends
        page.wait_for_selector("#banner >> text=session has expired", timeout=10_000)
        shot(page, "session-expired")
        s.stop()  # the manager goes away
        page.wait_for_selector("#banner >> text=Cannot reach the manager", timeout=10_000)
        time.sleep(2.2)
        assert int(page.inner_text("#updated").split()[0]) >= 2  # it keeps counting
        shot(page, "unreachable")
        assert not [e for e in watch.errors if "ERR_CONNECTION_REFUSED" not in e and "Failed to fetch" not in e]
    finally:
        s.stop()


def test_node_page_reads_in_words_and_units(browser: Browser, fleet: ManagerProcess) -> None:
    page, watch = logged_in(browser, fleet, **PHONE)
    page.goto(fleet.url + "/nodes/node-05")
    kv = page.locator("table.kv").first.inner_text()
    assert "False" not in kv and "True" not in kv and "CAP_IPC_LOCK: no" in kv
    assert "soft: unlimited, hard: unlimited" in kv and re.search(r"CPUs\s+2 \(", kv) and " -" not in kv
    when = page.locator("ol.timeline time").first
    assert re.fullmatch(r"\d+ s ago", when.inner_text())
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", when.get_attribute("title") or "")
    words = page.locator("td.gpu").first.evaluate(
        "e => getComputedStyle(e).wordBreak + '/' + getComputedStyle(e).overflowWrap"
    )
    assert words == "normal/break-word"  # GPU names wrap between words on a phone
    fits_page = page.evaluate("document.documentElement.scrollWidth")
    assert fits_page <= 390
    shot(page, "node-phone")
    assert not watch.errors, watch.errors


def test_chart_ranges_ticks_markers_and_hover(browser: Browser, fleet: ManagerProcess) -> None:
    page, watch = logged_in(browser, fleet, **WIDE)
    page.goto(fleet.url + "/nodes/node-05")
    ticks = page.locator("svg.chart text.axis[x='64']").evaluate_all("ts => ts.map(t => t.textContent)")
    assert ticks == ["0 B", "128 GiB", "256 GiB", "384 GiB", "512 GiB"]  # round steps (a 500 GiB budget)
    assert page.locator("svg.chart g.oom").count() == 2  # both OOM kills marked
    tip = page.locator("svg.chart .hover rect title").first.text_content() or ""
    assert "UTC" in tip and "working set:" in tip
    for key in ("1h", "24h", "7d", "30d"):
        page.click(f"nav.ranges >> text={key}")
        assert f"range={key}" in page.url
        assert page.locator("nav.ranges a.active").inner_text() == key
        assert page.locator("svg.chart polyline").count() >= 3
    shot(page, "chart")
    assert not watch.errors, watch.errors


def test_errors_are_pages_for_browsers_and_json_for_clients(browser: Browser, fleet: ManagerProcess) -> None:
    page = browser.new_context().new_page()
    response = page.goto(fleet.url + "/no/such/page")
    assert response is not None and response.status == 404
    assert page.locator("h1").inner_text() == "Not found"
    shot(page, "404")
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(fleet.url + "/no/such/page", timeout=10)
    assert caught.value.code == 404 and json.loads(caught.value.read()) == {"detail": "Not Found"}


def test_gaps_ticks_and_words_without_a_browser() -> None:
    hour = 3600.0
    thinned = [(t * hour, {}) for t in range(10)] + [(10 * hour + k * 30, {}) for k in range(20)]
    assert len(segments(thinned)) == 1  # retention's regular thinning is not a gap
    stopped = [(k * 30.0, {}) for k in range(10)] + [(3000 + k * 30.0, {}) for k in range(10)]
    assert [len(s) for s in segments(stopped)] == [10, 10]  # a stopped agent is
    assert y_step(342 * GiB) == 64 * GiB and y_step(700 * GiB) == 128 * GiB
    assert gpus([{"name": "A10", "memory_total_bytes": 24 * GiB}] * 2 + [{"name": "T4"}]) == "2× A10 24 GiB, 1× T4 ?"
    assert 'title="2026-01-02 03:04:05 UTC"' in str(timed("no report since 2026-01-02T03:04:05.000Z <b>"))
    assert "&lt;b&gt;" in str(timed("<b>"))
