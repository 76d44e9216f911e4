"""The read side: the node list, one node's detail and history, the dashboard's cards, metric rows.

Plain functions of a connection and the time ``now`` (epoch ms); the node status (online,
offline, run-only, archived) is the alert policy's rule (``oomguard.manager.alerts.node_status``),
on the receive time of the node's latest report (or, for a node known only from ``run`` events,
of its supervisor's latest event or heartbeat). Archived nodes leave the list (unless asked for
with ``status=archived``), the cards and the metrics. Every answer is bounded: a node's history
comes downsampled or a page at a time (``oomguard.manager.store.history``).

The per-node counts (OOM kills and pressure stops of the last day and hour, open alerts) come
from one grouped subquery of the last day's exit events, joined: never one query per row.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Connection, Float, and_, case, cast, func, select

from oomguard.manager.alerts import alert_count, node_status, recent_exits, seen_joined
from oomguard.manager.db import events, latest_reports, nodes
from oomguard.manager.store import history
from oomguard.manager.times import iso_ms

DAY_MS = 24 * 3_600_000
SORT_KEYS = (
    "risk",
    "name",
    "status",
    "last_seen",
    "effective_bytes",
    "host_total_bytes",
    "budget_bytes",
    "memlock_soft_bytes",
    "oom_kills_24h",
    "pressure_stops_24h",
    "working_set_pct",
    "alerts",
    "runtime",
)
DEFAULT_SORT = "risk"  # the API's and the dashboard's: who is about to OOM first
HISTORY_COLUMNS = history.COLUMNS


def _filters(status: Any, state: str | None, q: str | None) -> list[Any]:
    """The list's conditions: the status asked for, else every node not archived; the name filter."""
    conds = [status == state] if state else [nodes.c.archived_ms.is_(None)]
    if q:
        escaped = q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        conds.append(nodes.c.name.like(f"%{escaped}%", escape="\\"))
    return conds


def _counted(now: int, interval_ms: int, node_ids: list[int] | None = None) -> tuple[Any, list[Any]]:
    """(nodes outer-joined with their recent exit counts (of *node_ids*, or all), the summary's
    computed columns)."""
    recent = recent_exits(now, node_ids)
    status = node_status(now, interval_ms)
    computed = [
        status.label("status"),
        func.coalesce(recent.c.oom_24h, 0).label("oom_kills_24h"),
        func.coalesce(recent.c.stops_24h, 0).label("pressure_stops_24h"),
        alert_count(seen_joined(status, recent)).label("alerts"),
    ]
    return nodes.outerjoin(recent, recent.c.node_id == nodes.c.id), computed


def _working_set_ratio(status: Any) -> Any:
    """SQL: working set over the effective limit, for an online node (*status*); NULL when either
    is unknown, the limit is 0, or the node is not online (its last working set is not today's).

    In floating point on both sides: dividing by an integer column makes SQLAlchemy cast it to
    NUMERIC, which PostgreSQL then converts back to double for every one of 10,000 rows."""
    ratio = cast(nodes.c.working_set_bytes, Float) * 100.0 / cast(func.nullif(nodes.c.effective_bytes, 0), Float)
    return case((status == "online", ratio), else_=None)


def _order(sort: str, computed: dict[str, Any]) -> list[Any]:
    """ORDER BY for *sort* (a key of SORT_KEYS, ``-`` for descending), then by name.

    ``risk``: OOM kills in 24 h, then working set over limit (unknown or not online last), then alerts, each
    highest first; ``-risk`` reverses the three. ``working_set_pct`` puts unknown last both ways.
    Unknown (NULL) goes first or last by ``NULLS FIRST``/``NULLS LAST`` (PostgreSQL, and SQLite
    since 3.30.0: https://sqlite.org/lang_select.html#nullslast), not by a second key."""
    key, desc = sort.lstrip("-"), sort.startswith("-")
    ratio = _working_set_ratio(computed["status"])
    if key == "risk":
        keys = [computed["oom_kills_24h"], ratio, computed["alerts"]]
        if desc:  # reversed: the least risky first, unknown working set first
            return [keys[0].asc(), ratio.asc().nulls_first(), keys[2].asc(), nodes.c.name.asc()]
        return [keys[0].desc(), ratio.desc().nulls_last(), keys[2].desc(), nodes.c.name.asc()]
    if key == "working_set_pct":
        return [(ratio.desc() if desc else ratio.asc()).nulls_last(), nodes.c.name.asc()]
    special = {**computed, "last_seen": nodes.c.last_seen_ms}
    column = special[key] if key in special else nodes.c[key]
    return [column.desc() if desc else column.asc(), nodes.c.name.asc()]


