"""Usage and working set in the history, GPUs and the agent's interval per node, indexes for 10,000 nodes.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    with op.batch_alter_table("reports") as batch:
        batch.add_column(sa.Column("usage_bytes", sa.BigInteger))
        batch.add_column(sa.Column("working_set_bytes", sa.BigInteger))
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("interval_ms", sa.BigInteger))
        batch.add_column(sa.Column("gpus", sa.Text))
    op.create_index("ix_reports_node_time", "reports", ["node_id", "received_ms"])
    op.create_index("ix_events_node_time", "events", ["node_id", "received_ms"])
    op.create_index("ix_events_reason_time", "events", ["reason", "received_ms"])


def downgrade() -> None:
    op.drop_index("ix_events_reason_time", "events")
    op.drop_index("ix_events_node_time", "events")
    op.drop_index("ix_reports_node_time", "reports")
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("gpus")
        batch.drop_column("interval_ms")
    with op.batch_alter_table("reports") as batch:
        batch.drop_column("working_set_bytes")
        batch.drop_column("usage_bytes")
