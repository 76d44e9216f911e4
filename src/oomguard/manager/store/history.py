"""A node's history, bounded: a downsampled series for charts, and pages for everything else.

A busy node (one report a second: 3,600 rows an hour) must not make a reader's answer, or the
manager's memory, grow with its history:

- ``series``: at most *points* entries over the kept history (or its last part, from a time on:
  a chart's range). When there are more rows,
  time is cut into *points* equal buckets (integer arithmetic in SQL, so only the buckets leave
  the database), and each entry is the worst of its bucket: the lowest effective limit, the
  highest budget, usage and working set, at the time of the bucket's last report;
- ``page``: the stored reports themselves, newest first, *limit* at a time, with a cursor
  (``"<received ms>-<row id>"``) for the next page: keyset paging, so a deep page costs what
  the first does;
- ``measured_series``: ``series`` on the time each report was measured (``MEASURED``: the agent's
  own time where it sent one, never later than its arrival; else the arrival), for the
  dashboard's chart: a report delivered late from the agent's spool is drawn when it was made,
  not in a bar at its arrival. ``first_measured_ms`` is the oldest such time (the chart's range
  fits the data it finds). The API's ``series`` keeps the receive time.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import ColumnElement, Connection, and_, case, func, or_, select

from oomguard.manager.db import nodes, reports
from oomguard.manager.times import iso_ms

COLUMNS = ("effective_bytes", "budget_bytes", "usage_bytes", "working_set_bytes")
CURSOR_PATTERN = r"^[0-9]{1,16}-[0-9]{1,19}$"
MAX_ID = 2**63 - 1


Series = tuple[list[dict[str, Any]], int]


# When a report was measured: the agent's own time (``agent_ms``) where it sent one, but never after
# the report arrived (an agent clock ahead of the manager's is not believed); else its arrival.
MEASURED: ColumnElement[int] = case(
    (and_(reports.c.agent_ms.is_not(None), reports.c.agent_ms < reports.c.received_ms), reports.c.agent_ms),
    else_=reports.c.received_ms,
)


def series(conn: Connection, node_id: int, points: int, since_ms: int | None = None) -> Series:
    """(at most *points* entries, oldest first; the number of stored reports they summarize), of
    the reports received from *since_ms* on (all when None)."""
    mine = and_(reports.c.node_id == node_id, reports.c.received_ms >= (since_ms or 0))
    return _series(conn, mine, reports.c.received_ms, points)


def measured_series(conn: Connection, node_id: int, points: int, since_ms: int | None = None) -> Series:
    """``series`` by the time each report was measured (``MEASURED``), of those measured from
    *since_ms* on: its entries' ``time`` is that time, and its buckets cut that time."""
    return _series(conn, _measured_since(node_id, since_ms), MEASURED, points)


def first_measured_ms(conn: Connection, node_id: int, since_ms: int | None = None) -> int | None:
    """When the oldest of the node's reports measured from *since_ms* on was measured; None for none."""
    first = conn.execute(select(func.min(MEASURED)).where(_measured_since(node_id, since_ms))).scalar()
    return None if first is None else int(first)


def node_id_of(conn: Connection, name: str) -> int | None:
    """The id of the node *name*; None for no such node."""
    found = conn.execute(select(nodes.c.id).where(nodes.c.name == name)).scalar()
    return None if found is None else int(found)


def _measured_since(node_id: int, since_ms: int | None) -> ColumnElement[bool]:
    # A report is measured before it arrives, so the receive-time bound holds too: it keeps the
    # (node_id, received_ms) index in use.
    return and_(reports.c.node_id == node_id, reports.c.received_ms >= (since_ms or 0), (since_ms or 0) <= MEASURED)


def _series(conn: Connection, mine: ColumnElement[bool], t: ColumnElement[int], points: int) -> Series:
    count, first, last = conn.execute(select(func.count(reports.c.id), func.min(t), func.max(t)).where(mine)).one()
    count = int(count or 0)
    values = [reports.c[name] for name in COLUMNS]
    if count <= points:
        rows = conn.execute(select(t, *values).where(mine).order_by(t, reports.c.id)).all()
    else:
        span = int(last) - int(first) + 1
        bucket = ((t - int(first)) * points // span).label("bucket")
        worst = (func.min(values[0]), func.max(values[1]), func.max(values[2]), func.max(values[3]))
        rows = conn.execute(select(func.max(t), *worst).where(mine).group_by(bucket).order_by(bucket)).all()
    return [{"time": iso_ms(r[0]), **dict(zip(COLUMNS, r[1:], strict=True))} for r in rows], count


def parse_cursor(cursor: str | None) -> tuple[int, int] | None:
    """``(received_ms, id)`` of a cursor; None for none. ValueError for one that is not ours."""
    if cursor is None:
        return None
    if not re.fullmatch(CURSOR_PATTERN, cursor):
        raise ValueError(f"not a history cursor: {cursor[:40]!r}")
    t, row_id = (int(part) for part in cursor.split("-"))
    return t, min(row_id, MAX_ID)


def page(conn: Connection, node_id: int, limit: int, before: tuple[int, int] | None) -> dict[str, Any]:
    """Up to *limit* stored reports older than *before* (newest first), and the cursor of the next page."""
    conds = [reports.c.node_id == node_id]
    if before is not None:
        t, row_id = before
        conds.append(or_(reports.c.received_ms < t, and_(reports.c.received_ms == t, reports.c.id < row_id)))
    query = (
        select(reports.c.id, reports.c.received_ms, reports.c.agent_ms, *(reports.c[name] for name in COLUMNS))
        .where(*conds)
        .order_by(reports.c.received_ms.desc(), reports.c.id.desc())
        .limit(limit + 1)
    )
    rows = conn.execute(query).all()
    more, rows = len(rows) > limit, rows[:limit]
    history = [
        {"time": iso_ms(r[1]), "agent_time": iso_ms(r[2]), **dict(zip(COLUMNS, r[3:], strict=True))} for r in rows
    ]
    return {"history": history, "next": f"{rows[-1][1]}-{rows[-1][0]}" if more else None}
