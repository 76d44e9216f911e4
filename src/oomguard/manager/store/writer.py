"""The ingest side: reports and events into the database, through the group committer.

A report is one history row plus the node's latest values; the reports of a batch are written
with a handful of statements (one duplicate check, one insert, one update). An event is one row.
Each write is idempotent by its ingest id: a retry stores nothing and answers ``False``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine, and_, bindparam, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from oomguard.manager.db import events, nodes, reports
from oomguard.manager.models import EventEnvelope, ReportEnvelope
from oomguard.manager.store.commit import GroupCommitter
from oomguard.manager.times import now_ms, parse_iso_ms

FUTURE_SLACK_MS = 300_000  # a report may claim a time this far ahead of ours (clock skew)

_LATEST = (  # the node's latest values, unless a newer report got there first
    update(nodes)
    .where(and_(nodes.c.id == bindparam("b_id"), nodes.c.last_seen_ms <= bindparam("b_t")))
    .values(
        last_seen_ms=bindparam("b_t"),
        latest_report=bindparam("b_report"),
        effective_bytes=bindparam("b_effective"),
        host_total_bytes=bindparam("b_host"),
        budget_bytes=bindparam("b_budget"),
        limited_by=bindparam("b_limited_by"),
        runtime=bindparam("b_runtime"),
        memlock_soft_bytes=bindparam("b_memlock"),
        interval_ms=bindparam("b_interval"),
        warnings=bindparam("b_warnings"),
        gpus=bindparam("b_gpus"),
        concurrency=bindparam("b_concurrency"),
    )
)


class _ReportItem:
    """A report waiting for the writer: the history row and the node's new latest values."""

    __slots__ = ("latest", "node", "row", "t")

    def __init__(self, node: str, t: int, row: dict[str, Any], latest: dict[str, Any]) -> None:
        self.node = node
        self.t = t
        self.row = row
        self.latest = latest


def _report_item(env: ReportEnvelope, report_json: str, t: int) -> _ReportItem:
    r = env.report
    gpus = [
        {
            "index": g.index,
            "name": g.name,
            "memory_total_bytes": g.memory_total_bytes,
            "memory_free_bytes": g.memory_free_bytes,
        }
        for g in r.gpus
    ]
    row = {
        "ingest_id": env.id,
        "received_ms": t,
        "effective_bytes": r.memory.effective_bytes,
        "budget_bytes": r.budget.bytes,
        "usage_bytes": r.memory.usage_bytes,
        "working_set_bytes": r.memory.working_set_bytes,
    }
    latest = {
        "b_t": t,
        "b_report": report_json,
        "b_effective": r.memory.effective_bytes,
        "b_host": r.memory.host_total_bytes,
        "b_budget": r.budget.bytes,
        "b_limited_by": r.memory.limited_by,
        "b_runtime": r.container.runtime,
        "b_memlock": r.memlock.soft_bytes,
        "b_interval": int(env.interval_s * 1000) if env.interval_s else None,
        "b_warnings": json.dumps([w.code for w in r.warnings]),
        "b_gpus": json.dumps(gpus),
        "b_concurrency": r.plan.concurrency if r.plan is not None else None,
    }
    return _ReportItem(env.node, t, row, latest)


def _fresh(conn: Connection, items: list[_ReportItem]) -> tuple[list[_ReportItem], list[bool]]:
    """The items whose ingest id is new (first of a batch wins), and True/False for each item."""
    ids = [it.row["ingest_id"] for it in items]
    seen = set(conn.execute(select(reports.c.ingest_id).where(reports.c.ingest_id.in_(ids))).scalars())
    fresh, stored = [], []
    for it in items:
        new = it.row["ingest_id"] not in seen
        stored.append(new)
        if new:
            seen.add(it.row["ingest_id"])
            fresh.append(it)
    return fresh, stored


class Writer:
    """Every write of the manager, on one group-commit thread."""

    def __init__(self, engine: Engine, retention_ms: int) -> None:
        self.sqlite = engine.dialect.name == "sqlite"
        self._insert = sqlite_insert if self.sqlite else pg_insert
        self.retention_ms = retention_ms
        self._node_ids: dict[str, int] = {}  # written only by the writer thread
        self.committer = GroupCommitter(engine, on_rollback=self._node_ids.clear, bulk=self._write_reports)

    def submit(self, fn: Callable[[Connection], Any]) -> Any:
        """Any other write (retention): *fn(connection)* in the next commit, its result once committed."""
        return self.committer.submit(fn)

    async def report(self, env: ReportEnvelope, report_json: str, sent_ms: int | None = None) -> bool:
        """Store a report; False when its id was stored before (nothing changes then)."""
        item = _report_item(env, report_json, self._when(sent_ms, now_ms()))
        return bool(await self.committer.submit_async(item))

    async def event(self, env: EventEnvelope, body_json: str) -> bool:
        """Store an event; False when its id was stored before."""
        return bool(await self.committer.submit_async(self._event_writer(env, body_json)))

    def _when(self, sent_ms: int | None, now: int) -> int:
        """The report's own time when plausible (spooled reports keep theirs), else now."""
        if sent_ms is not None and now - self.retention_ms <= sent_ms <= now + FUTURE_SLACK_MS:
            return sent_ms
        return now

    def _node_id(self, conn: Connection, name: str, t: int) -> int:
        """The node's id, creating the node if needed (cached: nodes are never deleted)."""
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
        fresh, stored = _fresh(conn, items)
        if fresh:
            newest: dict[int, dict[str, Any]] = {}
            rows = []
            for it in fresh:
                node_id = self._node_id(conn, it.node, it.t)
                rows.append({**it.row, "node_id": node_id})
                if node_id not in newest or newest[node_id]["b_t"] <= it.t:
                    newest[node_id] = {**it.latest, "b_id": node_id}
            conn.execute(insert(reports), rows)
            conn.execute(_LATEST, list(newest.values()))
        return stored

    def _event_writer(self, env: EventEnvelope, body_json: str) -> Callable[[Connection], bool]:
        e = env.event
        t = self._when(parse_iso_ms(e.time), now_ms())
        values = {
            "ingest_id": env.id,
            "received_ms": t,
            "time": e.time,
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
            row = conn.execute(
                statement.on_conflict_do_nothing(index_elements=["ingest_id"]).returning(events.c.id)
            ).first()
            return row is not None

        return write
