"""Revoked nodes (issue 39, item 7; ``db.revoked_nodes``): each replica reads the list again every
second (``web.deps.Revoked``) and refuses a revoked node's writes and its token's reads, so a
revocation made on one replica (or by ``oomguard manager revoke`` on the database) holds on every
replica within a second."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, delete, select

from oomguard.manager.db import revoked_nodes
from oomguard.manager.times import iso_ms


def listed(conn: Connection) -> list[dict[str, Any]]:
    """Every revoked node, by name."""
    return [_shown(r) for r in conn.execute(select(revoked_nodes).order_by(revoked_nodes.c.name))]


def revoke(conn: Connection, node: str, now: int, reason: str | None) -> bool:
    """Revoke *node* (its reason kept); False when it was revoked already (the first time stays)."""
    if conn.execute(select(revoked_nodes.c.name).where(revoked_nodes.c.name == node)).first() is not None:
        return False
    conn.execute(revoked_nodes.insert().values(name=node, revoked_ms=now, reason=reason))
    return True


def unrevoke(conn: Connection, node: str) -> bool:
    """Take *node* off the list; False when it was not on it."""
    return bool(conn.execute(delete(revoked_nodes).where(revoked_nodes.c.name == node)).rowcount)


def _shown(row: Any) -> dict[str, Any]:
    return {"node": row.name, "revoked": iso_ms(int(row.revoked_ms)), "reason": row.reason}
