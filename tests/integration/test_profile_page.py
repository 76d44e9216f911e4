"""The profile page (issue 23, item 4): what the fleet learned of a profile, on SQLite and
PostgreSQL, and in Chromium at 1,280 and 390 px. Two classes of node run the profile: ``small``
nodes whose jobs use 9 GiB against the declared 14 GiB (over-declared), ``big`` nodes whose jobs
use 16 GiB, one of them OOM-killed at 14 GiB. Every number checked is computed here from what the
test posted: the recommendation per class (``manager/learning.py``: P98 + 10 %, the floor 1.3 x
after a kill), and the jobs each node's budget holds at the declared and the recommended size."""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from oomguard.manager.learning import MARGIN, OOM_BUMP
from tests.helpers.dashboard import api, fits, logged_in, needs_browser, shot
from tests.helpers.fleet import PHONE, WIDE
from tests.helpers.manager import VIEWER_H, ManagerProcess, db_url_of, envelope, fixture_report

if TYPE_CHECKING:
    from playwright.sync_api import Browser

GiB = 1 << 30
DECLARED, BASELINE = 14 * GiB, 40 * GiB
BUDGET = 200 * GiB  # each node's, from its report
CLASSES = {"small": (["s1", "s2", "s3"], 9 * GiB), "big": (["b1", "b2", "b3"], 16 * GiB)}
PROFILE = "porep-test"


def observation(peak: int, *, outcome: str = "ok", node_class: str) -> dict[str, Any]:
    return {
        "profile": PROFILE,
        "node_class": node_class,
        "declared_per_job_bytes": DECLARED,
        "peak_per_job_bytes": peak,
        "declared_baseline_bytes": BASELINE,
        "peak_baseline_bytes": None,
        "concurrency": 4,
        "outcome": outcome,
        "time": "2027-01-15T08:00:00Z",
    }


