"""The overview's numbers and the node lifecycle.

- ``nodes.usage_bytes``, ``nodes.working_set_bytes``: the latest report's (the fleet table,
  /metrics); nodes that reported before the upgrade get them from their latest stored report;
- ``nodes.archived_ms``: when the retention pass archived the node (``--forget-after``);
- ``nodes.last_event_ms``, ``nodes.heartbeat_interval_ms``: the supervisor's last sign of life
  (its latest event or heartbeat) and the heartbeat interval it announced, which judge the nodes
  known only from ``run`` events;
- ``latest_reports``: each node's latest whole report, moved out of ``nodes.latest_report``
  (left NULL). A node row with its 2-5 KB report made every scan of the nodes (the cards, the
  risk sort, the alerts) read it: 10 to 15 times slower at 10,000 nodes on SQLite. ``warnings``
  (a JSON list, ``[]`` when none) now says whether a node ever reported: set for every node
  whose report moves. On SQLite the table is copied once, so that its pages are dense again;
- ``ix_nodes_archived``: the list counts the nodes not archived from the index.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"

NEW_COLUMNS = ("usage_bytes", "working_set_bytes", "archived_ms", "last_event_ms", "heartbeat_interval_ms")


def upgrade() -> None:
    # Nullable, no default: an instant catalog change on PostgreSQL, ADD COLUMN on SQLite.
    with op.batch_alter_table("nodes") as batch:
        for name in NEW_COLUMNS:
            batch.add_column(sa.Column(name, sa.BigInteger))
    for column in ("usage_bytes", "working_set_bytes"):  # from the latest stored report (one index seek per node)
        op.execute(
            f"UPDATE nodes SET {column} = (SELECT r.{column} FROM reports r WHERE r.node_id = nodes.id "
            "ORDER BY r.received_ms DESC, r.id DESC LIMIT 1)"
        )
    op.create_table(
        "latest_reports",
        sa.Column("node_id", sa.Integer, sa.ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("received_ms", sa.BigInteger, nullable=False),
        sa.Column("report", sa.Text, nullable=False),
    )
    op.execute("UPDATE nodes SET warnings = '[]' WHERE warnings IS NULL AND latest_report IS NOT NULL")
    op.execute(
        "INSERT INTO latest_reports (node_id, received_ms, report) "
        "SELECT id, last_seen_ms, latest_report FROM nodes WHERE latest_report IS NOT NULL"
    )
    op.execute("UPDATE nodes SET latest_report = NULL WHERE latest_report IS NOT NULL")
    _compact_sqlite()
    op.create_index("ix_nodes_archived", "nodes", ["archived_ms"])  # the list counts the nodes not archived


def _compact_sqlite() -> None:
    """SQLite keeps the emptied rows' pages sparse until a VACUUM, which cannot run in a migration's
    transaction: copy the table instead (Alembic's batch "move and copy"), so scans read a fifth of
    the pages. Only with foreign keys off, as Alembic's own connection has them (with them on,
    dropping the old table would delete the reports and events that point at it:
    https://sqlite.org/foreignkeys.html#fk_schemacommands); else the next VACUUM compacts it."""
    bind = op.get_bind()
    if bind.dialect.name != "sqlite" or bind.exec_driver_sql("PRAGMA foreign_keys").scalar():
        return
    with op.batch_alter_table("nodes", recreate="always"):
        pass


def downgrade() -> None:
    op.drop_index("ix_nodes_archived", "nodes")
    op.execute("UPDATE nodes SET latest_report = (SELECT l.report FROM latest_reports l WHERE l.node_id = nodes.id)")
    op.drop_table("latest_reports")
    with op.batch_alter_table("nodes") as batch:
        for name in reversed(NEW_COLUMNS):
            batch.drop_column(name)
