"""The alert policy: a node's status, and which of its numbers deserve a page.

Statuses (``node_status``, one SQL expression):

- ``online``: the node's agent reported within three report intervals (its own, or the manager's
  default), counted from the time the manager received its latest report, never the agent's own
  clock: an agent whose clock is slow is not "offline" right after reporting; or, for a node that
  has reported, its supervisor's latest event or heartbeat arrived within three heartbeat
  intervals (the node is alive; its latest report may not be current: ``current_report``);
- ``run-only``: no agent ever reported, but ``oomguard run --manager`` sends events, and its
  supervisor's latest event or heartbeat arrived within three heartbeat intervals (the interval
  it announced, else ``HEARTBEAT_MS``): healthy, only without an agent;
- ``offline``: neither of the above;
- ``refused``: the node's latest ``gate`` event failed (the entrypoint's gate refused to start its
  worker: ``check``, ``plan`` or ``verify`` said no), and no ``start`` event or passed gate came
  after it (the writer keeps ``refused_ms`` and the failing step on the node row);
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

- ``refused`` (critical): the entrypoint's gate refused the node (status ``refused``), with the
  failing step's one line;
- ``working-set-high`` (critical): the node's current working set (its latest report, while that
  is current) is at or above the line (``--working-set-line``, 90 % of the effective limit by
  default) or above its budget; since the first of the consecutive reports at or above it
  (``nodes.ws_high_since_ms``, kept by the writer as each report lands: no history is read);
- ``offline`` (warning): no report (or, run-only, no event or heartbeat) for three intervals;
- ``budget-from-host`` (critical): the budget is above the effective limit and in the host's
  ballpark, so it was sized from the host's RAM: the outage oomguard exists for;
- ``budget-above-limit`` (critical): the budget is above the effective limit otherwise;
- ``consumer-budget-above-limit`` (critical): a memory consumer with a budget of its own (CuZK,
  ``agent --cuzk-status``) said, in the latest report, that its budget is above the effective limit
  of the same report: it plans on memory the kernel will not give it (a prover on a 503 GiB host in a
  342 GiB container that budgets from the host's RAM), and is OOM-killed before its budget runs out;
- ``memlock-below-pinned-need`` (critical): the report warns ``memlock-too-low``;
- ``oom-kills`` (critical): OOM kills in the last hour (exit events only: the restart or give-up
  after a kill repeats its reason; one kill, one count);
- ``pressure-stops`` (warning): ``run --guard`` stopped the worker in the last hour before the
  kernel's OOM killer acted (exit reason ``pressure-stop``): counted apart, never an OOM kill.

Where SQL and Python both decide, they decide alike: the host's ballpark is compared in IEEE
double precision on both sides (an integer column cast to FLOAT, as Python's ``float(int)``), and
the memlock code is matched case-sensitively (SQLite's LIKE ignores ASCII case:
https://sqlite.org/lang_expr.html#like; ``replace()`` does not). tests/manager/test_alert_groups.py
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
STATUSES = ("online", "offline", "run-only", "refused", "archived")
LIVE = ("online", "run-only", "refused")  # what the node says now; the risk order puts these first
DEFAULT_LINE = 0.9  # the working-set line: this share of the effective limit (Settings.working_set_line)
LINE_KEY = "working_set_line"  # the line, in the row ``node_alerts`` words
FROM_HOST_LIMIT = 0.8  # the limit is below this share of the host's RAM ...
FROM_HOST_BUDGET = 0.5  # ... and the budget at least this share of it: sized from the host
KERNEL_OOM = "kernel-oom"  # the events row of a rise of the kernel's oom_kill counter (store/kernel_ooms.py)
LAST_HOUR = {"oom-kill": "oom_1h", "pressure-stop": "stops_1h", KERNEL_OOM: "kernel_1h"}  # last hour's count, by name
# The supervisor's states (``nodes.supervisor_state``, by its latest lifecycle event) in which it
# sends heartbeats: silent past MISSED_INTERVALS of them, it is ``lost`` (issue 38, item 2).
ALIVE_STATES = ("running", "restarting", "starting")
SUPERVISOR_STATES = ("running", "restarting", "starting", "exited", "gave-up", "stopped", "refused", "lost")


def current_report(now: int, default_interval_ms: int) -> Any:
    """SQL: whether the node's latest report is current: received within three report intervals.
    Its working set is a reading only then; after that it is history (the node page says so)."""
    interval = func.coalesce(nodes.c.interval_ms, default_interval_ms)
    return and_(nodes.c.warnings.is_not(None), now - nodes.c.last_seen_ms <= MISSED_INTERVALS * interval)


def node_status(now: int, default_interval_ms: int) -> Any:
    """SQL: the node's status (see the module doc), one CASE expression."""
    heartbeat = func.coalesce(nodes.c.heartbeat_interval_ms, HEARTBEAT_MS)
    never_reported = nodes.c.warnings.is_(None)  # every report sets it, [] when none
    supervisor_alive = now - nodes.c.last_event_ms <= MISSED_INTERVALS * heartbeat  # NULL: never an event
    return case(
        (nodes.c.archived_ms.is_not(None), "archived"),
        (nodes.c.refused_ms.is_not(None), "refused"),
        # A node no agent reported: its last-seen time is its supervisor's latest event or heartbeat.
        (and_(never_reported, now - nodes.c.last_seen_ms <= MISSED_INTERVALS * heartbeat), "run-only"),
        (and_(not_(never_reported), or_(current_report(now, default_interval_ms), supervisor_alive)), "online"),
        else_="offline",
    )


