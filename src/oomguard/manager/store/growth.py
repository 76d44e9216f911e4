"""How fast the fleet grows: what the new-node cap (``web.credentials.NewNodes``) reads.

One connection, two small reads of the ``nodes`` table: whether a node exists, and, when it does
not, how many nodes were first seen since a time and the earliest of those (when the cap lifts).
Counted from the shared table, so every replica of a PostgreSQL deployment sees the same count.
"""

from __future__ import annotations

from sqlalchemy import Engine, func, select

from oomguard.manager.db import nodes


def growth(engine: Engine, name: str, since_ms: int, count: bool = True) -> tuple[bool, int, int | None]:
    """(whether *name* exists; when it does not and *count*, the nodes first seen at or after
    *since_ms* and the earliest such first sighting (None: none); else 0 and None)."""
    with engine.connect() as conn:
        if conn.execute(select(nodes.c.id).where(nodes.c.name == name)).first() is not None:
            return True, 0, None
        if not count:
            return False, 0, None
        count, oldest = conn.execute(
            select(func.count(), func.min(nodes.c.first_seen_ms)).where(nodes.c.first_seen_ms >= since_ms)
        ).one()
    return False, int(count), None if oldest is None else int(oldest)
