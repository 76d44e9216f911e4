"""Reads and writes of the manager's database. SQLAlchemy Core, bound parameters only.

Writes go through one writer thread with group commit (see GroupCommitter): each returns only
after the commit that holds it, and writes that arrive together share one commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, and_, bindparam, case, delete, func, insert, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from oomguard.manager.db import events, nodes, reports
from oomguard.manager.models import EventEnvelope, ReportEnvelope
from oomguard.units import format_size

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
FULL_RESOLUTION_MS = HOUR_MS  # history younger than this is kept whole; older, one report per node and hour
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


def now_ms() -> int:
    return int(time.time() * 1000)


def iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def parse_iso_ms(text: str | None) -> int | None:
    if not text:
        return None
    try:
        return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)
    except (ValueError, OverflowError, OSError):
        return None


class _ReportItem:
    """A report waiting for the writer: the history row and the node's new latest values."""

    __slots__ = ("latest", "node", "row", "t")

    def __init__(self, node: str, t: int, row: dict[str, Any], latest: dict[str, Any]) -> None:
        self.node = node
        self.t = t
        self.row = row
        self.latest = latest


class _Job:
    __slots__ = ("done", "error", "fn", "future", "loop", "result")

    def __init__(self, fn: Callable[[Any], Any], loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.fn = fn
        self.loop = loop
        self.future: asyncio.Future[Any] | None = loop.create_future() if loop is not None else None
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None

    def finish(self) -> None:
        if self.loop is None:
            self.done.set()
            return
        with contextlib.suppress(RuntimeError):  # the event loop is gone: nobody waits
            self.loop.call_soon_threadsafe(self._settle)

    def _settle(self) -> None:
        assert self.future is not None
        if self.future.done():
            return
        if self.error is not None:
            self.future.set_exception(self.error)
        else:
            self.future.set_result(self.result)


class GroupCommitter:
    """One writer thread; the writes that queue up while a commit runs share the next commit.

    Each caller still returns only after the transaction holding its write is committed, so a
    2xx always means durable; under load many writes share one fsync. If a batch fails, its
    writes are retried one transaction each, so one bad write never sinks the others.
    """

    def __init__(
        self,
        engine: Engine,
        max_batch: int = 500,
        on_rollback: Callable[[], None] = lambda: None,
        bulk: Callable[[Any, list[Any]], list[Any]] | None = None,
    ) -> None:
        self.engine = engine
        self.max_batch = max_batch
        self.on_rollback = on_rollback
        self.bulk = bulk  # writes jobs whose payload is not callable, all in one go
        self._queue: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="oomguard-writer", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[Any], Any]) -> Any:
        """Run *fn(connection)* in the next commit; return its result once committed."""
        job = _Job(fn)
        self._queue.put(job)
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result

    async def submit_async(self, fn: Callable[[Any], Any]) -> Any:
        """``submit`` for the event loop: no thread waits while the commit runs."""
        job = _Job(fn, asyncio.get_running_loop())
        self._queue.put(job)
        assert job.future is not None
        return await job.future

    def _loop(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < self.max_batch:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self._run(batch)

    def _apply(self, conn: Any, batch: list[_Job]) -> list[Any]:
        bulk_jobs = [job for job in batch if not callable(job.fn)]
        results: dict[int, Any] = {}
        if bulk_jobs:
            assert self.bulk is not None
            for job, result in zip(bulk_jobs, self.bulk(conn, [job.fn for job in bulk_jobs]), strict=True):
                results[id(job)] = result
        return [results[id(job)] if id(job) in results else job.fn(conn) for job in batch]

    def _run(self, batch: list[_Job]) -> None:
        try:
            with self.engine.begin() as conn:
                results = self._apply(conn, batch)
            for job, result in zip(batch, results, strict=True):
                job.result = result
        except Exception:  # one bad write: retry each alone, so the others still commit
            self.on_rollback()
            for job in batch:
                try:
                    with self.engine.begin() as conn:
                        job.result = self._apply(conn, [job])[0]
                except Exception as exc:
                    job.error = exc
        for job in batch:
            job.finish()


class Store:
    def __init__(self, engine: Engine, *, default_interval_s: float = 30.0, retention_s: float = 30 * 86400) -> None:
        self.engine = engine
        self.sqlite = engine.dialect.name == "sqlite"
        self._insert = sqlite_insert if self.sqlite else pg_insert
        self._node_ids: dict[str, int] = {}  # written only by the writer thread
        self._writer = GroupCommitter(engine, on_rollback=self._node_ids.clear, bulk=self._write_reports)
        self.default_interval_ms = int(default_interval_s * 1000)
        self.retention_ms = int(retention_s * 1000)

    # -- writes -------------------------------------------------------------------------------
    def _node_id(self, conn: Any, name: str, t: int) -> int:
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

    def _when(self, sent_ms: int | None, now: int) -> int:
        """The report's own time when plausible (spooled reports keep theirs), else now."""
        if sent_ms is not None and now - self.retention_ms <= sent_ms <= now + 300_000:
            return sent_ms
        return now

    async def ingest_report_async(self, env: ReportEnvelope, report_json: str, sent_ms: int | None = None) -> bool:
        """Store a report; False when its id was stored before (nothing changes then)."""
        return bool(await self._writer.submit_async(self._report_writer(env, report_json, sent_ms)))  # type: ignore[arg-type]

    def _report_writer(self, env: ReportEnvelope, report_json: str, sent_ms: int | None) -> _ReportItem:
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
        t = self._when(sent_ms, now_ms())
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

    _LATEST = (
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

    def _write_reports(self, conn: Any, items: list[_ReportItem]) -> list[bool]:
        """Store a batch of reports with a handful of statements; True for each stored, False for a duplicate."""
        ids = [it.row["ingest_id"] for it in items]
        seen = set(conn.execute(select(reports.c.ingest_id).where(reports.c.ingest_id.in_(ids))).scalars())
        fresh: list[_ReportItem] = []
        results = []
        for it in items:
            dup = it.row["ingest_id"] in seen
            results.append(not dup)
            if not dup:
                seen.add(it.row["ingest_id"])
                fresh.append(it)
        if fresh:
            newest: dict[int, dict[str, Any]] = {}
            rows = []
            for it in fresh:
                node_id = self._node_id(conn, it.node, it.t)
                rows.append({**it.row, "node_id": node_id})
                if node_id not in newest or newest[node_id]["b_t"] <= it.t:
                    newest[node_id] = {**it.latest, "b_id": node_id}
            conn.execute(insert(reports), rows)
            conn.execute(self._LATEST, list(newest.values()))
        return results

    async def ingest_event_async(self, env: EventEnvelope, body_json: str) -> bool:
        return bool(await self._writer.submit_async(self._event_writer(env, body_json)))

    def _event_writer(self, env: EventEnvelope, body_json: str) -> Callable[[Any], bool]:
        now = now_ms()
        e = env.event
        t = self._when(parse_iso_ms(e.time), now)

        def write(conn: Any) -> bool:
            node_id = self._node_id(conn, env.node, t)
            row = conn.execute(
                self._insert(events)
                .values(
                    node_id=node_id,
                    ingest_id=env.id,
                    received_ms=t,
                    time=e.time,
                    kind=e.event,
                    reason=e.reason,
                    exit_code=e.exit_code,
                    signal=e.signal,
                    budget_bytes=e.budget_bytes,
                    concurrency=e.concurrency,
                    peak_bytes=e.peak_bytes,
                    duration_s=e.duration_s,
                    body=body_json,
                )
                .on_conflict_do_nothing(index_elements=["ingest_id"])
                .returning(events.c.id)
            ).first()
            return row is not None

        return write

    def thin(self, now: int | None = None) -> dict[str, int]:
        """Retention: drop history older than the retention, keep one report per node and hour
        beyond the first hour, drop old events except OOM kills (kept for ever)."""
        now = now_ms() if now is None else now
        cut_old, cut_full = now - self.retention_ms, now - FULL_RESOLUTION_MS

        def write(conn: Any) -> dict[str, int]:
            gone = conn.execute(delete(reports).where(reports.c.received_ms < cut_old)).rowcount
            keep = (
                select(func.min(reports.c.id))
                .where(reports.c.received_ms < cut_full)
                .group_by(reports.c.node_id, reports.c.received_ms // HOUR_MS)
            )
            thinned = conn.execute(
                delete(reports).where(and_(reports.c.received_ms < cut_full, reports.c.id.not_in(keep)))
            ).rowcount
            ev = conn.execute(
                delete(events).where(
                    and_(events.c.received_ms < cut_old, or_(events.c.reason.is_(None), events.c.reason != "oom-kill"))
                )
            ).rowcount
            return {"expired_reports": gone, "thinned_reports": thinned, "expired_events": ev}

        result: dict[str, int] = self._writer.submit(write)
        return result

    # -- reads --------------------------------------------------------------------------------
    def _status(self, now: int) -> Any:
        interval = func.coalesce(nodes.c.interval_ms, self.default_interval_ms)
        return case((now - nodes.c.last_seen_ms > 3 * interval, "offline"), else_="online")

    def _oom_24h(self, now: int) -> Any:
        return (
            select(func.count(events.c.id))
            .where(
                and_(events.c.node_id == nodes.c.id, events.c.reason == "oom-kill", events.c.received_ms > now - DAY_MS)
            )
            .scalar_subquery()
        )

    def list_nodes(
        self, *, status: str | None = None, q: str | None = None, limit: int = 100, offset: int = 0, sort: str = "name"
    ) -> dict[str, Any]:
        now = now_ms()
        st = self._status(now).label("status")
        # OOM kills per node in the last day, counted once and joined (not a subquery per row).
        counts = (
            select(events.c.node_id, func.count(events.c.id).label("n"))
            .where(and_(events.c.reason == "oom-kill", events.c.received_ms > now - DAY_MS))
            .group_by(events.c.node_id)
            .subquery()
        )
        oom = func.coalesce(counts.c.n, 0).label("oom_kills_24h")
        conds = []
        if status:
            conds.append(self._status(now) == status)
        if q:
            escaped = q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            conds.append(nodes.c.name.like(f"%{escaped}%", escape="\\"))
        where = and_(*conds) if conds else None
        total_q = select(func.count(nodes.c.id))
        key = sort.lstrip("-")
        special: dict[str, Any] = {"status": st, "oom_kills_24h": oom, "last_seen": nodes.c.last_seen_ms}
        column = special[key] if key in special else nodes.c[key]
        order = [column.desc() if sort.startswith("-") else column.asc(), nodes.c.name.asc()]
        summary_columns = [c for c in nodes.c if c.name != "latest_report"]  # not the 2 KB report per row
        rows_q = (
            select(*summary_columns, st, oom)
            .select_from(nodes.outerjoin(counts, counts.c.node_id == nodes.c.id))
            .order_by(*order)
            .limit(limit)
            .offset(offset)
        )
        if where is not None:
            total_q, rows_q = total_q.where(where), rows_q.where(where)
        with self.engine.connect() as conn:
            total = int(conn.execute(total_q).scalar_one())
            rows = conn.execute(rows_q).mappings().all()
        return {"nodes": [self._summary(r) for r in rows], "total": total, "limit": limit, "offset": offset}

    @staticmethod
    def _summary(r: Any) -> dict[str, Any]:
        return {
            "name": r["name"],
            "status": r["status"],
            "last_seen": iso(r["last_seen_ms"]),
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
        }

    def node_detail(self, name: str, *, events_limit: int = 500) -> dict[str, Any] | None:
        now = now_ms()
        with self.engine.connect() as conn:
            row = (
                conn.execute(
                    select(nodes, self._status(now).label("status"), self._oom_24h(now).label("oom_kills_24h")).where(
                        nodes.c.name == name
                    )
                )
                .mappings()
                .first()
            )
            if row is None:
                return None
            history = conn.execute(
                select(
                    reports.c.received_ms,
                    reports.c.effective_bytes,
                    reports.c.budget_bytes,
                    reports.c.usage_bytes,
                    reports.c.working_set_bytes,
                )
                .where(reports.c.node_id == row["id"])
                .order_by(reports.c.received_ms)
            ).all()
            evs = conn.execute(
                select(events.c.received_ms, events.c.body)
                .where(events.c.node_id == row["id"])
                .order_by(events.c.received_ms.desc(), events.c.id.desc())
                .limit(events_limit)
            ).all()
        out = self._summary(row)
        out["latest"] = json.loads(row["latest_report"]) if row["latest_report"] else None
        out["history"] = [
            {
                "time": iso(h[0]),
                "effective_bytes": h[1],
                "budget_bytes": h[2],
                "usage_bytes": h[3],
                "working_set_bytes": h[4],
            }
            for h in history
        ]
        out["events"] = [{**json.loads(e[1]), "received": iso(e[0])} for e in evs]
        return out

    def alerts(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Alerts of every node; the database finds the nodes that have one (cheap at 10,000 nodes)."""
        now = now_ms()
        status = self._status(now)
        recent_oom = (
            select(events.c.node_id)
            .where(and_(events.c.reason == "oom-kill", events.c.received_ms > now - HOUR_MS))
            .distinct()
        )
        query = (
            select(
                nodes.c.id,
                nodes.c.name,
                nodes.c.effective_bytes,
                nodes.c.host_total_bytes,
                nodes.c.budget_bytes,
                nodes.c.warnings,
                nodes.c.last_seen_ms,
                status.label("status"),
            )
            .where(
                or_(
                    status == "offline",
                    nodes.c.budget_bytes > nodes.c.effective_bytes,
                    nodes.c.warnings.like('%"memlock-too-low"%'),
                    nodes.c.id.in_(recent_oom),
                )
            )
            .order_by(nodes.c.name)
        )
        out: list[dict[str, Any]] = []
        with self.engine.connect() as conn:
            rows = conn.execute(query).mappings().all()
            ooms: dict[int, int] = {
                int(node_id): int(count)
                for node_id, count in conn.execute(
                    select(events.c.node_id, func.count(events.c.id))
                    .where(and_(events.c.reason == "oom-kill", events.c.received_ms > now - HOUR_MS))
                    .group_by(events.c.node_id)
                ).all()
            }
        for r in rows:
            out.extend(node_alerts(r, ooms.get(r["id"], 0)))
            if limit is not None and len(out) >= limit:
                return out[:limit]
        return out

    def summary(self) -> dict[str, int]:
        """The dashboard's cards: nodes online and offline, their total effective memory, OOM kills today."""
        now = now_ms()
        status = self._status(now)
        out = {"online": 0, "offline": 0, "effective_bytes": 0}
        with self.engine.connect() as conn:
            for st, count, total in conn.execute(
                select(status, func.count(nodes.c.id), func.coalesce(func.sum(nodes.c.effective_bytes), 0)).group_by(
                    status
                )
            ).all():
                out[st] = int(count)
                out["effective_bytes"] += int(total)
            out["oom_kills_24h"] = int(
                conn.execute(
                    select(func.count(events.c.id)).where(
                        and_(events.c.reason == "oom-kill", events.c.received_ms > now - DAY_MS)
                    )
                ).scalar_one()
            )
        return out

    def metric_rows(self) -> list[dict[str, Any]]:
        now = now_ms()
        total_ooms = (
            select(func.count(events.c.id))
            .where(and_(events.c.node_id == nodes.c.id, events.c.reason == "oom-kill"))
            .scalar_subquery()
        )
        with self.engine.connect() as conn:
            return [
                dict(r)
                for r in conn.execute(
                    select(
                        nodes.c.name,
                        nodes.c.effective_bytes,
                        nodes.c.host_total_bytes,
                        nodes.c.budget_bytes,
                        nodes.c.memlock_soft_bytes,
                        nodes.c.last_seen_ms,
                        self._status(now).label("status"),
                        total_ooms.label("oom_kills_total"),
                    ).order_by(nodes.c.name)
                )
                .mappings()
                .all()
            ]

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(select(1))


def node_alerts(r: Any, ooms_last_hour: int) -> list[dict[str, Any]]:
    """The alerts of one node row (latest report columns, status)."""
    name, eff, host, budget = r["name"], r["effective_bytes"], r["host_total_bytes"], r["budget_bytes"]
    out = []

    def alert(kind: str, severity: str, message: str) -> None:
        out.append({"node": name, "kind": kind, "severity": severity, "message": message})

    if r["status"] == "offline":
        alert("offline", "warning", f"no report since {iso(r['last_seen_ms'])}")
    if budget is not None and eff is not None and budget > eff:
        if host is not None and eff < 0.8 * host and budget >= 0.5 * host:  # in the host's ballpark
            alert(
                "budget-from-host",
                "critical",
                f"budget {format_size(budget)} looks sized from the host's RAM ({format_size(host)}), "
                f"far above the container limit ({format_size(eff)}): the outage oomguard exists for",
            )
        else:
            alert(
                "budget-above-limit",
                "critical",
                f"budget {format_size(budget)} is above the effective limit {format_size(eff)}",
            )
    warnings = json.loads(r["warnings"]) if r["warnings"] else []
    if "memlock-too-low" in warnings:
        alert("memlock-below-pinned-need", "critical", "RLIMIT_MEMLOCK is below the plan's pinned need")
    if ooms_last_hour:
        alert("oom-kills", "critical", f"{ooms_last_hour} OOM kill(s) in the last hour")
    return out


__all__ = ["SORT_KEYS", "Store", "node_alerts"]