def last_seen() -> Any:
    """SQL: the node's last sign of life: its latest report, event or heartbeat (receive times)."""
    return case((nodes.c.last_event_ms > nodes.c.last_seen_ms, nodes.c.last_event_ms), else_=nodes.c.last_seen_ms)


def supervisor_view(now: int) -> Any:
    """SQL: the node's supervisor's state (``nodes.supervisor_state``: by its latest lifecycle
    event), ``lost`` where it is one that sends heartbeats (``ALIVE_STATES``) and neither an event
    nor a heartbeat arrived within ``MISSED_INTERVALS`` of its interval (issue 38: a SIGKILLed
    supervisor read "running" for ever); NULL: no supervisor ever heard of."""
    heartbeat = func.coalesce(nodes.c.heartbeat_interval_ms, HEARTBEAT_MS)
    silent = or_(nodes.c.last_event_ms.is_(None), now - nodes.c.last_event_ms > MISSED_INTERVALS * heartbeat)
    return case(
        (and_(nodes.c.supervisor_state.in_(ALIVE_STATES), silent), "lost"),
        else_=nodes.c.supervisor_state,
    )


def recent_exits(now: int, node_ids: list[int] | None = None) -> Any:
    """SQL subquery: per node (of *node_ids*, or all), its exit events of the last day by reason,
    counted once (exit events only): ``oom_24h``, ``oom_1h``, ``stops_24h``, ``stops_1h``
    (pressure stops); and the kernel counter's kills (``kernel-oom`` rows' ``kills``:
    ``store/kernel_ooms.py``), ``kernel_24h`` and ``kernel_1h``. Nodes without any have no row
    (join it outer, and coalesce)."""

    def count(reason: str, since: int, kind: Any) -> Any:
        return func.sum(case((and_(kind, events.c.reason == reason, events.c.received_ms > since), 1), else_=0))

    def kernel(since: int) -> Any:
        mine = and_(events.c.kind == KERNEL_OOM, events.c.received_ms > since)
        return func.sum(case((mine, func.coalesce(events.c.kills, 1)), else_=0))

    conds = [
        events.c.reason.in_(("oom-kill", "pressure-stop")),
        events.c.received_ms > now - DAY_MS,
        events.c.kind.in_(("exit", KERNEL_OOM)),
    ]
    if node_ids is not None:
        conds.append(events.c.node_id.in_(node_ids))
    exits = events.c.kind == "exit"
    return (
        select(
            events.c.node_id,
            count("oom-kill", now - DAY_MS, exits).label("oom_24h"),
            count("oom-kill", now - HOUR_MS, exits).label(LAST_HOUR["oom-kill"]),
            count("pressure-stop", now - DAY_MS, exits).label("stops_24h"),
            count("pressure-stop", now - HOUR_MS, exits).label(LAST_HOUR["pressure-stop"]),
            kernel(now - DAY_MS).label("kernel_24h"),
            kernel(now - HOUR_MS).label(LAST_HOUR[KERNEL_OOM]),
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
    current: Any  # SQL: whether its latest report is current (``current_report``)
    line: float  # the working-set line, a share of the effective limit
    supervisor: Any  # SQL: its supervisor's state, ``lost`` included (``supervisor_view``)


def seen_joined(now: int, default_interval_ms: int, recent: Any, line: float = DEFAULT_LINE) -> Seen:
    """``Seen`` for a query that joins *recent* (``recent_exits``, outer) to the nodes."""
    return Seen(
        node_status(now, default_interval_ms),
        lambda reason: func.coalesce(recent.c[LAST_HOUR[reason]], 0) > 0,
        current_report(now, default_interval_ms),
        line,
        supervisor_view(now),
    )


def seen_listed(now: int, default_interval_ms: int, line: float = DEFAULT_LINE) -> Seen:
    """``Seen`` for a query over the nodes alone: the nodes with an exit event of the reason received
    in the last hour (what ``recent_exits`` counts), as an ``IN`` list the database computes once."""

    def exited(reason: str) -> Any:
        kind = events.c.kind == KERNEL_OOM if reason == KERNEL_OOM else events.c.kind == "exit"
        recent = and_(kind, events.c.reason == ("oom-kill" if reason == KERNEL_OOM else reason))
        return nodes.c.id.in_(select(events.c.node_id).where(recent, events.c.received_ms > now - HOUR_MS))

    status, current = node_status(now, default_interval_ms), current_report(now, default_interval_ms)
    return Seen(status, exited, current, line, supervisor_view(now))


@dataclass(frozen=True)
class AlertKind:
    """One kind of alert: its rule in SQL (``sql``: whether a node has it) beside the same rule in
    Python (``says``: its message for one node row of ``node_alerts``, or None when it has none);
    ``since``: when the node got it (epoch ms), where that is known."""

    name: str
    severity: str
    sql: Callable[[Seen], Any]
    says: Callable[[Mapping[str, Any]], str | None]
    since: Callable[[Mapping[str, Any]], int | None] = lambda r: None


# -- the rules, each in SQL and in Python ------------------------------------------------------------


def working_set_ratio_sql() -> Any:
    """SQL: working set over the effective limit (NULL when either is unknown or the limit is 0).

    In floating point: dividing by an integer column makes SQLAlchemy cast it to NUMERIC, which
    PostgreSQL then converts back to double for every one of 10,000 rows."""
    return cast(nodes.c.working_set_bytes, Float) / cast(func.nullif(nodes.c.effective_bytes, 0), Float)


def working_set_ratio(working_set: int | None, effective: int | None) -> float | None:
    """``working_set_ratio_sql`` for one node: None when either is unknown or the limit is 0."""
    if working_set is None or not effective:
        return None
    return working_set / effective


def working_set_high_sql(line: float) -> Any:
    """SQL: the working set at or above *line* of the effective limit, or above the budget. The
    line is compared in double precision, as ``working_set_high`` does (FLOAT is double on
    PostgreSQL, REAL on SQLite: https://sqlite.org/datatype3.html#storage_classes_and_datatypes)."""
    ws, eff = cast(nodes.c.working_set_bytes, Float), cast(nodes.c.effective_bytes, Float)
    at_line = and_(nodes.c.effective_bytes > 0, ws >= literal(line, Float) * eff)
    return or_(at_line, nodes.c.working_set_bytes > nodes.c.budget_bytes)


def working_set_high(working_set: int | None, effective: int | None, budget: int | None, line: float) -> bool:
    """Whether a working set is at or above *line* of the effective limit, or above the budget
    (``working_set_high_sql`` in Python: ``float(int)`` rounds as the databases' casts do). The
    writer keeps ``ws_high_since_ms`` by it, report by report."""
    if working_set is None:
        return False
    at_line = bool(effective) and float(working_set) >= line * float(effective)  # type: ignore[arg-type]
    return at_line or (budget is not None and working_set > budget)


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


def _refused(r: Mapping[str, Any]) -> str | None:
    if r["status"] != "refused":
        return None
    code = r.get("refused_exit_code")
    exit_ = f", exit {code}" if code is not None else ""
    why = r.get("refused_message") or "no reason given"
    return f"the entrypoint's gate refused the node at {r.get('refused_step') or '?'}{exit_}: {why}"


def _high(r: Mapping[str, Any]) -> bool:
    line = r.get(LINE_KEY, DEFAULT_LINE)
    return bool(r.get("current")) and working_set_high(
        r.get("working_set_bytes"), r["effective_bytes"], r["budget_bytes"], line
    )


def _high_since(r: Mapping[str, Any]) -> int | None:
    """The first of the consecutive reports at or above the line; the latest report when the
    writer judged the earlier ones by another line (the manager restarted with a new one)."""
    if not _high(r):
        return None
    since = r.get("ws_high_since_ms")
    return int(since) if since is not None else int(r["last_seen_ms"])


def working_set_high_since(r: Mapping[str, Any], line: float) -> int | None:
    """When the node's ``working-set-high`` alert began (epoch ms; None: it has none): the row as
    ``node_alerts`` reads it (``last_seen_ms`` its latest report's receive time)."""
    return _high_since({**r, LINE_KEY: line})


def _working_set_high(r: Mapping[str, Any]) -> str | None:
    since = _high_since(r)
    if since is None:
        return None
    ws, eff, budget = r["working_set_bytes"], r["effective_bytes"], r["budget_bytes"]
    line = r.get(LINE_KEY, DEFAULT_LINE)
    ratio = working_set_ratio(ws, eff)
    said = f"working set {format_size(ws)}"
    if ratio is not None:
        said += f" is {ratio * 100:.1f}% of the {format_size(eff)} limit (line {line * 100:g}%)"
    if budget is not None and ws > budget:
        said += f", above its {format_size(budget)} budget"
    return f"{said}, since {iso_ms(since)}"


def _silent_since(r: Mapping[str, Any]) -> int | None:
    """An offline node's last sign of life: its latest report, event or heartbeat (``last_seen``)."""
    if r["status"] != "offline":
        return None
    event = r.get("last_event_ms")
    return max(int(r["last_seen_ms"]), int(event)) if event is not None else int(r["last_seen_ms"])


def _offline(r: Mapping[str, Any]) -> str | None:
    silent = _silent_since(r)
    if silent is None:
        return None
    since = iso_ms(silent)
    if r.get("run_only"):
        return f"no event or heartbeat from its supervisor since {since}"
    if r.get("last_event_ms") is not None:
        return f"no report, event or heartbeat since {since}"
    return f"no report since {since}"


def _budget_from_host(r: Mapping[str, Any]) -> str | None:
    if not (_over(r) and _from_host(r)):
        return None
    eff, host, budget = (format_size(r[k]) for k in ("effective_bytes", "host_total_bytes", "budget_bytes"))
    return (
        f"budget {budget} looks sized from the host's RAM ({host}), "
        f"far above the container limit ({eff}): the outage oomguard exists for"
    )


def largest_consumer_budget(consumers: Any) -> int | None:
    """The largest budget among a report's consumers (``contract.columns``' kept list), None when
    none is known: ``nodes.consumer_budget_bytes``, which the writer keeps by it."""
    items = consumers if isinstance(consumers, list) else []
    known = [c.get("budget_bytes") for c in items if isinstance(c, dict)]
    budgets = [b for b in known if isinstance(b, int) and not isinstance(b, bool)]
    return max(budgets) if budgets else None


def _consumer_over_sql() -> Any:
    """SQL: the largest consumer budget above the effective limit (integers: exact on both sides)."""
    return nodes.c.consumer_budget_bytes > nodes.c.effective_bytes


def _consumers_over(r: Mapping[str, Any], eff: int) -> str:
    """``name: size`` of each consumer whose budget is above *eff*, from the kept list (its JSON)."""
    try:
        items = json.loads(r.get("consumers") or "[]")
    except (ValueError, RecursionError):  # the column's text, whatever it holds: the size alone then
        items = []
    over = [
        f"{c.get('name')}: {format_size(c['budget_bytes'])}"
        for c in (items if isinstance(items, list) else [])
        if isinstance(c, dict) and isinstance(c.get("budget_bytes"), int) and c["budget_bytes"] > eff
    ]
    return ", ".join(over) if over else format_size(r["consumer_budget_bytes"])


def _consumer_budget_above_limit(r: Mapping[str, Any]) -> str | None:
    eff, budget = r["effective_bytes"], r.get("consumer_budget_bytes")
    if budget is None or eff is None or not budget > eff:
        return None
    return (
        f"a consumer's own budget ({_consumers_over(r, eff)}) is above the effective limit {format_size(eff)}: "
        "it plans on memory the kernel will not give it and is OOM-killed before its budget runs out"
    )


def _budget_above_limit(r: Mapping[str, Any]) -> str | None:
    if not _over(r) or _from_host(r):
        return None
    return f"budget {format_size(r['budget_bytes'])} is above the effective limit {format_size(r['effective_bytes'])}"


def _oom_kills(r: Mapping[str, Any]) -> str | None:
    n = r[LAST_HOUR["oom-kill"]]
    return f"{n} OOM kill(s) in the last hour" if n else None


def _kernel_oom_kills(r: Mapping[str, Any]) -> str | None:
    n = r.get(LAST_HOUR[KERNEL_OOM]) or 0
    if not n:
        return None
    return (
        f"{n} OOM kill(s) in the last hour by the kernel's oom_kill counter of the node's group "
        "(any process in it, supervised or not)"
    )


def _supervisor(state: str, severity_: str, words: Callable[[Mapping[str, Any]], str]) -> AlertKind:
    """The alert of a supervisor in *state* (``supervisor_view``), since its latest event."""
    return AlertKind(
        f"supervisor-{state}",
        severity_,
        lambda s: s.supervisor == state,
        lambda r: words(r) if r.get("supervisor") == state else None,
        lambda r: r.get("last_event_ms") if r.get("supervisor") == state else None,
    )


def _since_event(r: Mapping[str, Any]) -> str:
    event = r.get("last_event_ms")
    return "never" if event is None else str(iso_ms(int(event)))


def _pressure_stops(r: Mapping[str, Any]) -> str | None:
    n = r[LAST_HOUR["pressure-stop"]]
    if not n:
        return None
    return f"{n} pressure stop(s) in the last hour: run --guard stopped the worker before the kernel's OOM killer acted"


ALERTS = (  # every kind, in the order node_alerts lists a node's alerts: the live danger first
    AlertKind("refused", "critical", lambda s: s.status == "refused", _refused, lambda r: r.get("refused_ms")),
    AlertKind(
        "working-set-high",
        "critical",
        lambda s: and_(s.current, working_set_high_sql(s.line)),
        _working_set_high,
        _high_since,
    ),
    AlertKind("offline", "warning", lambda s: s.status == "offline", _offline, _silent_since),
    AlertKind("budget-from-host", "critical", lambda s: and_(_over_sql(), _from_host_sql()), _budget_from_host),
    # A NULL host is not the host's ballpark; where the budget or the limit is NULL, neither kind.
    AlertKind(
        "budget-above-limit", "critical", lambda s: and_(_over_sql(), not_(_from_host_sql())), _budget_above_limit
    ),
    # The consumer's budget and the limit of the same report; NULL (none known, or an older agent): none.
    AlertKind("consumer-budget-above-limit", "critical", lambda s: _consumer_over_sql(), _consumer_budget_above_limit),
    AlertKind("memlock-below-pinned-need", "critical", lambda s: memlock_sql(), _memlock),
    AlertKind("oom-kills", "critical", lambda s: s.exited("oom-kill"), _oom_kills),
    AlertKind("kernel-oom-kills", "critical", lambda s: s.exited(KERNEL_OOM), _kernel_oom_kills),
    _supervisor(
        "lost",
        "critical",
        lambda r: (
            f"no event or heartbeat from its supervisor since {_since_event(r)}: "
            f"{MISSED_INTERVALS} heartbeat intervals missed (killed, or its node gone); nothing says its worker runs"
        ),
    ),
    _supervisor(
        "gave-up",
        "critical",
        lambda r: (
            f"its supervisor gave up restarting the worker at {_since_event(r)}: nothing runs until it is restarted"
        ),
    ),
    _supervisor("exited", "warning", lambda r: f"its worker exited at {_since_event(r)} and was not restarted"),
    _supervisor(
        "stopped", "warning", lambda r: f"its supervisor was stopped at {_since_event(r)} (a signal: no restart)"
    ),
    AlertKind("pressure-stops", "warning", lambda s: s.exited("pressure-stop"), _pressure_stops),
)
KINDS = {kind.name: kind.severity for kind in ALERTS}


def severity(name: str) -> str:
    """The severity of the kind *name* (of ``ALERTS`` as it is now)."""
    return next(kind.severity for kind in ALERTS if kind.name == name)


# -- derived ---------------------------------------------------------------------------------------


def kind_conditions(now: int, default_interval_ms: int, line: float = DEFAULT_LINE) -> dict[str, Any]:
    """SQL: per alert kind (``KINDS``), whether a node not archived has it at *now* (``seen_listed``)."""
    seen = seen_listed(now, default_interval_ms, line)
    return {kind.name: kind.sql(seen) for kind in ALERTS}


def any_alert(seen: Seen) -> Any:
    """SQL: whether a node not archived has any alert."""
    return or_(*(kind.sql(seen) for kind in ALERTS))


def kind_flags(seen: Seen) -> list[Any]:
    """SQL: per kind of ``ALERTS``, in order, 1 when the node has it, else 0."""
    return [case((kind.sql(seen), 1), else_=0) for kind in ALERTS]


def alert_count(seen: Seen, flags: list[Any] | None = None, archived: Any = nodes.c.archived_ms) -> Any:
    """SQL: how many alerts ``node_alerts`` gives the node (0 when *archived* is set): the sum of
    its ``kind_flags``, or of *flags* where a query has them as columns already (each rule
    evaluated once)."""
    total = functools.reduce(operator.add, kind_flags(seen) if flags is None else flags)
    return case((archived.is_not(None), 0), else_=total)


def node_alerts(
    r: Any, ooms_last_hour: int, stops_last_hour: int = 0, line: float = DEFAULT_LINE
) -> list[dict[str, Any]]:
    """The alerts of one node row (latest report columns, status; ``run_only`` when no agent ever
    reported; ``current`` when its latest report is), with its OOM kills and pressure stops of the
    last hour, against the working-set *line*. ``since``: when the node got it, where known."""
    if r["status"] == "archived":
        return []
    row = {
        **r,
        LAST_HOUR["oom-kill"]: ooms_last_hour,
        LAST_HOUR["pressure-stop"]: stops_last_hour,
        LAST_HOUR[KERNEL_OOM]: int(r.get(LAST_HOUR[KERNEL_OOM]) or 0),
        LINE_KEY: line,
    }
    found = ((kind, kind.says(row)) for kind in ALERTS)
    return [
        {"node": r["name"], "kind": k.name, "severity": k.severity, "message": m, "since": _iso(k.since(row))}
        for k, m in found
        if m
    ]


def _iso(ms: int | None) -> str | None:
    return None if ms is None else iso_ms(ms)


__all__ = [
    "ALERTS",
    "DEFAULT_LINE",
    "KINDS",
    "LIVE",
    "STATUSES",
    "AlertKind",
    "alert_count",
    "any_alert",
    "current_report",
    "kind_conditions",
    "kind_flags",
    "largest_consumer_budget",
    "last_seen",
    "memlock_sql",
    "node_alerts",
    "node_status",
    "recent_exits",
    "seen_joined",
    "seen_listed",
    "severity",
    "supervisor_view",
    "working_set_high",
    "working_set_high_since",
    "working_set_high_sql",
    "working_set_ratio",
    "working_set_ratio_sql",
]
