"""The read side: the node list, one node's detail and history, the dashboard's cards, metric rows.

Plain functions of a connection and the time ``now`` (epoch ms); the node status (online, refused,
offline, run-only, archived) is the alert policy's rule (``oomguard.manager.alerts.node_status``),
on the receive time of the node's latest report (or, for a node known only from ``run`` events,
of its supervisor's latest event or heartbeat). Archived nodes leave the list (unless asked for
with ``status=archived``), the cards and the metrics. Every answer is bounded: a node's history
comes downsampled or a page at a time (``oomguard.manager.store.history``).

The per-node counts (OOM kills and pressure stops of the last day and hour, open alerts) come
from one grouped subquery of the last day's exit events, joined: never one query per row.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BigInteger, Connection, Float, String, case, cast, func, literal, null, select, union_all

from oomguard.manager.alerts import (
    ALERTS,
    DEFAULT_LINE,
    LIVE,
    STATUSES,
    alert_count,
    current_report,
    kind_flags,
    last_seen,
    node_alerts,
    node_status,
    recent_exits,
    seen_joined,
    supervisor_view,
    working_set_high_since,
    working_set_ratio,
    working_set_ratio_sql,
)
from oomguard.manager.db import events, latest_reports, node_labels, nodes
from oomguard.manager.store import history, supervisor, text
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


def _filters(
    cols: Any, state: str | None, q: str | None, label: tuple[str, str] | None = None, supervisor: str | None = None
) -> list[Any]:
    """The list's conditions on *cols* (``status``, ``archived_ms``, ``name``, ``id``, ``supervisor``:
    the nodes' own, or the overview's pass over them): the status asked for, else every node not
    archived; the name filter; the label filter (*label*: key and value, through ``node_labels``'
    index); the supervisor's state (``alerts.supervisor_view``, ``lost`` included)."""
    conds = [cols["status"] == state] if state else [cols["archived_ms"].is_(None)]
    if supervisor:
        conds.append(cols["supervisor"] == supervisor)
    if q:
        escaped = q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        conds.append(cols["name"].like(f"%{escaped}%", escape="\\"))
    if label is not None:
        key, value = label
        labelled = select(node_labels.c.node_id).where(node_labels.c.key == key, node_labels.c.value == value)
        conds.append(cols["id"].in_(labelled))
    return conds


def _node_columns(computed: list[Any], sort: str) -> dict[str, Any]:
    """The columns ``_filters`` and ``_order`` read, on the nodes themselves: *computed*
    (``_counted``'s), the ratio, and *sort*'s column."""
    cols = {c.name: c for c in computed}
    cols |= {"archived_ms": nodes.c.archived_ms, "name": nodes.c.name, "id": nodes.c.id}
    cols["ratio"] = _working_set_ratio(cols["current"])
    key = sort.lstrip("-")
    if key not in {"risk", "working_set_pct", *cols}:
        cols[key] = last_seen() if key == "last_seen" else nodes.c[key]
    return cols


def _counted(
    now: int, interval_ms: int, node_ids: list[int] | None = None, line: float = DEFAULT_LINE
) -> tuple[Any, list[Any]]:
    """(nodes outer-joined with their recent exit counts (of *node_ids*, or all), the summary's
    computed columns)."""
    recent = recent_exits(now, node_ids)
    seen = seen_joined(now, interval_ms, recent, line)
    computed = [
        seen.status.label("status"),
        seen.current.label("current"),
        func.coalesce(recent.c.oom_24h, 0).label("oom_kills_24h"),
        func.coalesce(recent.c.stops_24h, 0).label("pressure_stops_24h"),
        func.coalesce(recent.c.kernel_24h, 0).label("kernel_oom_kills_24h"),
        seen.supervisor.label("supervisor"),
        alert_count(seen).label("alerts"),
    ]
    return nodes.outerjoin(recent, recent.c.node_id == nodes.c.id), computed


def _working_set_ratio(current: Any) -> Any:
    """SQL: working set over the effective limit while the latest report is *current*; NULL when
    either is unknown, the limit is 0, or the report is not current (its working set is history)."""
    return case((current, working_set_ratio_sql()), else_=None)


