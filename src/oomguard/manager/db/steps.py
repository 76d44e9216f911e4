"""Migrations as a step of their own (issue 39, item 3): ``oomguard manager migrate`` applies the
revisions the database is behind, one line each; ``--check`` says whether it is behind without
changing it; the server refuses a database *ahead* of it (a revision this manager does not carry:
a newer manager migrated it, and this one would misread its tables).

Alembic keeps the database's revision in ``alembic_version`` (``MigrationContext.get_current_revision``);
the revisions this manager carries are its ``migrations/versions`` (``ScriptDirectory``): Alembic,
"Running Migrations" and "The Migration Environment"
(https://alembic.sqlalchemy.org/en/latest/tutorial.html).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from oomguard.manager.db.engine import alembic_config, make_engine


@dataclass(frozen=True)
class State:
    """The database's revision (None: no schema yet), this manager's head, and the revisions to
    apply, oldest first (``ahead``: the database's revision is not one this manager carries)."""

    current: str | None
    head: str
    pending: tuple[str, ...]
    ahead: bool


def _script() -> Any:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config("sqlite://"))


def state(url: str) -> State:
    """Where the database at *url* stands against this manager's migrations."""
    from alembic.runtime.migration import MigrationContext

    script = _script()
    head = str(script.get_current_head())
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            current = MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
    known = {r.revision for r in script.walk_revisions()}
    if current is not None and current not in known:
        return State(current, head, (), True)
    pending = [r.revision for r in script.iterate_revisions(head, current or "base")]
    return State(current, head, tuple(reversed(pending)), False)


def summary(revision: str) -> str:
    """The first line of *revision*'s docstring: what it changes."""
    doc = (_script().get_revision(revision).doc or "").strip()
    return doc.splitlines()[0] if doc else ""


def ahead_message(found: State) -> str:
    return (
        f"manager: the database is at revision {found.current}, which this manager (head {found.head}) does not "
        "carry: a newer manager migrated it. Run that manager, or restore a backup taken before the upgrade "
        "(docs/operations.md, Upgrades)"
    )


def upgrade(url: str, say: Callable[[str], None]) -> State:
    """Apply the revisions *url*'s database is behind, one at a time, saying each (*say*); the state
    before. Refuses (``RuntimeError``, ``ahead_message``) a database ahead of this manager."""
    from alembic import command

    found = state(url)
    if found.ahead:
        raise RuntimeError(ahead_message(found))
    for revision in found.pending:
        command.upgrade(alembic_config(url), revision)
        say(f"oomguard manager: applied revision {revision}: {summary(revision)}")
    return found
