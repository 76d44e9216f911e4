"""The alert policy: when a node is offline, and which of its numbers deserve a page.

A node is offline after three missed report intervals (its own, or the manager's default),
counted from the time the manager received its latest report, never the agent's own clock: an
agent whose clock is slow is not "offline" right after reporting. Alerts, per node:

- ``offline`` (warning): no report for three intervals;
- ``budget-from-host`` (critical): the budget is above the effective limit and in the host's
  ballpark, so it was sized from the host's RAM: the outage oomguard exists for;
- ``budget-above-limit`` (critical): the budget is above the effective limit otherwise;
- ``memlock-below-pinned-need`` (critical): the report warns ``memlock-too-low``;
- ``oom-kills`` (critical): OOM kills in the last hour.

The database picks the nodes that have one (cheap at 10,000 nodes); ``node_alerts`` words them.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Connection, and_, case, func, or_, select

from oomguard.manager.db import events, nodes
from oomguard.manager.times import iso_ms
from oomguard.units import format_size

HOUR_MS = 3_600_000
MISSED_INTERVALS = 3


def node_status(now: int, default_interval_ms: int) -> Any:
    """SQL: ``'offline'`` after three missed intervals, else ``'online'``."""
    interval = func.coalesce(nodes.c.interval_ms, default_interval_ms)
    return case((now - nodes.c.last_seen_ms > MISSED_INTERVALS * interval, "offline"), else_="online")


def _recent_ooms(now: int) -> Any:
    # Exit events only: a restart or give-up after an OOM kill repeats its reason (one kill, one count).
    return and_(events.c.kind == "exit", events.c.reason == "oom-kill", events.c.received_ms > now - HOUR_MS)


def _candidates(now: int, default_interval_ms: int) -> Any:
    """SQL: the nodes with at least one alert, the columns ``node_alerts`` reads."""
    status = node_status(now, default_interval_ms)
    recent_oom = select(events.c.node_id).where(_recent_ooms(now)).distinct()
    return (
        select(
            nodes.c.id,
            nodes.c.name,
            nodes.c.effective_bytes,
            nodes.c.host_total_bytes,
            nodes.c.budget_bytes,
            nodes.c.warnings,
            nodes.c.last_seen_ms,
            status.label("status"),
        )
        .where(
            or_(
                status == "offline",
                nodes.c.budget_bytes > nodes.c.effective_bytes,
                nodes.c.warnings.like('%"memlock-too-low"%'),
                nodes.c.id.in_(recent_oom),
            )
        )
        .order_by(nodes.c.name)
    )


def fleet_alerts(
    conn: Connection, now: int, default_interval_ms: int, limit: int | None = None
) -> list[dict[str, Any]]:
    """Every node's alerts, nodes by name; at most *limit*."""
    rows = conn.execute(_candidates(now, default_interval_ms)).mappings().all()
    counts = select(events.c.node_id, func.count(events.c.id)).where(_recent_ooms(now)).group_by(events.c.node_id)
    ooms = {int(node_id): int(count) for node_id, count in conn.execute(counts).all()}
    out: list[dict[str, Any]] = []
    for r in rows:
        out.extend(node_alerts(r, ooms.get(r["id"], 0)))
        if limit is not None and len(out) >= limit:
            return out[:limit]
    return out


def _budget_alert(eff: int, host: int | None, budget: int) -> tuple[str, str]:
    if host is not None and eff < 0.8 * host and budget >= 0.5 * host:  # in the host's ballpark
        return (
            "budget-from-host",
            f"budget {format_size(budget)} looks sized from the host's RAM ({format_size(host)}), "
            f"far above the container limit ({format_size(eff)}): the outage oomguard exists for",
        )
    return "budget-above-limit", f"budget {format_size(budget)} is above the effective limit {format_size(eff)}"


def node_alerts(r: Any, ooms_last_hour: int) -> list[dict[str, Any]]:
    """The alerts of one node row (latest report columns, status)."""
    found: list[tuple[str, str, str]] = []  # kind, severity, message
    if r["status"] == "offline":
        found.append(("offline", "warning", f"no report since {iso_ms(r['last_seen_ms'])}"))
    eff, budget = r["effective_bytes"], r["budget_bytes"]
    if budget is not None and eff is not None and budget > eff:
        kind, message = _budget_alert(eff, r["host_total_bytes"], budget)
        found.append((kind, "critical", message))
    if "memlock-too-low" in (json.loads(r["warnings"]) if r["warnings"] else []):
        found.append(("memlock-below-pinned-need", "critical", "RLIMIT_MEMLOCK is below the plan's pinned need"))
    if ooms_last_hour:
        found.append(("oom-kills", "critical", f"{ooms_last_hour} OOM kill(s) in the last hour"))
    return [{"node": r["name"], "kind": k, "severity": s, "message": m} for k, s, m in found]


__all__ = ["fleet_alerts", "node_alerts", "node_status"]
