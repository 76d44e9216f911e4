"""Who is at risk, in Chromium (issues 14 and 15): the working set against the limit in the fleet
table, the default sort by risk, pressure stops apart from OOM kills, the run-only status, and
the chart's ranges and pressure-stop markers on the node page. At 20 nodes (through the API) and
10,000 (straight into the database), at 1,280 px and 390 px; screenshots in test-artifacts/.

Every number checked here is computed from the data the fixtures posted, not read back from the
manager: ``working_set``/``pct_text`` and ``big_working_set``/``big_exits`` in
``tests/helpers/fleet.py``."""

from __future__ import annotations

import re
import time
import urllib.parse
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.helpers.dashboard import fits, logged_in, needs_browser, rows, shot
from tests.helpers.fleet import (
    BIG,
    BIG_RUN_ONLY,
    LIMIT,
    LIMIT_BIG,
    NO_WORKING_SET,
    PHONE,
    RUN_ONLY,
    WIDE,
    MiB,
    big_exits,
    big_working_set,
    pct_text,
    working_set,
)
from tests.helpers.manager import ManagerProcess

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytestmark = needs_browser

VIEWS = {"wide": WIDE, "phone": PHONE}


def cell(page: Page, node: str, label: str) -> str:
    row = page.locator("table.nodes tbody tr", has=page.locator("a.node", has_text=re.compile(f"^{node}$")))
    return row.locator(f"td[data-label='{label}']").inner_text().strip()


def expected_fleet_order() -> list[str]:
    """Riskiest first: every node is live (online, or run-only): working set over limit, highest
    first, unknown last (then by alerts, then OOM kills, then name: node-11 has 0 alerts, as
    runner-01). node-05's OOM kills are history next to the working sets above its own."""
    known = sorted((i for i in range(20) if working_set(i) is not None), key=lambda i: -working_set(i))  # type: ignore[operator]
    return [*(f"node-{i:02d}" for i in known), f"node-{NO_WORKING_SET:02d}", RUN_ONLY]


def expected_big_first_page() -> list[str]:
    """The first 50 by (offline last, working set known first, ratio desc, name): every 100th node
    is offline (its report an hour old); the ratios are distinct, so alerts never decide."""

    def key(i: int) -> tuple[bool, int, int, str]:
        ws = big_working_set(i)
        return (i % 100 == 0, ws is None, -(ws or 0), f"node-{i:05d}")

    return [f"node-{i:05d}" for i in sorted(range(BIG), key=key)[:50]]


# -- the working set column --------------------------------------------------------------------


@pytest.mark.parametrize("view", ["wide", "phone"])
def test_working_set_column_shows_the_posted_numbers(browser: Browser, fleet: ManagerProcess, view: str) -> None:
    page, watch = logged_in(browser, fleet, **VIEWS[view])
    for i in range(20):
        node = f"node-{i:02d}"
        text = cell(page, node, "Working set / limit")
        assert text == pct_text(i), (node, text)
        td = page.locator("tr", has=page.locator("a.node", has_text=re.compile(f"^{node}$"))).locator("td.ws")
        meter = td.locator("meter")
        if working_set(i) is None:
            assert meter.count() == 0 and text == "unknown"  # never a 0% bar
            assert td.get_attribute("title") == "no working set reported"
            continue
        ws = working_set(i)
        assert ws is not None
        value = float(meter.get_attribute("value") or "nan")
        assert abs(value - min(ws * 100 / LIMIT, 100)) <= 0.05, (node, value)  # the bar: clamped at 100
        assert meter.evaluate("m => m.getAttribute('aria-label')") == "working set of the limit"
        box = meter.bounding_box()
        assert meter.is_visible() and box is not None and box["width"] > 10
        title = td.get_attribute("title") or ""
        assert f"working set {ws // MiB} MiB of the 512 MiB limit; usage {ws // MiB + 30} MiB" == title, title
    fits(page, VIEWS[view]["viewport"]["width"])
    # above 90 %: in red and the row highlighted (node-02 is at 117.2 %, node-19 at 93.2 %)
    risky = page.locator("tr.risk td:first-child").all_inner_texts()
    assert {"node-02", "node-19"} <= set(risky) and "node-18" not in risky
    shot(page, f"working-set-{view}")
    assert not watch.errors, watch.errors