def _order(sort: str, cols: Any) -> list[Any]:
    """ORDER BY for *sort* (a key of SORT_KEYS, ``-`` for descending), then by name, on *cols*
    (``_node_columns``, or the overview's pass: ``status``, ``ratio``, ``alerts``, ``oom_kills_24h``,
    ``name`` and *sort*'s key).

    ``risk``: the live danger first. The live nodes (online, run-only, refused: ``alerts.LIVE``)
    before the others (offline, archived); within each, working set over limit (unknown or not
    current last), then open alerts, then OOM kills in 24 h (supervised, then the kernel
    counter's), each highest first: a node at 99 % now
    outranks one whose OOM kills are history. ``-risk`` reverses them all. ``working_set_pct``
    puts unknown last both ways. Unknown (NULL) goes first or last by ``NULLS FIRST``/``NULLS
    LAST`` (PostgreSQL, and SQLite since 3.30.0: https://sqlite.org/lang_select.html#nullslast),
    not by a second key."""
    key, desc = sort.lstrip("-"), sort.startswith("-")
    ratio, name = cols["ratio"], cols["name"]
    if key == "risk":
        gone = case((cols["status"].in_(LIVE), 0), else_=1)
        if desc:  # reversed: the least risky first, unknown working set first
            keys = [gone.desc(), ratio.asc().nulls_first(), cols["alerts"].asc(), cols["oom_kills_24h"].asc()]
            keys.append(cols["kernel_oom_kills_24h"].asc())
        else:
            keys = [gone.asc(), ratio.desc().nulls_last(), cols["alerts"].desc(), cols["oom_kills_24h"].desc()]
            keys.append(cols["kernel_oom_kills_24h"].desc())
        return [*keys, name.asc()]
    if key == "working_set_pct":
        return [(ratio.desc() if desc else ratio.asc()).nulls_last(), name.asc()]
    return [cols[key].desc() if desc else cols[key].asc(), name.asc()]


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
    label: tuple[str, str] | None = None,
    line: float = DEFAULT_LINE,
    total: int | None = None,
    ids: list[int] | None = None,
    supervisor: str | None = None,
) -> dict[str, Any]:
    """A page of node summaries (filtered, sorted, then by name) and the number of nodes that match
    (*total* and the page's *ids* where the caller has read them at the same *now*: ``overview``).

    Two steps: the page's node ids, sorted over every node that matches (only the sort keys go
    through the sort), then the summaries of those ids alone."""
    joined, computed = _counted(now, interval_ms, line=line)
    cols = _node_columns(computed, sort)
    conds = _filters(cols, status, q, label, supervisor)
    if ids is None:
        page = select(nodes.c.id).select_from(joined).where(*conds)
        page = page.order_by(*_order(sort, cols)).limit(limit).offset(offset)
        ids = [int(i) for i in conn.execute(page).scalars()]
    if total is None:
        total = int(conn.execute(select(func.count(nodes.c.id)).where(*conds)).scalar_one())
    rows = {}
    if ids:
        joined, computed = _counted(now, interval_ms, ids, line)
        found = select(*SUMMARY_COLUMNS, *computed).select_from(joined).where(nodes.c.id.in_(ids))
        rows = {int(r["id"]): r for r in conn.execute(found).mappings()}
    return {
        "nodes": [_summary(rows[i]) for i in ids if i in rows],
        "total": total,
        "limit": limit,
        "offset": offset,
    }


SUMMARY_COLUMNS = [c for c in nodes.c if c.name != "latest_report"]  # NULL since 0005 (latest_reports)


def working_set_pct(working_set: int | None, effective: int | None) -> float | None:
    """Working set over the effective limit (``alerts.working_set_ratio``), in percent to one
    decimal; None when either is unknown or the limit is 0."""
    ratio = working_set_ratio(working_set, effective)
    return None if ratio is None else round(ratio * 100, 1)


