"""The node page's chart (``manager/web/chart.py``) as SVG geometry, without a browser: the y axis
reaches what the limit and the data need, a bogus budget above them is marked at the top instead of
squashing the other lines, and the 15-minute range is the shortest. The chart's words are in the
``<svg>`` laid over it (``svg.chart-labels``). The browser side (the range links, the ticks on a
node page) is in ``test_dashboard_fleet.py``, ``test_dashboard_risk.py`` and ``test_layout_pages.py``."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from oomguard.manager.web.chart import BOTTOM, RANGES, TOP, H, memory_chart, y_needed
from oomguard.times import iso_from_epoch

GiB = 1024**3
MiB = 1024**2
NOW = 1_767_225_600.0  # 2026-01-01 00:00:00 UTC
PLOT = H - TOP - BOTTOM


def history(n: int = 30, budget: int | None = 20 * GiB, limit: int | None = 2 * GiB) -> list[dict[str, Any]]:
    """*n* reports 30 s apart up to NOW: usage from 1.2 GiB up to 1.8 GiB, the working set 200 MiB below."""
    out = []
    for k in range(n):
        usage = int(1.2 * GiB + 0.6 * GiB * k / (n - 1))
        out.append(
            {
                "time": iso_from_epoch(NOW - 30 * (n - 1 - k)),
                "effective_bytes": limit,
                "budget_bytes": budget,
                "usage_bytes": usage,
                "working_set_bytes": usage - 200 * MiB,
            }
        )
    return out


def svg(markup: str) -> ET.Element:
    """The chart's <svg> element (its words and the legend left out)."""
    start = markup.index('<svg class="chart"')
    return ET.fromstring(markup[start : markup.index("</svg>", start) + len("</svg>")])


def words(markup: str) -> ET.Element:
    """The <svg> of the chart's words, laid over it."""
    start = markup.index('<svg class="chart-labels"')
    return ET.fromstring(markup[start : markup.index("</svg>", start) + len("</svg>")])


def ys(root: ET.Element, css: str) -> list[float]:
    """Every y of the series *css*'s lines (the <svg>'s own polylines: not the off-the-top arrow)."""
    return [
        float(pair.split(",")[1])
        for line in root.findall("polyline")
        if line.get("class") == css
        for pair in (line.get("points") or "").split()
    ]


def ticks(markup: str) -> list[str]:
    return [t.text or "" for t in words(markup).iter("text") if "y" in (t.get("class") or "").split()]


def labelled(markup: str, css: str) -> list[ET.Element]:
    return [t for t in words(markup).iter("text") if css in (t.get("class") or "").split()]


def test_a_bogus_budget_does_not_flatten_the_usage_line() -> None:
    markup = memory_chart(history(), [], RANGES["1h"], NOW)
    root = svg(markup)
    usage = ys(root, "s-usage")
    assert len(usage) == 30
    # usage runs from 60% to 90% of a 2 GiB axis: the top of the line in the upper fifth, and it
    # spans over a quarter of the height (under a 20 GiB axis it was 3%, within the bottom tenth)
    assert min(usage) < TOP + 0.2 * PLOT
    assert max(usage) - min(usage) > 0.25 * PLOT
    assert ticks(markup) == ["0 B", "512 MiB", "1 GiB", "1.5 GiB", "2 GiB"]
    limit = ys(root, "s-limit")
    assert limit and all(abs(y - TOP) < 0.5 for y in limit)  # the limit is the top line
    assert ys(root, "s-budget") == []  # not drawn to scale: no budget line pinned to the top or beyond
    assert all(y >= TOP for css in ("s-usage", "s-ws", "s-limit") for y in ys(root, css))
    marker = root.find("g[@class='offtop']")
    assert marker is not None
    assert [t.text for t in labelled(markup, "offtop")] == ["budget 20 GiB (above the limit)"]
    assert marker.findtext("title", "").startswith("budget 20 GiB (above the limit): off the top")
    arrow = marker.find("polyline")
    assert arrow is not None and arrow.get("class") == "s-budget"
    arrow_ys = [float(p.split(",")[1]) for p in (arrow.get("points") or "").split()]
    assert min(arrow_ys) >= TOP and max(arrow_ys) < TOP + 0.1 * PLOT  # at the top edge, inside the plot
    tips = [t.text or "" for t in root.iter("title")]
    assert any("budget: 20 GiB" in tip for tip in tips)  # the hover still says the real value


def test_a_budget_under_the_limit_is_drawn_to_scale() -> None:
    root = svg(memory_chart(history(budget=1536 * MiB), [], RANGES["1h"], NOW))
    budget = ys(root, "s-budget")
    assert len(budget) == 30 and all(abs(y - (TOP + PLOT / 4)) < 0.5 for y in budget)  # 1.5 of a 2 GiB axis
    assert root.find("g[@class='offtop']") is None


def test_without_a_limit_the_budget_sets_the_axis() -> None:
    """Nothing says a budget is bogus without a limit: it counts, and nothing is off the top."""
    points = [(0.0, h) for h in history(budget=4 * GiB, limit=None)]
    assert y_needed(points) == 4 * GiB
    markup = memory_chart(history(budget=4 * GiB, limit=None), [], RANGES["15m"], NOW)
    root = svg(markup)
    assert ticks(markup)[-1] == "4 GiB" and min(ys(root, "s-budget")) == TOP
    assert root.find("g[@class='offtop']") is None


def test_a_budget_off_the_top_for_part_of_the_range_is_drawn_where_it_fits() -> None:
    reports = history()
    for h in reports[:10]:
        h["budget_bytes"] = 1 * GiB
    root = svg(memory_chart(reports, [], RANGES["15m"], NOW))
    budget = ys(root, "s-budget")
    assert len(budget) == 10 and all(abs(y - (TOP + PLOT / 2)) < 0.5 for y in budget)
    assert root.find("g[@class='offtop']") is not None


def test_fifteen_minutes_is_the_shortest_range() -> None:
    assert next(iter(RANGES)) == "15m" and RANGES["15m"] == 900 == min(RANGES.values())
    reports = history(n=60)  # 30 minutes of reports: only the last 15 are drawn
    markup = memory_chart(reports, [], RANGES["15m"], NOW)
    hover = svg(markup).find("g[@class='hover']")
    assert hover is not None and len(hover.findall("rect")) == 31  # 0 s to 900 s ago, both ends included
    axis = [t.text for t in labelled(markup, "x")]
    assert axis == ["23:45", "23:48", "23:52", "23:56", "00:00 UTC"]
