"""The database: its tables (``tables``), engines and migrations (``engine``; the Alembic revisions
are in ``migrations/``). Reads and writes on it are the store's (``oomguard.manager.store``)."""

from __future__ import annotations

from oomguard.manager.db.engine import (
    alembic_config,
    current_revision,
    fleet_read,
    head_revision,
    make_engine,
    migrate,
    normalize_url,
)
from oomguard.manager.db.tables import (
    events,
    latest_reports,
    metadata,
    node_labels,
    nodes,
    observations,
    reports,
    retention_state,
    revoked_nodes,
)

__all__ = [
    "alembic_config",
    "current_revision",
    "events",
    "fleet_read",
    "head_revision",
    "latest_reports",
    "make_engine",
    "metadata",
    "migrate",
    "node_labels",
    "nodes",
    "normalize_url",
    "observations",
    "reports",
    "retention_state",
    "revoked_nodes",
]
