"""Retention: what history the manager keeps, and the thread that enforces it.

- reports younger than an hour (by receive time) are kept whole; older ones, the first of each
  node and clock hour;
- reports, events and observations older than the retention (``--retention``, 30 days) go: the
  events of OOM kills and pressure stops too (issue 37: they were kept for ever, so a node could
  grow the database without end with fake ones). Their counts stay: each node counts them as
  they are stored (``nodes.oom_kills_total``, ``nodes.pressure_stops_total``, revision 0011), and
  ``oomguard_oom_kills_total`` / ``oomguard_pressure_stops_total`` read those, so the counters
  never go down. The recommender reads only the last 14 days of observations, so a retention
  below that shortens it. What one node may add meanwhile is bounded by its quotas
  (``--max-events-per-node``, ``--max-observations-per-node``: ``web.quotas``);
- nodes silent for longer than ``--forget-after`` (7 days; ``off`` never) are archived: nothing
  from them (no report, no event, no heartbeat) since then. They leave the list, the cards, the
  alerts and /metrics; their rows stay (under the retention above) and the node comes back with
  its next report, event or heartbeat. Forgetting a node for good is ``DELETE /api/v1/nodes/NAME``.

A pass runs off the ingest path: on its own connection, never on the writer thread, in small
transactions (``nodes_per_batch`` nodes, at most ``rows_per_batch`` rows per statement), each
followed by a pause as long as the batch took (at least ``pause_s``), so ingest always gets at
least half the time; on SQLite that is the one write lock, which each batch holds briefly.
A pass looks only at the history that crossed the one-hour line since the previous pass (rows
are stamped with the receive time, so none arrive below it): the line is kept in the database
(table ``retention_state``), so a restarted or another replica does not scan it all again.

On PostgreSQL each pass holds a session advisory lock (``pg_try_advisory_lock``, released at the
end of the pass or when its connection drops): of several replicas one runs a pass at a time,
and a replica that finds the lock taken skips its turn. See
https://www.postgresql.org/docs/current/explicit-locking.html#ADVISORY-LOCKS

The pass runs every ``thin_every_s`` on a daemon thread. A pass that the database failed (down,
hung, full, locked) is one line naming the fault (logger ``oomguard.manager.retention``); any
other failure, a bug, is logged with its full traceback; either way the thread keeps going and
the next pass retries.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from sqlalchemy import (
    Connection,
    Engine,
    and_,
    delete,
    func,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import SQLAlchemyError

from oomguard.manager.alerts import node_status
from oomguard.manager.db import events, nodes, observations, reports, retention_state
from oomguard.manager.redact import first_line
from oomguard.manager.times import now_ms

HOUR_MS = 3_600_000
FULL_RESOLUTION_MS = HOUR_MS  # history younger than this is kept whole; older, one report per node and hour
LOCK_KEY = 7220452  # PostgreSQL advisory lock of the pass (the migrations' is 7220451)
KINDS = ("expired_reports", "thinned_reports", "expired_events", "expired_observations")

log = logging.getLogger(__name__)


class _Cuts(NamedTuple):
    old: int  # received before this: expired
    full: int  # received before this (and from ``lo``): thinned to one per node and hour
    lo: int  # the start of the clock hour that holds the previous pass's ``full``


def _batch(conn: Connection, ids: list[int], cuts: _Cuts, rows: int) -> dict[str, int]:
    """One transaction's deletes for the nodes *ids*: each at most *rows* rows."""
    cut_old, cut_full, lo = cuts
    mine = reports.c.node_id.in_(ids)
    old = select(reports.c.id).where(mine, reports.c.received_ms < cut_old).limit(rows)
    window = and_(mine, reports.c.received_ms >= lo, reports.c.received_ms < cut_full)
    keep = select(func.min(reports.c.id)).where(window).group_by(reports.c.node_id, reports.c.received_ms // HOUR_MS)
    extra = select(reports.c.id).where(window, reports.c.id.not_in(keep)).limit(rows)
    old_events = select(events.c.id).where(events.c.node_id.in_(ids), events.c.received_ms < cut_old)
    old_seen = observations.c.received_ms < cut_old
    old_observations = select(observations.c.id).where(observations.c.node_id.in_(ids), old_seen).limit(rows)
    return {
        "expired_reports": conn.execute(delete(reports).where(reports.c.id.in_(old))).rowcount,
        "thinned_reports": conn.execute(delete(reports).where(reports.c.id.in_(extra))).rowcount,
        "expired_events": conn.execute(delete(events).where(events.c.id.in_(old_events.limit(rows)))).rowcount,
        "expired_observations": conn.execute(
            delete(observations).where(observations.c.id.in_(old_observations))
        ).rowcount,
    }


class Retention:
    """The retention pass (``run``), one at a time per process and, on PostgreSQL, per database."""

    def __init__(
        self,
        engine: Engine,
        retention_ms: int,
        *,
        forget_after_ms: int | None = None,
        default_interval_ms: int = 30_000,
        nodes_per_batch: int = 25,
        rows_per_batch: int = 1000,
        pause_s: float = 0.005,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.engine = engine
        self.retention_ms = retention_ms
        self.default_interval_ms = default_interval_ms  # for "offline": a node is archived only then
        self.forget_after_ms = forget_after_ms  # None: nodes are never archived
        self.nodes_per_batch = nodes_per_batch
        self.rows_per_batch = rows_per_batch
        self.pause_s = pause_s
        self.sleep = sleep
        self.postgres = engine.dialect.name == "postgresql"
        self._insert = pg_insert if self.postgres else sqlite_insert
        self._mutex = threading.Lock()

    def run(self, now: int | None = None) -> dict[str, int]:
        """One pass: the rows it removed by kind, the nodes it archived, its ``batches``, and
        ``skipped`` (1: another replica's turn)."""
        now = now_ms() if now is None else now
        cut_old, cut_full = now - self.retention_ms, now - FULL_RESOLUTION_MS
        started = time.monotonic()
        with self._mutex, self.engine.connect() as conn:
            if not self._lock(conn):
                log.info("retention pass skipped: another replica holds the lock")
                return {**dict.fromkeys(KINDS, 0), "archived_nodes": 0, "batches": 0, "skipped": 1}
            try:
                below = conn.execute(
                    select(retention_state.c.value_ms).where(retention_state.c.name == "thinned_below")
                ).scalar()
                conn.rollback()
                lo = 0 if below is None else min(int(below), cut_full) // HOUR_MS * HOUR_MS
                totals = self._batches(conn, _Cuts(cut_old, cut_full, lo))
                self._mark(conn, max(cut_full, int(below or 0)))
                totals["archived_nodes"] = self._archive(conn, now)
            finally:
                self._unlock(conn)
        log.info("retention pass: %s in %.2f s", totals, time.monotonic() - started)
        return {**totals, "skipped": 0}

    def _archive(self, conn: Connection, now: int) -> int:
        """Archive the nodes silent since ``now - forget_after_ms`` that are offline by their own
        interval (an agent may announce one longer than the manager's default; a node is seen
        offline, and alerts, before it is archived). One statement; a node whose report or event
        commits meanwhile is re-checked by the database and left alone."""
        if not self.forget_after_ms:
            return 0
        cut = now - self.forget_after_ms
        silent = and_(
            nodes.c.archived_ms.is_(None),
            nodes.c.last_seen_ms < cut,
            or_(nodes.c.last_event_ms.is_(None), nodes.c.last_event_ms < cut),
            node_status(now, self.default_interval_ms) == "offline",
        )
        with conn.begin():
            archived = conn.execute(update(nodes).where(silent).values(archived_ms=now)).rowcount
        if archived:
            log.info("retention pass: archived %d node(s) silent for --forget-after", archived)
        return int(archived)

    def _mark(self, conn: Connection, thinned_below: int) -> None:
        """Remember where this pass's thinning ended, for the next pass (of any replica)."""
        upsert = self._insert(retention_state).values(name="thinned_below", value_ms=thinned_below)
        with conn.begin():
            conn.execute(upsert.on_conflict_do_update(index_elements=["name"], set_={"value_ms": thinned_below}))

    def _lock(self, conn: Connection) -> bool:
        if not self.postgres:
            return True
        got = bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": LOCK_KEY}).scalar())
        conn.commit()  # a session lock: it outlives this transaction
        return got

    def _unlock(self, conn: Connection) -> None:
        if self.postgres and not conn.invalidated:
            conn.rollback()
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": LOCK_KEY})
            conn.commit()

    def _batches(self, conn: Connection, cuts: _Cuts) -> dict[str, int]:
        ids = list(conn.execute(select(nodes.c.id).order_by(nodes.c.id)).scalars())
        conn.rollback()
        totals = {**dict.fromkeys(KINDS, 0), "batches": 0}
        for i in range(0, len(ids), self.nodes_per_batch):
            chunk = ids[i : i + self.nodes_per_batch]
            more = True
            while more:  # the chunk again while a statement hit its row limit
                t0 = time.monotonic()
                with conn.begin():
                    counts = _batch(conn, chunk, cuts, self.rows_per_batch)
                for kind, n in counts.items():
                    totals[kind] += n
                totals["batches"] += 1
                more = max(counts.values()) >= self.rows_per_batch
                self.sleep(max(self.pause_s, time.monotonic() - t0))  # ingest gets at least as long
        return totals


class RetentionThread:
    """Calls *thin* every *every_s* seconds on a daemon thread until ``stop``; failures are logged, not fatal."""

    def __init__(self, thin: Callable[[], Any], every_s: float) -> None:
        self.thin = thin
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="oomguard-retention", daemon=True)

    def start(self) -> RetentionThread:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def run_once(self) -> bool:
        """One pass; False (and logged: one line for a database fault, the traceback for a bug)
        when it failed."""
        try:
            self.thin()
        except SQLAlchemyError as exc:  # the database's fault, seen by the routes too: one line
            cause = first_line(exc)[:300]
            log.error("oomguard manager: retention pass failed (database): %s; next try in %gs", cause, self.every_s)
            return False
        except Exception:  # a bug: log it whole, retry at the next pass
            log.exception("oomguard manager: retention pass failed; next try in %gs", self.every_s)
            return False
        return True

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.run_once()


__all__ = ["FULL_RESOLUTION_MS", "LOCK_KEY", "Retention", "RetentionThread"]
