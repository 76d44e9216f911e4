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

Alerts, per node that is not archived: ``ALERTS``, one entry per kind, in the order a node's
alerts are listed. Each entry holds its rule twice, side by side: in SQL (``AlertKind.sql``), for
the database to count and pick the nodes that have one (cheap at 10,000 nodes: the queries are in
``oomguard.manager.store.alerting``), and in Python (``AlertKind.says``), which words it for one
node. The rest is derived from the table: ``KINDS`` (the severities), ``kind_conditions`` (the
overview's counts per kind), ``any_alert`` (the nodes with one), ``alert_count`` (the list's
``alerts`` column) and ``node_alerts``. A new kind is one entry.

- ``offline`` (warning): no report (or, run-only, no event or heartbeat) for three intervals;
- ``budget-from-host`` (critical): the budget is above the effective limit and in the host's
  ballpark, so it was sized from the host's RAM: the outage oomguard exists for;
- ``budget-above-limit`` (critical): the budget is above the effective limit otherwise;
- ``memlock-below-pinned-need`` (critical): the report warns ``memlock-too-low``;
- ``oom-kills`` (critical): OOM kills in the last hour (exit events only: the restart or give-up
  after a kill repeats its reason; one kill, one count);
- ``pressure-stops`` (warning): ``run --guard`` stopped the worker in the last hour before the
  kernel's OOM killer acted (exit reason ``pressure-stop``): counted apart, never an OOM kill.

Where SQL and Python both decide, they decide alike: the host's ballpark is compared in IEEE
double precision on both sides (an integer column cast to FLOAT, as Python's ``float(int)``), and
the memlock code is matched case-sensitively (SQLite's LIKE ignores ASCII case:
https://sqlite.org/lang_expr.html#like; ``replace()`` does not). tests/test_alert_groups.py
compares the two at those boundaries on SQLite and PostgreSQL.
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

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
FROM_HOST_LIMIT = 0.8  # the limit is below this share of the host's RAM ...
FROM_HOST_BUDGET = 0.5  # ... and the budget at least this share of it: sized from the host
LAST_HOUR = {"oom-kill": "oom_1h", "pressure-stop": "stops_1h"}  # an exit reason's count of the last hour, by name


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
            count("oom-kill", now - HOUR_MS).label(LAST_HOUR["oom-kill"]),
            count("pressure-stop", now - DAY_MS).label("stops_24h"),
            count("pressure-stop", now - HOUR_MS).label(LAST_HOUR["pressure-stop"]),
        )
        .where(*conds)
        .group_by(events.c.node_id)
        .subquery()
    )


class Seen(NamedTuple):
    """What an alert kind's SQL reads besides the node's own columns (``nodes``): built by
    ``seen_joined`` (the exits of ``recent_exits`` joined) or ``seen_listed`` (none joined)."""

    status: Any  # SQL: the node's status (``node_status``)
    exited: Callable[[str], Any]  # SQL: whether the node has an exit event of a reason in the last hour


def seen_joined(status: Any, recent: Any) -> Seen:
    """``Seen`` for a query that joins *recent* (``recent_exits``, outer) to the nodes."""
    return Seen(status, lambda reason: func.coalesce(recent.c[LAST_HOUR[reason]], 0) > 0)


def seen_listed(now: int, default_interval_ms: int) -> Seen:
    """``Seen`` for a query over the nodes alone: the nodes with an exit event of the reason received
    in the last hour (what ``recent_exits`` counts), as an ``IN`` list the database computes once."""

    def exited(reason: str) -> Any:
        recent = and_(events.c.kind == "exit", events.c.reason == reason, events.c.received_ms > now - HOUR_MS)
        return nodes.c.id.in_(select(events.c.node_id).where(recent))

    return Seen(node_status(now, default_interval_ms), exited)


@dataclass(frozen=True)
class AlertKind:
    """One kind of alert: its rule in SQL (``sql``: whether a node has it) beside the same rule in
    Python (``says``: its message for one node row of ``node_alerts``, or None when it has none)."""

    name: str
    severity: str
    sql: Callable[[Seen], Any]
    says: Callable[[Mapping[str, Any]], str | None]


# -- the rules, each in SQL and in Python ------------------------------------------------------------


def _over_sql() -> Any:
    return nodes.c.budget_bytes > nodes.c.effective_bytes


def _over(r: Mapping[str, Any]) -> bool:
    eff, budget = r["effective_bytes"], r["budget_bytes"]
    return budget is not None and eff is not None and budget > eff


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


def _from_host(r: Mapping[str, Any]) -> bool:
    """The budget is in the host's ballpark while the limit is not: sized from the host's RAM.
    In double precision, as ``_from_host_sql`` (``float(int)`` rounds as the databases' casts do)."""
    eff, host, budget = r["effective_bytes"], r["host_total_bytes"], r["budget_bytes"]
    return (
        host is not None
        and float(eff) < FROM_HOST_LIMIT * float(host)
        and float(budget) >= FROM_HOST_BUDGET * float(host)
    )