def _summary(r: Any) -> dict[str, Any]:
    warnings = text.loads(r["warnings"]) if r["warnings"] else []
    seen = max(r["last_seen_ms"], r["last_event_ms"] or 0)
    last_pct = working_set_pct(r["working_set_bytes"], r["effective_bytes"])
    refused = None
    if r["refused_ms"] is not None:
        refused = {
            "since": iso_ms(r["refused_ms"]),
            "step": r["refused_step"],
            "exit_code": r["refused_exit_code"],
            "message": r["refused_message"],
        }
    return {
        "name": r["name"],
        "status": r["status"],
        # The last sign of life: its latest report, event or heartbeat; ``last_report``: the report's.
        "last_seen": iso_ms(seen),
        "last_report": None if r["warnings"] is None else iso_ms(r["last_seen_ms"]),
        "offline_since": iso_ms(seen) if r["status"] == "offline" else None,
        "current": bool(r["current"]),  # whether the latest report is current (its working set a reading)
        "effective_bytes": r["effective_bytes"],
        "host_total_bytes": r["host_total_bytes"],
        "budget_bytes": r["budget_bytes"],
        "usage_bytes": r["usage_bytes"],
        "working_set_bytes": r["working_set_bytes"],
        # Current only while the latest report is: an offline node's last working set is history,
        # which ``last_working_set_pct`` keeps (the node page marks it as not current).
        "working_set_pct": last_pct if r["current"] else None,
        "last_working_set_pct": last_pct,
        "limited_by": r["limited_by"],
        "runtime": r["runtime"],
        "gpus": text.loads(r["gpus"]) if r["gpus"] else [],
        "memlock_soft_bytes": r["memlock_soft_bytes"],
        "cap_ipc_lock": r["cap_ipc_lock"],
        "oom_kills_24h": int(r["oom_kills_24h"] or 0),
        # The kernel's oom_kill counter of the node's group, apart (store/kernel_ooms.py): its kills
        # in 24 h and in all (as its rises add up), and its value in the latest report (None: unknown).
        "kernel_oom_kills_24h": int(r["kernel_oom_kills_24h"] or 0),
        "kernel_oom_kills_total": int(r["kernel_oom_kills_total"] or 0),
        "kernel_oom_counter": r["kernel_oom_kill"],
        "pressure_stops_24h": int(r["pressure_stops_24h"] or 0),
        # Its supervisor's state (alerts.supervisor_view: lost after 3 missed heartbeats); None: none heard of.
        "supervisor_state": r["supervisor"],
        "alerts": int(r["alerts"] or 0),
        "warnings": warnings,
        "warnings_count": len(warnings),
        "concurrency": r["concurrency"],
        "clock_skew_s": None if r["clock_skew_ms"] is None else r["clock_skew_ms"] / 1000,
        "refused": refused,
        "labels": text.loads(r["labels"]) if r["labels"] else {},
    }


