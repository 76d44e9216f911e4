"""The ingest side: reports, events and observations into the database, through the group committer.

Times: ``received_ms`` is the manager's own clock when the request arrived; offline status,
ordering and retention use it. The agent's time is kept as reported (a report's ``agent_ms``, an
event's ``time``), and a report's agent time minus its receive time is its node's clock skew.

A report is one history row, the node's latest values, and its whole JSON in ``latest_reports``
(apart, so that node rows stay small); the reports of a batch are written with a handful of
statements (node ids, one insert, one update, one upsert). Each write is idempotent by its
node and ingest id (an id is the node's own: node B's row with node A's id is stored; revision
0011), between replicas on one PostgreSQL too: the insert is ``ON CONFLICT (node_id, ingest_id)
DO NOTHING ... RETURNING``, so when two replicas store the same row at once, one stores it and the
other answers ``False`` (PostgreSQL's unique index waits for the first to commit or roll back).
Rows are written in one order (node names, then node ids and ingest ids) so replicas never deadlock.

An exit event of an OOM kill or a pressure stop also counts on its node (``oom_kills_total``,
``pressure_stops_total``: /metrics' counters, which outlive the events' retention).

An event, and a heartbeat (which is no row: ``oomguard run --manager``'s supervisor saying it is
alive), stamp the node's ``last_event_ms``; for a node no agent ever reported, its last-seen time
too (the run-only status). A report, event or heartbeat un-archives its node. ``forget`` deletes
a node and its rows on the same writer thread, so no write of it can interleave; ``set_excluded``
sets an observation's ``excluded`` flag (an operator's), there too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine, and_, bindparam, case, delete, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from oomguard.labels import CLASS_LABEL
from oomguard.manager import contract
from oomguard.manager.alerts import DEFAULT_LINE, largest_consumer_budget, working_set_high
from oomguard.manager.bodies import EventEnvelope, ObservationEnvelope, ReportEnvelope
from oomguard.manager.db import events, latest_reports, node_labels, nodes, observations, reports
from oomguard.manager.store import history, kernel_ooms
from oomguard.manager.store.claims import Caps, Refused, confirm, confirmed, own_class
from oomguard.manager.store.commit import DEFAULT_MAX_BYTES, GroupCommitter
from oomguard.manager.store.supervisor import STATES as SUPERVISOR_STATES
from oomguard.manager.times import now_ms

# A supervisor's announced heartbeat interval is kept within these: a dead supervisor that had
# announced a day must not keep its node "run-only" for three days, nor a tiny one flap it offline.
HEARTBEAT_MIN_MS, HEARTBEAT_MAX_MS = 10_000, 3_600_000
SCOPE = ["node_id", "ingest_id"]  # what makes a row's id unique (revision 0011): its node's, not the fleet's
COUNTERS = {"oom-kill": "oom_kills_total", "pressure-stop": "pressure_stops_total"}  # exit reason -> node column
_LATEST = (  # the node's latest values, unless a report received later got there first
    update(nodes)
    .where(
        and_(
            nodes.c.id == bindparam("b_id"),
            # A node's first report always lands, even when run events (another replica's clock) came later.
            or_(nodes.c.last_seen_ms <= bindparam("b_t"), nodes.c.warnings.is_(None)),
        )
    )
    .values(
        last_seen_ms=bindparam("b_t"),
        archived_ms=None,  # a node that reports again is back
        clock_skew_ms=bindparam("b_skew"),
        interval_ms=bindparam("b_interval"),
        warnings=bindparam("b_warnings"),
        gpus=bindparam("b_gpus"),
        # Revision 0009: the consumers' own view (NULL: none sent) and their largest budget.
        consumers=bindparam("b_consumers"),
        consumer_budget_bytes=bindparam("b_consumer_budget"),
        # A report without a plan leaves the jobs column to the supervisor's start events.
        concurrency=func.coalesce(bindparam("b_concurrency"), nodes.c.concurrency),
        # The first of the consecutive reports at or above the working-set line (alerts.working_set_high).
        ws_high_since_ms=case(
            (bindparam("b_high") == 1, func.coalesce(nodes.c.ws_high_since_ms, bindparam("b_t"))), else_=None
        ),
        # The report's other columns as it says them (None stays NULL: unknown, never 0).
        **{name: bindparam(f"b_{name}") for name in contract.COLUMNS if name != "concurrency"},
    )
)


def labels_json(labels: dict[str, str] | None) -> str | None:
    """The labels as the ``nodes.labels`` column holds them (sorted keys); None when none were sent."""
    return None if labels is None else json.dumps(labels, sort_keys=True, separators=(",", ":"))


class _ReportItem:
    """A report waiting for the writer: the history row and the node's new latest values."""

    __slots__ = ("labels", "latest", "node", "oom", "report", "row", "t")

    def __init__(
        self, node: str, t: int, row: dict[str, Any], latest: dict[str, Any], report: str, *, labels: str | None
    ) -> None:
        self.node = node
        self.t = t
        self.row = row
        self.latest = latest
        self.report = report  # the whole report, JSON
        self.labels = labels  # the envelope's labels, JSON (None: not sent, the node keeps its own)
        self.oom: tuple[str | None, int | None] = (None, None)  # the kernel's oom_kill counter: file, value

    @property
    def key(self) -> tuple[str, str]:
        """What makes it the same report again: its node and ingest id."""
        return self.node, self.row["ingest_id"]

    @property
    def order(self) -> tuple[int, int]:
        """Newest first by receive time, then by the agent's time."""
        agent = self.row["agent_ms"]
        return self.t, -(2**63) if agent is None else agent


