"""The alert policy: a node's status, and which of its numbers deserve a page.

Statuses (``node_status``, one SQL expression):

- ``online``: the node's agent reported within three report intervals (its own, or the manager's
  default), counted from the time the manager received its latest report, never the agent's own
  clock: an agent whose clock is slow is not "offline" right after reporting;
- ``run-only``: no agent ever reported, but ``oomguard run --manager`` sends events, and its
  supervisor's latest event or heartbeat arrived within three heartbeat intervals (the interval
  it announced, else ``HEARTBEAT_MS``): healthy, only without an agent;
- ``offline``: neither of the above;
- ``archived``: nothing from the node for ``--forget-after`` (the retention pass sets it; a new
  report, event or heartbeat clears it). Archived nodes leave the list, the cards, the alerts
  and /metrics.

Alerts, per node that is not archived:

- ``offline`` (warning): no report (or, run-only, no event or heartbeat) for three intervals;
- ``budget-from-host`` (critical): the budget is above the effective limit and in the host's
  ballpark, so it was sized from the host's RAM: the outage oomguard exists for;
- ``budget-above-limit`` (critical): the budget is above the effective limit otherwise;
- ``memlock-below-pinned-need`` (critical): the report warns ``memlock-too-low``;
- ``oom-kills`` (critical): OOM kills in the last hour (exit events only: the restart or give-up
  after a kill repeats its reason; one kill, one count);
- ``pressure-stops`` (warning): ``run --guard`` stopped the worker in the last hour before the
  kernel's OOM killer acted (exit reason ``pressure-stop``): counted apart, never an OOM kill.

The database picks the nodes that have one (cheap at 10,000 nodes; the queries are in
``oomguard.manager.store.alerting``); ``node_alerts`` words them, ``kind_conditions`` is the
policy per kind in SQL, and ``alert_count`` the same policy as one SQL expression (the list's
``alerts`` column).

Where SQL and Python both decide, they decide alike: the host's ballpark is compared in IEEE
double precision on both sides (an integer column cast to FLOAT, as Python's ``float(int)``), and
the memlock code is matched case-sensitively (SQLite's LIKE ignores ASCII case:
https://sqlite.org/lang_expr.html#like; ``replace()`` does not). tests/test_alert_groups.py
compares the two at those boundaries on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Float, and_, case, cast, func, literal, not_, or_, select

from oomguard.manager.db import events, nodes
from oomguard.manager.times import iso_ms
from oomguard.units import format_size

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
MISSED_INTERVALS = 3
HEARTBEAT_MS = 60_000  # a supervisor's heartbeat interval when it announced none
MEMLOCK_CODE = '"memlock-too-low"'  # in the JSON list of warning codes ([A-Za-z0-9._-] only)
MEMLOCK_WARNING = f"%{MEMLOCK_CODE}%"
STATUSES = ("online", "offline", "run-only", "archived")
KINDS = {  # every alert kind and its severity, in the order node_alerts lists a node's alerts
    "offline": "warning",
    "budget-from-host": "critical",
    "budget-above-limit": "critical",
    "memlock-below-pinned-need": "critical",
    "oom-kills": "critical",
    "pressure-stops": "warning",
}
FROM_HOST_LIMIT = 0.8  # the limit is below this share of the host's RAM ...
FROM_HOST_BUDGET = 0.5  # ... and the budget at least this share of it: sized from the host


def node_status(now: int, default_interval_ms: int) -> Any:
    """SQL: the node's status (see the module doc), one CASE expression."""
    interval = func.coalesce(nodes.c.interval_ms, default_interval_ms)
    heartbeat = func.coalesce(nodes.c.heartbeat_interval_ms, HEARTBEAT_MS)
    silent = now - nodes.c.last_seen_ms
    never_reported = nodes.c.warnings.is_(None)  # every report sets it, [] when none
    return case(
        (nodes.c.archived_ms.is_not(None), "archived"),
        (and_(never_reported, silent <= MISSED_INTERVALS * heartbeat), "run-only"),
        (or_(never_reported, silent > MISSED_INTERVALS * interval), "offline"),
        else_="online",
    )


def recent_exits(now: int, node_ids: list[int] | None = None) -> Any:
    """SQL subquery: per node (of *node_ids*, or all), its exit events of the last day by reason,
    counted once (exit events only): ``oom_24h``, ``oom_1h``, ``stops_24h``, ``stops_1h``
    (pressure stops). Nodes without any have no row (join it outer, and coalesce)."""

    def count(reason: str, since: int) -> Any:
        return func.sum(case((and_(events.c.reason == reason, events.c.received_ms > since), 1), else_=0))

    conds = [
        events.c.reason.in_(("oom-kill", "pressure-stop")),
        events.c.received_ms > now - DAY_MS,
        events.c.kind == "exit",
    ]
    if node_ids is not None:
        conds.append(events.c.node_id.in_(node_ids))
    return (
        select(
            events.c.node_id,
            count("oom-kill", now - DAY_MS).label("oom_24h"),
            count("oom-kill", now - HOUR_MS).label("oom_1h"),
            count("pressure-stop", now - DAY_MS).label("stops_24h"),
            count("pressure-stop", now - HOUR_MS).label("stops_1h"),
        )
        .where(*conds)
        .group_by(events.c.node_id)
        .subquery()
    )


def memlock_sql() -> Any:
    """SQL: the node's warning list names ``memlock-too-low``, case-sensitively as ``_warns_memlock``
    (LIKE picks the rows cheaply; on SQLite it ignores case, ``replace()`` never does)."""
    w = nodes.c.warnings
    return and_(w.like(MEMLOCK_WARNING), func.replace(w, MEMLOCK_CODE, "") != w)


