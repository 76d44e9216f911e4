"""The manager's database, as the routes use it: ``Store`` reads and writes; SQLAlchemy Core,
bound parameters only.

- ``writer``: reports and events in, on one writer thread with group commit (``commit``): each
  write returns only after the commit that holds it, and writes that arrive together share one;
- ``queries``: the node list, a node's detail and history, the dashboard's cards, metric rows;
- the policies beside it: ``oomguard.manager.alerts`` (offline, alerts) and
  ``oomguard.manager.retention`` (what history is kept).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine

from oomguard.manager import alerts, retention
from oomguard.manager.models import EventEnvelope, ReportEnvelope
from oomguard.manager.store import queries
from oomguard.manager.store.queries import SORT_KEYS
from oomguard.manager.store.writer import Writer
from oomguard.manager.times import now_ms


class Store:
    """Reads open their own connection; writes go through the one writer thread."""

    def __init__(self, engine: Engine, *, default_interval_s: float = 30.0, retention_s: float = 30 * 86400) -> None:
        self.engine = engine
        self.default_interval_ms = int(default_interval_s * 1000)
        self.retention_ms = int(retention_s * 1000)
        self._writer = Writer(engine, self.retention_ms)

    # -- writes --------------------------------------------------------------------------------
    async def ingest_report_async(self, env: ReportEnvelope, report_json: str, sent_ms: int | None = None) -> bool:
        """Store a report; False when its id was stored before (nothing changes then)."""
        return await self._writer.report(env, report_json, sent_ms)

    async def ingest_event_async(self, env: EventEnvelope, body_json: str) -> bool:
        """Store an event; False when its id was stored before."""
        return await self._writer.event(env, body_json)

    def thin(self, now: int | None = None) -> dict[str, int]:
        """One retention pass (see ``oomguard.manager.retention``); the rows it removed, by kind."""
        job = retention.thin_job(now_ms() if now is None else now, self.retention_ms)
        result: dict[str, int] = self._writer.submit(job)
        return result

    # -- reads ---------------------------------------------------------------------------------
    def list_nodes(
        self, *, status: str | None = None, q: str | None = None, limit: int = 100, offset: int = 0, sort: str = "name"
    ) -> dict[str, Any]:
        with self.engine.connect() as conn:
            return queries.list_nodes(
                conn, now_ms(), self.default_interval_ms, status=status, q=q, limit=limit, offset=offset, sort=sort
            )

    def node_detail(self, name: str, *, events_limit: int = 500) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            return queries.node_detail(conn, now_ms(), self.default_interval_ms, name, events_limit)

    def alerts(self, limit: int | None = None) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            return alerts.fleet_alerts(conn, now_ms(), self.default_interval_ms, limit)

    def summary(self) -> dict[str, int]:
        with self.engine.connect() as conn:
            return queries.summary(conn, now_ms(), self.default_interval_ms)

    def metric_rows(self) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            return queries.metric_rows(conn, now_ms(), self.default_interval_ms)


__all__ = ["SORT_KEYS", "Store"]
