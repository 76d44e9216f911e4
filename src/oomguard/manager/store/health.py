"""Database failures, seen: each becomes a fast 503 (the route's ``DatabaseUnavailable``), is
counted by kind for /metrics, and every episode of them is logged once when it starts (with its
cause, passwords masked) and once when it ends.

An episode is per direction, reads or writes: a full disk or a read-only file stops writes while
reads go on, and a read that succeeds must not end (and so re-log) a write outage.

Kinds, from the driver's error: SQLite's result codes (https://sqlite.org/rescode.html: FULL,
READONLY, BUSY/LOCKED, CANTOPEN/IOERR) and PostgreSQL's SQLSTATE codes (PostgreSQL docs,
Appendix A: 53100 disk_full, 25006 read_only_sql_transaction, 57014 query_canceled (the
statement_timeout), 55P03 lock_not_available, class 08 and 57P0x: connection lost or refused).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

from oomguard.manager.redact import Redactor, first_line

KINDS = ("disk-full", "read-only", "timeout", "locked", "unavailable", "other")
log = logging.getLogger("oomguard.manager.database")

_SQLSTATE = {"53100": "disk-full", "25006": "read-only", "57014": "timeout", "55P03": "locked"}
_TEXT = (  # lower-case message fragments, first match wins
    ("database or disk is full", "disk-full"),
    ("no space left", "disk-full"),
    ("readonly database", "read-only"),
    ("read-only", "read-only"),
    ("database is locked", "locked"),
    ("database table is locked", "locked"),
    ("statement timeout", "timeout"),
    ("timed out", "timeout"),
    ("timeout", "timeout"),
)


class DatabaseUnavailable(Exception):
    """A route's database work failed for a reason that is not the client's: answered 503."""

    def __init__(self, kind: str, cause: str) -> None:
        super().__init__(f"{kind}: {cause}")
        self.kind = kind
        self.cause = cause


def classify(exc: BaseException) -> str:
    """The kind of a database failure (one of ``KINDS``)."""
    from sqlalchemy.exc import DBAPIError
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    if isinstance(exc, PoolTimeout | TimeoutError | asyncio.TimeoutError):
        return "timeout"
    orig: Any = exc.orig if isinstance(exc, DBAPIError) else exc
    state = str(getattr(orig, "sqlstate", "") or "")
    if state in _SQLSTATE:
        return _SQLSTATE[state]
    if state.startswith("08") or state.startswith("57P"):
        return "unavailable"
    text = str(orig).lower()
    for fragment, kind in _TEXT:
        if fragment in text:
            return kind
    if isinstance(exc, DBAPIError) and type(exc).__name__ in ("OperationalError", "InterfaceError"):
        return "unavailable"
    return "other"


class _Episode:
    __slots__ = ("kind", "last", "refused", "started")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.started = self.last = time.monotonic()
        self.refused = 0


class DbHealth:
    """Counts failures by kind and logs each episode's start (with its cause) and end, once."""

    def __init__(self, redactor: Redactor | None = None) -> None:
        self.redact = redactor or Redactor()
        self.errors = dict.fromkeys(KINDS, 0)
        self._open: dict[str, _Episode] = {}
        self._lock = threading.Lock()

    def failure(self, direction: str, exc: BaseException) -> DatabaseUnavailable:
        """Count *exc*; log it when it starts an episode (or changes its kind). Returns what to raise."""
        kind = classify(exc)
        cause = self.redact(first_line(exc))[:300]
        with self._lock:
            self.errors[kind] += 1
            episode = self._open.get(direction)
            fresh = episode is None or episode.kind != kind
            if fresh:
                episode = self._open[direction] = _Episode(kind)
            assert episode is not None
            episode.refused += 1
            episode.last = time.monotonic()
        if fresh:
            log.error(
                "oomguard manager: database %s failing (%s): %s; answering 503 until they work again",
                direction,
                kind,
                cause,
            )
        return DatabaseUnavailable(kind, cause)

    def success(self, direction: str) -> None:
        """A database read or write worked: end that direction's episode, if one is open."""
        if direction not in self._open:
            return
        with self._lock:
            episode = self._open.pop(direction, None)
        if episode is not None:
            log.warning(
                "oomguard manager: database %s work again after %.1fs (%s; %d request(s) answered 503)",
                direction,
                time.monotonic() - episode.started,
                episode.kind,
                episode.refused,
            )

    def failing(self, within_s: float = 60.0) -> dict[str, str]:
        """The open episodes whose last failure was within *within_s*: direction -> kind. An older
        one is left out, so a replica taken out of rotation (/healthz 503) comes back to be tried."""
        now = time.monotonic()
        with self._lock:
            return {d: e.kind for d, e in self._open.items() if now - e.last <= within_s}
