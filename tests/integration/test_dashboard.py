"""The dashboard in a real browser: headless Chromium (Debian's package) driven by Playwright (the
``browser`` fixture and the page helpers: ``tests/helpers/dashboard.py``)."""

from __future__ import annotations

import json
import re
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.helpers.dashboard import HAVE_BROWSER, api, logged_in, needs_browser, rows, shot
from tests.helpers.manager import VIEWER, ManagerProcess, fixture_report

if TYPE_CHECKING:
    from playwright.sync_api import Browser

HOSTILE = "<script>alert(1)</script>"

pytestmark = needs_browser
if not HAVE_BROWSER:
    print("\nSKIP browser tests: Playwright or /usr/bin/chromium missing", file=sys.stderr)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagerProcess]:
    db = tmp_path_factory.mktemp("dash") / "fleet.db"
    s = ManagerProcess(f"sqlite:///{db}").start()
    small = fixture_report("docker_v2_private_ns_limit_512m")
    for i in range(57):
        api(s, "/api/v1/reports", {"node": f"gpu-{i:02d}", "id": uuid.uuid4().hex, "report": small})
    hostile = fixture_report(budget="500GiB")  # the outage: a budget sized from the host
    hostile["warnings"].append({"code": "xss", "message": HOSTILE})
    hostile["memory"]["cgroup"]["path"] = f"/kubepods/{HOSTILE}"
    hostile["gpus"] = [
        {"index": 0, "name": f"H100 {HOSTILE}", "memory_total_bytes": 80 << 30, "memory_free_bytes": 70 << 30}
    ]
    hostile["plan"] = {"concurrency": 18}
    api(s, "/api/v1/reports", {"node": "evil-node", "id": uuid.uuid4().hex, "report": hostile})
    api(
        s,
        "/api/v1/events",
        {
            "node": "evil-node",
            "id": uuid.uuid4().hex,
            "event": {"event": "exit", "reason": "oom-kill", "signal": 9, "message": HOSTILE},
        },
    )
    yield s
    s.stop()


def test_dashboard_lists_sorts_filters_pages(browser: Browser, server: ManagerProcess) -> None:
    page, watch = logged_in(browser, server)
    assert page.locator(".cards .card").first.inner_text().startswith("58")  # online
    # Risk ranks the live working set first: the gpu nodes' 15.6 % of their limit before evil-node's
    # 4.7 % (its OOM kill and budget alert rank it first among the nodes at its working set).
    assert len(rows(page)) == 50 and rows(page)[0] == "gpu-00"
    shot(page, "dashboard")
    page.click("th >> text=Budget")  # sort by budget, ascending
    page.wait_for_url(re.compile(r"sort=budget_bytes"))  # loaded, not only committed: then read the rows
    assert rows(page)[-1].startswith("gpu-")
    page.click("th >> text=Budget")  # and descending: the host-sized budget first
    page.wait_for_url(re.compile(r"sort=-budget_bytes"))
    assert rows(page)[0] == "evil-node"
    assert page.locator("td.bad").first.inner_text() == "500 GiB"  # budget above the limit, highlighted
    page.fill("input[name=q]", "gpu-1")
    page.click("button >> text=Filter")
    page.wait_for_url(re.compile(r"q=gpu-1"))
    assert rows(page) == [f"gpu-{i}" for i in range(10, 20)][::-1] or sorted(rows(page)) == [
        f"gpu-{i}" for i in range(10, 20)
    ]
    page.goto(server.url + "/")
    page.click("a >> text=next")
    page.wait_for_url(re.compile(r"offset=50"))
    assert len(rows(page)) == 8
    alerts = page.locator(".alerts").inner_text()
    assert "budget-from-host" in alerts and "oom-kills" in alerts
    assert not watch.errors, watch.errors
    assert not watch.dialogs


def test_node_page_chart_and_hostile_text(browser: Browser, server: ManagerProcess) -> None:
    page, watch = logged_in(browser, server)
    page.fill("input[name=q]", "evil")  # past the first page of the risk order: filtered to it
    page.click("button >> text=Filter")
    page.click("a.node >> text=evil-node")
    page.wait_for_selector("svg.chart")
    assert page.locator("svg.chart polyline").count() >= 3  # limit, budget, usage, working set
    body = page.locator("main").inner_text()
    assert HOSTILE in body  # shown as text: in the warnings, the GPU name, the cgroup path, the event
    assert body.count(HOSTILE) >= 4
    assert page.locator("main script").count() == 0
    assert "OOM kill by the kernel" in page.locator("ol.timeline").inner_text()  # the reason in words
    shot(page, "node")
    raw = page.locator("a >> text=raw JSON").get_attribute("href")
    assert raw == "/api/v1/nodes/evil-node"
    page.goto(server.url + raw)  # the cookie works for the raw JSON too
    assert json.loads(page.locator("body").inner_text())["latest"]["warnings"][-1]["message"] == HOSTILE
    assert not watch.errors, watch.errors
    assert not watch.dialogs  # no alert(1) ran


def test_auto_refresh_without_reload_and_phone_width(browser: Browser, server: ManagerProcess) -> None:
    page, watch = logged_in(browser, server, viewport={"width": 390, "height": 844})
    page.goto(server.url + "/?refresh=1&q=late")
    assert rows(page) == ["No node matches."]
    page.evaluate("document.body.dataset.marker = 'same-page'")
    api(
        server,
        "/api/v1/reports",
        {"node": "late-node", "id": uuid.uuid4().hex, "report": fixture_report("docker_v2_private_ns_limit_512m")},
    )
    page.wait_for_selector("a.node >> text=late-node", timeout=10_000)
    assert page.evaluate("document.body.dataset.marker") == "same-page"  # swapped in, not reloaded
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390 + 1  # the page fits a phone; the wide table scrolls inside its box
    shot(page, "phone")
    assert not watch.errors, watch.errors


@pytest.mark.slow
def test_pages_send_a_csp_that_forbids_inline_script(server: ManagerProcess) -> None:
    req = urllib.request.Request(server.url + "/login")
    with urllib.request.urlopen(req, timeout=10) as r:
        csp = r.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "default-src 'none'" in csp


def test_logout_ends_the_session_in_the_browser(browser: Browser, server: ManagerProcess) -> None:
    """The cookie is a signed session, not the token; the log-out page POSTs, and the old cookie
    is refused afterwards even if replayed."""
    page, watch = logged_in(browser, server)
    cookies = {c["name"]: c for c in page.context.cookies()}
    session = cookies["oomguard_session"]
    assert VIEWER not in session["value"] and session["httpOnly"] and session["sameSite"] == "Strict"
    assert session["expires"] > 0  # an expiry, not a browser-session cookie
    page.goto(server.url + "/logout")
    shot(page, "logout")
    page.click("button[type=submit]")
    page.wait_for_url("**/login")
    # replayed by whoever kept it (a Cookie names no url, but its domain and path, which suffice)
    page.context.add_cookies([{**session}])  # type: ignore[typeddict-item]
    page.goto(server.url + "/")
    assert "/login" in page.url
    assert not watch.errors, watch.errors