def _report_item(env: ReportEnvelope, report_json: str, t: int, agent_ms: int | None, line: float) -> _ReportItem:
    columns = contract.columns(env.report)
    high = working_set_high(columns["working_set_bytes"], columns["effective_bytes"], columns["budget_bytes"], line)
    row = {
        "ingest_id": env.id,
        "received_ms": t,
        "agent_ms": agent_ms,
        **{name: columns[name] for name in history.COLUMNS},
    }
    latest = {
        "b_t": t,
        "b_skew": None if agent_ms is None else agent_ms - t,
        "b_interval": int(env.interval_s * 1000) if env.interval_s else None,
        "b_warnings": json.dumps(columns["warnings"]),
        "b_gpus": json.dumps(columns["gpus"]),
        "b_consumers": None if columns["consumers"] is None else json.dumps(columns["consumers"]),
        "b_consumer_budget": largest_consumer_budget(columns["consumers"]),
        "b_high": int(high),
        **{f"b_{name}": columns[name] for name in contract.COLUMNS},
    }
    item = _ReportItem(env.node, t, row, latest, report_json, labels=labels_json(env.labels))
    item.oom = kernel_ooms.oom_counter(env.report)
    return item


class Writer:
    """Every write of the manager, on one group-commit thread; *clock* gives the receive time;
    *max_queue_bytes*: the most bytes of writes held at once (``commit``: beyond it, 503)."""

    def __init__(
        self,
        engine: Engine,
        clock: Callable[[], int] = now_ms,
        line: float = DEFAULT_LINE,
        max_queue_bytes: int = DEFAULT_MAX_BYTES,
        caps: Caps | None = None,
    ) -> None:
        self.caps = caps or Caps()  # distinct profiles and classes (claims.Caps), on the writer thread
        self.sqlite = engine.dialect.name == "sqlite"
        self.line = line  # the working-set line, which ``ws_high_since_ms`` is kept by
        self._insert = sqlite_insert if self.sqlite else pg_insert
        self.clock = clock
        self._node_ids: dict[str, int] = {}  # written only by the writer thread
        self.committer = GroupCommitter(
            engine, on_rollback=self._rolled_back, bulk=self._write_reports, max_bytes=max_queue_bytes
        )
        self._insert_reports = (
            self._insert(reports)
            .on_conflict_do_nothing(index_elements=SCOPE)
            .returning(reports.c.node_id, reports.c.ingest_id)
        )
        upsert = self._insert(latest_reports)
        self._upsert_latest = upsert.on_conflict_do_update(  # unless a report received later got there first
            index_elements=["node_id"],
            set_={"received_ms": upsert.excluded.received_ms, "report": upsert.excluded.report},
            where=latest_reports.c.received_ms <= upsert.excluded.received_ms,
        )

    def _rolled_back(self) -> None:
        """A batch rolled back: what the caches took from it may not be in the database."""
        self._node_ids.clear()
        self.caps.reset()

    async def report(self, env: ReportEnvelope, report_json: str, agent_ms: int | None = None) -> bool:
        """Store a report received now, with the agent's own time; False when its id was stored before."""
        item = _report_item(env, report_json, self.clock(), agent_ms, self.line)
        return bool(await self.committer.submit_async(item, len(report_json) + len(item.labels or "")))

    async def event(self, env: EventEnvelope, body_json: str) -> bool:
        """Store an event received now; False when its id was stored before. A heartbeat is no
        row: it only says the node's supervisor is alive (True)."""
        t = self.clock()
        size = len(body_json) + len(labels_json(env.labels) or "")
        if env.event.event == "heartbeat":
            return bool(await self.committer.submit_async(self._heartbeat_writer(env, t), size))
        return bool(await self.committer.submit_async(self._event_writer(env, body_json, t), size))

    async def observation(self, env: ObservationEnvelope) -> bool | Refused:
        """Store an observation received now; False when its id was stored before; ``Refused``
        where the node may not post it (``claims``: another class than its own, or a new profile
        or class past a cap). Stored with the node's own class (``claims.own_class``), confirmed
        where its failure is shown by the node's own exit event (``claims.confirmed``)."""
        t, o = self.clock(), env.observation
        values = {
            "ingest_id": env.id,
            "received_ms": t,
            "observed": o.time,
            "profile": o.profile,
            "declared_per_job_bytes": o.declared_per_job_bytes,
            "peak_per_job_bytes": o.peak_per_job_bytes,
            "declared_baseline_bytes": o.declared_baseline_bytes,
            "peak_baseline_bytes": o.peak_baseline_bytes,
            "concurrency": o.concurrency,
            "outcome": o.outcome,
        }
        label = (env.labels or {}).get(CLASS_LABEL)
        if o.node_class is not None and label is not None and label != o.node_class:
            return Refused(422, "observation.node_class: differs from the envelope's node_class label")
        claimed, where = (o.node_class, "observation.node_class") if o.node_class else (label, "labels.node_class")

        def write(conn: Connection) -> bool | Refused:
            node_id = self._node_id(conn, env.node, t)
            found = own_class(conn, node_id, claimed, where)
            if isinstance(found, Refused):
                return found
            node_class, claim_taken = found
            stored_before = conn.execute(
                select(observations.c.id).where(observations.c.node_id == node_id, observations.c.ingest_id == env.id)
            ).first()
            if stored_before is not None:
                return False  # an idempotent retry: no cap counts it twice
            refused = self.caps.admit(conn, t, node_id, o.profile, node_class)
            if refused is not None:
                return refused
            ok = confirmed(conn, node_id, o.outcome, o.time)
            statement = self._insert(observations).values(
                node_id=node_id, node_class=node_class, confirmed=ok, **values
            )
            stored = conn.execute(
                statement.on_conflict_do_nothing(index_elements=SCOPE).returning(observations.c.id)
            ).first()
            if stored is not None and claim_taken:  # a run-only node's first word: its class becomes its label
                _set_labels(conn, {node_id: str(labels_json({**(env.labels or {}), CLASS_LABEL: node_class}))})
            return stored is not None

        result = await self.committer.submit_async(write, 512)
        return result if isinstance(result, Refused) else bool(result)

    async def set_excluded(self, node: str, ingest_id: str, excluded: bool, profile: str | None = None) -> bool:
        """Exclude the observation *ingest_id* of *node* (of *profile*, when given) from what the
        fleet learns, or include it again; False when there is no such observation."""

        def write(conn: Connection) -> bool:
            node_id = select(nodes.c.id).where(nodes.c.name == node).scalar_subquery()
            where = [observations.c.ingest_id == ingest_id, observations.c.node_id == node_id]
            if profile is not None:
                where.append(observations.c.profile == profile)
            # rowcount: the rows matched, on both databases, also where the flag already held
            return conn.execute(update(observations).where(*where).values(excluded=excluded)).rowcount == 1

        return bool(await self.committer.submit_async(write))

    async def warm(self, limit: int) -> list[str]:
        """Read the names and ids of up to *limit* nodes (the newest first) into the writer's cache,
        on its own thread; the names. A manager started beside a large fleet then makes no lookup
        for each node's first report (at 100,000 nodes each cost a read and a connection of its own)."""

        def read(conn: Connection) -> list[str]:
            rows = conn.execute(select(nodes.c.name, nodes.c.id).order_by(nodes.c.id.desc()).limit(limit)).all()
            for name, node_id in rows:
                self._node_ids.setdefault(name, int(node_id))
            return [name for name, _ in rows]

        return list(await self.committer.submit_async(read))

    async def forget(self, name: str) -> bool:
        """Delete the node *name* and every row of it; False when there is no such node."""
        return bool(await self.committer.submit_async(lambda conn: self._forget(conn, name)))

    def _forget(self, conn: Connection, name: str) -> bool:
        node_id = conn.execute(select(nodes.c.id).where(nodes.c.name == name)).scalar()
        self._node_ids.pop(name, None)  # the writer thread's cache: a later report creates the node anew
        if node_id is None:
            return False
        self.caps.forget(int(node_id))
        # Explicitly, not by trusting ON DELETE CASCADE.
        for table in (events, reports, latest_reports, node_labels, observations):
            conn.execute(delete(table).where(table.c.node_id == node_id))
        conn.execute(delete(nodes).where(nodes.c.id == node_id))
        return True

    def _node_id(self, conn: Connection, name: str, t: int) -> int:
        """The node's id, creating the node if needed (cached; ``_forget`` drops a forgotten node's
        entry, and a failed batch clears the cache, which heals another replica's forgetting)."""
        cached = self._node_ids.get(name)
        if cached is not None:
            return cached
        conn.execute(
            self._insert(nodes)
            .values(name=name, first_seen_ms=t, last_seen_ms=t)
            .on_conflict_do_nothing(index_elements=["name"])
        )
        node_id = int(conn.execute(select(nodes.c.id).where(nodes.c.name == name)).scalar_one())
        self._node_ids[name] = node_id
        return node_id

    def _write_reports(self, conn: Connection, items: list[_ReportItem]) -> list[bool]:
        """A batch of reports in a handful of statements; True for each stored, False for a duplicate."""
        first: dict[tuple[str, str], _ReportItem] = {}
        for it in items:
            first.setdefault(it.key, it)  # the first of a batch wins
        t0 = min((it.t for it in first.values()), default=0)
        ids = {name: self._node_id(conn, name, t0) for name in sorted({it.node for it in first.values()})}
        fresh = sorted(first.values(), key=lambda it: (ids[it.node], it.row["ingest_id"]))
        rows = [{**it.row, "node_id": ids[it.node]} for it in fresh]
        stored = {(int(n), str(i)) for n, i in conn.execute(self._insert_reports, rows).all()} if rows else set()
        newest: dict[int, _ReportItem] = {}
        for it in fresh:
            node_id = ids[it.node]
            later = node_id not in newest or newest[node_id].order <= it.order
            if (node_id, it.row["ingest_id"]) in stored and later:
                newest[node_id] = it
        if newest:
            conn.execute(_LATEST, [{**newest[n].latest, "b_id": n} for n in sorted(newest)])
            whole = [{"node_id": n, "received_ms": newest[n].t, "report": newest[n].report} for n in sorted(newest)]
            conn.execute(self._upsert_latest, whole)
        _set_labels(conn, {n: text for n in newest if (text := newest[n].labels) is not None})
        counted = [it for it in fresh if (ids[it.node], it.row["ingest_id"]) in stored]
        kernel_ooms.count(
            conn,
            [kernel_ooms.Seen(ids[it.node], it.t, it.row["agent_ms"], it.row["ingest_id"], *it.oom) for it in counted],
        )
        return [first[it.key] is it and (ids[it.node], it.row["ingest_id"]) in stored for it in items]

    def _event_writer(self, env: EventEnvelope, body_json: str, t: int) -> Callable[[Connection], bool]:
        e = env.event
        values = {
            "ingest_id": env.id,
            "received_ms": t,
            "time": e.time,  # the agent's time, as reported
            "kind": e.event,
            "reason": e.reason,
            "exit_code": e.exit_code,
            "signal": e.signal,
            "budget_bytes": e.budget_bytes,
            "concurrency": e.concurrency,
            "peak_bytes": e.peak_bytes,
            "duration_s": e.duration_s,
            "body": body_json,
        }

        def write(conn: Connection) -> bool:
            node_id = self._node_id(conn, env.node, t)
            statement = self._insert(events).values(node_id=node_id, **values)
            row = conn.execute(statement.on_conflict_do_nothing(index_elements=SCOPE).returning(events.c.id)).first()
            if row is None:
                return False
            if e.event == "exit":  # the node's own supervisor shows the kill: its observation's floor counts
                confirm(conn, node_id, e.reason, e.time)
            changes = {**_alive(t), **_event_changes(e, t)}
            conn.execute(update(nodes).where(nodes.c.id == node_id).values(**changes))
            labels = labels_json(env.labels)
            if labels is not None:
                _set_labels(conn, {node_id: labels})
            return True

        return write

    def _heartbeat_writer(self, env: EventEnvelope, t: int) -> Callable[[Connection], bool]:
        interval = env.event.interval_s

        def write(conn: Connection) -> bool:
            values = _alive(t)
            if interval is not None:
                values["heartbeat_interval_ms"] = min(HEARTBEAT_MAX_MS, max(HEARTBEAT_MIN_MS, int(interval * 1000)))
            node_id = self._node_id(conn, env.node, t)
            if conn.execute(update(nodes).where(nodes.c.id == node_id).values(**values)).rowcount == 0:
                self._node_ids.pop(env.node, None)  # forgotten by another replica: the node starts anew
                node_id = self._node_id(conn, env.node, t)
                conn.execute(update(nodes).where(nodes.c.id == node_id).values(**values))
            return True

        return write


