"""The alerts read from the database: every open alert (``fleet_alerts``, for the API) and the
overview's groups (``alert_groups``): each kind's count in SQL (``alerts.kind_conditions``) and
only the first few alerts of each worded by ``alerts.node_alerts``, so an outage (10,000 offline
nodes) costs one pass over the nodes, not 10,000 alerts built in Python. The policy itself, each
kind's SQL beside its Python, is ``oomguard.manager.alerts.ALERTS``."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, case, func, select

from oomguard.manager.alerts import (
    DEFAULT_LINE,
    any_alert,
    current_report,
    kind_conditions,
    node_alerts,
    node_status,
    recent_exits,
    seen_joined,
    severity,
    supervisor_view,
    working_set_ratio_sql,
)
from oomguard.manager.db import nodes

ROW_COLUMNS = (  # what ``node_alerts`` reads of a node row
    "id",
    "name",
    "effective_bytes",
    "host_total_bytes",
    "budget_bytes",
    "working_set_bytes",
    "warnings",
    "last_seen_ms",
    "last_event_ms",
    "ws_high_since_ms",
    "refused_ms",
    "refused_step",
    "refused_exit_code",
    "refused_message",
    "consumer_budget_bytes",
    "consumers",
    "kernel_oom_kills_total",
    "oom_kills_total",
)


def _alert_rows(now: int, default_interval_ms: int, recent: Any) -> Any:
    """SQL: every node with the columns ``node_alerts`` reads, its recent exits (*recent*) joined."""
    return select(
        *(nodes.c[name] for name in ROW_COLUMNS),
        nodes.c.warnings.is_(None).label("run_only"),
        node_status(now, default_interval_ms).label("status"),
        current_report(now, default_interval_ms).label("current"),
        func.coalesce(recent.c.oom_1h, 0).label("oom_1h"),
        func.coalesce(recent.c.stops_1h, 0).label("stops_1h"),
        func.coalesce(recent.c.kernel_1h, 0).label("kernel_1h"),
        supervisor_view(now).label("supervisor"),
    ).select_from(nodes.outerjoin(recent, recent.c.node_id == nodes.c.id))


def risk_order() -> list[Any]:
    """ORDER BY of the nodes within an alert group, the riskiest first (issue 38, item 3): the
    least headroom to the limit (the working set over the effective limit, highest first; unknown
    last), then the most OOM kills (the kernel counter's, then the supervised ones, all kept on the
    node), then by name. The manager keeps no pressure reading of its own on the node row; a node
    under pressure shows it as a high working set or a kill."""
    return [
        working_set_ratio_sql().desc().nulls_last(),
        nodes.c.kernel_oom_kills_total.desc(),
        nodes.c.oom_kills_total.desc(),
        nodes.c.name,
    ]


def _candidates(now: int, default_interval_ms: int, recent: Any, line: float) -> Any:
    """SQL: the nodes with at least one alert, the columns ``node_alerts`` reads, riskiest first."""
    seen = seen_joined(now, default_interval_ms, recent, line)
    return (
        _alert_rows(now, default_interval_ms, recent)
        .where(nodes.c.archived_ms.is_(None), any_alert(seen))
        .order_by(*risk_order())
    )


def fleet_alerts(
    conn: Connection, now: int, default_interval_ms: int, limit: int | None = None, line: float = DEFAULT_LINE
) -> list[dict[str, Any]]:
    """Every node's alerts, the riskiest nodes first (``risk_order``); at most *limit*."""
    rows = conn.execute(_candidates(now, default_interval_ms, recent_exits(now), line)).mappings().all()
    out: list[dict[str, Any]] = []
    for r in rows:
        out.extend(node_alerts(r, int(r["oom_1h"]), int(r["stops_1h"]), line))
        if limit is not None and len(out) >= limit:
            return out[:limit]
    return out


def group_order(group: dict[str, Any]) -> tuple[bool, int, str]:
    """The overview's order of alert groups: critical kinds first, then the larger groups."""
    return (group["severity"] != "critical", -group["count"], group["kind"])


def alert_groups(
    conn: Connection,
    now: int,
    default_interval_ms: int,
    *,
    shown: int,
    show_all: str = "",
    start: int = 0,
    page: int = 500,
    line: float = DEFAULT_LINE,
    counts: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The overview's alerts: ``{total, groups}``, each group ``{kind, severity, count, start,
    alerts}`` in ``group_order``; a group lists its first *shown* alerts (the riskiest nodes first,
    ``risk_order``, as ``fleet_alerts`` orders them), the kind *show_all* its *page* alerts from *start*.

    The counts are one pass over the nodes (``kind_conditions``), or *counts* where the caller
    counted them at the same *now* (``queries.overview``); then, per kind that has any,
    the ids of the nodes listed (in ``risk_order``), and one read of those rows alone,
    worded by ``node_alerts``."""
    conds = kind_conditions(now, default_interval_ms, line)
    mine = nodes.c.archived_ms.is_(None)
    if counts is None:
        counting = select(*(func.coalesce(func.sum(case((c, 1), else_=0)), 0) for c in conds.values())).where(mine)
        counts = dict(zip(conds, map(int, conn.execute(counting).one()), strict=True))
    listed: dict[str, list[int]] = {}
    for kind, cond in conds.items():
        if counts[kind]:
            ids = select(nodes.c.id).where(mine, cond).order_by(*risk_order())
            ids = ids.limit(page).offset(start) if kind == show_all else ids.limit(shown)
            listed[kind] = [int(i) for i in conn.execute(ids).scalars()]
    worded = _worded(conn, now, default_interval_ms, sorted({i for ids in listed.values() for i in ids}), line)
    groups = [
        {
            "kind": kind,
            "severity": severity(kind),
            "count": counts[kind],
            "start": start if kind == show_all else 0,
            "alerts": [worded[(i, kind)] for i in ids if (i, kind) in worded],  # changed in between: left out
        }
        for kind, ids in listed.items()
    ]
    return {"total": sum(counts.values()), "groups": sorted(groups, key=group_order)}


def _worded(
    conn: Connection, now: int, default_interval_ms: int, ids: list[int], line: float
) -> dict[tuple[int, str], Any]:
    """The alerts of the nodes *ids*, by (node id, kind)."""
    out: dict[tuple[int, str], Any] = {}
    if ids:
        rows = _alert_rows(now, default_interval_ms, recent_exits(now, ids)).where(nodes.c.id.in_(ids))
        for r in conn.execute(rows).mappings():
            for a in node_alerts(r, int(r["oom_1h"]), int(r["stops_1h"]), line):
                out[(int(r["id"]), a["kind"])] = a
    return out