def list_nodes(
    conn: Connection,
    now: int,
    interval_ms: int,
    *,
    status: str | None,
    q: str | None,
    limit: int,
    offset: int,
    sort: str,
) -> dict[str, Any]:
    """A page of node summaries (filtered, sorted, then by name) and the number of nodes that match.

    Two steps: the page's node ids, sorted over every node that matches (only the sort keys go
    through the sort), then the summaries of those ids alone."""
    joined, computed = _counted(now, interval_ms)
    conds = _filters(node_status(now, interval_ms), status, q)
    page = select(nodes.c.id).select_from(joined).where(*conds)
    page = page.order_by(*_order(sort, {c.name: c for c in computed})).limit(limit).offset(offset)
    ids = [int(i) for i in conn.execute(page).scalars()]
    total = int(conn.execute(select(func.count(nodes.c.id)).where(*conds)).scalar_one())
    rows = {}
    if ids:
        joined, computed = _counted(now, interval_ms, ids)
        summary_columns = [c for c in nodes.c if c.name != "latest_report"]  # NULL since 0005 (latest_reports)
        found = select(*summary_columns, *computed).select_from(joined).where(nodes.c.id.in_(ids))
        rows = {int(r["id"]): r for r in conn.execute(found).mappings()}
    return {
        "nodes": [_summary(rows[i]) for i in ids if i in rows],
        "total": total,
        "limit": limit,
        "offset": offset,
    }


def working_set_pct(working_set: int | None, effective: int | None) -> float | None:
    """Working set over the effective limit, in percent to one decimal; None when either is
    unknown or the limit is 0."""
    if working_set is None or not effective:
        return None
    return round(working_set * 100 / effective, 1)


def _summary(r: Any) -> dict[str, Any]:
    warnings = json.loads(r["warnings"]) if r["warnings"] else []
    return {
        "name": r["name"],
        "status": r["status"],
        "last_seen": iso_ms(r["last_seen_ms"]),
        "effective_bytes": r["effective_bytes"],
        "host_total_bytes": r["host_total_bytes"],
        "budget_bytes": r["budget_bytes"],
        "usage_bytes": r["usage_bytes"],
        "working_set_bytes": r["working_set_bytes"],
        # Current only while the node reports: an offline node's last working set is history.
        "working_set_pct": working_set_pct(r["working_set_bytes"], r["effective_bytes"])
        if r["status"] == "online"
        else None,
        "limited_by": r["limited_by"],
        "runtime": r["runtime"],
        "gpus": json.loads(r["gpus"]) if r["gpus"] else [],
        "memlock_soft_bytes": r["memlock_soft_bytes"],
        "oom_kills_24h": int(r["oom_kills_24h"] or 0),
        "pressure_stops_24h": int(r["pressure_stops_24h"] or 0),
        "alerts": int(r["alerts"] or 0),
        "warnings": warnings,
        "warnings_count": len(warnings),
        "concurrency": r["concurrency"],
        "clock_skew_s": None if r["clock_skew_ms"] is None else r["clock_skew_ms"] / 1000,
    }


def _events(conn: Connection, node_id: int, limit: int) -> list[dict[str, Any]]:
    rows = conn.execute(
        select(events.c.received_ms, events.c.body)
        .where(events.c.node_id == node_id)
        .order_by(events.c.received_ms.desc(), events.c.id.desc())
        .limit(limit)
    ).all()
    return [{**json.loads(body), "received": iso_ms(t)} for t, body in rows]


