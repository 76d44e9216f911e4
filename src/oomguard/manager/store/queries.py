"""The read side: the node list, one node's detail and history, the dashboard's cards, metric rows.

Plain functions of a connection and the time ``now`` (epoch ms); the node status (online or
offline) is the alert policy's rule (``oomguard.manager.alerts.node_status``), on the receive
time of the node's latest report. Every answer is bounded: a node's history comes downsampled
or a page at a time (``oomguard.manager.store.history``).
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Connection, and_, func, select

from oomguard.manager.alerts import node_status
from oomguard.manager.db import events, nodes
from oomguard.manager.store import columns as _columns  # noqa: F401  (nodes.clock_skew_ms)
from oomguard.manager.store import history
from oomguard.manager.times import iso_ms

DAY_MS = 24 * 3_600_000
SORT_KEYS = (
    "name",
    "status",
    "last_seen",
    "effective_bytes",
    "host_total_bytes",
    "budget_bytes",
    "memlock_soft_bytes",
    "oom_kills_24h",
    "runtime",
)
HISTORY_COLUMNS = history.COLUMNS


def _ooms_today(now: int) -> Any:
    # One OOM kill is one exit event: the restart or give-up event after it carries the same reason.
    return and_(events.c.kind == "exit", events.c.reason == "oom-kill", events.c.received_ms > now - DAY_MS)


def _filters(status: Any, state: str | None, q: str | None) -> list[Any]:
    conds = []
    if state:
        conds.append(status == state)
    if q:
        escaped = q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        conds.append(nodes.c.name.like(f"%{escaped}%", escape="\\"))
    return conds


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
    """A page of node summaries (filtered, sorted, then by name) and the number of nodes that match."""
    st = node_status(now, interval_ms).label("status")
    # OOM kills per node in the last day, counted once and joined (not a subquery per row).
    counts = (
        select(events.c.node_id, func.count(events.c.id).label("n")).where(_ooms_today(now)).group_by(events.c.node_id)
    ).subquery()
    oom = func.coalesce(counts.c.n, 0).label("oom_kills_24h")
    conds = _filters(node_status(now, interval_ms), status, q)
    key = sort.lstrip("-")
    special: dict[str, Any] = {"status": st, "oom_kills_24h": oom, "last_seen": nodes.c.last_seen_ms}
    column = special[key] if key in special else nodes.c[key]
    summary_columns = [c for c in nodes.c if c.name != "latest_report"]  # not the 2 KB report per row
    rows_q = (
        select(*summary_columns, st, oom)
        .select_from(nodes.outerjoin(counts, counts.c.node_id == nodes.c.id))
        .where(*conds)
        .order_by(column.desc() if sort.startswith("-") else column.asc(), nodes.c.name.asc())
        .limit(limit)
        .offset(offset)
    )
    total = int(conn.execute(select(func.count(nodes.c.id)).where(*conds)).scalar_one())
    rows = conn.execute(rows_q).mappings().all()
    return {"nodes": [_summary(r) for r in rows], "total": total, "limit": limit, "offset": offset}


def _summary(r: Any) -> dict[str, Any]:
    return {
        "name": r["name"],
        "status": r["status"],
        "last_seen": iso_ms(r["last_seen_ms"]),
        "effective_bytes": r["effective_bytes"],
        "host_total_bytes": r["host_total_bytes"],
        "budget_bytes": r["budget_bytes"],
        "limited_by": r["limited_by"],
        "runtime": r["runtime"],
        "gpus": json.loads(r["gpus"]) if r["gpus"] else [],
        "memlock_soft_bytes": r["memlock_soft_bytes"],
        "oom_kills_24h": int(r["oom_kills_24h"] or 0),
        "warnings": json.loads(r["warnings"]) if r["warnings"] else [],
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
    oom_24h = select(func.count(events.c.id)).where(and_(events.c.node_id == nodes.c.id, _ooms_today(now)))
    return (
        conn.execute(
            select(
                nodes, node_status(now, interval_ms).label("status"), oom_24h.scalar_subquery().label("oom_kills_24h")
            ).where(nodes.c.name == name)
        )
        .mappings()
        .first()
    )


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
    out["latest"] = json.loads(row["latest_report"]) if row["latest_report"] else None
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
    """The dashboard's cards: nodes online and offline, their total effective memory, OOM kills today."""
    status = node_status(now, interval_ms)
    out = {"online": 0, "offline": 0, "effective_bytes": 0}
    per_status = select(status, func.count(nodes.c.id), func.coalesce(func.sum(nodes.c.effective_bytes), 0))
    for st, count, total in conn.execute(per_status.group_by(status)).all():
        out[st] = int(count)
        out["effective_bytes"] += int(total)
    out["oom_kills_24h"] = int(conn.execute(select(func.count(events.c.id)).where(_ooms_today(now))).scalar_one())
    return out


def metric_rows(conn: Connection, now: int, interval_ms: int) -> list[dict[str, Any]]:
    """Each node's numbers for /metrics, by name; OOM kills counted over all the history kept."""
    total_ooms = (
        select(func.count(events.c.id))
        .where(and_(events.c.node_id == nodes.c.id, events.c.kind == "exit", events.c.reason == "oom-kill"))
        .scalar_subquery()
    )
    pressure_stops = (
        select(func.count(events.c.id))
        .where(and_(events.c.node_id == nodes.c.id, events.c.kind == "exit", events.c.reason == "pressure-stop"))
        .scalar_subquery()
    )
    query = select(
        nodes.c.name,
        nodes.c.effective_bytes,
        nodes.c.host_total_bytes,
        nodes.c.budget_bytes,
        nodes.c.memlock_soft_bytes,
        nodes.c.last_seen_ms,
        node_status(now, interval_ms).label("status"),
        total_ooms.label("oom_kills_total"),
        pressure_stops.label("pressure_stops_total"),
    ).order_by(nodes.c.name)
    return [dict(r) for r in conn.execute(query).mappings().all()]
