"""The node page's memory chart as server-rendered SVG: no script, nothing fetched from elsewhere.

What a chart library would add, drawn here in a few lines each:

- a time range (``RANGES``: 15 min, 1 h, 24 h, 7 d, 30 d), the x axis spanning exactly that range up to now;
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
  set's peak and the guard margin on hover. A pressure stop is never drawn as an OOM kill.

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
RANGES = {"15m": 900, "1h": 3600, "24h": 86400, "7d": 7 * 86400, "30d": 30 * 86400}
W, H, LEFT, RIGHT, TOP, BOTTOM = 760, 260, 70, 10, 10, 30
MAX_TICKS = 6
GAP_FACTOR = 3
Point = tuple[float, dict[str, Any]]


def y_step(top: float) -> int:
    """The smallest power of two (bytes) that covers *top* in at most ``MAX_TICKS`` steps."""
    step = 1
    while step * MAX_TICKS < top:
        step *= 2
    return step


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


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
    """(when, event) of each exit event with *reason* (receive time, else the agent's time)."""
    out = []
    for e in events:
        if e.get("event") == "exit" and e.get("reason") == reason:
            t = parse_iso(e.get("received")) or parse_iso(e.get("time"))
            if t is not None:
                out.append((t, e))
    return out


def oom_times(events: list[dict[str, Any]]) -> list[float]:
    """When each OOM kill happened: the exit events with ``reason: oom-kill`` (receive time)."""
    return [t for t, _ in exit_events(events, "oom-kill")]


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


def _axes(f: _Frame, step: int) -> list[str]:
    parts = []
    for i in range(int(f.top // step) + 1):
        v, yv = i * step, f.y(i * step)
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{W - RIGHT}" y1="{yv:.1f}" y2="{yv:.1f}"/>')
        parts.append(f'<text class="axis" x="{LEFT - 6}" y="{yv + 4:.1f}" text-anchor="end">{format_size(v)}</text>')
    fmt = "%H:%M" if f.span <= 86400 else "%m-%d %H:%M"
    for i in range(5):
        t = f.t0 + f.span * i / 4
        anchor = "start" if i == 0 else "end" if i == 4 else "middle"
        label = html.escape(_utc(t, fmt) + (" UTC" if i == 4 else ""))
        parts.append(f'<text class="axis" x="{f.x(t):.1f}" y="{H - 8}" text-anchor="{anchor}">{label}</text>')
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


def _off_top(f: _Frame, points: list[Point]) -> list[str]:
    """A budget above the axis: an arrow up at its latest such report, "budget 20 GiB (above the limit)"."""
    over = [(t, h["budget_bytes"]) for t, h in points if _is_int(h.get("budget_bytes")) and h["budget_bytes"] > f.top]
    if not over:
        return []
    t, budget = over[-1]
    x = f.x(t)
    words = html.escape(f"budget {format_size(budget)} (above the limit)")
    tx, anchor = (x - 8, "end") if x - LEFT > (W - LEFT - RIGHT) / 2 else (x + 8, "start")
    return [
        f'<g class="offtop"><polyline class="s-budget" points="{x - 5:.1f},{TOP + 7} {x:.1f},{TOP + 1} '
        f'{x + 5:.1f},{TOP + 7} {x:.1f},{TOP + 1} {x:.1f},{TOP + 16}"/>'
        f'<text class="axis" x="{tx:.1f}" y="{TOP + 12}" text-anchor="{anchor}">{words}</text>'
        f"<title>{words}: off the top of the chart, which stops at the limit and the data</title></g>"
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
        if f.t0 <= t <= f.t0 + f.span:
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
        if f.t0 <= t <= f.t0 + f.span:
            numbers = stop_words(e)
            x = f.x(t)
            tip = html.escape(f"pressure stop at {_utc(t)}" + (f": {numbers}" if numbers else ""))
            parts.append(
                f'<g class="stop"><line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{H - BOTTOM}"/>'
                f'<path d="M{x:.1f},{TOP} l5,6 l-5,6 l-5,-6 z"/><title>{tip}</title></g>'
            )
    return parts


def memory_chart(
    history: list[dict[str, Any]], events: list[dict[str, Any]] | None = None, span_s: float = 0, now: float = 0
) -> str:
    """An <svg> of the four series; over the last *span_s* seconds up to *now* when given, else
    over the history's own span. A short note when there is nothing to draw."""
    timed = sorted(((parse_iso(h.get("time")), h) for h in history), key=lambda p: p[0] or 0)
    points: list[Point] = [(t, h) for t, h in timed if t is not None and (not span_s or t >= now - span_s)]
    values = [h[k] for _, h in points for k, _, _ in SERIES if _is_int(h.get(k))]
    if not points or not values:
        return '<p class="muted">No reports in this range.</p>'
    t0, t1 = (now - span_s, now) if span_s else (points[0][0], points[-1][0])
    needed = y_needed(points)
    step = y_step(needed)
    f = _Frame(t0, t1, -(-needed // step) * step)
    parts = [f'<svg class="chart" viewBox="0 0 {W} {H}" role="img" aria-label="memory over time">']
    markers = _ooms(f, oom_times(events or [])) + _stops(f, exit_events(events or [], "pressure-stop"))
    parts += _axes(f, step) + _lines(f, points) + _off_top(f, points) + _hover(f, points) + markers
    parts.append("</svg>")
    legend = "".join(f'<span class="legend {css}">{html.escape(label)}</span>' for _, label, css in SERIES)
    legend += '<span class="legend s-oom">OOM kill</span><span class="legend s-stop">pressure stop</span>'
    return "".join(parts) + f'<div class="legends">{legend}</div>'


PROFILE_SPAN_S = 14 * 86400  # the recommender's window (manager/learning.py: WINDOW_MS)
_OUTCOME_MARK = {"oom-kill": "oom", "pressure-stop": "stop"}


def _level(f: _Frame, value: int, css: str, words: str) -> str:
    """A horizontal line at *value* across the chart, labelled at its right end."""
    y = f.y(value)
    label = html.escape(words)
    return (
        f'<g class="{css}"><line x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
        f'<text class="axis" x="{W - RIGHT - 4}" y="{y - 4:.1f}" text-anchor="end">{label}</text>'
        f"<title>{label}</title></g>"
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
    parts += _axes(f, step)
    parts.append(_level(f, declared, "l-declared", f"declared {format_size(declared)}"))
    if recommended is not None:
        parts.append(_level(f, recommended, "l-recommended", f"recommended {format_size(recommended)}"))
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
    return "".join(parts) + f'<div class="legends">{legend}</div>'