def _event_changes(e: Any, t: int) -> dict[str, Any]:
    """The node's columns an event changes besides ``_alive``'s: the jobs a start gives, the limit
    and budget of a node no agent reported, the gate's refusal (set by a failed gate; cleared by a
    later start or passed gate), and the count of its OOM kills or pressure stops (an exit's)."""
    changes: dict[str, Any] = {}
    never_reported = nodes.c.warnings.is_(None)
    lifecycle = SUPERVISOR_STATES.get(e.event)
    if e.event == "gate":
        lifecycle = "starting" if e.passed else "refused"
    if lifecycle is not None:
        changes["supervisor_state"] = lifecycle
    counter = COUNTERS.get(e.reason or "") if e.event == "exit" else None
    if counter is not None:
        changes[counter] = nodes.c[counter] + 1
    if e.event == "start":
        if e.concurrency is not None:
            # The jobs column shows what the supervisor really runs (after step-downs), not the plan.
            changes["concurrency"] = e.concurrency
        for name in ("effective_bytes", "limited_by", "budget_bytes"):  # a report's, where there is one
            if getattr(e, name) is not None:
                changes[name] = case((never_reported, getattr(e, name)), else_=nodes.c[name])
    if e.event == "gate" and not e.passed:
        later = or_(nodes.c.refused_ms.is_(None), nodes.c.refused_ms <= t)
        values = {
            "refused_ms": t,
            "refused_step": e.step,
            "refused_exit_code": e.exit_code,
            "refused_message": e.message,
        }
        changes.update({k: case((later, v), else_=nodes.c[k]) for k, v in values.items()})
    elif e.event in ("start", "gate"):
        changes["refused_ms"] = case((nodes.c.refused_ms <= t, None), else_=nodes.c.refused_ms)
    return changes