def expected() -> dict[str, dict[str, int]]:
    """Per class: the recommended per-job size and the jobs over its nodes, declared and recommended."""
    out = {}
    for cls, (names, peak) in CLASSES.items():
        rec = math.ceil(peak * (1 + MARGIN))
        if cls == "big":
            rec = max(rec, math.ceil(max(DECLARED, peak) * OOM_BUMP))  # the kill's floor
        out[cls] = {
            "per_job": rec,
            "today": len(names) * ((BUDGET - BASELINE) // DECLARED),
            "learned": len(names) * ((BUDGET - BASELINE) // rec),
        }
    return out


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def fleet(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagerProcess]:
    url = db_url_of(request.param, Path(tmp_path_factory.mktemp("profile")), "pp_")
    server = ManagerProcess(url).start()
    try:
        report = fixture_report(budget=f"{BUDGET // GiB}GiB")
        for cls, (names, peak) in CLASSES.items():
            for name in names:
                api(server, "/api/v1/reports", envelope(name, report, labels={"node_class": cls}))  # its class
                obs = observation(peak, node_class=cls, outcome="oom-kill" if name == "b1" else "ok")
                if name == "b1":  # run's exit event beside the kill's observation: it confirms the kill
                    event = {"event": "exit", "reason": "oom-kill", "time": obs["time"], "concurrency": 4}
                    api(server, "/api/v1/events", {"node": name, "id": uuid.uuid4().hex, "event": event})
                api(server, "/api/v1/observations", {"node": name, "id": uuid.uuid4().hex, "observation": obs})
        yield server
    finally:
        server.stop()


def get(server: ManagerProcess, path: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(server.url + path, headers={**VIEWER_H, "Accept": "text/html"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def cells(html: str, cls: str) -> str:
    """The text of the classes table's row of *cls*, tags dropped."""
    row = re.search(rf'<tr><td data-label="Class" class="class-name">{cls}</td>(.*?)</tr>', html, re.S)
    assert row is not None, html[-3000:]
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", row.group(1)))


def test_the_page_says_declared_observed_per_class_failures_and_the_jobs_it_changes(fleet: ManagerProcess) -> None:
    from oomguard.units import format_size

    status, index = get(fleet, "/profiles")
    assert status == 200 and f'href="/profiles/{PROFILE}"' in index
    assert (
        '<td data-label="Runs">6</td><td data-label="Nodes">6</td><td data-label="Failures" class="bad">1</td>' in index
    )
    status, page = get(fleet, f"/profiles/{PROFILE}")
    assert status == 200, page
    want = expected()
    for cls, numbers in want.items():
        row = cells(page, cls)
        assert f"{format_size(numbers['per_job'])} (class)" in row, (cls, row)
        assert f"{numbers['today']} → {numbers['learned']}" in row.replace("&rarr;", "→"), (cls, row)
    assert cells(page, "small").startswith(" 3 on 3 nodes 9 GiB, 9 GiB ")  # median and max peak per job
    big = re.search(
        r'class-name">big</td>.*?data-label="Floor">([^<]*)</td>.*?data-label="OOM kills"([^>]*)>(\d+)<', page, re.S
    )
    assert (
        big is not None
        and big.group(1) == format_size(want["big"]["per_job"])
        and big.groups()[1:] == (' class="bad"', "1")
    )
    today = sum(n["today"] for n in want.values())
    learned = sum(n["learned"] for n in want.values())
    assert f"{today} &rarr; {learned}" in page  # the fleet's sum: more jobs where declared too high
    assert want["small"]["learned"] > want["small"]["today"] and want["big"]["learned"] < want["big"]["today"]
    assert re.search(r"<b>oom-kill</b> on <a href=\"/nodes/b1\">b1</a> \(big\): at 14 GiB per job", page)
    assert page.count('<g class="run ok">') == 5 and page.count('<g class="run oom">') == 1  # one mark a run
    assert "declared 14 GiB" in page  # the declared line of the chart
    missing, body = get(fleet, "/profiles/never-run")
    assert missing == 404 and "No observations of a profile named" in body
    assert get(fleet, "/profiles/bad%20name")[0] == 404


def test_the_profiles_api_lists_what_was_observed(fleet: ManagerProcess) -> None:
    import json
    import urllib.request

    req = urllib.request.Request(fleet.url + "/api/v1/profiles", headers=VIEWER_H)
    with urllib.request.urlopen(req, timeout=10) as r:
        (listed,) = json.loads(r.read())["profiles"]
    assert (listed["profile"], listed["samples"], listed["nodes"], listed["failures"]) == (PROFILE, 6, 6, 1)
    unauthorised = urllib.request.Request(fleet.url + "/api/v1/profiles")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(unauthorised, timeout=10)
    assert err.value.code == 401


@needs_browser
@pytest.mark.browser
@pytest.mark.parametrize("view", ["wide", "phone"])
def test_the_profile_page_in_chromium(browser: Browser, fleet: ManagerProcess, view: str) -> None:
    context = {"wide": WIDE, "phone": PHONE}[view]
    page, watch = logged_in(browser, fleet, **context)
    page.click("header a[href='/profiles']")
    page.wait_for_selector("table.profiles")
    page.click(f"a[href='/profiles/{PROFILE}']")
    page.wait_for_selector("svg.profile-chart")
    fits(page, context["viewport"]["width"])
    assert page.locator("svg.profile-chart g.run").count() == 6
    assert page.locator("table.classes tbody tr").count() == 2
    # The chart's marks lie inside the chart, and the declared line is drawn above the small class's peaks.
    declared_y = page.locator("svg.profile-chart .l-declared line").get_attribute("y1")
    small_ys = page.locator("svg.profile-chart g.run.ok circle").evaluate_all(
        "cs => cs.map(c => +c.getAttribute('cy'))"
    )
    assert declared_y is not None and sum(y > float(declared_y) for y in small_ys) == 3  # below it: 9 GiB < 14
    shot(page, f"profile-{view}-{fleet.db_url.split(':')[0]}")
    assert not watch.errors and not watch.dialogs
