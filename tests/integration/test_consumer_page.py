"""The node page in a real browser (headless Chromium, ``tests/helpers/dashboard.py``): CuZK's own
view beside the limit (budget, used, available; the budget red when above the limit), its alert,
and a consumer whose status could not be read shown with the reason, never a number."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from oomguard.agent.consumers import check_status_url, poll_cuzk
from tests.helpers.cuzk import fake_cuzk
from tests.helpers.dashboard import HAVE_BROWSER, api, logged_in, needs_browser, shot
from tests.helpers.manager import ManagerProcess, fixture_report

if TYPE_CHECKING:
    from playwright.sync_api import Browser

pytestmark = needs_browser
if not HAVE_BROWSER:
    print("\nSKIP browser tests: Playwright or /usr/bin/chromium missing", file=sys.stderr)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagerProcess]:
    db = tmp_path_factory.mktemp("consumers") / "fleet.db"
    s = ManagerProcess(f"sqlite:///{db}").start()
    with fake_cuzk() as cuzk:
        url = check_status_url(cuzk.url)
        report = fixture_report()  # the 342 GiB container on a 503 GiB host
        report["consumers"] = [poll_cuzk(url)]  # CuZK's "auto" budget: 498 GiB
    api(s, "/api/v1/reports", {"node": "prover-1", "id": uuid.uuid4().hex, "report": report, "interval_s": 30})
    down = fixture_report()
    down["consumers"] = [poll_cuzk(url)]  # the stand-in is gone: connection refused
    api(s, "/api/v1/reports", {"node": "prover-2", "id": uuid.uuid4().hex, "report": down, "interval_s": 30})
    yield s
    s.stop()


def test_the_node_page_shows_cuzks_view_beside_the_limit(browser: Browser, server: ManagerProcess) -> None:
    page, watch = logged_in(browser, server)
    page.click("a.node >> text=prover-1")
    line = page.locator("section.usage p.consumer")
    line.wait_for()
    said = " ".join(line.inner_text().split())
    assert said.startswith("cuzk's own view (http://127.0.0.1:")
    assert said.endswith("/status): budget 498 GiB above the 342 GiB limit · used 184.35 GiB · available 313.65 GiB")
    budget = line.locator("b.bad")
    assert budget.inner_text() == "498 GiB"
    plain = line.locator("b").first  # the consumer's name: not styled as bad
    assert budget.evaluate("b => getComputedStyle(b).color") != plain.evaluate("b => getComputedStyle(b).color")
    alerts = page.locator("section.node-alerts").inner_text()
    assert (
        "consumer-budget-above-limit: a consumer's own budget (cuzk: 498 GiB) is above the effective limit 342 GiB"
        in (" ".join(alerts.split()))
    )
    # the usage section's lines, in the page's order: working set, usage, then the consumer's
    order = page.locator("section.usage p").evaluate_all("ps => ps.map(p => p.className)")
    assert order == ["ws", "use", "consumer"]
    shot(page, "node-consumer")
    page.goto(server.url + "/nodes/prover-2")
    unknown = " ".join(page.locator("section.usage p.consumer").inner_text().split())
    assert unknown.endswith("/status): unknown: unreachable: connection refused"), unknown
    assert "GiB" not in unknown  # no number where the value is unknown
    assert "consumer-budget-above-limit" not in page.locator("section.node-alerts").inner_text()
    shot(page, "node-consumer-unknown")
    assert not watch.errors, watch.errors
