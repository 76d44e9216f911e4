"""The node page's memory chart as server-rendered SVG: no script, nothing fetched from elsewhere.

What a chart library would add, drawn here in a few lines each:

- a time range (``RANGES``: 15 min, 1 h, 6 h, 24 h, 7 d, 30 d), the x axis spanning exactly that
  range up to now; without a range chosen, the smallest of ``AUTO_RANGES`` that holds the node's
  data (``fit_range``), so an hour of reports is not a sliver at the right edge of 30 days;
- each report at the time it was measured (the agent's time, ``store/history.py``'s
  ``MEASURED``), each event at its own time (``measured_time``): a report delivered late from the
  agent's spool is drawn when it was made, never in a vertical bar at its arrival;
- round y ticks: steps of a power of two in bytes (128 GiB, 256 GiB, ...), at most ``MAX_TICKS``;
- a y axis as high as the limit and the data need (``y_needed``): a budget above them (a bogus
  20 GiB on a 2 GiB node) would squash every other line to the bottom, so it is not drawn to
  scale but marked at the top, an arrow and "budget 20 GiB (above the limit)";
- gaps left as gaps: a step between two reports more than ``GAP_FACTOR`` times both its
  neighbouring steps (a missed report, a stopped agent) ends the line; retention's thinning
  (every report of the last hour, then one an hour) is regular, so it is not taken for a gap;
- hover values: each report has a transparent column whose ``<title>`` (the browser's tooltip)
  lists its time and the four values;
- OOM markers: a red dashed line under a triangle at each OOM kill (the exit event that carries
  ``reason: oom-kill``, counted once), with its time on hover;
- pressure-stop markers, apart: an amber solid line under a diamond at each stop of
  ``run --guard`` (the exit event with ``reason: pressure-stop``), with its time, the working
  set's peak and the guard margin on hover. A pressure stop is never drawn as an OOM kill;
- the supervisor's other events: any other exit a grey dotted line under a circle; a start, a
  restart, a give-up and a stop each a small mark on the bottom edge (``LIFECYCLE``), in words
  on hover. A node no agent reports (run-only) still gets its chart: these marks, and the limit
  and budget of its start events as steps;
- labels readable on a phone: the chart scales to its box (to about half its size at 390 px), its
  words do not. They are drawn in a second ``<svg>`` laid over the chart (``_Labels``), in CSS
  pixels, at the chart's own points given as percentages of the box.

Only numbers and fixed labels go into the markup, and every label is escaped anyway. Times are UTC.
"""

from __future__ import annotations

import html
import itertools
import time
from typing import Any

from oomguard.times import parse_iso
from oomguard.units import format_size

SERIES = (  # key, label, css class
    ("effective_bytes", "effective limit", "s-limit"),
    ("budget_bytes", "budget", "s-budget"),
    ("usage_bytes", "usage", "s-usage"),
    ("working_set_bytes", "working set", "s-ws"),
)
RANGES = {"15m": 900, "1h": 3600, "6h": 6 * 3600, "24h": 86400, "7d": 7 * 86400, "30d": 30 * 86400}
AUTO_RANGES = ("1h", "6h", "24h", "7d", "30d")  # what ``fit_range`` picks among
# The chart's own units (its viewBox); the y axis's words sit inside the plot, over its grid lines,
# so the left margin is small. TOP and BOTTOM leave room, at 390 px (the chart at half its size),
# for 12 px words over the top line and under the bottom one.
W, H, LEFT, RIGHT, TOP, BOTTOM = 760, 260, 8, 10, 30, 36
MAX_TICKS = 6
GAP_FACTOR = 3
Point = tuple[float, dict[str, Any]]
# Lifecycle events drawn as a small mark on the bottom edge: css class, the words on hover.
LIFECYCLE = {"start": ("start", "start"), "restart": ("restart", "restart"), "give-up": ("give-up", "gave up")}
LIFECYCLE["stop"] = ("stopped", "stopped")


