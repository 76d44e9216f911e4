"""Revoked nodes (issue 39, item 7; ``db.revoked_nodes``): read on every request that writes a
node or reads with a node's token, so a revocation made on one replica (or by ``oomguard manager
revoke`` on the database) holds on every replica at once. One primary-key read a request."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, delete, select

from oomguard.manager.db import revoked_nodes
from oomguard.manager.times import iso_ms


def revoked(conn: Connection, node: str) -> dict[str, Any] | None:
    """``{node, revoked, reason}`` when *node* is revoked, else None."""
    row = conn.execute(select(revoked_nodes).where(revoked_nodes.c.name == node)).first()
    return None if row is None else _shown(row)


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