@pytest.mark.parametrize("view", ["wide", "phone"])
def test_working_set_column_at_10000_nodes(browser: Browser, big: ManagerProcess, view: str) -> None:
    page, watch = logged_in(browser, big, **VIEWS[view])
    names = rows(page)
    assert len(names) == 50
    for name in names:
        ws = big_working_set(int(name.split("-")[1]))
        shown = cell(page, name, "Working set / limit")
        assert shown == ("unknown" if ws is None else f"{ws * 100 / LIMIT_BIG:.1f}%"), (name, shown)
    fits(page, VIEWS[view]["viewport"]["width"])
    page.goto(big.url + "/?sort=working_set_pct")  # lowest first; unknown still last
    low = rows(page)
    ratios = [big_working_set(int(n.split("-")[1])) for n in low]
    assert None not in ratios and ratios == sorted(ratios)  # type: ignore[type-var]
    shot(page, f"working-set-big-{view}")
    assert not watch.errors, watch.errors


# -- the default sort: risk --------------------------------------------------------------------


def test_default_sort_is_risk_and_headings_link_right(browser: Browser, fleet: ManagerProcess) -> None:
    page, watch = logged_in(browser, fleet, **WIDE)
    assert rows(page) == expected_fleet_order()
    assert "riskiest first" in page.locator("p.count").inner_text()
    assert page.locator("th a.active").count() == 0  # no column claims the risk sort
    heading = page.locator("th a", has_text="Working set / limit")
    assert heading.get_attribute("href") == "?sort=-working_set_pct"  # highest first on the first click
    heading.click()
    page.wait_for_url("**/?sort=-working_set_pct")
    assert rows(page)[0] == "node-02" and rows(page)[-2:] == [f"node-{NO_WORKING_SET:02d}", RUN_ONLY]
    active = page.locator("th a.active")
    assert active.inner_text() == "Working set / limit ▼" and active.get_attribute("aria-sort") == "descending"
    assert active.get_attribute("href") == "?sort=working_set_pct"  # the other way
    page.click("a.sorted >> text=sort by risk")
    page.wait_for_url(fleet.url + "/")  # the default sort leaves the address bare
    assert rows(page) == expected_fleet_order()
    page.locator("th a", has_text="Issues").click()  # sort by open alerts, most first
    page.wait_for_url("**/?sort=-alerts")
    # 4 alerts: budget from host, OOM kills, pressure stops, and its supervisor exited (its last
    # event is the pressure stop's exit, no restart after it: issue 38's supervisor states)
    assert rows(page)[0] == "node-05"
    assert cell(page, "node-05", "Issues").startswith("4 alerts") and "supervisor-exited" in page.inner_text("#alerts")
    shot(page, "sort-risk")
    assert not watch.errors, watch.errors


def test_default_sort_is_risk_at_10000_nodes(browser: Browser, big: ManagerProcess) -> None:
    page, watch = logged_in(browser, big, **WIDE)
    assert rows(page) == expected_big_first_page()
    assert rows(page)[0] == "node-02321"  # 99.99 % of its limit (node-04321's 3 OOM kills are history)
    page.click("a >> text=next")  # the next page continues the same order
    page.wait_for_url("**/?offset=50")
    ws = [big_working_set(int(n.split("-")[1])) for n in rows(page)]
    last = big_working_set(int(expected_big_first_page()[-1].split("-")[1]))
    assert None not in ws and last is not None and all(w <= last for w in ws)  # type: ignore[operator]
    assert not watch.errors, watch.errors


# -- pressure stops apart from OOM kills -------------------------------------------------------


@pytest.mark.parametrize("view", ["wide", "phone"])
def test_pressure_stops_apart_from_oom_kills(browser: Browser, fleet: ManagerProcess, view: str) -> None:
    page, watch = logged_in(browser, fleet, **VIEWS[view])
    assert cell(page, "node-05", "OOM 24h") == "2 · 1 stop"  # 2 kills (their restarts not counted), 1 stop
    assert cell(page, "node-12", "OOM 24h") == "0 · 2 stops"  # a stop is never an OOM kill
    assert cell(page, "node-10", "OOM 24h") == "0"
    stops = page.locator("tr", has=page.locator("a.node", has_text="node-12")).locator(".stops")
    assert "not OOM kills" in (stops.get_attribute("title") or "")
    cards = {c.split("\n")[-1].strip(): c.split("\n")[0] for c in page.locator(".cards .card").all_inner_texts()}
    assert cards["OOM kills in 24 h"] == "2" and cards["pressure stops in 24 h"] == "3"
    assert "pressure-stops" in page.locator("#alerts").inner_text()
    fits(page, VIEWS[view]["viewport"]["width"])
    shot(page, f"pressure-stops-{view}")
    assert not watch.errors, watch.errors


