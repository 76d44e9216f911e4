"""The live question and the nodes that cannot run (issue 21).

- ``nodes.ws_high_since_ms``: the first of the node's consecutive reports whose working set is at
  or above the working-set line (or above the budget); NULL while the latest is below. The writer
  keeps it as each report lands, so the ``working-set-high`` alert says since when without reading
  any history. Nodes above the line at the upgrade count from their next report;
- ``nodes.refused_ms``, ``refused_step``, ``refused_exit_code``, ``refused_message``: the
  entrypoint gate's latest refusal (a failed ``gate`` event), until a ``start`` event or a passed
  gate clears it (status ``refused``);
- ``nodes.labels`` (a JSON object, sorted keys) and ``node_labels`` (one row per label, indexed
  by key and value): the node's latest labels, shown, filtered on (``label=KEY=VALUE``) and
  exported on one ``oomguard_node_info`` series;
- ``nodes.cap_ipc_lock``: whether the latest report's process holds CAP_IPC_LOCK, which lifts
  RLIMIT_MEMLOCK (mlock(2)): the memlock column is highlighted only where the limit can bind.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"

NEW_COLUMNS = (
    ("ws_high_since_ms", sa.BigInteger),
    ("refused_ms", sa.BigInteger),
    ("refused_step", lambda: sa.String(16)),
    ("refused_exit_code", sa.Integer),
    ("refused_message", sa.Text),
    ("labels", sa.Text),
    ("cap_ipc_lock", sa.Boolean),
)


def upgrade() -> None:
    # Nullable, no default: an instant catalog change on PostgreSQL, ADD COLUMN on SQLite.
    with op.batch_alter_table("nodes") as batch:
        for name, kind in NEW_COLUMNS:
            batch.add_column(sa.Column(name, kind()))
    op.create_table(
        "node_labels",
        sa.Column("node_id", sa.Integer, sa.ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("key", sa.String(63), primary_key=True),
        sa.Column("value", sa.String(256), nullable=False),
    )
    op.create_index("ix_node_labels_key_value", "node_labels", ["key", "value"])


def downgrade() -> None:
    op.drop_index("ix_node_labels_key_value", "node_labels")
    op.drop_table("node_labels")
    with op.batch_alter_table("nodes") as batch:
        for name, _ in reversed(NEW_COLUMNS):
            batch.drop_column(name)
