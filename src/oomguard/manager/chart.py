"""The node page's memory chart as server-rendered SVG: no script, nothing fetched from elsewhere.

Only numbers and fixed labels go into the markup, and every label is escaped anyway.
"""

from __future__ import annotations

import html
from datetime import datetime
from typing import Any

from oomguard.times import parse_iso
from oomguard.units import format_size

SERIES = (  # key, label, css class
    ("effective_bytes", "effective limit", "s-limit"),
    ("budget_bytes", "budget", "s-budget"),
    ("usage_bytes", "usage", "s-usage"),
    ("working_set_bytes", "working set", "s-ws"),
)
W, H, LEFT, RIGHT, TOP, BOTTOM = 760, 260, 70, 10, 10, 30


def _series(css: str, label: str, pts: list[tuple[float, float]]) -> list[str]:
    """One series as a polyline; with few points, a dot on each, so a single report still shows."""
    if not pts:
        return []
    coords = " ".join(f"{px:.1f},{py:.1f}" for px, py in pts)
    out = [f'<polyline class="{css}" points="{coords}"><title>{html.escape(label)}</title></polyline>']
    if len(pts) <= 60:
        out.extend(f'<circle class="{css}" cx="{px:.1f}" cy="{py:.1f}" r="3"/>' for px, py in pts)
    return out


def memory_chart(history: list[dict[str, Any]]) -> str:
    """An <svg> of the four series over time; a short note when there is nothing to draw."""
    timed = [(parse_iso(h.get("time")), h) for h in history]
    points = [(t, h) for t, h in timed if t is not None]
    values = [h[k] for _, h in points for k, _, _ in SERIES if isinstance(h.get(k), int)]
    if not points or not values:
        return '<p class="muted">No history yet.</p>'
    t0, t1 = points[0][0], points[-1][0]
    span = max(t1 - t0, 1.0)
    top = max(values) * 1.05 or 1
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def x(t: float) -> float:
        return LEFT + (t - t0) / span * pw

    def y(v: float) -> float:
        return TOP + ph - v / top * ph

    parts = [f'<svg class="chart" viewBox="0 0 {W} {H}" role="img" aria-label="memory over time">']
    for i in range(5):  # gridlines and y labels
        v = top * i / 4
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{W - RIGHT}" y1="{y(v):.1f}" y2="{y(v):.1f}"/>')
        parts.append(
            f'<text class="axis" x="{LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end">'
            f"{html.escape(format_size(int(v)))}</text>"
        )
    for t, anchor in ((t0, "start"), (t1, "end")) if t1 - t0 >= 600 else ((t0, "start"),):
        label = datetime.fromtimestamp(t).strftime("%m-%d %H:%M")
        parts.append(
            f'<text class="axis" x="{x(t):.1f}" y="{H - 8}" text-anchor="{anchor}">{html.escape(label)}</text>'
        )
    for key, label, css in SERIES:
        parts.extend(_series(css, label, [(x(t), y(h[key])) for t, h in points if isinstance(h.get(key), int)]))
    parts.append("</svg>")
    legend = "".join(f'<span class="legend {css}">{html.escape(label)}</span>' for _, label, css in SERIES)
    return "".join(parts) + f'<div class="legends">{legend}</div>'