def y_step(top: float) -> int:
    """The smallest power of two (bytes) that covers *top* in at most ``MAX_TICKS`` steps."""
    step = 1
    while step * MAX_TICKS < top:
        step *= 2
    return step


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def fit_range(now: float, times: list[float | None]) -> str:
    """The smallest of ``AUTO_RANGES`` that reaches back to the oldest of *times* (epoch seconds:
    the node's data); the largest when none is known or the oldest is older than all of them."""
    known = [t for t in times if t is not None]
    if not known:
        return AUTO_RANGES[-1]
    oldest = min(known)
    return next((key for key in AUTO_RANGES if now - RANGES[key] <= oldest), AUTO_RANGES[-1])


def measured_time(e: dict[str, Any]) -> float | None:
    """When an event happened: its own ``time`` (the supervisor's clock) where it has one and it
    is not after the event arrived, else when it arrived (``received``)."""
    received, own = parse_iso(e.get("received")), parse_iso(e.get("time"))
    if own is None or (received is not None and own > received):
        return received
    return own


def y_needed(points: list[Point]) -> int:
    """The top the y axis must reach: the limit, usage and working set, and the budget only where
    it is not above all of them (without a limit nothing says a budget is bogus: it counts)."""
    keys = ("effective_bytes", "usage_bytes", "working_set_bytes")
    data: list[int] = [h[k] for _, h in points for k in keys if _is_int(h.get(k))]
    budgets: list[int] = [h["budget_bytes"] for _, h in points if _is_int(h.get("budget_bytes"))]
    if not any(_is_int(h.get("effective_bytes")) for _, h in points):
        return max(data + budgets)
    top = max(data)  # once: 30 days of points is about 840 budgets, each compared with it
    return max([top, *(b for b in budgets if b <= top)])


def segments(points: list[Point]) -> list[list[Point]]:
    """The points cut where a step is more than ``GAP_FACTOR`` times both neighbouring steps."""
    steps = [b[0] - a[0] for a, b in itertools.pairwise(points)]
    out: list[list[Point]] = [points[:1]] if points else []
    for i, step in enumerate(steps):
        near = [s for s in (steps[i - 1] if i else None, steps[i + 1] if i + 1 < len(steps) else None) if s]
        if near and step > GAP_FACTOR * max(near):
            out.append([])
        out[-1].append(points[i + 1])
    return out


def exit_events(events: list[dict[str, Any]], reason: str) -> list[tuple[float, dict[str, Any]]]:
    """(when, event) of each exit event with *reason* (``measured_time``)."""
    out = []
    for e in events:
        if e.get("event") == "exit" and e.get("reason") == reason:
            t = measured_time(e)
            if t is not None:
                out.append((t, e))
    return out


def oom_times(events: list[dict[str, Any]]) -> list[float]:
    """When each OOM kill happened: the exit events with ``reason: oom-kill``."""
    return [t for t, _ in exit_events(events, "oom-kill")]


def other_events(events: list[dict[str, Any]]) -> list[tuple[float, dict[str, Any]]]:
    """(when, event) of the exits that were neither an OOM kill nor a pressure stop, and of the
    lifecycle events (``LIFECYCLE``)."""
    out = []
    for e in events:
        kind = e.get("event")
        if (kind == "exit" and e.get("reason") not in ("oom-kill", "pressure-stop")) or kind in LIFECYCLE:
            t = measured_time(e)
            if t is not None:
                out.append((t, e))
    return out


def marked_times(events: list[dict[str, Any]]) -> list[float]:
    """When each event the chart marks happened: the exits and the lifecycle events."""
    return [
        *oom_times(events),
        *(t for t, _ in exit_events(events, "pressure-stop")),
        *(t for t, _ in other_events(events)),
    ]


def stop_words(e: dict[str, Any]) -> str:
    """What a pressure stop's event says in numbers: "working set peak 461 MiB, guard margin 64 MiB"."""
    parts = [
        f"{label} {format_size(e[key])}"
        for key, label in (("working_set_peak_bytes", "working set peak"), ("guard_margin_bytes", "guard margin"))
        if isinstance(e.get(key), int) and not isinstance(e.get(key), bool)
    ]
    return ", ".join(parts)


def _bytes(v: Any) -> str:
    return format_size(v) if _is_int(v) else "unknown"


def _utc(t: float, fmt: str = "%Y-%m-%d %H:%M:%S UTC") -> str:
    return time.strftime(fmt, time.gmtime(t))


