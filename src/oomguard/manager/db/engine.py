"""Engines for SQLite and PostgreSQL, and migrations (Alembic): the revisions in ``migrations/``
create and upgrade the tables (``tables``), so an upgrade keeps the data.
"""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine


def normalize_url(url: str) -> str:
    """``postgresql://`` means psycopg 3 here; SQLite and explicit drivers pass through."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def make_engine(url: str, *, timeout_s: float = 5.0) -> Engine:
    """An engine whose waits are bounded by *timeout_s*, so a stuck database becomes a fast 503.

    - SQLite: the busy timeout (``PRAGMA busy_timeout``, https://sqlite.org/pragma.html#pragma_busy_timeout);
      a connection that SQLite opened read-only (the file was not writable then) is dropped on its
      first SQLITE_READONLY error, so the next write opens the file again (``_reopen_read_only``).
    - PostgreSQL: libpq's ``connect_timeout`` (seconds, at least 2: PostgreSQL docs, "Parameter Key
      Words"), ``statement_timeout`` and ``lock_timeout`` for every statement (docs, "Client Connection
      Defaults"), and SQLAlchemy's ``pool_timeout`` for a free connection.
    """
    url = normalize_url(url)
    ms = max(int(timeout_s * 1000), 1)
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": timeout_s, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")  # a 2xx means the report survives a crash
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute(f"PRAGMA busy_timeout={ms}")
            cur.close()

        event.listen(engine, "handle_error", _reopen_read_only)
        return engine
    connect_args = {
        "connect_timeout": max(2, round(timeout_s)),
        "options": f"-c statement_timeout={ms} -c lock_timeout={ms}",
    }
    return create_engine(
        url, pool_size=10, max_overflow=20, pool_pre_ping=True, pool_timeout=timeout_s, connect_args=connect_args
    )


def _reopen_read_only(context: Any) -> None:
    """SQLITE_READONLY (https://sqlite.org/rescode.html#readonly): treat it as a lost connection,
    which makes SQLAlchemy drop it and the pool's others; the next use opens the file anew and
    writes once the file is writable again (a handle opened read-only stays read-only)."""
    orig = getattr(context, "original_exception", None)
    if orig is not None and "readonly database" in str(orig).lower():
        context.is_disconnect = True


def alembic_config(url: str) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", os.path.join(os.path.dirname(__file__), "migrations"))
    cfg.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return cfg


def migrate(url: str, revision: str = "head") -> None:
    """Create or upgrade the schema to *revision* (idempotent)."""
    from alembic import command

    command.upgrade(alembic_config(url), revision)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
