"""Retention: what history the manager keeps, and the thread that enforces it.

- reports younger than an hour are kept whole; older ones, the first of each node and clock hour;
- reports and events older than the retention (``--retention``, 30 days) go, except OOM kills,
  which are kept for ever (they are the history oomguard exists to show).

The pass runs every ``thin_every_s`` on a daemon thread. A failed pass is logged with its full
traceback (logger ``oomguard.manager.retention``; stderr when logging is not configured) and the
thread keeps going: the next pass retries.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, and_, delete, func, or_, select

from oomguard.manager.db import events, reports

HOUR_MS = 3_600_000
FULL_RESOLUTION_MS = HOUR_MS  # history younger than this is kept whole; older, one report per node and hour

log = logging.getLogger(__name__)


def thin_job(now: int, retention_ms: int) -> Callable[[Connection], dict[str, int]]:
    """The retention pass as one write (for the store's writer): it returns the rows it removed."""
    cut_old, cut_full = now - retention_ms, now - FULL_RESOLUTION_MS

    def write(conn: Connection) -> dict[str, int]:
        gone = conn.execute(delete(reports).where(reports.c.received_ms < cut_old)).rowcount
        keep = (
            select(func.min(reports.c.id))
            .where(reports.c.received_ms < cut_full)
            .group_by(reports.c.node_id, reports.c.received_ms // HOUR_MS)
        )
        thinned = conn.execute(
            delete(reports).where(and_(reports.c.received_ms < cut_full, reports.c.id.not_in(keep)))
        ).rowcount
        not_oom = or_(events.c.reason.is_(None), events.c.reason != "oom-kill")
        ev = conn.execute(delete(events).where(and_(events.c.received_ms < cut_old, not_oom))).rowcount
        return {"expired_reports": gone, "thinned_reports": thinned, "expired_events": ev}

    return write


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
        """One pass; False (and the traceback logged) when it failed."""
        try:
            self.thin()
        except Exception:  # a bug or a database outage: log it whole, retry at the next pass
            log.exception("oomguard manager: retention pass failed; next try in %gs", self.every_s)
            return False
        return True

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.run_once()


__all__ = ["FULL_RESOLUTION_MS", "RetentionThread", "thin_job"]