def _set_labels(conn: Connection, labels: dict[int, str]) -> None:
    """Each node's latest labels (*labels*: node id -> ``labels_json``): the column, and the
    ``node_labels`` rows the filter reads, rewritten only where they changed."""
    if not labels:
        return
    held = dict(conn.execute(select(nodes.c.id, nodes.c.labels).where(nodes.c.id.in_(sorted(labels)))).all())
    changed = sorted(n for n, text in labels.items() if n in held and held[n] != text)
    if not changed:
        return
    conn.execute(
        update(nodes).where(nodes.c.id == bindparam("b_id")).values(labels=bindparam("b_labels")),
        [{"b_id": n, "b_labels": labels[n]} for n in changed],
    )
    conn.execute(delete(node_labels).where(node_labels.c.node_id.in_(changed)))
    rows = [{"node_id": n, "key": k, "value": v} for n in changed for k, v in json.loads(labels[n]).items()]
    if rows:
        conn.execute(node_labels.insert(), rows)


def _alive(t: int) -> dict[str, Any]:
    """The node's columns after an event or heartbeat received at *t*: the supervisor's last sign
    of life, not archived; and, for a node no agent ever reported (run-only), its last-seen time."""
    never_reported = and_(nodes.c.warnings.is_(None), nodes.c.last_seen_ms < t)
    return {
        "last_event_ms": _later(nodes.c.last_event_ms, t),
        "archived_ms": None,
        "last_seen_ms": case((never_reported, t), else_=nodes.c.last_seen_ms),
    }


def _later(column: Any, t: int) -> Any:
    """SQL: the later of *column* (NULL: never) and *t* (replicas' clocks may differ a little)."""
    return case((or_(column.is_(None), column < t), t), else_=column)
