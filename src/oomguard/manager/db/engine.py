"""Engines for SQLite and PostgreSQL, and migrations (Alembic): the revisions in ``migrations/``
create and upgrade the tables (``tables``), so an upgrade keeps the data.
"""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import Connection, create_engine, event, text
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


# The planner settings of a read over the whole fleet on PostgreSQL, for its transaction alone
# (``SET LOCAL``: https://www.postgresql.org/docs/current/sql-set.html). Such a read joins every
# node to its exits of the last day (``alerts.recent_exits``), which the planner estimates from
# the events' statistics; where those lag the table (never analyzed yet, an OOM storm newer than
# the last ANALYZE) it estimated 1 row for 10,000 and chose a nested loop over them: 66 s for the
# first page of 100,000 nodes where the hash join it chose with the setting below took 0.49 s
# (BENCHMARKS.md). ``enable_nestloop = off`` "discourages the planner from using one if there are
# other methods available" (https://www.postgresql.org/docs/current/runtime-config-query.html
# #GUC-ENABLE-NESTLOOP); a single node's reads (its page, its history) keep it. JIT compilation
# took 90-136 ms of each such statement, which runs in 0.1-0.5 s: "for short queries the added
# overhead of performing JIT compilation will often be higher than the time it can save"
# (https://www.postgresql.org/docs/current/jit-decision.html).
FLEET_READ_SETTINGS = ("enable_nestloop = off", "jit = off")


def fleet_read(conn: Connection) -> Connection:
    """*conn*, its transaction begun with ``FLEET_READ_SETTINGS`` on PostgreSQL (SQLite has
    neither setting: nothing to do)."""
    if conn.dialect.name == "postgresql":
        for setting in FLEET_READ_SETTINGS:
            conn.execute(text(f"SET LOCAL {setting}"))
    return conn


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


def head_revision() -> str:
    """The newest revision of the migrations this manager carries."""
    from alembic.script import ScriptDirectory

    return str(ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head())


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
