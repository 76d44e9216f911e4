"""Every dashboard page in Chromium at 1,280 and 390 px with what vast.ai sends (issue 38, items 4-6),
on SQLite and PostgreSQL:

- nodes with sixteen labels (one value of 256 characters), eight GPUs, a 200-character cgroup path
  (in the report and in a warning) and a 128-character name: no page is wider than the window,
  and the nodes table keeps "OOM 24h" and "Last seen" in view at 1,280 px (three labels a row,
  each cut at 16em, whole on hover; "+13" for the rest);
- on a phone the cards take two short rows, so the alerts start on the first screen;
- the chart: reports delivered late from the agent's spool drawn when they were measured, the range
  fitted to the data, words of 10 px or more at 390 px;
- a run-only node (only its supervisor's events): its OOM kill, restart and starts on the chart,
  its known budget shown, memlock and the report's other numbers unknown, never "unlimited";
- the header links to the API's page, /docs, which fits a phone too.

Every number checked is computed here from what the fixture posted. Screenshots in test-artifacts/."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.helpers.dashboard import api, logged_in, needs_browser, shot
from tests.helpers.fleet import PHONE, WIDE
from tests.helpers.manager import ManagerProcess, db_url_of, fixture_report, observation_body

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytestmark = needs_browser

GiB = 1 << 30
VIEWS = {"wide": WIDE, "phone": PHONE}
VAST = [f"vast-{i:02d}" for i in range(12)]
LONG_NAME = "c" + "0123456789abcdef" * 7 + "-" + "x" * 14  # 128 characters, the longest a node name may be
CGROUP = "/docker/" + "7f3a9c" * 32  # 200 characters, no space to break at
NOTE = "rented on vast.ai, " + "n" * 237  # a label's value at its 256-character limit
LABELS = {  # sixteen, the most a node may carry: vast.ai's two, and what an operator adds
    "comment": NOTE,
    "container_id": "C.12345678",
    "cpu_name": "AMD EPYC 7B13 64-Core Processor",
    "cuda_max_good": "12.4",
    "datacenter": "se-sto-1",
    "disk_name": "Samsung SSD 990 PRO 2TB",
    "driver_version": "550.54.15",
    "geolocation": "Stockholm, Sweden, SE",
    "gpu_name": "NVIDIA GeForce RTX 4090",
    "host_id": "98765",
    "machine_id": "123456",
    "mobo_name": "ROMED8-2T",
    "node_class": "rtx4090x8",
    "public_ipaddr": "203.0.113.77",
    "vast_containerlabel": "C.12345678",
    "verification": "verified",
}
SHOWN = sorted(LABELS)[:3]  # the nodes table lists the first three by key
BUDGET, LIMIT = 24 * GiB, 32 * GiB  # the run-only node's start event
LATE_MIN = 55  # the spooled reports were made over the last 55 minutes
KILLS: dict[str, float] = {}  # the run-only node's OOM kill, by database URL: when it happened (epoch s)


def vast_report() -> dict[str, Any]:
    rep = fixture_report(budget="500GiB")  # 342 GiB limit: a budget sized from the host, alerted
    rep["gpus"] = [
        {"index": i, "name": "NVIDIA GeForce RTX 4090", "memory_total_bytes": 24 * GiB, "memory_free_bytes": 23 * GiB}
        for i in range(8)
    ]
    rep["memory"]["cgroup"]["path"] = CGROUP
    rep["warnings"].append(
        {"code": "cgroup-path", "message": f"the limit is read at /sys/fs/cgroup{CGROUP}/memory.max"}
    )
    return rep


def event(s: ManagerProcess, node: str, **fields: Any) -> None:
    api(s, "/api/v1/events", {"node": node, "id": uuid.uuid4().hex, "event": fields})


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(t))


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def site(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagerProcess]:
    url = db_url_of(request.param, Path(tmp_path_factory.mktemp("layout")), "lay_")
    s = ManagerProcess(url).start()
    try:
        rep = vast_report()
        for name in [*VAST, LONG_NAME]:
            api(s, "/api/v1/reports", {"node": name, "id": uuid.uuid4().hex, "report": rep, "labels": LABELS})
        now = time.time()
        for k in range(12):  # kept in the agent's spool, all delivered now: each keeps its own time
            made = iso(now - (LATE_MIN - 5 * k) * 60)
            api(s, "/api/v1/reports", {"node": "late", "id": uuid.uuid4().hex, "report": rep, "time": made})
        sizes = {"budget_bytes": BUDGET, "effective_bytes": LIMIT, "limited_by": "cgroup-v2"}
        event(s, "runner", event="start", concurrency=2, time=iso(now - 50 * 60), **sizes)
        KILLS[url] = int(now) - 40 * 60
        event(s, "runner", event="exit", reason="oom-kill", signal=9, time=iso(KILLS[url]))
        event(s, "runner", event="restart", reason="oom-kill", delay_s=1.0, time=iso(now - 40 * 60 + 1))
        event(s, "runner", event="start", concurrency=1, time=iso(now - 40 * 60 + 2), **sizes)
        obs = observation_body(time=iso(now))
        api(s, "/api/v1/observations", {"node": VAST[0], "id": uuid.uuid4().hex, "observation": obs})
        yield s
    finally:
        s.stop()


def db_of(server: ManagerProcess) -> str:
    return server.db_url.split(":")[0]


def fits_window(page: Page, what: str) -> None:
    """Nothing wider than the window, and every box that scrolls its content holds it whole."""
    width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], (what, width)
    boxes = page.evaluate("[...document.querySelectorAll('.scroll')].map(b => [b.scrollWidth, b.clientWidth])")
    assert all(inner <= box for inner, box in boxes), (what, boxes)


def pages(server: ManagerProcess, page: Page) -> list[tuple[str, str]]:
    """(name, path) of every page: the overview, an alert kind listed in full, the nodes, the
    forget form, the profiles."""
    page.goto(server.url + "/")
    kind = page.locator("#alerts details summary b").first.inner_text()
    return [
        ("overview", "/"),
        ("alerts", f"/?alerts={kind}#alerts"),
        ("vast-node", f"/nodes/{VAST[0]}"),
        ("long-name", f"/nodes/{LONG_NAME}"),
        ("late-node", "/nodes/late"),
        ("run-only-node", "/nodes/runner"),
        ("forget", f"/nodes/{VAST[0]}/forget"),
        ("profiles", "/profiles"),
        ("profile", "/profiles/cuzk-porep"),
    ]


@pytest.mark.parametrize("view", ["wide", "phone"])
def test_every_page_fits_the_window(browser: Browser, site: ManagerProcess, view: str) -> None:
    page, watch = logged_in(browser, site, **VIEWS[view])
    for name, path in pages(site, page):
        response = page.goto(site.url + path)
        assert response is not None and response.status == 200, (name, response and response.status)
        page.wait_for_selector("main h1, main table.nodes")
        fits_window(page, name)
        shot(page, f"layout-{name}-{view}-{db_of(site)}")
    assert not watch.errors, watch.errors


def test_the_nodes_table_keeps_its_last_columns_in_view(browser: Browser, site: ManagerProcess) -> None:
    page, watch = logged_in(browser, site, **WIDE)
    box = page.locator(".scroll").bounding_box()
    assert box is not None
    for heading in ("OOM 24h", "Last seen"):
        th = page.locator("table.nodes thead th", has_text=heading).bounding_box()
        assert th is not None and th["x"] + th["width"] <= min(box["x"] + box["width"], 1280), (heading, th)
    row = page.locator("table.nodes tbody tr", has=page.locator("a.node", has_text=re.compile(f"^{VAST[0]}$")))
    chips = row.locator("a.label:not(.more)")
    assert chips.all_inner_texts() == [f"{k}={LABELS[k]}" for k in SHOWN]  # whole in the text, cut on screen
    assert [chips.nth(i).get_attribute("title") for i in range(3)] == [
        f"{k}={LABELS[k]}: show the nodes labelled so" for k in SHOWN
    ]
    cut = chips.first.evaluate("a => [a.scrollWidth, a.clientWidth, parseFloat(getComputedStyle(a).fontSize)]")
    assert cut[0] > cut[1] and cut[1] <= 16 * cut[2] + 1, cut  # the 256-character value, cut at 16em
    more = row.locator("a.label.more")
    rest = sorted(LABELS)[3:]
    assert more.inner_text() == f"+{len(rest)}" and more.get_attribute("href") == f"/nodes/{VAST[0]}#labels"
    assert (more.get_attribute("title") or "").split("\n") == [f"{k}={LABELS[k]}" for k in rest]
    long_row = page.locator("table.nodes tbody tr", has=page.locator("a.node", has_text=LONG_NAME))
    name_box = long_row.locator("a.node").bounding_box()
    assert name_box is not None and name_box["x"] + name_box["width"] <= box["x"] + box["width"]
    more.click()  # the node page lists every label
    page.wait_for_url(f"**/nodes/{VAST[0]}#labels")
    assert len(page.locator("p.labels a.label").all_inner_texts()) == len(LABELS)
    assert not watch.errors, watch.errors


def test_on_a_phone_the_cards_leave_the_first_screen_to_the_fleet(browser: Browser, site: ManagerProcess) -> None:
    page, watch = logged_in(browser, site, **PHONE)
    height = 844
    cards = page.locator("section.cards")
    box = cards.bounding_box()
    assert box is not None and cards.locator(".card").count() == 8
    assert box["height"] <= 0.2 * height, box  # two rows of four small tiles
    tops = sorted({round(b["y"]) for b in (c.bounding_box() for c in cards.locator(".card").all()) if b})
    assert len(tops) == 2, tops
    alerts = page.locator("#alerts h2").bounding_box()
    assert alerts is not None and alerts["y"] + alerts["height"] <= 0.5 * height  # the alerts start above the fold
    texts = {c.split("\n")[-1].strip(): c.split("\n")[0] for c in cards.locator(".card").all_inner_texts()}
    assert texts["online"] == str(len(VAST) + 2) and texts["run only"] == "1"
    shot(page, f"layout-cards-phone-{db_of(site)}")
    page.goto(site.url + f"/nodes/{VAST[0]}")  # the node's six cards: two rows too
    node_cards = page.locator("section.cards").bounding_box()
    assert node_cards is not None and node_cards["height"] <= 0.2 * height
    assert not watch.errors, watch.errors


RENDERED = """() => [...document.querySelectorAll('svg.chart-labels text')]
    .filter(t => getComputedStyle(t).display !== 'none')
    .map(t => { const b = t.getBoundingClientRect();
                return {text: t.textContent, px: parseFloat(getComputedStyle(t).fontSize) * t.getScreenCTM().a,
                        box: [b.left, b.top, b.right, b.bottom]}; })"""


@pytest.mark.parametrize("view", ["wide", "phone"])
def test_the_chart_draws_when_measured_fits_the_data_and_reads_on_a_phone(
    browser: Browser, site: ManagerProcess, view: str
) -> None:
    page, watch = logged_in(browser, site, **VIEWS[view])
    page.goto(site.url + "/nodes/late")
    assert page.locator("nav.ranges a.active").inner_text() == "1h"  # 55 minutes of reports: not 30 days
    assert page.locator("nav.ranges .fitted").inner_text() == "fits the data"
    chart = page.locator("svg.chart").bounding_box()
    assert chart is not None
    dots = page.locator("svg.chart circle.s-ws").evaluate_all("cs => cs.map(c => c.getBoundingClientRect().x)")
    assert len(dots) == 12 and dots == sorted(dots)  # twelve points across the hour, not one bar at its end
    assert dots[0] - chart["x"] < 0.15 * chart["width"] and dots[-1] - dots[0] > 0.8 * chart["width"]
    words = page.evaluate(RENDERED)
    assert len(words) >= 6 and all(w["px"] >= 10 for w in words), words
    scale = page.locator("svg.chart").evaluate("s => s.getScreenCTM().a")
    if view == "phone":
        assert scale < 0.55  # the chart is drawn at half its size; its words are not
    for a, b in ((a, b) for i, a in enumerate(words) for b in words[i + 1 :]):  # no two words overlap
        apart = a["box"][2] <= b["box"][0] or b["box"][2] <= a["box"][0]
        assert apart or a["box"][3] <= b["box"][1] or b["box"][3] <= a["box"][1], (a, b)
    page.click("nav.ranges >> text=30d")  # a chosen range wins
    page.wait_for_url("**/nodes/late?range=30d")
    assert page.locator("nav.ranges a.active").inner_text() == "30d" and page.locator("nav.ranges .fitted").count() == 0
    shot(page, f"layout-chart-{view}-{db_of(site)}")
    assert not watch.errors, watch.errors


@pytest.mark.parametrize("view", ["wide", "phone"])
def test_a_run_only_node_shows_what_it_knows_and_nothing_else(
    browser: Browser, site: ManagerProcess, view: str
) -> None:
    page, watch = logged_in(browser, site, **VIEWS[view])
    row = page.locator("table.nodes tbody tr", has=page.locator("a.node", has_text=re.compile("^runner$")))
    cells = {
        label: row.locator(f"td[data-label='{label}']").inner_text().strip()
        for label in ("Runtime", "Host RAM / limit", "Budget", "Memlock", "GPUs", "Jobs")
    }
    assert cells == {
        "Runtime": "unknown",
        "Host RAM / limit": "unknown / 32 GiB",
        "Budget": "24 GiB",
        "Memlock": "unknown",  # never "unlimited": no report ever said
        "GPUs": "unknown",
        "Jobs": "1",
    }, cells
    page.goto(site.url + "/nodes/runner")
    kv = {
        tr.locator("th").inner_text(): tr.locator("td").inner_text()
        for tr in page.locator("table.kv").first.locator("tr").all()
    }
    assert kv["budget"] == "24 GiB, the supervisor's start event"  # not "none" under a known budget
    assert kv["effective limit"] == "32 GiB (cgroup-v2), the supervisor's start event"
    assert kv["memlock"] == kv["host RAM"] == kv["CPUs"] == kv["cgroup"] == "unknown: not reported"
    cards = {c.split("\n")[-1].strip(): c.split("\n")[0] for c in page.locator("section.cards .card").all_inner_texts()}
    assert cards["budget (its supervisor's)"] == "24 GiB" and cards["host RAM"] == "unknown"
    assert "unlimited" not in page.locator("main").inner_text()
    # The chart: its events, at their own times, and the sizes its start events gave; no "no reports".
    assert page.locator("nav.ranges a.active").inner_text() == "1h"  # 50 minutes of events
    assert page.locator("svg.chart g.oom").count() == 1 and page.locator("svg.chart g.restart").count() == 1
    assert page.locator("svg.chart g.start").count() == 2
    assert page.locator("svg.chart polyline.s-budget.step").count() == 2
    kill = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(KILLS[site.db_url]))
    assert page.locator("svg.chart g.oom title").text_content() == f"OOM kill at {kill}"
    assert "restart" in page.locator(".legends").inner_text()
    ticks = page.locator("svg.chart-labels text.y").all_text_contents()
    assert ticks[0] == "0 B" and ticks[-1] == "32 GiB"
    # The timeline says when the kill happened, and that its event came 40 minutes later.
    line = page.locator("ol.timeline li.oom-kill")
    assert re.search(r"^4\d m ago \(arrived 40 m later\) exit", " ".join(line.inner_text().split())), line.inner_text()
    assert line.locator("time").get_attribute("title") == kill
    fits_window(page, "run-only")
    shot(page, f"layout-run-only-{view}-{db_of(site)}")
    assert not watch.errors, watch.errors


@pytest.mark.parametrize("view", ["wide", "phone"])
def test_the_header_links_to_the_api_page(browser: Browser, site: ManagerProcess, view: str) -> None:
    """The phone here is a mobile browser (``is_mobile``: it honours the page's viewport, and without
    one lays the page out 980 px wide): /docs fits it as the dashboard's pages do."""
    mobile = {"is_mobile": True, "has_touch": True} if view == "phone" else {}
    page, watch = logged_in(browser, site, **VIEWS[view], **mobile)
    link = page.locator("header.top a", has_text=re.compile("^API$"))
    assert link.get_attribute("href") == "/docs"
    link.click()
    page.wait_for_url("**/docs")
    page.wait_for_selector("#swagger-ui .opblock")  # Swagger UI started from the manager's own assets
    assert page.evaluate("window.innerWidth") == VIEWS[view]["viewport"]["width"]
    fits_window(page, "docs")
    shot(page, f"layout-docs-{view}-{db_of(site)}")
    assert not watch.errors, watch.errors