def _node_row(conn: Connection, now: int, interval_ms: int, name: str) -> Any:
    node_id = conn.execute(select(nodes.c.id).where(nodes.c.name == name)).scalar()
    if node_id is None:
        return None
    joined, computed = _counted(now, interval_ms, [int(node_id)])
    whole = latest_reports.c.report.label("latest_json")
    query = select(nodes, *computed, whole).select_from(
        joined.outerjoin(latest_reports, latest_reports.c.node_id == nodes.c.id)
    )
    return conn.execute(query.where(nodes.c.id == node_id)).mappings().first()


def node_detail(
    conn: Connection,
    now: int,
    interval_ms: int,
    name: str,
    *,
    events_limit: int,
    history_points: int,
    history_since_ms: int | None = None,
) -> dict[str, Any] | None:
    """One node: its summary, latest whole report, history (oldest first, at most *history_points*
    entries, downsampled when there are more reports; from *history_since_ms* on when given) and
    events (newest first)."""
    row = _node_row(conn, now, interval_ms, name)
    if row is None:
        return None
    out = _summary(row)
    out["latest"] = json.loads(row["latest_json"]) if row["latest_json"] else None
    out["history"], out["history_count"] = history.series(conn, row["id"], history_points, history_since_ms)
    out["events"] = _events(conn, row["id"], events_limit)
    return out


def node_history(conn: Connection, name: str, limit: int, before: tuple[int, int] | None) -> dict[str, Any] | None:
    """A page of one node's stored reports, newest first (``history.page``); None for no such node."""
    node_id = conn.execute(select(nodes.c.id).where(nodes.c.name == name)).scalar()
    if node_id is None:
        return None
    return {"node": name, **history.page(conn, int(node_id), limit, before)}


def summary(conn: Connection, now: int, interval_ms: int) -> dict[str, int]:
    """The dashboard's cards: nodes by status (``online``, ``offline``, ``run_only``, and
    ``archived``, which the other cards leave out), the total effective memory of the nodes not
    archived, and their OOM kills and pressure stops of the last day (each counted once).

    One pass over the nodes, grouped by status, with each node's recent exits joined."""
    status = node_status(now, interval_ms)
    recent = recent_exits(now)
    per_status = (
        select(
            status,
            func.count(nodes.c.id),
            func.coalesce(func.sum(nodes.c.effective_bytes), 0),
            func.coalesce(func.sum(recent.c.oom_24h), 0),
            func.coalesce(func.sum(recent.c.stops_24h), 0),
        )
        .select_from(nodes.outerjoin(recent, recent.c.node_id == nodes.c.id))
        .group_by(status)
    )
    out = {"online": 0, "offline": 0, "run_only": 0, "archived": 0, "effective_bytes": 0}
    out["oom_kills_24h"] = out["pressure_stops_24h"] = 0
    for st, count, total, ooms, stops in conn.execute(per_status).all():
        out[str(st).replace("-", "_")] = int(count)
        if st != "archived":
            out["effective_bytes"] += int(total)
            out["oom_kills_24h"] += int(ooms)
            out["pressure_stops_24h"] += int(stops)
    return out


def _total(reason: str) -> Any:
    """SQL: the node's exit events of *reason* over all the history kept."""
    mine = and_(events.c.node_id == nodes.c.id, events.c.kind == "exit", events.c.reason == reason)
    return select(func.count(events.c.id)).where(mine).scalar_subquery()


def metric_rows(conn: Connection, now: int, interval_ms: int) -> list[dict[str, Any]]:
    """The numbers of each node not archived, for /metrics, by name; OOM kills and pressure stops
    counted over all the history kept."""
    query = (
        select(
            nodes.c.name,
            nodes.c.effective_bytes,
            nodes.c.host_total_bytes,
            nodes.c.budget_bytes,
            nodes.c.memlock_soft_bytes,
            nodes.c.usage_bytes,
            nodes.c.working_set_bytes,
            nodes.c.last_seen_ms,
            node_status(now, interval_ms).label("status"),
            _total("oom-kill").label("oom_kills_total"),
            _total("pressure-stop").label("pressure_stops_total"),
        )
        .where(nodes.c.archived_ms.is_(None))
        .order_by(nodes.c.name)
    )
    return [dict(r) for r in conn.execute(query).mappings().all()]
