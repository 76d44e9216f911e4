"""The node chart's rules without a database or a browser (issue 38, item 4): the range that fits
the node's data, events at the time they happened, a run-only node's chart drawn from its events,
and the words laid over the chart at the chart's own points. The database side (reports at the time
they were measured) is ``test_chart_history.py``; the pages in Chromium, ``tests/integration/test_layout_pages.py``."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from types import SimpleNamespace
from typing import Any

import pytest

from oomguard.manager.web.chart import (
    AUTO_RANGES,
    BOTTOM,
    LEFT,
    RANGES,
    RIGHT,
    TOP,
    H,
    W,
    fit_range,
    measured_time,
    memory_chart,
    profile_chart,
)
from oomguard.manager.web.formatting import happened
from oomguard.times import iso_from_epoch

GiB = 1024**3
NOW = 1_767_225_600.0  # 2026-01-01 00:00:00 UTC
PLOT_H = H - TOP - BOTTOM


def iso(t: float) -> str:
    return iso_from_epoch(t)


def parts(markup: str) -> tuple[ET.Element, ET.Element]:
    """(the chart's <svg>, the <svg> of its words laid over it)."""
    box = ET.fromstring(markup[: markup.index('<div class="legends">')])
    assert box.get("class") == "chart-box"
    chart, words = list(box)
    assert "chart" in (chart.get("class") or "").split() and words.get("class") == "chart-labels"
    return chart, words


def texts(words: ET.Element, css: str) -> list[ET.Element]:
    return [t for t in words.iter("text") if css in (t.get("class") or "").split()]


@pytest.mark.parametrize(
    ("age_s", "expected"),
    [
        (50 * 60, "1h"),
        (3600, "1h"),  # exactly an hour old: the hour holds it
        (3601, "6h"),
        (5 * 3600, "6h"),
        (20 * 3600, "24h"),
        (3 * 86400, "7d"),
        (20 * 86400, "30d"),
        (45 * 86400, "30d"),  # older than every range: the widest
    ],
)
def test_the_range_is_the_smallest_that_holds_the_data(age_s: int, expected: str) -> None:
    assert fit_range(NOW, [NOW - 60, NOW - age_s, None]) == expected
    assert expected in AUTO_RANGES and RANGES[expected] >= min(age_s, RANGES["30d"])


def test_without_data_the_widest_range() -> None:
    assert fit_range(NOW, []) == fit_range(NOW, [None]) == "30d"
    assert AUTO_RANGES == ("1h", "6h", "24h", "7d", "30d") and RANGES["6h"] == 6 * 3600


def test_an_event_is_drawn_when_it_happened_not_when_it_arrived() -> None:
    spooled = {"event": "exit", "reason": "oom-kill", "time": iso(NOW - 7200), "received": iso(NOW)}
    assert measured_time(spooled) == NOW - 7200
    ahead = {"event": "exit", "time": iso(NOW + 600), "received": iso(NOW)}  # a clock ahead: not believed
    assert measured_time(ahead) == NOW
    assert measured_time({"event": "exit", "received": iso(NOW)}) == NOW  # no time of its own
    assert measured_time({"event": "exit", "time": iso(NOW - 5)}) == NOW - 5  # no receive time: its own
    assert measured_time({"event": "exit"}) is None
    late = str(happened(spooled))
    assert 'title="2025-12-31 22:00:00 UTC"' in late and "(arrived 2 h later)" in late
    on_time = str(happened({**spooled, "time": iso(NOW - 30)}))
    assert "arrived" not in on_time and 'title="2025-12-31 23:59:30 UTC"' in on_time


def run_only_events() -> list[dict[str, Any]]:
    """A supervisor's events, newest first as the store gives them: a start (24 GiB budget under a
    32 GiB limit) 3 h ago, an OOM kill 2 h ago, its restart, and a start with one job fewer."""

    def ev(age: float, **fields: Any) -> dict[str, Any]:
        return {"time": iso(NOW - age), "received": iso(NOW - age + 1), **fields}

    sizes = {"budget_bytes": 24 * GiB, "effective_bytes": 32 * GiB, "limited_by": "cgroup-v2"}
    return [
        ev(7190, event="start", concurrency=1, **sizes),
        ev(7195, event="restart", reason="oom-kill", delay_s=1.0),
        ev(7200, event="exit", reason="oom-kill", signal=9, peak_bytes=31 * GiB),
        ev(10800, event="start", concurrency=2, **sizes),
    ]


def test_a_run_only_node_gets_a_chart_of_its_events() -> None:
    """No report: the OOM kill, the restart and the starts are marked at their times, and the
    limit and budget of the start events drawn as steps on a y axis they set."""
    markup = memory_chart([], run_only_events(), RANGES["6h"], NOW)
    assert "No reports" not in markup
    chart, words = parts(markup)

    def x_at(t: float) -> float:
        return LEFT + (t - (NOW - RANGES["6h"])) / RANGES["6h"] * (W - LEFT - RIGHT)

    oom = chart.find("g[@class='oom']")
    assert oom is not None and len(chart.findall("g[@class='oom']")) == 1
    line = oom.find("line")
    assert line is not None and abs(float(line.get("x1") or 0) - x_at(NOW - 7200)) < 0.1
    title = oom.find("title")
    assert title is not None and title.text == "OOM kill at 2025-12-31 22:00:00 UTC"
    restart = chart.find("g[@class='restart']")
    assert restart is not None and (restart.findtext("title") or "").startswith("restart after an OOM kill at")
    starts = chart.findall("g[@class='start']")
    assert len(starts) == 2 and "(jobs 2, budget 24 GiB)" in (starts[1].findtext("title") or "")
    # the steps: from each start to the next (the last to now), at 24 GiB and 32 GiB of a 32 GiB axis
    steps = {(p.get("class"), p.get("points")) for p in chart.findall("polyline")}
    y_limit, y_budget = TOP, TOP + PLOT_H / 4
    first, second = (x_at(NOW - 10800), x_at(NOW - 7190)), (x_at(NOW - 7190), x_at(NOW))
    for css, y in (("s-limit step", y_limit), ("s-budget step", y_budget)):
        for a, b in (first, second):
            assert (css, f"{a:.1f},{y:.1f} {b:.1f},{y:.1f}") in steps, (css, steps)
    assert [t.text for t in texts(words, "y")] == ["0 B", "8 GiB", "16 GiB", "24 GiB", "32 GiB"]
    legend = markup[markup.index('<div class="legends">') :]
    assert "restart" in legend and "start" in legend and "other exit" not in legend  # only the marks drawn


def test_a_run_only_node_without_sizes_still_shows_its_marks() -> None:
    events = [{"event": "exit", "reason": "exit", "exit_code": 3, "received": iso(NOW - 60)}]
    chart, words = parts(memory_chart([], events, RANGES["1h"], NOW))
    mark = chart.find("g[@class='exit']")
    assert (
        mark is not None and mark.findtext("title") == "exit: exited with an error at 2025-12-31 23:59:00 UTC (exit 3)"
    )
    assert texts(words, "y") == [] and [t.text for t in texts(words, "note")] == [
        "memory not reported: no agent on this node"
    ]


def test_nothing_in_the_range_says_so() -> None:
    old = [{"event": "exit", "reason": "oom-kill", "received": iso(NOW - 2 * 86400)}]
    assert memory_chart([], old, RANGES["24h"], NOW) == '<p class="muted">No reports or events in this range.</p>'


def test_the_words_sit_at_the_charts_own_points_in_css_pixels() -> None:
    """Each word is placed at its point of the chart as percentages of the box (the chart scales
    evenly, so that is the same point at any width), in an <svg> without a viewBox: 12 CSS px,
    whatever the chart's scale."""
    history = [
        {"time": iso(NOW - 60 * (30 - k)), "effective_bytes": 2 * GiB, "usage_bytes": GiB + k * 2**24}
        for k in range(30)
    ]
    chart, words = parts(memory_chart(history, [], RANGES["1h"], NOW))
    assert chart.get("viewBox") == f"0 0 {W} {H}" and words.get("viewBox") is None
    assert chart.find(".//text") is None  # no word is scaled with the chart
    grid = [float(g.get("y1") or 0) for g in chart.findall("line[@class='grid']")]
    ys = texts(words, "y")
    assert [t.text for t in ys] == ["0 B", "512 MiB", "1 GiB", "1.5 GiB", "2 GiB"]
    for t, y in zip(ys, grid, strict=True):  # each size over its own grid line, at the plot's left
        assert t.get("x") == f"{LEFT / W * 100:.2f}%" and t.get("y") == f"{y / H * 100:.2f}%"
        assert t.get("dy") == "-3" and t.get("text-anchor") == "start"
    assert [t.get("class") for t in ys] == ["axis y", "axis y odd"] * 2 + ["axis y"]  # every other one on a phone
    xs = texts(words, "x")
    assert [t.text for t in xs] == ["23:00", "23:15", "23:30", "23:45", "00:00 UTC"]
    assert [t.get("x") for t in xs] == [
        f"{(LEFT + (W - LEFT - RIGHT) * i / 4) / W * 100:.2f}%" for i in range(5)
    ] and all(t.get("y") == f"{(H - BOTTOM) / H * 100:.2f}%" for t in xs)
    assert [t.get("class") for t in xs] == ["axis x", "axis x odd", "axis x", "axis x odd", "axis x"]
    assert all(re.fullmatch(r"-?\d+(\.\d+)?%", t.get("x") or "") for t in words.iter("text"))


@pytest.mark.parametrize(("recommended", "below"), [(14 * GiB, True), (8 * GiB, False)])
def test_the_profile_charts_levels_are_worded_apart(recommended: int, below: bool) -> None:
    """The declared and the recommended size are labelled over their lines, in the words' <svg>;
    the recommended one under its line where the two lines are close, so neither covers the other."""
    run = SimpleNamespace(
        peak_per_job=10 * GiB,
        declared_per_job=14 * GiB,
        received_ms=int((NOW - 3600) * 1000),
        node="n1",
        node_class="big",
        outcome="ok",
        concurrency=4,
    )
    _, words = parts(profile_chart([run], 14 * GiB, recommended, NOW))
    levels = {t.text: t.get("dy") for t in texts(words, "level")}
    rec = f"recommended {recommended // GiB} GiB"
    assert levels == {"declared 14 GiB": "-4", rec: "14" if below else "-4"}