def test_pressure_stops_apart_at_10000_nodes(browser: Browser, big: ManagerProcess) -> None:
    page, watch = logged_in(browser, big, **WIDE)
    kills = sum(big_exits(i)[0] for i in range(BIG))
    stops = sum(big_exits(i)[1] for i in range(BIG))
    cards = {c.split("\n")[-1].strip(): c.split("\n")[0] for c in page.locator(".cards .card").all_inner_texts()}
    assert cards["OOM kills in 24 h"] == str(kills) and cards["pressure stops in 24 h"] == str(stops)
    page.click(".card >> text=pressure stops in 24 h")
    page.wait_for_url("**/?sort=-pressure_stops_24h")
    assert cell(page, rows(page)[0], "OOM 24h") == "0 · 2 stops"
    assert set(rows(page)[: stops // 2]) == {f"node-{i:05d}" for i in range(BIG) if big_exits(i)[1]}
    assert not watch.errors, watch.errors


# -- run-only ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("which", "count"), [("fleet", 1), ("big", BIG_RUN_ONLY)])
@pytest.mark.parametrize("view", ["wide", "phone"])
def test_run_only_status(browser: Browser, request: pytest.FixtureRequest, which: str, count: int, view: str) -> None:
    server: ManagerProcess = request.getfixturevalue(which)
    page, watch = logged_in(browser, server, **VIEWS[view])
    card = page.locator(".cards a.card", has_text="run only")
    assert card.locator(".big").inner_text() == str(count)
    card.click()
    page.wait_for_url("**/?status=run-only")
    assert page.input_value("select[name=status]") == "run-only"
    names = rows(page)
    assert len(names) == count and all(n.startswith("runner-") for n in names)
    badges = page.locator("td[data-label=Status] .badge.run-only").all_inner_texts()
    assert badges == ["run-only"] * count
    page.select_option("select[name=status]", "online")
    page.click("button >> text=Filter")
    page.wait_for_url(re.compile(r"status=online"))
    assert not [n for n in rows(page) if n.startswith("runner-")]
    page.goto(server.url + "/nodes/" + ("runner-01" if which == "fleet" else "runner-0"))
    assert page.locator("h1 .badge").inner_text() == "run-only"
    shot(page, f"run-only-{which}-{view}")
    assert not watch.errors, watch.errors


# -- the node page: chart ranges, pressure-stop markers, usage against the limit ---------------


HISTORY_NODE = "node-07"
RECENT = 100  # reports 30 s apart, the newest 45 s old: all within the last hour
HOURLY = 719  # then one an hour, at h h 30 m, back to 29 d 23.5 h


@pytest.fixture(scope="module")
def history(fleet: ManagerProcess) -> Iterator[ManagerProcess]:
    """node-07 gets 30 days of history as retention leaves it, straight into the database."""
    from sqlalchemy import insert, select

    from oomguard.manager.db import make_engine, nodes, reports

    now = int(time.time() * 1000)
    ages_s = [45 + 30 * k for k in range(RECENT)] + [h * 3600 + 1800 for h in range(1, HOURLY + 1)]
    engine = make_engine(fleet.db_url)
    with engine.begin() as conn:
        node_id = conn.execute(select(nodes.c.id).where(nodes.c.name == HISTORY_NODE)).scalar_one()
        conn.execute(
            insert(reports),
            [
                {
                    "node_id": node_id,
                    "ingest_id": f"hist-{k}",
                    "received_ms": now - age * 1000,
                    "effective_bytes": LIMIT,
                    "budget_bytes": 500 << 30,
                    "usage_bytes": (200 + k % 50) * MiB,
                    "working_set_bytes": (150 + k % 40) * MiB,
                }
                for k, age in enumerate(ages_s)
            ],
        )
    engine.dispose()
    yield fleet


def expected_points(span_s: int) -> int:
    """Reports received within *span_s*: the inserted ones, and the one node-07 posted at start."""
    ages = [45 + 30 * k for k in range(RECENT)] + [h * 3600 + 1800 for h in range(1, HOURLY + 1)]
    return 1 + sum(1 for a in ages if a < span_s)


@pytest.mark.parametrize("view", ["wide", "phone"])
def test_chart_range_links_change_the_points_drawn(browser: Browser, history: ManagerProcess, view: str) -> None:
    page, watch = logged_in(browser, history, **VIEWS[view])
    page.goto(history.url + f"/nodes/{HISTORY_NODE}")
    counts = {}
    for key, span in (("1h", 3600), ("24h", 86400), ("7d", 7 * 86400), ("30d", 30 * 86400)):
        page.click(f"nav.ranges >> text={key}")
        page.wait_for_url(f"**/nodes/{HISTORY_NODE}?range={key}")
        counts[key] = page.locator("svg.chart .hover rect").count()  # one hover column per point drawn
        if key != "30d":  # up to 7 d every report is drawn: fewer than the bound
            assert counts[key] == expected_points(span), (key, counts[key])
    assert counts["1h"] == 101 and counts["24h"] == 124 and counts["7d"] == 268
    assert counts["7d"] < counts["30d"] <= 500  # 820 reports, downsampled to at most 500 buckets
    assert page.evaluate("document.documentElement.scrollWidth") <= VIEWS[view]["viewport"]["width"]
    shot(page, f"chart-30d-{view}")
    assert not watch.errors, watch.errors


@pytest.mark.parametrize("view", ["wide", "phone"])
def test_node_page_pressure_stops_and_working_set(browser: Browser, fleet: ManagerProcess, view: str) -> None:
    page, watch = logged_in(browser, fleet, **VIEWS[view])
    page.goto(fleet.url + "/nodes/node-05")
    assert page.locator("svg.chart g.oom").count() == 2  # the two exits; their restart events are not kills
    stop = page.locator("svg.chart g.stop")
    assert stop.count() == 1
    tip = stop.locator("title").text_content() or ""
    assert re.fullmatch(
        r"pressure stop at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC: working set peak 461 MiB, guard margin 64 MiB", tip
    ), tip
    colours = page.evaluate(
        "['g.oom line', 'g.stop line'].map(s => getComputedStyle(document.querySelector('svg.chart ' + s)).stroke)"
    )
    assert colours[0] != colours[1]  # another colour, and another shape (diamond vs triangle)
    assert "pressure stop" in page.locator(".legends").inner_text()
    timeline = page.locator("ol.timeline").inner_text()
    assert timeline.count("pressure stop: run --guard stopped the worker before the kernel's OOM killer acted") == 1
    assert "(461 MiB working set peak, 64 MiB guard margin)" in timeline
    assert timeline.count("OOM kill by the kernel") == 2 and timeline.count("restart after an OOM kill") == 2
    usage = " ".join(page.locator("section.usage").inner_text().split())
    ws = working_set(5)
    assert ws is not None
    assert f"Working set {ws // MiB} MiB of the 512 MiB limit: {pct_text(5)}" in usage
    assert f"Usage {ws // MiB + 30} MiB of the limit" in usage
    cards = page.locator(".cards").inner_text()
    assert "1\npressure stops in 24 h" in cards and "2\nOOM kills in 24 h" in cards
    assert page.evaluate("document.documentElement.scrollWidth") <= VIEWS[view]["viewport"]["width"]
    shot(page, f"node-pressure-{view}")
    assert not watch.errors, watch.errors


def test_node_page_unknown_working_set(browser: Browser, fleet: ManagerProcess) -> None:
    page, _ = logged_in(browser, fleet, **WIDE)
    page.goto(fleet.url + f"/nodes/node-{NO_WORKING_SET:02d}")
    usage = " ".join(page.locator("section.usage").inner_text().split())
    assert "Working set unknown of the 512 MiB limit: unknown" in usage
    assert page.locator("section.usage meter").count() == 0 and "0%" not in usage
    page.goto(fleet.url + "/nodes/" + urllib.parse.quote(RUN_ONLY))
    assert "unknown" in page.locator("section.usage").inner_text()