def events_page(conn: Connection, node_id: int, limit: int, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """(up to *limit* of the node's events from *offset*, newest first; how many it has)."""
    rows = conn.execute(
        select(events.c.received_ms, events.c.body)
        .where(events.c.node_id == node_id)
        .order_by(events.c.received_ms.desc(), events.c.id.desc())
        .limit(limit)
        .offset(offset)
    ).all()
    total = conn.execute(select(func.count(events.c.id)).where(events.c.node_id == node_id)).scalar_one()
    return [{**text.loads(body), "received": iso_ms(t)} for t, body in rows], int(total)


def _node_row(conn: Connection, now: int, interval_ms: int, name: str, line: float = DEFAULT_LINE) -> Any:
    node_id = conn.execute(select(nodes.c.id).where(nodes.c.name == name)).scalar()
    if node_id is None:
        return None
    recent = recent_exits(now, [int(node_id)])
    joined, computed = _counted(now, interval_ms, [int(node_id)], line)
    hour = [func.coalesce(recent.c[k], 0).label(k) for k in ("oom_1h", "stops_1h", "kernel_1h")]
    whole = latest_reports.c.report.label("latest_json")
    query = select(*SUMMARY_COLUMNS, *computed, *hour, whole).select_from(
        joined.outerjoin(recent, recent.c.node_id == nodes.c.id).outerjoin(
            latest_reports, latest_reports.c.node_id == nodes.c.id
        )
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
    line: float = DEFAULT_LINE,
    timeline: tuple[int, int] | None = None,
) -> dict[str, Any] | None:
    """One node: its summary, open alerts, latest whole report, its supervisor's state
    (``supervisor.state``), history (oldest first, at most
    *history_points* entries, downsampled when there are more reports; from *history_since_ms* on
    when given) and its latest *events_limit* events (newest first; ``events_total`` says how many
    it has: ``node_events`` pages through them all). With *timeline* (limit, offset), also
    ``timeline``: that page of its events as ``node_events`` gives it, cut from the events read
    when it lies among them (the node page's first pages: no second read)."""
    row = _node_row(conn, now, interval_ms, name, line)
    if row is None:
        return None
    out = _summary(row)
    worded = {**row, "run_only": row["warnings"] is None}
    out["open_alerts"] = node_alerts(worded, int(row["oom_1h"]), int(row["stops_1h"]), line)
    out["latest"] = text.loads(row["latest_json"]) if row["latest_json"] else None
    plan = (out["latest"] or {}).get("plan") if isinstance(out["latest"], dict) else None
    planned = plan.get("concurrency") if isinstance(plan, dict) else None
    recent = supervisor.recent_events(conn, row["id"])
    state = supervisor.state(recent, now, planned if isinstance(planned, int) else None, out["status"] != "offline")
    if state is not None and out["supervisor_state"] == "lost":  # silent for 3 heartbeats: not "running"
        state |= {"state": "lost", "was": state["state"], "jobs": None, "restart_in_s": None}
        state["since"] = iso_ms(int(row["last_event_ms"])) if row["last_event_ms"] is not None else state["since"]
    out["supervisor"] = text.clean(state)  # its messages are the events' own (supervisor.py reads their JSON)
    out["history"], out["history_count"] = history.series(conn, row["id"], history_points, history_since_ms)
    out["events"], out["events_total"] = events_page(conn, row["id"], events_limit)
    if timeline is not None:
        limit, offset = timeline
        if offset + limit <= events_limit:
            page = out["events"][offset : offset + limit]
        else:
            page, _ = events_page(conn, row["id"], limit, offset)
        out["timeline"] = {"node": name, "events": page, "total": out["events_total"], "limit": limit, "offset": offset}
    return out


def node_events(conn: Connection, name: str, limit: int, offset: int) -> dict[str, Any] | None:
    """A page of one node's events, newest first; None for no such node."""
    node_id = conn.execute(select(nodes.c.id).where(nodes.c.name == name)).scalar()
    if node_id is None:
        return None
    page, total = events_page(conn, int(node_id), limit, offset)
    return {"node": name, "events": page, "total": total, "limit": limit, "offset": offset}


def node_history(conn: Connection, name: str, limit: int, before: tuple[int, int] | None) -> dict[str, Any] | None:
    """A page of one node's stored reports, newest first (``history.page``); None for no such node."""
    node_id = conn.execute(select(nodes.c.id).where(nodes.c.name == name)).scalar()
    if node_id is None:
        return None
    return {"node": name, **history.page(conn, int(node_id), limit, before)}


def summary(conn: Connection, now: int, interval_ms: int) -> dict[str, int]:
    """The dashboard's cards: nodes by status (``online``, ``offline``, ``run_only``, ``refused``,
    and ``archived``, which the other cards leave out), the total effective memory of the online
    nodes (the memory the fleet has now: an offline node's is not there), and the OOM kills and
    pressure stops of the last day of the nodes not archived (each counted once).

    One pass over the nodes, grouped by status, with each node's recent exits joined."""
    status = node_status(now, interval_ms)
    recent = recent_exits(now)
    per_status = (
        select(
            status.label("status"),
            func.count(nodes.c.id).label("n"),
            func.sum(cast(nodes.c.effective_bytes, Float)).label("effective"),
            func.sum(recent.c.oom_24h).label("oom"),
            func.sum(recent.c.stops_24h).label("stops"),
            func.sum(recent.c.kernel_24h).label("kernel"),
        )
        .select_from(nodes.outerjoin(recent, recent.c.node_id == nodes.c.id))
        .group_by(status)
    )
    return _cards(conn.execute(per_status).mappings().all())


def _cards(rows: Any) -> dict[str, int]:
    """``summary``'s cards from its rows per status (``status``, ``n``, ``effective``, ``oom``,
    ``stops``).

    The effective memory is summed in double precision: SQLite's ``sum()`` raises "integer
    overflow" past 2**63 (https://sqlite.org/lang_aggfunc.html#sumunc), which a few nodes that
    report limits near it reach; a double is exact while the total is below 2**53 bytes (8 PiB)
    and rounds past it, where the card shows PiB anyway."""
    out = {"online": 0, "offline": 0, "run_only": 0, "refused": 0, "archived": 0, "effective_bytes": 0}
    out["oom_kills_24h"] = out["pressure_stops_24h"] = out["kernel_oom_kills_24h"] = 0
    for r in rows:
        out[str(r["status"]).replace("-", "_")] = int(r["n"])
        if r["status"] == "online":
            out["effective_bytes"] = int(r["effective"] or 0)
        if r["status"] != "archived":
            out["oom_kills_24h"] += int(r["oom"] or 0)
            out["pressure_stops_24h"] += int(r["stops"] or 0)
            out["kernel_oom_kills_24h"] += int(r.get("kernel") or 0)
    return out


def overview(
    conn: Connection,
    now: int,
    interval_ms: int,
    line: float,
    *,
    status: str | None,
    q: str | None,
    limit: int,
    offset: int,
    sort: str,
    label: tuple[str, str] | None = None,
    supervisor: str | None = None,
) -> tuple[dict[str, int], dict[str, int], dict[str, Any]]:
    """The overview's fleet-wide reads, one statement: (``summary``'s cards, the number of nodes
    not archived that have each alert kind (``alerts.ALERTS``' rules against the working-set
    *line*, as ``alerting.alert_groups`` counts them), ``list_nodes``' page of the keywords).

    The nodes, their recent exits joined and every alert rule evaluated, are one pass kept for the
    statement (a common table expression, ``MATERIALIZED`` on PostgreSQL:
    https://www.postgresql.org/docs/current/queries-with.html#QUERIES-WITH-CTE-MATERIALIZATION;
    SQLite keeps one that is read more than once: https://sqlite.org/lang_with.html#materialization_hints),
    read twice: grouped by status for the cards and kinds, and sorted for the page's ids (and
    counted for its total where a name or label filter narrows it). Two statements each joined
    every node to its exits again: at 100,000 nodes on PostgreSQL that was 188 ms of which the
    second pass took 81 (BENCHMARKS.md)."""
    recent = recent_exits(now)
    seen = seen_joined(now, interval_ms, recent, line)
    columns = [
        nodes.c.id,
        nodes.c.name,
        nodes.c.archived_ms,
        seen.status.label("status"),
        cast(nodes.c.effective_bytes, Float).label("effective"),
        _working_set_ratio(seen.current).label("ratio"),
        func.coalesce(recent.c.oom_24h, 0).label("oom_kills_24h"),
        func.coalesce(recent.c.stops_24h, 0).label("pressure_stops_24h"),
        func.coalesce(recent.c.kernel_24h, 0).label("kernel_oom_kills_24h"),
        seen.supervisor.label("supervisor"),
        *(flag.label(f"kind_{i}") for i, flag in enumerate(kind_flags(seen))),
    ]
    key = sort.lstrip("-")
    if key not in {"risk", "working_set_pct", "alerts", *(c.name for c in columns)}:  # a column of the node's own
        columns.append((last_seen() if key == "last_seen" else nodes.c[key]).label(key))
    joined = nodes.outerjoin(recent, recent.c.node_id == nodes.c.id)
    fleet = select(*columns).select_from(joined).cte("fleet").prefix_with("MATERIALIZED", dialect="postgresql")
    kinds = [fleet.c[f"kind_{i}"] for i in range(len(ALERTS))]
    alerts = alert_count(seen, kinds, fleet.c.archived_ms)  # of the kinds the pass evaluated, each rule once
    listed = select(fleet, alerts.label("alerts")).subquery("listed")

    names = [
        "status",
        "n",
        "effective",
        "oom",
        "stops",
        "kernel",
        *(f"kind_{i}" for i in range(len(kinds))),
        "id",
        "pos",
    ]
    types = [String, BigInteger, Float, *[BigInteger] * (len(names) - 3)]

    def part(name: str, **given: Any) -> list[Any]:
        """One part's columns by *names*, those not *given* NULL (typed: a UNION's columns agree)."""
        columns = [literal(name).label("part")]
        for column, kind in zip(names, types, strict=True):
            value = given.get(column)
            columns.append((cast(null(), kind) if value is None else cast(value, kind)).label(column))
        return columns

    sums = {"effective": func.sum(fleet.c.effective), "oom": func.sum(fleet.c.oom_kills_24h)}
    sums["kernel"] = func.sum(fleet.c.kernel_oom_kills_24h)
    sums |= {"stops": func.sum(fleet.c.pressure_stops_24h)} | {f"kind_{i}": func.sum(k) for i, k in enumerate(kinds)}
    counted = select(*part("cards", status=fleet.c.status, n=func.count(), **sums)).group_by(fleet.c.status)
    conds = _filters(listed.c, status, q, label, supervisor)
    page = select(listed).where(*conds).order_by(*_order(sort, listed.c)).limit(limit).offset(offset).subquery("page")
    ranked = select(*part("page", id=page.c.id, pos=func.row_number().over(order_by=_order(sort, page.c))))
    parts = [counted, ranked]
    if q or label is not None or supervisor:
        parts.append(select(*part("total", n=func.count())).select_from(listed).where(*conds))
    rows = conn.execute(union_all(*parts)).mappings().all()
    per_status = [r for r in rows if r["part"] == "cards"]
    cards = _cards(per_status)
    alerting = {kind.name: 0 for kind in ALERTS}
    for r in (r for r in per_status if r["status"] != "archived"):
        for i, kind in enumerate(ALERTS):
            alerting[kind.name] += int(r[f"kind_{i}"] or 0)
    ids = [int(r["id"]) for r in sorted((r for r in rows if r["part"] == "page"), key=lambda r: r["pos"])]
    total = None if supervisor else listed_total(cards, status, q, label)
    if total is None:
        total = next(int(r["n"]) for r in rows if r["part"] == "total")
    listing = list_nodes(
        conn,
        now,
        interval_ms,
        status=status,
        q=q,
        limit=limit,
        offset=offset,
        sort=sort,
        label=label,
        line=line,
        total=total,
        ids=ids,
        supervisor=supervisor,
    )
    return cards, alerting, listing


def listed_total(cards: dict[str, int], status: str | None, q: str | None, label: Any) -> int | None:
    """The node list's ``total`` read from ``summary``'s *cards* of the same moment: the nodes of
    *status* (every status but archived when None); None when a name or label filter narrows it
    (``overview`` counts those in its pass)."""
    if q or label is not None:
        return None
    if status:
        return cards.get(status.replace("-", "_"), 0)
    return sum(cards[s.replace("-", "_")] for s in STATUSES if s != "archived")


def metric_rows(conn: Connection, now: int, interval_ms: int, line: float = DEFAULT_LINE) -> list[dict[str, Any]]:
    """The numbers of each node not archived, for /metrics, by name; OOM kills and pressure stops
    ever received (the node's counters: their events expire, the counts stay), and the kernel
    counter's kills; its supervisor's state (``alerts.supervisor_view``);
    ``ws_high_since_ms``: when its ``working-set-high`` alert began (None: it has none;
    ``alerts.working_set_high_since``)."""
    query = (
        select(
            nodes.c.name,
            nodes.c.effective_bytes,
            nodes.c.host_total_bytes,
            nodes.c.budget_bytes,
            nodes.c.memlock_soft_bytes,
            nodes.c.usage_bytes,
            nodes.c.working_set_bytes,
            last_seen().label("last_seen_ms"),
            nodes.c.last_seen_ms.label("report_ms"),
            nodes.c.ws_high_since_ms,
            nodes.c.labels,
            nodes.c.consumers,
            node_status(now, interval_ms).label("status"),
            current_report(now, interval_ms).label("current"),
            nodes.c.oom_kills_total,
            nodes.c.pressure_stops_total,
            nodes.c.kernel_oom_kills_total,
            nodes.c.warnings.is_(None).label("run_only"),
            supervisor_view(now).label("supervisor"),
        )
        .where(nodes.c.archived_ms.is_(None))
        .order_by(nodes.c.name)
    )
    rows = [dict(r) for r in conn.execute(query).mappings().all()]
    for r in rows:
        r["ws_high_since_ms"] = working_set_high_since({**r, "last_seen_ms": r["report_ms"]}, line)
    return rows