class _Frame:
    """The chart's coordinates: time from *t0* to *t1* across, bytes from 0 to *top* up."""

    def __init__(self, t0: float, t1: float, top: float) -> None:
        self.t0, self.span, self.top = t0, max(t1 - t0, 1.0), max(top, 1.0)
        self.pw, self.ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def x(self, t: float) -> float:
        return LEFT + (t - self.t0) / self.span * self.pw

    def y(self, v: float) -> float:
        return TOP + self.ph - v / self.top * self.ph

    def holds(self, t: float) -> bool:
        return self.t0 <= t <= self.t0 + self.span


class _Labels:
    """The chart's words, in an ``<svg>`` of their own laid over the chart (``svg.chart-labels``,
    no viewBox: its units are CSS pixels, so 12 px stay 12 px at any width). The chart scales
    evenly to its box, so a point of the chart (x, y) is at (x / W, y / H) of the box at any width:
    each word is placed there as percentages, then moved by *dx*, *dy* in pixels."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def add(self, x: float, y: float, words: str, css: str, anchor: str = "start", *, dx: int = 0, dy: int = 0) -> None:
        shift = (f' dx="{dx}"' if dx else "") + (f' dy="{dy}"' if dy else "")
        self.parts.append(
            f'<text class="{css}" x="{x / W * 100:.2f}%" y="{y / H * 100:.2f}%"{shift} text-anchor="{anchor}">'
            f"{html.escape(words)}</text>"
        )

    def svg(self) -> str:
        return f'<svg class="chart-labels" aria-hidden="true">{"".join(self.parts)}</svg>'


def _axes(f: _Frame, step: int | None, words: _Labels) -> list[str]:
    """The grid lines, each tick's size over its line at the left (none when *step* is None: no
    size is known), and five times along the bottom; on a phone, every other size and time
    (css ``odd``: hidden under 640 px)."""
    parts = []
    ticks = range(int(f.top // step) + 1) if step else range(1)
    for i in ticks:
        v, yv = i * (step or 0), f.y(i * (step or 0))
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{W - RIGHT}" y1="{yv:.1f}" y2="{yv:.1f}"/>')
        if step:
            words.add(LEFT, yv, format_size(v), "axis y odd" if i % 2 else "axis y", dx=4, dy=-3)
    fmt = "%H:%M" if f.span <= 86400 else "%m-%d %H:%M"
    for i in range(5):
        t = f.t0 + f.span * i / 4
        anchor = "start" if i == 0 else "end" if i == 4 else "middle"
        css = "axis x odd" if i % 2 else "axis x"
        words.add(f.x(t), H - BOTTOM, _utc(t, fmt) + (" UTC" if i == 4 else ""), css, anchor, dy=14)
    return parts


def in_range(points: list[Point], key: str, top: float) -> list[list[Point]]:
    """The runs of *points* whose *key* is a number no higher than *top*, cut at gaps (``segments``)."""
    runs: list[list[Point]] = [[]]
    for t, h in points:
        if _is_int(h.get(key)) and h[key] <= top:
            runs[-1].append((t, h))
        elif runs[-1]:
            runs.append([])
    return [seg for run in runs if run for seg in segments(run)]


def _lines(f: _Frame, points: list[Point]) -> list[str]:
    """Each series as polylines, one per segment of the values on the axis; a dot on each point
    when there are few."""
    parts = []
    for key, label, css in SERIES:
        for seg in in_range(points, key, f.top):
            coords = " ".join(f"{f.x(t):.1f},{f.y(h[key]):.1f}" for t, h in seg)
            parts.append(f'<polyline class="{css}" points="{coords}"><title>{html.escape(label)}</title></polyline>')
            if len(points) <= 60:
                parts.extend(f'<circle class="{css}" cx="{f.x(t):.1f}" cy="{f.y(h[key]):.1f}" r="3"/>' for t, h in seg)
    return parts


def start_steps(events: list[dict[str, Any]], t0: float, t1: float) -> list[tuple[float, float, dict[str, Any]]]:
    """What the start events say of the memory, for a node no report speaks for: (from, to, sizes)
    for each start with a limit or budget, from its time (or *t0*) to the next start (or *t1*)."""
    starts = sorted((t, e) for e in events if e.get("event") == "start" and (t := measured_time(e)) is not None)
    out = []
    for i, (t, e) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else t1
        sizes = {k: e[k] for k in ("effective_bytes", "budget_bytes") if _is_int(e.get(k))}
        if sizes and end >= t0 and t <= t1:
            out.append((max(t, t0), min(end, t1), sizes))
    return out


def _steps(f: _Frame, steps: list[tuple[float, float, dict[str, Any]]]) -> list[str]:
    """The limit and budget of each start, level from it to the next start."""
    parts = []
    for a, b, sizes in steps:
        for key, label, css in SERIES:
            v = sizes.get(key)
            if v is not None and v <= f.top:
                tip = html.escape(f"{label} {format_size(v)}: the supervisor's start event at {_utc(a)}")
                parts.append(
                    f'<polyline class="{css} step" points="{f.x(a):.1f},{f.y(v):.1f} {f.x(b):.1f},{f.y(v):.1f}">'
                    f"<title>{tip}</title></polyline>"
                )
    return parts


def _off_top(f: _Frame, points: list[Point], words: _Labels) -> list[str]:
    """A budget above the axis: an arrow up at its latest such report, "budget 20 GiB (above the limit)"."""
    over = [(t, h["budget_bytes"]) for t, h in points if _is_int(h.get("budget_bytes")) and h["budget_bytes"] > f.top]
    if not over:
        return []
    t, budget = over[-1]
    x = f.x(t)
    text = f"budget {format_size(budget)} (above the limit)"
    anchor, dx = ("end", -8) if x - LEFT > (W - LEFT - RIGHT) / 2 else ("start", 8)
    words.add(x, TOP + 12, text, "axis offtop", anchor, dx=dx)
    return [
        f'<g class="offtop"><polyline class="s-budget" points="{x - 5:.1f},{TOP + 7} {x:.1f},{TOP + 1} '
        f'{x + 5:.1f},{TOP + 7} {x:.1f},{TOP + 1} {x:.1f},{TOP + 16}"/>'
        f"<title>{html.escape(text)}: off the top of the chart, which stops at the limit and the data</title></g>"
    ]


def _hover(f: _Frame, points: list[Point]) -> list[str]:
    """A transparent column per report, from halfway to the previous one to halfway to the next."""
    xs = [f.x(t) for t, _ in points]
    parts = ['<g class="hover">']
    for i, (t, h) in enumerate(points):
        left = (xs[i - 1] + xs[i]) / 2 if i else max(xs[i] - 4, LEFT)
        right = (xs[i] + xs[i + 1]) / 2 if i + 1 < len(xs) else min(xs[i] + 4, W - RIGHT)
        values = "\n".join(
            f"{label}: {format_size(h[k]) if isinstance(h.get(k), int) else '-'}" for k, label, _ in SERIES
        )
        tip = html.escape(f"{_utc(t)}\n{values}")
        parts.append(
            f'<rect x="{left:.1f}" y="{TOP}" width="{max(right - left, 1):.1f}" height="{f.ph}">'
            f"<title>{tip}</title></rect>"
        )
    return [*parts, "</g>"]


def _ooms(f: _Frame, times: list[float]) -> list[str]:
    parts = []
    for t in times:
        if f.holds(t):
            x, tip = f.x(t), html.escape(f"OOM kill at {_utc(t)}")
            parts.append(
                f'<g class="oom"><line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{H - BOTTOM}"/>'
                f'<path d="M{x - 5:.1f},{TOP} h10 l-5,8 z"/><title>{tip}</title></g>'
            )
    return parts


def _stops(f: _Frame, stops: list[tuple[float, dict[str, Any]]]) -> list[str]:
    """A pressure stop: a solid amber line under a diamond (an OOM kill is a dashed red one under a triangle)."""
    parts = []
    for t, e in stops:
        if f.holds(t):
            numbers = stop_words(e)
            x = f.x(t)
            tip = html.escape(f"pressure stop at {_utc(t)}" + (f": {numbers}" if numbers else ""))
            parts.append(
                f'<g class="stop"><line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{H - BOTTOM}"/>'
                f'<path d="M{x:.1f},{TOP} l5,6 l-5,6 l-5,-6 z"/><title>{tip}</title></g>'
            )
    return parts


REASON_WORDS = {"clean": "exited cleanly", "exit": "exited with an error", "signal": "ended by a signal"}
AFTER_WORDS = {"oom-kill": "after an OOM kill", "pressure-stop": "after a pressure stop"}


def event_words(e: dict[str, Any], t: float) -> str:
    """An exit or lifecycle event in words, for its hover: "restart after an OOM kill at TIME"."""
    kind = str(e.get("event"))
    reason = e.get("reason") if isinstance(e.get("reason"), str) else None
    if kind == "exit":
        words = "exit: " + (REASON_WORDS.get(reason, reason) if reason else "no reason given")
    else:
        words = LIFECYCLE[kind][1] + (" " + AFTER_WORDS.get(reason, f"after {reason}") if reason else "")
    details = [
        f"{label} {e[key]}"
        for key, label in (("exit_code", "exit"), ("signal", "signal"), ("concurrency", "jobs"))
        if _is_int(e.get(key))
    ]
    if _is_int(e.get("budget_bytes")):
        details.append(f"budget {format_size(e['budget_bytes'])}")
    message = e.get("message") if isinstance(e.get("message"), str) else ""
    out = f"{words} at {_utc(t)}" + (f" ({', '.join(details)})" if details else "")
    return out + (f": {message}" if message else "")


def _others(f: _Frame, marks: list[tuple[float, dict[str, Any]]]) -> tuple[list[str], set[str]]:
    """Any other exit: a grey dotted line under a circle; a lifecycle event: a small mark on the
    bottom edge. Also the css classes drawn (for the legend)."""
    parts, drawn = [], set()
    base = H - BOTTOM
    for t, e in marks:
        if not f.holds(t):
            continue
        x, tip = f.x(t), html.escape(event_words(e, t)[:600])
        if e.get("event") == "exit":
            css = "exit"
            shape = (
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{base}"/><circle cx="{x:.1f}" cy="{TOP + 4}" r="4"/>'
            )
        else:
            css = LIFECYCLE[str(e.get("event"))][0]
            shape = {
                "start": f'<path d="M{x - 5:.1f},{base} l5,-9 l5,9 z"/>',
                "restart": f'<circle cx="{x:.1f}" cy="{base - 5}" r="4"/>',
            }.get(css, f'<rect x="{x - 4:.1f}" y="{base - 8}" width="8" height="8"/>')
        drawn.add(css)
        parts.append(f'<g class="{css}">{shape}<title>{tip}</title></g>')
    return parts, drawn


LEGEND_EXTRA = (  # the marks shown in the legend only where drawn: css class, words
    ("exit", "other exit"),
    ("start", "start"),
    ("restart", "restart"),
    ("give-up", "gave up"),
    ("stopped", "stopped"),
)


def memory_chart(
    history: list[dict[str, Any]], events: list[dict[str, Any]] | None = None, span_s: float = 0, now: float = 0
) -> str:
    """An <svg> of the four series and the events' marks; over the last *span_s* seconds up to
    *now* when given, else over the history's own span. Without reports in the range, the events
    in it (with the limit and budget their start events gave); a short note when there is neither."""
    events = events or []
    timed = sorted(((parse_iso(h.get("time")), h) for h in history), key=lambda p: p[0] or 0)
    points: list[Point] = [(t, h) for t, h in timed if t is not None and (not span_s or t >= now - span_s)]
    if not any(_is_int(h.get(k)) for _, h in points for k, _, _ in SERIES):
        points = []
    ooms, stops, others = oom_times(events), exit_events(events, "pressure-stop"), other_events(events)
    marked = marked_times(events)
    if span_s:
        t0, t1 = now - span_s, now
    elif points or marked:
        times = [t for t, _ in points] or marked
        t0, t1 = min(times), max(times)
    else:
        t0 = t1 = 0
    if not points and not any(t0 <= t <= t1 for t in marked):
        return '<p class="muted">No reports or events in this range.</p>'
    steps = [] if points else start_steps(events, t0, t1)
    sized = points or [(a, h) for a, _, h in steps]
    needed = y_needed(sized) if sized else 0
    step = y_step(needed) if needed else None
    f = _Frame(t0, t1, -(-needed // step) * step if step else 1)
    words = _Labels()
    parts = [f'<svg class="chart" viewBox="0 0 {W} {H}" role="img" aria-label="memory over time">']
    parts += _axes(f, step, words)
    if points:
        parts += _lines(f, points) + _off_top(f, points, words) + _hover(f, points)
    else:
        parts += _steps(f, steps) + _off_top(f, sized, words)
        if not sized:
            note = "memory not reported: no agent on this node"
            words.add(W / 2, TOP + (H - TOP - BOTTOM) / 2, note, "note", "middle")
    more, drawn = _others(f, others)
    parts += _ooms(f, ooms) + _stops(f, stops) + more
    parts.append("</svg>")
    legend = "".join(f'<span class="legend {css}">{html.escape(label)}</span>' for _, label, css in SERIES)
    legend += '<span class="legend s-oom">OOM kill</span><span class="legend s-stop">pressure stop</span>'
    legend += "".join(f'<span class="legend m-{css}">{words_}</span>' for css, words_ in LEGEND_EXTRA if css in drawn)
    return f'<div class="chart-box">{"".join(parts)}{words.svg()}</div><div class="legends">{legend}</div>'


PROFILE_SPAN_S = 14 * 86400  # the recommender's window (manager/learning.py: WINDOW_MS)
_OUTCOME_MARK = {"oom-kill": "oom", "pressure-stop": "stop"}


def _level(f: _Frame, value: int, css: str, text: str, words: _Labels, *, below: bool = False) -> str:
    """A horizontal line at *value* across the chart, labelled at its right end, over the line
    (*below*: under it, where another level's words are over a line close by)."""
    y = f.y(value)
    words.add(W - RIGHT, y, text, f"axis level {css}", "end", dx=-4, dy=14 if below else -4)
    return (
        f'<g class="{css}"><line x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
        f"<title>{html.escape(text)}</title></g>"
    )


def profile_chart(samples: list[Any], declared: int, recommended: int | None, now: float) -> str:
    """An <svg> of a profile's observed per-job peaks over the recommender's window (one dot per
    run: a red triangle for an OOM kill, an amber diamond for a pressure stop, each with its node,
    time, size and peak on hover), against the declared size and the fleet's recommended size."""
    if not samples:
        return '<p class="muted">No observations in the window.</p>'
    levels = [declared] + ([recommended] if recommended is not None else [])
    needed = max([s.peak_per_job for s in samples] + [s.declared_per_job for s in samples] + levels)
    step = y_step(needed)
    f = _Frame(now - PROFILE_SPAN_S, now, -(-needed // step) * step or step)
    parts = [f'<svg class="chart profile-chart" viewBox="0 0 {W} {H}" role="img" aria-label="observed per-job peaks">']
    words = _Labels()
    parts += _axes(f, step, words)
    parts.append(_level(f, declared, "l-declared", f"declared {format_size(declared)}", words))
    if recommended is not None:
        near = abs(f.y(recommended) - f.y(declared)) < 30  # its words would be over the declared size's
        words_at = f"recommended {format_size(recommended)}"
        parts.append(_level(f, recommended, "l-recommended", words_at, words, below=near))
    for s in samples:
        x, y = f.x(s.received_ms / 1000), f.y(s.peak_per_job)
        tip = html.escape(
            f"{s.node} ({s.node_class}), {_utc(s.received_ms / 1000)}: {s.outcome}, peak {format_size(s.peak_per_job)} "
            f"per job at a size of {format_size(s.declared_per_job)}, {s.concurrency} job(s)"
        )
        mark = _OUTCOME_MARK.get(s.outcome)
        if mark == "oom":
            shape = f'<path d="M{x - 5:.1f},{y - 4:.1f} h10 l-5,8 z"/>'
        elif mark == "stop":
            shape = f'<path d="M{x:.1f},{y - 6:.1f} l5,6 l-5,6 l-5,-6 z"/>'
        else:
            shape = f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3"/>'
        parts.append(f'<g class="run {mark or "ok"}">{shape}<title>{tip}</title></g>')
    parts.append("</svg>")
    legend = (
        '<span class="legend l-declared">declared</span><span class="legend l-recommended">recommended (fleet)</span>'
        '<span class="legend s-ws">a run\'s peak per job</span><span class="legend s-oom">OOM kill</span>'
        '<span class="legend s-stop">pressure stop</span>'
    )
    return f'<div class="chart-box">{"".join(parts)}{words.svg()}</div><div class="legends">{legend}</div>'