def _from_host_sql() -> Any:
    """SQL: ``_from_host`` in double precision (FLOAT is double on PostgreSQL, REAL on SQLite)."""
    eff, host, budget = (
        cast(c, Float) for c in (nodes.c.effective_bytes, nodes.c.host_total_bytes, nodes.c.budget_bytes)
    )
    return and_(
        nodes.c.host_total_bytes.is_not(None),
        eff < literal(FROM_HOST_LIMIT, Float) * host,
        budget >= literal(FROM_HOST_BUDGET, Float) * host,
    )


def _exited_last_hour(now: int, reason: str) -> Any:
    """SQL: the ids of the nodes with an exit event of *reason* received in the last hour (what
    ``recent_exits`` counts as ``oom_1h`` or ``stops_1h``), for ``IN``."""
    recent = and_(events.c.kind == "exit", events.c.reason == reason, events.c.received_ms > now - HOUR_MS)
    return select(events.c.node_id).where(recent)


def kind_conditions(now: int, default_interval_ms: int) -> dict[str, Any]:
    """SQL: per alert kind (``KINDS``), whether a node not archived has it at *now*: the policy
    of ``node_alerts`` on the same columns, the exits of the last hour as ``recent_exits`` counts
    them (an ``IN`` list, computed once, not a join)."""
    over = nodes.c.budget_bytes > nodes.c.effective_bytes
    return {
        "offline": node_status(now, default_interval_ms) == "offline",
        "budget-from-host": and_(over, _from_host_sql()),
        "budget-above-limit": and_(over, not_(_from_host_sql())),  # NULL host: not from the host
        "memlock-below-pinned-need": memlock_sql(),
        "oom-kills": nodes.c.id.in_(_exited_last_hour(now, "oom-kill")),
        "pressure-stops": nodes.c.id.in_(_exited_last_hour(now, "pressure-stop")),
    }


def alert_count(status: Any, ooms_last_hour: Any, stops_last_hour: Any) -> Any:
    """SQL: how many alerts ``node_alerts`` gives the node (0 when archived), from the node's
    status and its OOM kills and pressure stops of the last hour (SQL expressions)."""

    def one(cond: Any) -> Any:
        return case((cond, 1), else_=0)

    total = (
        one(status == "offline")
        + one(nodes.c.budget_bytes > nodes.c.effective_bytes)  # budget-from-host or -above-limit: one of the two
        + one(memlock_sql())
        + one(ooms_last_hour > 0)
        + one(stops_last_hour > 0)
    )
    return case((nodes.c.archived_ms.is_not(None), 0), else_=total)


def _from_host(eff: int, host: int | None, budget: int) -> bool:
    """The budget is in the host's ballpark while the limit is not: sized from the host's RAM.
    In double precision, as ``_from_host_sql`` (``float(int)`` rounds as the databases' casts do)."""
    return (
        host is not None
        and float(eff) < FROM_HOST_LIMIT * float(host)
        and float(budget) >= FROM_HOST_BUDGET * float(host)
    )


def _budget_alert(eff: int, host: int | None, budget: int) -> tuple[str, str]:
    if _from_host(eff, host, budget):
        assert host is not None
        return (
            "budget-from-host",
            f"budget {format_size(budget)} looks sized from the host's RAM ({format_size(host)}), "
            f"far above the container limit ({format_size(eff)}): the outage oomguard exists for",
        )
    return "budget-above-limit", f"budget {format_size(budget)} is above the effective limit {format_size(eff)}"


def _warns_memlock(warnings: str | None) -> bool:
    """Whether the JSON list of warning codes holds ``memlock-too-low``. Parsed only when the text
    could hold it (the quoted code, or an escape): 10,000 offline nodes are 10,000 lists of ``[]``."""
    if not warnings or ('"memlock-too-low"' not in warnings and "\\" not in warnings):
        return False
    return "memlock-too-low" in json.loads(warnings)


def node_alerts(r: Any, ooms_last_hour: int, stops_last_hour: int = 0) -> list[dict[str, Any]]:
    """The alerts of one node row (latest report columns, status; ``run_only`` when no agent ever
    reported), with its OOM kills and pressure stops of the last hour."""
    found: list[tuple[str, str, str]] = []  # kind, severity, message
    if r["status"] == "archived":
        return []
    if r["status"] == "offline":
        since = iso_ms(r["last_seen_ms"])
        if r.get("run_only"):
            found.append(("offline", "warning", f"no event or heartbeat from its supervisor since {since}"))
        else:
            found.append(("offline", "warning", f"no report since {since}"))
    eff, budget = r["effective_bytes"], r["budget_bytes"]
    if budget is not None and eff is not None and budget > eff:
        kind, message = _budget_alert(eff, r["host_total_bytes"], budget)
        found.append((kind, "critical", message))
    if _warns_memlock(r["warnings"]):
        found.append(("memlock-below-pinned-need", "critical", "RLIMIT_MEMLOCK is below the plan's pinned need"))
    if ooms_last_hour:
        found.append(("oom-kills", "critical", f"{ooms_last_hour} OOM kill(s) in the last hour"))
    if stops_last_hour:
        found.append(
            (
                "pressure-stops",
                "warning",
                f"{stops_last_hour} pressure stop(s) in the last hour: run --guard stopped the worker "
                "before the kernel's OOM killer acted",
            )
        )
    return [{"node": r["name"], "kind": k, "severity": s, "message": m} for k, s, m in found]


__all__ = [
    "KINDS",
    "STATUSES",
    "alert_count",
    "kind_conditions",
    "memlock_sql",
    "node_alerts",
    "node_status",
    "recent_exits",
]
