"""Alembic environment: run the revisions against the URL given in the config."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool, text

url = context.config.get_main_option("sqlalchemy.url")
assert url is not None
engine = create_engine(url, poolclass=pool.NullPool)
with engine.connect() as connection:
    postgres = connection.dialect.name == "postgresql"
    if postgres:
        # Managers that start together (replicas) migrate one after another; the later ones then
        # find nothing to do. A session lock, released below or when the connection closes.
        connection.execute(text("SELECT pg_advisory_lock(7220451)"))
        connection.commit()
    context.configure(connection=connection, render_as_batch=url.startswith("sqlite"))
    with context.begin_transaction():
        context.run_migrations()
    if postgres:
        connection.execute(text("SELECT pg_advisory_unlock(7220451)"))
        connection.commit()
engine.dispose()