def memlock_sql() -> Any:
    """SQL: the node's warning list names ``memlock-too-low``, case-sensitively as ``_warns_memlock``
    (LIKE picks the rows cheaply; on SQLite it ignores case, ``replace()`` never does)."""
    w = nodes.c.warnings
    return and_(w.like(MEMLOCK_WARNING), func.replace(w, MEMLOCK_CODE, "") != w)


def _warns_memlock(warnings: str | None) -> bool:
    """Whether the JSON list of warning codes holds ``memlock-too-low``. Parsed only when the text
    could hold it (the quoted code, or an escape): 10,000 offline nodes are 10,000 lists of ``[]``."""
    if not warnings or (MEMLOCK_CODE not in warnings and "\\" not in warnings):
        return False
    return "memlock-too-low" in json.loads(warnings)


def _memlock(r: Mapping[str, Any]) -> str | None:
    return "RLIMIT_MEMLOCK is below the plan's pinned need" if _warns_memlock(r["warnings"]) else None


def _offline(r: Mapping[str, Any]) -> str | None:
    if r["status"] != "offline":
        return None
    since = iso_ms(r["last_seen_ms"])
    if r.get("run_only"):
        return f"no event or heartbeat from its supervisor since {since}"
    return f"no report since {since}"


def _budget_from_host(r: Mapping[str, Any]) -> str | None:
    if not (_over(r) and _from_host(r)):
        return None
    eff, host, budget = (format_size(r[k]) for k in ("effective_bytes", "host_total_bytes", "budget_bytes"))
    return (
        f"budget {budget} looks sized from the host's RAM ({host}), "
        f"far above the container limit ({eff}): the outage oomguard exists for"
    )


def _budget_above_limit(r: Mapping[str, Any]) -> str | None:
    if not _over(r) or _from_host(r):
        return None
    return f"budget {format_size(r['budget_bytes'])} is above the effective limit {format_size(r['effective_bytes'])}"


def _oom_kills(r: Mapping[str, Any]) -> str | None:
    n = r[LAST_HOUR["oom-kill"]]
    return f"{n} OOM kill(s) in the last hour" if n else None


def _pressure_stops(r: Mapping[str, Any]) -> str | None:
    n = r[LAST_HOUR["pressure-stop"]]
    if not n:
        return None
    return f"{n} pressure stop(s) in the last hour: run --guard stopped the worker before the kernel's OOM killer acted"


ALERTS = (  # every kind, in the order node_alerts lists a node's alerts
    AlertKind("offline", "warning", lambda s: s.status == "offline", _offline),
    AlertKind("budget-from-host", "critical", lambda s: and_(_over_sql(), _from_host_sql()), _budget_from_host),
    # A NULL host is not the host's ballpark; where the budget or the limit is NULL, neither kind.
    AlertKind(
        "budget-above-limit", "critical", lambda s: and_(_over_sql(), not_(_from_host_sql())), _budget_above_limit
    ),
    AlertKind("memlock-below-pinned-need", "critical", lambda s: memlock_sql(), _memlock),
    AlertKind("oom-kills", "critical", lambda s: s.exited("oom-kill"), _oom_kills),
    AlertKind("pressure-stops", "warning", lambda s: s.exited("pressure-stop"), _pressure_stops),
)
KINDS = {kind.name: kind.severity for kind in ALERTS}


def severity(name: str) -> str:
    """The severity of the kind *name* (of ``ALERTS`` as it is now)."""
    return next(kind.severity for kind in ALERTS if kind.name == name)


# -- derived ---------------------------------------------------------------------------------------


def kind_conditions(now: int, default_interval_ms: int) -> dict[str, Any]:
    """SQL: per alert kind (``KINDS``), whether a node not archived has it at *now* (``seen_listed``)."""
    seen = seen_listed(now, default_interval_ms)
    return {kind.name: kind.sql(seen) for kind in ALERTS}


def any_alert(seen: Seen) -> Any:
    """SQL: whether a node not archived has any alert."""
    return or_(*(kind.sql(seen) for kind in ALERTS))


def alert_count(seen: Seen) -> Any:
    """SQL: how many alerts ``node_alerts`` gives the node (0 when archived)."""
    total = functools.reduce(operator.add, (case((kind.sql(seen), 1), else_=0) for kind in ALERTS))
    return case((nodes.c.archived_ms.is_not(None), 0), else_=total)


def node_alerts(r: Any, ooms_last_hour: int, stops_last_hour: int = 0) -> list[dict[str, Any]]:
    """The alerts of one node row (latest report columns, status; ``run_only`` when no agent ever
    reported), with its OOM kills and pressure stops of the last hour."""
    if r["status"] == "archived":
        return []
    row = {**r, LAST_HOUR["oom-kill"]: ooms_last_hour, LAST_HOUR["pressure-stop"]: stops_last_hour}
    found = ((kind, kind.says(row)) for kind in ALERTS)
    return [{"node": r["name"], "kind": k.name, "severity": k.severity, "message": m} for k, m in found if m]


__all__ = [
    "ALERTS",
    "KINDS",
    "STATUSES",
    "AlertKind",
    "alert_count",
    "any_alert",
    "kind_conditions",
    "memlock_sql",
    "node_alerts",
    "node_status",
    "recent_exits",
    "seen_joined",
    "seen_listed",
    "severity",
]
